// poll-position: the polling fallback under a crowd.
//
// USERS users join the queue (spread evenly over SPREAD seconds, in VU order,
// so arrival order is known), then each polls
// `GET /api/queues/{queue}/position` with `X-Queue-Ticket: <ticket>`, sleeping
// the `pollingIntervalSeconds` the server advises (1/3/5 s tiers), until it is
// READY or DURATION seconds after the start (or MAX_POLLS polls). It measures
// poll latency, how many users reached READY and how fast, how many polls a
// user needed, whether the advised tier matches the rank, and that a rank
// never goes up (strict FIFO).
//
//   k6 run -e BASE_URL=http://127.0.0.1:8080 loadtest/k6/poll-position.js
//
// env: BASE_URL, QUEUE (default), USERS (1500), SPREAD (5 s), DURATION (45 s,
//      the polling deadline from the start), MAX_POLLS (300 per user),
//      P95_MS (50), P99_MS (100), MAX_FAILED (0.01), MIN_CHECKS (0.99),
//      MIN_READY (0.95 of users must reach READY), RESULTS_DIR.
//
// With the default server (50 admissions per 1 s) 1,500 users are all READY
// after ~30 s, and the line is long enough for all three polling tiers. A
// slower server needs fewer USERS or a longer DURATION.

import { check, sleep } from 'k6';
import exec from 'k6/execution';
import { Counter, Rate, Trend } from 'k6/metrics';
import {
  BASE_URL, QUEUE, SUMMARY_TREND_STATS, envInt, envNum, enter, expectedPollInterval, newRunId,
  position, requireServer, stat, statusConsistent, summarize, userId,
} from './common.js';

const USERS = envInt('USERS', 1500);
const SPREAD = envNum('SPREAD', 5);
const DURATION = envNum('DURATION', 45);
const MAX_POLLS = envInt('MAX_POLLS', 300);
const P95_MS = envNum('P95_MS', 50);
const P99_MS = envNum('P99_MS', 100);
const MAX_FAILED = envNum('MAX_FAILED', 0.01);
const MIN_CHECKS = envNum('MIN_CHECKS', 0.99);
const MIN_READY = envNum('MIN_READY', 0.95);

if (USERS < 1 || DURATION <= 0 || SPREAD < 0 || SPREAD >= DURATION) {
  throw new Error('need USERS >= 1 and 0 <= SPREAD < DURATION');
}

const usersEntered = new Counter('users_entered');
const usersReady = new Counter('users_ready');
const usersTimedOut = new Counter('users_timed_out');
const usersLost = new Counter('users_lost'); // NOT_ENTERED or 401 while waiting
const reachedReady = new Rate('reached_ready');
const fastTracked = new Counter('users_fast_tracked');
const pollsPerUser = new Trend('polls_per_user');
const timeToReady = new Trend('time_to_ready', true);
const etaError = new Trend('eta_error_seconds'); // actual wait - estimate at enter
const tierOk = new Rate('poll_tier_matches_rank');
const rankIncreased = new Counter('rank_increased');
const advised = {
  1: new Counter('advised_interval_1s'),
  3: new Counter('advised_interval_3s'),
  5: new Counter('advised_interval_5s'),
};

export const options = {
  scenarios: {
    users: {
      executor: 'per-vu-iterations',
      vus: USERS,
      iterations: 1,
      maxDuration: `${Math.ceil(DURATION + 10)}s`,
      gracefulStop: '5s',
    },
  },
  thresholds: {
    http_req_failed: [`rate<${MAX_FAILED}`],
    'http_req_duration{name:position}': [`p(95)<${P95_MS}`, `p(99)<${P99_MS}`],
    'http_req_duration{name:enter}': [`p(95)<${P95_MS}`, `p(99)<${P99_MS}`],
    checks: [`rate>${MIN_CHECKS}`],
    reached_ready: [`rate>=${MIN_READY}`],
    rank_increased: ['count==0'],
  },
  summaryTrendStats: SUMMARY_TREND_STATS,
  setupTimeout: '20s',
};

export function setup() {
  requireServer();
  return { runId: newRunId() };
}

function advise(b) {
  const s = b && b.pollingIntervalSeconds;
  if (advised[s]) advised[s].add(1);
}

