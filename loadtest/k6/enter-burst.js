// enter-burst: how fast can waitroom take people into the queue?
//
// A burst of joins with a ramping-arrival-rate executor: the rate ramps from 0
// to RATE/s over RAMP_SECONDS, then holds at RATE/s until ENTERS joins were
// sent (never more; the whole burst is capped at DURATION seconds). Every
// join is a distinct user (`X-User-Id: k6-<vu>-<iter>-<runid>`), so each must
// get `201` with a ticket and a status.
//
//   k6 run -e BASE_URL=http://127.0.0.1:8080 loadtest/k6/enter-burst.js
//
// env: BASE_URL, QUEUE (default), RATE (2000), ENTERS (10000), RAMP_SECONDS (2),
//      DURATION (50, cap on the burst), VUS (200 pre-allocated), MAX_VUS (1000),
//      P95_MS (50), P99_MS (100), MAX_FAILED (0.01), MIN_CHECKS (0.99),
//      MAX_DROPPED (0.01 of ENTERS), RESULTS_DIR (loadtest/results).

import http from 'k6/http';
import { check } from 'k6';
import exec from 'k6/execution';
import { Counter, Rate, Trend } from 'k6/metrics';
import {
  BASE_URL, QUEUE, SUMMARY_TREND_STATS, envInt, envNum, json, newRunId, requireServer,
  stat, statusConsistent, summarize, ticketCookieOk, userId,
} from './common.js';

const RATE = envInt('RATE', 2000);
const ENTERS = envInt('ENTERS', 10000);
const DURATION = envNum('DURATION', 50);
const P95_MS = envNum('P95_MS', 50);
const P99_MS = envNum('P99_MS', 100);
const MAX_FAILED = envNum('MAX_FAILED', 0.01);
const MIN_CHECKS = envNum('MIN_CHECKS', 0.99);
const MAX_DROPPED = envNum('MAX_DROPPED', 0.01);

if (RATE < 1 || ENTERS < 1 || DURATION <= 0) throw new Error('RATE, ENTERS and DURATION must be positive');

// Stages: a linear ramp sends RATE * ramp / 2 joins, the plateau the rest.
let rampS = envNum('RAMP_SECONDS', 2);
let holdS = (ENTERS - (RATE * rampS) / 2) / RATE;
if (holdS < 0) {
  rampS = (2 * ENTERS) / RATE; // the ramp alone sends ENTERS
  holdS = 0;
}
if (rampS + holdS > DURATION) holdS = Math.max(0, DURATION - rampS);
const ms = (s) => `${Math.max(1, Math.round(s * 1000))}ms`;
// k6 starts slightly fewer iterations than the stages' area; a short tail
// makes up for it, and the guard in the default function cuts at ENTERS.
const tailS = Math.min(Math.max(0.25, 0.03 * (rampS + holdS)), Math.max(0, DURATION - rampS - holdS));
const stages = [{ target: RATE, duration: ms(rampS) }];
if (holdS + tailS > 0) stages.push({ target: RATE, duration: ms(holdS + tailS) });

// Per join only one check and one Rate sample: on 2 shared cores k6's own
// per-sample cost is what limits the rate, not the server.
const enterOk = new Rate('enter_ok');
const enterReady = new Counter('enter_fast_tracked');
const enterRepeat = new Counter('enter_answered_200');
const totalWaitingSeen = new Trend('total_waiting_seen'); // sampled, 1 in 50
const failures = { status: new Counter('enter_fail_status'), body: new Counter('enter_fail_body'), cookie: new Counter('enter_fail_cookie') };
let warned = 0;

export const options = {
  scenarios: {
    burst: {
      executor: 'ramping-arrival-rate',
      startRate: 0,
      timeUnit: '1s',
      stages,
      preAllocatedVUs: envInt('VUS', 200),
      maxVUs: envInt('MAX_VUS', 1000),
      gracefulStop: '5s',
    },
  },
  thresholds: {
    http_req_failed: [`rate<${MAX_FAILED}`],
    'http_req_duration{name:enter}': [`p(95)<${P95_MS}`, `p(99)<${P99_MS}`],
    enter_ok: [`rate>${MIN_CHECKS}`],
    checks: [`rate>${MIN_CHECKS}`],
    // The generator could not keep the rate (server too slow or MAX_VUS low).
    dropped_iterations: [`count<${Math.max(1, Math.ceil(ENTERS * MAX_DROPPED))}`],
  },
  summaryTrendStats: SUMMARY_TREND_STATS,
  setupTimeout: '20s',
  teardownTimeout: '10s',
};

