#!/usr/bin/env node
// loadtest/proxy-burst.mjs: a burst of visitors at the built-in proxy, and
// what the origin itself counts.
//
//   node loadtest/proxy-burst.mjs --base http://127.0.0.1:8080 --origin-stats http://127.0.0.1:3000 \
//        --visitors 10000 --procs 4 --batch 50 --interval-ms 1000
//
// Each visitor is a browser without JavaScript: its own cookie jar, its
// own loopback source address (127.0.0.2-127.0.0.251, so per-address limits
// see many clients), asks for /product/<n>, follows the waiting page's
// refresh (every --poll-ms, jittered) until the 303 to the pass endpoint,
// follows it (the 303 back that brings the pass), then asks for the
// product with it. The origin (tests/front/origin.mjs
// with --session-cookie waitroom_pass) records each pass's first request:
// its arrivals. Checked: every visitor got in, and in no window of
// --interval-ms did more than two batches (the configured rate plus one
// batch) arrive at the origin, and (with --max-active, the room's
// maxActive) the origin's peak of concurrent sessions stayed within it.
// Loopback only; bounded by --deadline-s. loadtest/proxy-burst.sh starts
// the origin and a release server and writes the report.
import { fork } from 'node:child_process';
import http from 'node:http';
import { parseArgs } from 'node:util';

const { values: o } = parseArgs({
  options: {
    base: { type: 'string' },
    'origin-stats': { type: 'string' },
    visitors: { type: 'string', default: '10000' },
    procs: { type: 'string', default: '4' },
    batch: { type: 'string', default: '50' },
    'interval-ms': { type: 'string', default: '1000' },
    'poll-ms': { type: 'string', default: '3000' },
    'deadline-s': { type: 'string', default: '600' },
    'max-active': { type: 'string' },
    worker: { type: 'string' },
  },
});
for (const url of [o.base, o['origin-stats']]) {
  if (!/^http:\/\/127\.0\.0\.1:\d+$/.test(url ?? '')) throw new Error(`loopback only: ${url}`);
}
const agent = new http.Agent({ keepAlive: false });

function get(path, { cookies, source }) {
  return new Promise((resolve, reject) => {
    const req = http.request(`${o.base}${path}`, {
      headers: { accept: 'text/html', cookie: [...cookies.entries()].map(([k, v]) => `${k}=${v}`).join('; ') },
      localAddress: source,
      agent,
      timeout: 30_000,
    }, (res) => {
      for (const line of res.headers['set-cookie'] ?? []) {
        const [pair] = line.split(';');
        const eq = pair.indexOf('=');
        cookies.set(pair.slice(0, eq), pair.slice(eq + 1));
      }
      res.resume();
      res.on('end', () => resolve({ status: res.statusCode, location: res.headers.location }));
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', reject);
    req.end();
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function visitor(i, deadline) {
  const cookies = new Map();
  const source = `127.0.0.${2 + (i % 250)}`;
  const path = `/product/${i}`;
  await sleep(Math.random() * 1000);
  while (Date.now() < deadline) {
    let answer;
    try { answer = await get(path, { cookies, source }); } catch { answer = { status: 0 }; }
    // Admitted: a 303 to the pass endpoint (under the reserved prefix),
    // which starts the session, sets the pass cookie and sends the
    // browser back (303) to the product.
    if (answer.status === 303 && answer.location?.startsWith('/') && !cookies.has('waitroom_pass')) {
      try { answer = await get(answer.location, { cookies, source }); } catch { answer = { status: 0 }; }
    }
    if (answer.status === 303 && cookies.has('waitroom_pass')) {
      const through = await get(path, { cookies, source }).then((r) => r.status, (e) => e.code ?? e.message);
      return through === 200 ? 'in' : `after-pass-${through}`;
    }
    await sleep(Number(o['poll-ms']) * (0.5 + Math.random()));
  }
  return 'timeout';
}

async function work(from, to) {
  const deadline = Date.now() + Number(o['deadline-s']) * 1000;
  const outcomes = await Promise.all(Array.from({ length: to - from }, (_, k) => visitor(from + k, deadline)));
  const counts = {};
  for (const x of outcomes) counts[x] = (counts[x] ?? 0) + 1;
  return counts;
}

if (o.worker) {
  const [from, to] = o.worker.split(':').map(Number);
  process.send(await work(from, to));
  process.exit(0);
}

const total = Number(o.visitors);
const procs = Number(o.procs);
const started = Date.now();
const parts = await Promise.all(Array.from({ length: procs }, (_, p) => new Promise((resolve, reject) => {
  const from = Math.floor((total * p) / procs);
  const to = Math.floor((total * (p + 1)) / procs);
  const child = fork(new URL(import.meta.url).pathname, [...process.argv.slice(2), '--worker', `${from}:${to}`]);
  child.on('message', resolve);
  child.on('exit', (code) => code && reject(new Error(`worker exited ${code}`)));
})));
const outcomes = {};
for (const part of parts) for (const [k, v] of Object.entries(part)) outcomes[k] = (outcomes[k] ?? 0) + v;
const stats = await (await fetch(`${o['origin-stats']}/__origin/stats?arrivals`)).json();
const arrivals = stats.arrivals;
const interval = Number(o['interval-ms']);
let worst = 0;
for (let a = 0, b = 0; b < arrivals.length; b += 1) {
  while (arrivals[b] - arrivals[a] >= interval) a += 1;
  worst = Math.max(worst, b - a + 1);
}
const batch = Number(o.batch);
const span = arrivals.length ? (arrivals.at(-1) - arrivals[0]) / 1000 : 0;
const result = {
  visitors: total,
  outcomes,
  originPasses: stats.total,
  originRequests: stats.requests,
  originPeakSessions: stats.peak,
  originSessionWindowMs: stats.sessionWindowMs,
  maxActive: o['max-active'] ? Number(o['max-active']) : null,
  mostArrivalsInOneInterval: worst,
  allowed: 2 * batch,
  arrivalsPerSecond: span ? Number(((arrivals.length - 1) / span).toFixed(1)) : null,
  configuredPerSecond: (batch * 1000) / interval,
  seconds: (Date.now() - started) / 1000,
  ok: outcomes.in === total && stats.total === total && worst <= 2 * batch
    && (!o['max-active'] || stats.peak <= Number(o['max-active'])),
};
console.log(JSON.stringify(result, null, 2));
process.exit(result.ok ? 0 : 1);
