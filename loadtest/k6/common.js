// Shared helpers for the waitroom k6 scripts. This is a module, not a test:
// `k6 run` the other files in this folder, not this one.
//
// Everything here follows the public API (docs/api.md):
//   POST /api/queues/{queue}/entries   -> 201/200 QueueStatus + ticket
//   GET  /api/queues/{queue}/position  -> 200 QueueStatus (X-Queue-Ticket)
//   GET  /api/products, POST /api/orders (X-User-Id + X-Entry-Token)

import http from 'k6/http';
import exec from 'k6/execution';

// ---------------------------------------------------------------- settings

export const BASE_URL = (__ENV.BASE_URL || 'http://127.0.0.1:8080').replace(/\/+$/, '');
export const QUEUE = __ENV.QUEUE || 'default';
export const RESULTS_DIR = (__ENV.RESULTS_DIR || 'loadtest/results').replace(/\/+$/, '');
const REQUEST_TIMEOUT = __ENV.REQUEST_TIMEOUT || '10s';

// Loopback only: these scripts are meant for a server on this machine.
if (!/^https?:\/\/(127\.\d+\.\d+\.\d+|localhost|\[::1\])(:\d+)?$/.test(BASE_URL)) {
  throw new Error(`BASE_URL must be a loopback address such as http://127.0.0.1:8080 (got ${BASE_URL})`);
}

export function envInt(name, dflt) {
  const raw = __ENV[name];
  if (raw === undefined || raw === '') return dflt;
  const v = Number(raw);
  if (!Number.isFinite(v)) throw new Error(`env ${name} must be a number, got "${raw}"`);
  return Math.floor(v);
}

export function envNum(name, dflt) {
  const raw = __ENV[name];
  if (raw === undefined || raw === '') return dflt;
  const v = Number(raw);
  if (!Number.isFinite(v)) throw new Error(`env ${name} must be a number, got "${raw}"`);
  return v;
}

// Summary percentiles: k6 only computes the ones listed here, and thresholds
// and the JSON summary need p(99).
export const SUMMARY_TREND_STATS = ['avg', 'min', 'med', 'max', 'p(90)', 'p(95)', 'p(99)', 'count'];

// ---------------------------------------------------------------- identity

// A short id for this run, so repeated runs against one server never reuse a
// user id. Generate it in setup() and hand it to the VUs through setup data.
export function newRunId() {
  return (__ENV.RUN_ID || `${Date.now().toString(36)}${Math.floor(Math.random() * 1296).toString(36)}`)
    .replace(/[^A-Za-z0-9_.:-]/g, '')
    .slice(0, 24);
}

// `k6-<vu>-<iter>-<runid>`: unique per VU iteration across all scenarios.
// Fits the contract's `[A-Za-z0-9_.:-]{1,64}`.
export function userId(runId, suffix) {
  const base = `k6-${exec.vu.idInTest}-${exec.vu.iterationInInstance}-${runId}`;
  return suffix ? `${base}-${suffix}` : base;
}

// A forged entry token with the same shape as a real one (32 random bytes,
// URL-safe base64 without padding = 43 chars).
const B64URL = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_';
export function forgedToken() {
  let s = '';
  for (let i = 0; i < 43; i++) s += B64URL[Math.floor(Math.random() * 64)];
  return s;
}

// ---------------------------------------------------------------- HTTP

// Each request gets a throw-away cookie jar: the ticket cookie that enter sets
// is never sent back, so the scripts exercise the header path
// (X-Queue-Ticket), and one user's cookie never leaks into another user's
// request on the same VU.
export function params(name, headers, expected) {
  const p = {
    headers: Object.assign({ Accept: 'application/json' }, headers || {}),
    tags: { name },
    timeout: REQUEST_TIMEOUT,
    jar: new http.CookieJar(),
  };
  if (expected) p.responseCallback = http.expectedStatuses(...expected);
  return p;
}

export function json(res) {
  try {
    return res.json();
  } catch (_) {
    return null;
  }
}

export function enter(uid) {
  const res = http.post(
    `${BASE_URL}/api/queues/${QUEUE}/entries`,
    null,
    params('enter', { 'X-User-Id': uid }, [200, 201]),
  );
  return { res, body: json(res) };
}

export function position(uid, ticket) {
  const res = http.get(
    `${BASE_URL}/api/queues/${QUEUE}/position`,
    params('position', { 'X-User-Id': uid, 'X-Queue-Ticket': ticket }, [200]),
  );
  return { res, body: json(res) };
}

// ---------------------------------------------------------------- contract

const STATUS_FIELDS = [
  'status', 'rank', 'position', 'totalWaiting', 'estimatedWaitSeconds',
  'pollingIntervalSeconds', 'enteredAt', 'entryToken', 'tokenExpiresInSeconds',
];

// "The shape is stable: a field that does not apply is null, never missing."
export function hasStatusShape(b) {
  return !!b && typeof b === 'object' && STATUS_FIELDS.every((f) => f in b);
}