export default function (data) {
  const start = exec.scenario.startTime;
  const deadline = start + DURATION * 1000;
  // Even arrival over SPREAD seconds in VU order.
  sleep(((exec.vu.idInTest - 1) / USERS) * SPREAD);

  const uid = userId(data.runId);
  const entered = Date.now();
  const e = enter(uid);
  const enterOk = check(e.res, {
    'enter: 201': (r) => r.status === 201,
    'enter: ticket': () => !!e.body && typeof e.body.ticket === 'string' && e.body.ticket.length > 0,
    'enter: consistent QueueStatus': () => statusConsistent(e.body),
  });
  if (!enterOk || !e.body || !e.body.ticket) {
    usersLost.add(1);
    reachedReady.add(false);
    return;
  }
  usersEntered.add(1);
  const ticket = e.body.ticket;
  const eta = e.body.estimatedWaitSeconds;
  advise(e.body);

  let last = e.body;
  let lastRank = last.status === 'WAITING' ? last.rank : null;
  let polls = 0;
  if (last.status === 'READY') fastTracked.add(1);

  while (last.status === 'WAITING' && polls < MAX_POLLS) {
    const interval = Number.isFinite(last.pollingIntervalSeconds) && last.pollingIntervalSeconds > 0
      ? last.pollingIntervalSeconds : 1;
    const left = deadline - Date.now();
    if (left <= 0) break;
    sleep(Math.min(interval, left / 1000));
    if (Date.now() >= deadline) break;

    const p = position(uid, ticket);
    polls++;
    const ok = check(p.res, {
      'position: 200': (r) => r.status === 200,
      'position: consistent QueueStatus': () => statusConsistent(p.body),
      'position: still queued or admitted': () => !!p.body && (p.body.status === 'WAITING' || p.body.status === 'READY'),
    });
    if (!ok || !p.body) {
      if (p.res.status === 401 || (p.body && p.body.status === 'NOT_ENTERED')) {
        usersLost.add(1);
        reachedReady.add(false);
        pollsPerUser.add(polls);
        return;
      }
      continue; // transient error: keep polling within the bounds
    }
    last = p.body;
    advise(last);
    if (last.status === 'WAITING') {
      tierOk.add(last.pollingIntervalSeconds === expectedPollInterval(last.rank));
      if (lastRank !== null && last.rank > lastRank) rankIncreased.add(1);
      lastRank = last.rank;
    }
  }

  pollsPerUser.add(polls);
  if (last.status === 'READY') {
    usersReady.add(1);
    reachedReady.add(true);
    const waited = Date.now() - entered;
    timeToReady.add(waited);
    if (Number.isFinite(eta) && polls > 0) etaError.add(waited / 1000 - eta);
  } else {
    usersTimedOut.add(1);
    reachedReady.add(false);
  }
}

export function handleSummary(data) {
  const figures = {
    users: USERS,
    users_entered: stat(data, 'users_entered', 'count') || 0,
    users_ready: stat(data, 'users_ready', 'count') || 0,
    users_fast_tracked: stat(data, 'users_fast_tracked', 'count') || 0,
    users_timed_out: stat(data, 'users_timed_out', 'count') || 0,
    users_lost: stat(data, 'users_lost', 'count') || 0,
    reached_ready_rate: stat(data, 'reached_ready', 'rate'),
    polls: stat(data, 'http_req_duration{name:position}', 'count') || 0,
    polls_per_user_avg: stat(data, 'polls_per_user', 'avg'),
    polls_per_user_max: stat(data, 'polls_per_user', 'max'),
    time_to_ready_p50_ms: stat(data, 'time_to_ready', 'med'),
    time_to_ready_max_ms: stat(data, 'time_to_ready', 'max'),
    eta_error_avg_s: stat(data, 'eta_error_seconds', 'avg'),
    poll_p50_ms: stat(data, 'http_req_duration{name:position}', 'med'),
    poll_p95_ms: stat(data, 'http_req_duration{name:position}', 'p(95)'),
    poll_p99_ms: stat(data, 'http_req_duration{name:position}', 'p(99)'),
    enter_p95_ms: stat(data, 'http_req_duration{name:enter}', 'p(95)'),
    http_req_failed_rate: stat(data, 'http_req_failed', 'rate'),
    poll_tier_matches_rank_rate: stat(data, 'poll_tier_matches_rank', 'rate'),
    advised_1s: stat(data, 'advised_interval_1s', 'count') || 0,
    advised_3s: stat(data, 'advised_interval_3s', 'count') || 0,
    advised_5s: stat(data, 'advised_interval_5s', 'count') || 0,
    rank_increased: stat(data, 'rank_increased', 'count') || 0,
  };
  return summarize('poll-position', data, figures, {
    baseUrl: BASE_URL, queue: QUEUE, users: USERS, spreadSeconds: SPREAD, durationSeconds: DURATION,
    maxPolls: MAX_POLLS, p95Ms: P95_MS, p99Ms: P99_MS, minReady: MIN_READY,
  });
}