export function setup() {
  requireServer();
  const expected = Math.round((RATE * rampS) / 2 + RATE * holdS);
  if (expected < ENTERS) console.warn(`DURATION=${DURATION}s caps the burst at about ${expected} of ENTERS=${ENTERS}`);
  return { runId: newRunId(), rate: RATE, enters: ENTERS, rampSeconds: rampS, holdSeconds: holdS };
}

export default function (data) {
  const n = exec.scenario.iterationInTest;
  if (n >= ENTERS) return; // exact bound on the count
  const uid = userId(data.runId);
  // The VU's cookie jar is emptied between iterations, so one user's ticket
  // cookie never reaches the next user.
  const res = http.post(`${BASE_URL}/api/queues/${QUEUE}/entries`, null, {
    headers: { 'X-User-Id': uid, Accept: 'application/json' },
    tags: { name: 'enter' },
    timeout: '10s',
  });
  const body = json(res);
  // One combined check: 201 (or 200), a ticket, WAITING or READY, a complete
  // and consistent QueueStatus, and the ticket cookie.
  let why = null;
  if (res.status !== 201 && res.status !== 200) why = 'status';
  else if (!body || typeof body.ticket !== 'string' || body.ticket.length === 0 ||
    (body.status !== 'WAITING' && body.status !== 'READY') || !statusConsistent(body)) why = 'body';
  else if (!ticketCookieOk(res)) why = 'cookie';
  const ok = check(res, { 'enter: 201/200, ticket, WAITING/READY, full QueueStatus, ticket cookie': () => why === null });
  enterOk.add(ok);
  if (!ok) {
    failures[why].add(1);
    if (exec.vu.idInTest <= 20 && warned++ < 1) console.warn(`enter failed (${why}): ${res.status} ${String(res.body).slice(0, 300)}`);
  }
  if (res.status === 200) enterRepeat.add(1); // distinct users: should stay 0
  if (body && body.status === 'READY') enterReady.add(1);
  if (n % 50 === 0 && body && Number.isInteger(body.totalWaiting)) totalWaitingSeen.add(body.totalWaiting);
}

export function handleSummary(data) {
  const sent = stat(data, 'http_req_duration{name:enter}', 'count') || 0;
  const runS = data.state.testRunDurationMs / 1000;
  const figures = {
    enters: sent,
    target_rate_per_s: RATE,
    // over the whole run, ramp included; dropped_iterations == 0 means the
    // plateau held RATE
    mean_enters_per_s: runS > 0 ? Math.round(sent / runS) : null,
    enter_p50_ms: stat(data, 'http_req_duration{name:enter}', 'med'),
    enter_p95_ms: stat(data, 'http_req_duration{name:enter}', 'p(95)'),
    enter_p99_ms: stat(data, 'http_req_duration{name:enter}', 'p(99)'),
    enter_max_ms: stat(data, 'http_req_duration{name:enter}', 'max'),
    http_req_failed_rate: stat(data, 'http_req_failed', 'rate'),
    enter_fail_status: stat(data, 'enter_fail_status', 'count') || 0,
    enter_fail_body: stat(data, 'enter_fail_body', 'count') || 0,
    enter_fail_cookie: stat(data, 'enter_fail_cookie', 'count') || 0,
    enter_ok_rate: stat(data, 'enter_ok', 'rate'),
    dropped_iterations: stat(data, 'dropped_iterations', 'count') || 0,
    fast_tracked: stat(data, 'enter_fast_tracked', 'count') || 0,
    answered_200: stat(data, 'enter_answered_200', 'count') || 0,
    max_total_waiting_seen: stat(data, 'total_waiting_seen', 'max'),
    vus_max: stat(data, 'vus_max', 'value'),
  };
  return summarize('enter-burst', data, figures, {
    baseUrl: BASE_URL, queue: QUEUE, rate: RATE, enters: ENTERS, rampSeconds: rampS, holdSeconds: holdS,
    p95Ms: P95_MS, p99Ms: P99_MS, maxFailed: MAX_FAILED, minChecks: MIN_CHECKS,
  });
}