// Rank and token consistency of one QueueStatus.
export function statusConsistent(b) {
  if (!hasStatusShape(b)) return false;
  if (b.status === 'WAITING') {
    return Number.isInteger(b.rank) && b.rank >= 0 && b.position === b.rank + 1 &&
      b.entryToken === null && Number.isInteger(b.totalWaiting) && b.totalWaiting > b.rank;
  }
  if (b.status === 'READY') {
    return b.rank === null && typeof b.entryToken === 'string' && b.entryToken.length > 0 &&
      Number.isInteger(b.tokenExpiresInSeconds) && b.tokenExpiresInSeconds > 0;
  }
  return b.status === 'NOT_ENTERED';
}

// Polling tiers of the contract: 1 s with fewer than 100 ahead, 3 s under
// 1,000, else 5 s. `rank` is 0-based, so it is the number of users ahead.
export function expectedPollInterval(rank) {
  if (rank < 100) return 1;
  if (rank < 1000) return 3;
  return 5;
}

// ---------------------------------------------------------------- summary

function fmtNum(v, isTime) {
  if (v === undefined || v === null || Number.isNaN(v)) return '-';
  if (isTime) {
    if (v >= 1000) return `${(v / 1000).toFixed(2)}s`;
    if (v >= 1) return `${v.toFixed(2)}ms`;
    return `${(v * 1000).toFixed(0)}µs`;
  }
  return Number.isInteger(v) ? `${v}` : v.toFixed(4).replace(/\.?0+$/, '');
}

function metricLine(name, m) {
  const v = m.values;
  const t = m.contains === 'time';
  switch (m.type) {
    case 'trend':
      return `${name}: ` + ['avg', 'med', 'p(95)', 'p(99)', 'max', 'count']
        .filter((k) => k in v)
        .map((k) => `${k}=${k === 'count' ? v[k] : fmtNum(v[k], t)}`)
        .join(' ');
    case 'rate':
      return `${name}: ${(v.rate * 100).toFixed(2)}% (${v.passes} of ${v.passes + v.fails})`;
    case 'counter':
      return `${name}: ${v.count} (${fmtNum(v.rate)}/s)`;
    case 'gauge':
      return `${name}: ${fmtNum(v.value)}`;
    default:
      return `${name}: ${JSON.stringify(v)}`;
  }
}

function metricValues(data, name) {
  return data.metrics[name] ? data.metrics[name].values : undefined;
}

// Pick `stat` of `metric` ("count", "rate", "p(95)", ...), or null.
export function stat(data, metric, key) {
  const v = metricValues(data, metric);
  return v && key in v ? v[key] : null;
}

// A compact text summary on stdout and the full summary plus `figures` as
// JSON in <RESULTS_DIR>/<script>.json (the directory must exist; k6 does not
// create it). `figures` is a flat object a runner can read without knowing
// k6's layout.
export function summarize(script, data, figures, config) {
  const thresholds = {};
  let allOk = true;
  for (const [name, m] of Object.entries(data.metrics)) {
    if (!m.thresholds) continue;
    for (const [expr, r] of Object.entries(m.thresholds)) {
      thresholds[`${name}: ${expr}`] = r.ok;
      if (!r.ok) allOk = false;
    }
  }

  const lines = [];
  lines.push('');
  lines.push(`== waitroom ${script} against ${BASE_URL} (${(data.state.testRunDurationMs / 1000).toFixed(1)} s)`);
  lines.push(`-- thresholds: ${allOk ? 'all passed' : 'SOME FAILED'}`);
  for (const [k, ok] of Object.entries(thresholds)) lines.push(`   ${ok ? 'ok  ' : 'FAIL'} ${k}`);
  lines.push('-- figures');
  for (const [k, v] of Object.entries(figures)) lines.push(`   ${k} = ${typeof v === 'number' ? fmtNum(v) : JSON.stringify(v)}`);
  lines.push('-- metrics');
  for (const name of Object.keys(data.metrics).sort()) {
    if (name.startsWith('data_') || name === 'vus' || name === 'vus_max') continue;
    lines.push(`   ${metricLine(name, data.metrics[name])}`);
  }
  lines.push(`-- JSON summary: ${RESULTS_DIR}/${script}.json`);
  lines.push('');

  const out = {
    script,
    baseUrl: BASE_URL,
    queue: QUEUE,
    finishedAt: new Date().toISOString(),
    testRunDurationMs: data.state.testRunDurationMs,
    thresholdsPassed: allOk,
    thresholds,
    config,
    figures,
    setupData: data.setup_data || null,
    metrics: data.metrics,
  };
  return {
    stdout: lines.join('\n') + '\n',
    [`${RESULTS_DIR}/${script}.json`]: JSON.stringify(out, null, 2) + '\n',
  };
}

// Fail fast with a clear message when no server answers at BASE_URL.
export function requireServer() {
  let res;
  for (let i = 0; i < 3; i++) {
    res = http.get(`${BASE_URL}/healthz`, params('healthz'));
    if (res.status === 200) return;
  }
  throw new Error(`no waitroom server at ${BASE_URL} (GET /healthz -> ${res.status} ${res.error || ''})`);
}

// Ticket cookie as the contract sets it: HttpOnly; SameSite=Strict, scoped
// to the queue's path.
export function ticketCookieOk(res) {
  const raw = res.headers['Set-Cookie'] || '';
  return /httponly/i.test(raw) && /samesite=strict/i.test(raw) &&
    new RegExp(`path=/api/queues/${QUEUE}(;|$|,|\\s)`, 'i').test(raw);
}
