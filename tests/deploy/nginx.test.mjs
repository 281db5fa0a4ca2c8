// The deployment of deploy/nginx.conf, end to end: nginx (TLS, HTTP/2 to the
// browser, HTTP/1.1 keep-alive upstream) in front of two waitroom release
// instances sharing Redis, and the waiting-room page driven through it in
// Chromium. Covers a whole purchase, a SIGTERM of the instance holding the
// buyer's stream mid-wait, what nginx must not expose, the forwarding and
// identity headers it sets or strips, its access log, its per-address
// limit on joins, HSTS on every HTTPS answer, and a port 80 that redirects
// only the site's own name.
//
// Run by tests/deploy/run.sh (nginx, Chromium, Node packages, the release
// build); the committed nginx.conf is used as it is, with only its ports and
// file paths replaced (`siteConfig`).

import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import http2 from 'node:http2';
import { createRequire } from 'node:module';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import tls from 'node:tls';
import { fileURLToPath } from 'node:url';

import {
  BROWSER_DIR,
  assertNoConsoleErrors,
  orderFirstProduct,
  pageVisitor,
  readPosition,
  screenshot,
  waitForState,
  watchConsole,
} from '../browser/lib/harness.js';

// Extra flags of every instance, in one place. The last three are the
// deployment's final shape (deploy/nginx.conf's header); switch them on
// once the binary has them (branches `web` and `limits`).
const EXTRA_INSTANCE_FLAGS = [
  '--idle-timeout-secs', '75',        // > nginx upstream keepalive_timeout 60s
  '--trusted-proxies', '127.0.0.1/32', // believe nginx's X-Forwarded-*
  '--cookie-secure', 'auto',
];

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const SITE_CONF = path.join(ROOT, 'deploy/nginx.conf');
const NGINX = process.env.NGINX_PATH || '/usr/sbin/nginx';
const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
const REDIS_URL = process.env.WAITROOM_TEST_REDIS || 'redis://127.0.0.1:6379';
// deploy/nginx.conf's server_name, and the HSTS it sends.
const SITE_NAME = 'shop.example.com';
const HSTS = 'max-age=31536000; includeSubDomains';
const DRAIN_SECS = 2;
// The limit nginx.conf sets on joins: burst=20 on top of the first one.
const JOIN_BURST = 20;
// playwright-core is installed for the page tests; use that copy.
const { chromium } = createRequire(path.join(BROWSER_DIR, 'package.json'))('playwright-core');

const ADMIN_TOKEN = `deploy-admin-${Math.random().toString(36).slice(2)}`;
const SERVICE_TOKEN = `deploy-service-${Math.random().toString(36).slice(2)}`;
const PREFIX = `t-deploy-${Math.random().toString(36).slice(2, 10)}`;

const work = mkdtempSync(path.join(os.tmpdir(), 'waitroom-deploy-'));
// nginx's workers run as `nobody` when the test runs as root: they must
// reach their temp paths. The key stays readable by its owner only (the
// master process reads it).
chmodSync(work, 0o755);

const children = new Set();
process.on('exit', () => {
  for (const child of children) child.kill('SIGKILL');
});

let nginx;
const instances = [];
let browser;
let origin;
let ca;

function freePort() {
  return new Promise((resolve, reject) => {
    const probe = net.createServer();
    probe.unref();
    probe.on('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address();
      probe.close(() => resolve(port));
    });
  });
}

/** A child process whose output is kept (the last 300 lines) for failure messages. */
function run(name, file, args) {
  const env = { ...process.env };
  for (const key of Object.keys(env)) {
    if (key.startsWith('WAITROOM_') || key === 'REDIS_URL') delete env[key];
  }
  const child = spawn(file, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
  children.add(child);
  const log = [];
  const keep = (chunk) => {
    for (const line of chunk.toString().split('\n')) {
      if (!line) continue;
      log.push(line);
      if (log.length > 300) log.shift();
    }
  };
  child.stdout.on('data', keep);
  child.stderr.on('data', keep);
  const proc = { name, child, log, exit: null };
  proc.exited = new Promise((resolve) => {
    const done = (exit) => {
      proc.exit = exit;
      children.delete(child);
      resolve(exit);
    };
    child.on('exit', (code, signal) => done({ code, signal }));
    child.on('error', (error) => done({ error: error.message }));
  });
  proc.tail = (n = 30) => `${name}:\n  ${log.slice(-n).join('\n  ')}`;
  return proc;
}

/** SIGTERM, then SIGKILL after `graceMs`; resolves to the exit and whether it hung. */
async function stop(proc, graceMs) {
  if (proc.exit) return { exit: proc.exit, hung: false };
  proc.child.kill('SIGTERM');
  let hung = false;
  const timer = setTimeout(() => {
    hung = true;
    proc.child.kill('SIGKILL');
  }, graceMs);
  const exit = await proc.exited;
  clearTimeout(timer);
  return { exit, hung };
}

async function waitUntil(what, check, { timeoutMs = 20_000, proc } = {}) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (proc?.exit) throw new Error(`${proc.name} exited (${JSON.stringify(proc.exit)}) before ${what}\n${proc.tail()}`);
    try {
      if (await check()) return;
    } catch {
      // not yet
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}${proc ? `\n${proc.tail()}` : ''}`);
    await sleep(100);
  }
}

async function startInstance(index, ordersDb) {
  const port = await freePort();
  const adminPort = await freePort();
  const args = [
    '--addr', `127.0.0.1:${port}`,
    '--admin-addr', `127.0.0.1:${adminPort}`,
    '--service-token', SERVICE_TOKEN,
    '--redis-url', REDIS_URL,
    '--key-prefix', PREFIX,
    '--orders-db', ordersDb,
    '--admin-token', ADMIN_TOKEN,
    '--admission-interval-ms', '700',
    '--admission-batch', '1',
    '--drain-secs', String(DRAIN_SECS),
    ...EXTRA_INSTANCE_FLAGS,
  ];
  const proc = run(`waitroom #${index} (:${port})`, process.env.WAITROOM_BIN, args);
  proc.port = port;
  proc.base = `http://127.0.0.1:${port}`;
  proc.admin = `http://127.0.0.1:${adminPort}`;
  await waitUntil(`${proc.name} answers /readyz`, async () => {
    const res = await fetch(`${proc.base}/readyz`, { signal: AbortSignal.timeout(1_000) });
    return res.status === 200;
  }, { proc });
  return proc;
}

/**
 * deploy/nginx.conf as committed, with the operator's values replaced by
 * the test's. Each replacement must match exactly as often as expected, so
 * an edit of the file that the test would silently miss fails here.
 */
function siteConfig(ports) {
  let text = readFileSync(SITE_CONF, 'utf8');
  const replace = (from, to, times = 1) => {
    const count = text.split(from).length - 1;
    assert.equal(count, times, `deploy/nginx.conf: expected "${from}" ${times}×, found ${count}×`);
    text = text.split(from).join(to);
  };
  replace('listen 443 ssl http2 backlog=4096;', `listen 127.0.0.1:${ports.https} ssl http2 backlog=4096;`);
  // Every port-80 server (however many): the same test port.
  const plain = text.match(/\blisten 80\b/g)?.length ?? 0;
  assert.ok(plain >= 1, 'deploy/nginx.conf: no "listen 80"');
  text = text.replace(/\blisten 80\b/g, `listen 127.0.0.1:${ports.http}`);
  replace('server 127.0.0.1:8081 ', `server 127.0.0.1:${ports.instances[0]} `);
  replace('server 127.0.0.1:8082 ', `server 127.0.0.1:${ports.instances[1]} `);
  replace('/etc/nginx/tls/waitroom.crt', path.join(work, 'tls.crt'));
  replace('/etc/nginx/tls/waitroom.key', path.join(work, 'tls.key'));
  replace('/var/log/nginx/waitroom.access.log', path.join(work, 'access.log'));
  return text;
}

/** The main configuration around the site file: everything in the temp dir, no root needed. */
function mainConfig() {
  const temp = (name) => path.join(work, 'tmp', name);
  return `worker_processes 1;
pid ${path.join(work, 'nginx.pid')};
error_log ${path.join(work, 'error.log')} warn;
events { worker_connections 512; }
http {
    client_body_temp_path ${temp('body')};
    proxy_temp_path ${temp('proxy')};
    fastcgi_temp_path ${temp('fastcgi')};
    uwsgi_temp_path ${temp('uwsgi')};
    scgi_temp_path ${temp('scgi')};
    default_type application/octet-stream;
    include ${path.join(work, 'waitroom.conf')};
}
`;
}

/** One HTTP/2 request to nginx (trusting the test's certificate): `{ status, headers, body }`. */
function h2(session, method, pathWithQuery, headers = {}, body) {
  return new Promise((resolve, reject) => {
    const req = session.request({ ':method': method, ':path': pathWithQuery, ...headers });
    const chunks = [];
    let head = null;
    req.setTimeout(10_000, () => req.close(http2.constants.NGHTTP2_CANCEL));
    req.on('response', (h) => {
      head = h;
    });
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => resolve({ status: head?.[':status'], headers: head ?? {}, body: Buffer.concat(chunks).toString() }));
    req.on('error', reject);
    req.end(body);
  });
}

function connectH2() {
  const session = http2.connect(origin, { ca, servername: 'localhost' });
  session.on('error', () => {});
  return session;
}

/**
 * One HTTP/1.1 request over TLS to nginx, written byte for byte (repeated
 * headers, unnormalised paths): `{ status, head, body }`.
 */
function rawHttps(port, request) {
  return new Promise((resolve, reject) => {
    const socket = tls.connect({ host: '127.0.0.1', port, ca, servername: 'localhost', ALPNProtocols: ['http/1.1'] });
    const chunks = [];
    socket.setTimeout(10_000, () => socket.destroy(new Error('raw request timed out')));
    socket.on('secureConnect', () => socket.write(request));
    socket.on('data', (c) => chunks.push(c));
    socket.on('error', reject);
    socket.on('end', () => {
      const text = Buffer.concat(chunks).toString();
      const split = text.indexOf('\r\n\r\n');
      const head = text.slice(0, split);
      resolve({ status: Number(head.split(' ')[1]), head, body: text.slice(split + 4) });
    });
  });
}

/** A raw HTTP/1.1 request over plain TCP (an instance, nginx's port 80); the whole answer as text. */
function rawHttpDirect(port, request) {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, '127.0.0.1', () => socket.write(request));
    const chunks = [];
    socket.setTimeout(10_000, () => socket.destroy(new Error('raw request timed out')));
    socket.on('data', (c) => chunks.push(c));
    socket.on('error', reject);
    socket.on('end', () => resolve(Buffer.concat(chunks).toString()));
  });
}

async function metric(instance, name) {
  const res = await fetch(`${instance.admin}/metrics`, { signal: AbortSignal.timeout(3_000) });
  const text = await res.text();
  let sum = 0;
  for (const line of text.split('\n')) {
    if (line.startsWith(`${name} `) || line.startsWith(`${name}{`)) sum += Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return sum;
}

/** Put `count` other buyers in line, straight at an instance (each request without a cookie is a new visitor). */
async function prefill(instance, count) {
  for (let i = 0; i < count; i += 1) {
    const res = await fetch(`${instance.base}/api/queues/default/entries`, { method: 'POST' });
    assert.equal(res.status, 201, `prefill join: ${res.status} ${await res.text()}`);
  }
}

/** Hold (or resume) admission to the default queue, through one instance's admin API: the hold is in Redis, for all. */
async function hold(instance, paused) {
  const res = await fetch(`${instance.admin}/api/admin/queues/default/${paused ? 'pause' : 'resume'}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
  });
  assert.equal(res.status, 200, `${paused ? 'pause' : 'resume'}: ${await res.text()}`);
}

/** After a test that holds admission: resume it, whatever happened, so a failure does not spread to the next test. */
function resumeAfter(t) {
  t.after(async () => {
    const alive = instances.find((i) => !i.exit);
    if (alive) await hold(alive, false).catch(() => {});
  });
}

before(async () => {
  assert.ok(process.env.WAITROOM_BIN, 'WAITROOM_BIN names the release binary (tests/deploy/run.sh sets it)');
  execFileSync('openssl', [
    'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '2',
    '-subj', '/CN=localhost', '-addext', 'subjectAltName=DNS:localhost,IP:127.0.0.1',
    '-keyout', path.join(work, 'tls.key'), '-out', path.join(work, 'tls.crt'),
  ], { stdio: 'pipe' });
  ca = readFileSync(path.join(work, 'tls.crt'));

  // The instances share Redis (one key prefix) and the demo orders database.
  const ordersDb = path.join(work, 'orders.db');
  instances.push(await startInstance(1, ordersDb));
  instances.push(await startInstance(2, ordersDb));

  const ports = { https: await freePort(), http: await freePort(), instances: instances.map((i) => i.port) };
  mkdirSync(path.join(work, 'tmp'), { recursive: true });
  writeFileSync(path.join(work, 'waitroom.conf'), siteConfig(ports));
  writeFileSync(path.join(work, 'nginx.conf'), mainConfig());
  const nginxArgs = ['-e', path.join(work, 'error.log'), '-p', work, '-c', path.join(work, 'nginx.conf')];
  try {
    execFileSync(NGINX, [...nginxArgs, '-t', '-q'], { stdio: 'pipe' });
  } catch (err) {
    throw new Error(`nginx -t refused deploy/nginx.conf:\n${err.stderr}`);
  }
  nginx = run(`nginx (:${ports.https})`, NGINX, [...nginxArgs, '-g', 'daemon off;']);
  origin = `https://127.0.0.1:${ports.https}`;
  nginx.httpPort = ports.http;
  nginx.httpsPort = ports.https;
  await waitUntil('nginx answers /healthz over TLS', async () => {
    const session = connectH2();
    try {
      return (await h2(session, 'GET', '/healthz')).status === 200;
    } finally {
      session.close();
    }
  }, { proc: nginx });

  browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    timeout: 30_000,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--ignore-certificate-errors', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
});

after(async () => {
  if (browser) await browser.close().catch(() => {});
  const problems = [];
  for (const instance of instances) {
    const { exit, hung } = await stop(instance, (DRAIN_SECS + 8) * 1000);
    if (hung || exit.code !== 0) problems.push(`${instance.name} stopped with ${JSON.stringify(exit)}${hung ? ' after SIGKILL' : ''}`);
  }
  if (nginx) await stop(nginx, 5_000);
  try {
    // Leave nothing of ours in the shared Redis.
    const url = new URL(REDIS_URL);
    const cli = ['-h', url.hostname, '-p', url.port || '6379'];
    const keys = execFileSync('redis-cli', [...cli, '--scan', '--pattern', `*${PREFIX}*`]).toString().split('\n').filter(Boolean);
    for (let i = 0; i < keys.length; i += 200) execFileSync('redis-cli', [...cli, 'DEL', ...keys.slice(i, i + 200)]);
  } catch {
    // redis-cli missing: the keys are under a prefix no one else uses
  }
  rmSync(work, { recursive: true, force: true });
  assert.deepEqual(problems, [], 'every instance stops cleanly on SIGTERM');
});

test('through nginx over HTTP/2: join, the live place, READY, order, confirmation', { timeout: 60_000 }, async (t) => {
  await prefill(instances[0], 3);
  // Admission waits until the page is in line, however slow the machine.
  resumeAfter(t);
  await hold(instances[0], true);
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  t.after(() => context.close().catch(() => {}));
  const page = await context.newPage();
  const consoleWatch = watchConsole(page);

  await page.goto(`${origin}/`);
  await waitForState(page, 'waiting', 20_000);
  const protocol = await page.evaluate(() => performance.getEntriesByType('navigation')[0].nextHopProtocol);
  assert.equal(protocol, 'h2', 'the browser speaks HTTP/2 to nginx');

  // Live over the stream through nginx: the place moves while waiting,
  // which it could not if nginx held the events back in a buffer.
  await page.waitForSelector('#conn[data-mode="live"]', { timeout: 10_000 });
  const first = await readPosition(page);
  assert.ok(first >= 2, `waits behind the others (position ${first})`);
  await hold(instances[1], false);
  await page.waitForFunction(
    (p) => document.body.dataset.state === 'waiting' && Number(document.getElementById('position').dataset.position) < p,
    first,
    { timeout: 15_000 },
  );
  const streams = await page.evaluate(() =>
    performance.getEntriesByType('resource').filter((e) => e.name.endsWith('/events')).map((e) => e.nextHopProtocol));
  assert.ok(streams.every((p) => p === 'h2'), `the event stream is HTTP/2 too (${streams})`);
  await screenshot(page, 'deploy-nginx-waiting');

  await waitForState(page, 'ready', 30_000);
  assert.equal(await page.getAttribute('#conn', 'data-mode'), 'live', 'still live at READY');
  const orderId = await orderFirstProduct(page);
  await screenshot(page, 'deploy-nginx-confirmed');

  // nginx (a trusted proxy) said https: the visitor cookie is Secure and
  // carries the __Host- prefix.
  const visitor = await pageVisitor(page);
  const cookie = (await context.cookies()).find((c) => c.name === '__Host-waitroom_visitor');
  assert.ok(cookie, `a __Host- visitor cookie: ${(await context.cookies()).map((c) => c.name)}`);
  assert.equal(cookie.secure, true, 'the visitor cookie is Secure behind TLS');
  // The order is there for its buyer, through nginx.
  const session = connectH2();
  try {
    const mine = await h2(session, 'GET', `/api/orders/${encodeURIComponent(orderId)}`, { cookie: visitor.cookie });
    assert.equal(mine.status, 200, mine.body);
    assert.equal(JSON.parse(mine.body).userId, visitor.id);
  } finally {
    session.close();
  }

  // nginx spread the page's requests over both instances.
  const upstreams = new Set(
    readFileSync(path.join(work, 'access.log'), 'utf8').split('\n').flatMap((l) => l.match(/upstream=(127\.0\.0\.1:\d+)/)?.[1] ?? []),
  );
  assert.deepEqual([...upstreams].sort(), instances.map((i) => `127.0.0.1:${i.port}`).sort(), 'both instances served');
  assertNoConsoleErrors(consoleWatch);
});

test('metrics, the admin API and the token API are not reachable through nginx', { timeout: 30_000 }, async () => {
  const bearer = { authorization: `Bearer ${ADMIN_TOKEN}` };
  // The same requests at an instance's operator listener succeed (and its
  // public port does not serve them either): the refusals below are nginx's.
  assert.equal((await fetch(`${instances[0].admin}/api/admin/queues`, { headers: bearer })).status, 200);
  assert.equal((await fetch(`${instances[0].admin}/metrics`)).status, 200);
  assert.equal((await fetch(`${instances[0].base}/metrics`)).status, 404);
  const claimDirect = await fetch(`${instances[0].admin}/api/tokens/claim`, {
    method: 'POST',
    headers: { authorization: `Bearer ${SERVICE_TOKEN}`, 'content-type': 'application/json' },
    body: '{"userId":"u","token":"x"}',
  });
  assert.equal(claimDirect.status, 401, 'the token API answers an unknown token 401 when reached');

  const session = connectH2();
  try {
    const refused = [
      ['GET', '/metrics'], ['GET', '/metrics/'], ['GET', '/metrics?format=prometheus'], ['GET', '/%6Detrics'],
      ['GET', '/api/admin/queues'], ['GET', '/api//admin/queues'], ['GET', '/api/%61dmin/queues'],
      ['GET', '/api/queues/../admin/queues'], ['POST', '/api/admin/queues/default/pause'],
      ['PUT', '/api/admin/products/demo-sneaker'], ['POST', '/api/tokens/claim'], ['POST', '/api/tokens/consume'],
      ['POST', '/api//tokens/release'],
    ];
    for (const [method, p] of refused) {
      const res = await h2(session, method, p, { ...bearer, 'content-type': 'application/json' }, method === 'GET' ? undefined : '{}');
      assert.ok(res.status === 404 || res.status === 403, `${method} ${p} through nginx: ${res.status} ${res.body.slice(0, 200)}`);
      assert.doesNotMatch(res.body, /waitroom_|"error"/, `${method} ${p}: the answer is nginx's, not waitroom's`);
    }
    // What buyers need still goes through.
    for (const p of ['/healthz', '/readyz', '/api/products', '/api/openapi.json', '/']) {
      assert.equal((await h2(session, 'GET', p)).status, 200, `GET ${p} through nginx`);
    }
  } finally {
    session.close();
  }
  // Over HTTP/1.1 with a path a client wrote by hand, the same.
  const raw = await rawHttps(nginx.httpsPort,
    `GET /api/./admin/queues HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer ${ADMIN_TOKEN}\r\nConnection: close\r\n\r\n`);
  assert.equal(raw.status, 404, raw.head);

  // Plain HTTP only redirects to HTTPS, and only for the site's own name:
  // nothing is served without TLS, and no other name is sent anywhere.
  const plain = await rawHttpDirect(nginx.httpPort, `GET /api/products HTTP/1.1\r\nHost: ${SITE_NAME}\r\nConnection: close\r\n\r\n`);
  assert.match(plain, /^HTTP\/1\.1 301 /, plain.slice(0, 200));
  assert.match(plain, new RegExp(`\r\nLocation: https://${SITE_NAME.replaceAll('.', '\\.')}/api/products\r\n`, 'i'));
  for (const host of ['localhost', 'attacker.example', `${SITE_NAME}.attacker.example`, '127.0.0.1']) {
    const other = await rawHttpDirect(nginx.httpPort, `GET /api/products HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`);
    assert.equal(other, '', `Host: ${host} on port 80 is closed unanswered (444), not redirected: ${other.slice(0, 200)}`);
  }
  const noHost = await rawHttpDirect(nginx.httpPort, 'GET /api/products HTTP/1.0\r\n\r\n');
  assert.equal(noHost, '', `no Host on port 80: ${noHost.slice(0, 200)}`);
});

test('every HTTPS answer carries HSTS, nginx\'s own included', { timeout: 30_000 }, async () => {
  const session = connectH2();
  try {
    // waitroom's answers (a page, the API, an error) and nginx's own (a
    // refused operator path).
    for (const [p, status] of [['/', 200], ['/api/products', 200], ['/healthz', 200], ['/api/nope', 404], ['/metrics', 404]]) {
      const res = await h2(session, 'GET', p);
      assert.equal(res.status, status, `${p}: ${res.body.slice(0, 200)}`);
      assert.equal(res.headers['strict-transport-security'], HSTS, `${p}`);
    }
  } finally {
    session.close();
  }
  const raw = await rawHttps(nginx.httpsPort, 'GET /api/products HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n');
  assert.match(raw.head, new RegExp(`\r\nStrict-Transport-Security: ${HSTS}(\r\n|$)`, 'i'), raw.head);
});

test('nginx sets the forwarding headers, strips X-User-Id and keeps tickets out of its log', { timeout: 30_000 }, async () => {
  // A client claiming plain HTTP over TLS still gets Secure cookies: nginx
  // replaces X-Forwarded-Proto. Straight at an instance (no proxy), not Secure.
  const direct = await fetch(`${instances[0].base}/api/queues/default/entries`, { method: 'POST' });
  assert.equal(direct.status, 201);
  assert.doesNotMatch(direct.headers.getSetCookie().join('\n'), /Secure/i, 'no Secure over plain HTTP');

  const session = connectH2();
  try {
    const joined = await h2(session, 'POST', '/api/queues/default/entries', { 'x-forwarded-proto': 'http' });
    assert.equal(joined.status, 201, joined.body);
    const cookies = [].concat(joined.headers['set-cookie'] ?? []);
    assert.ok(cookies.length >= 2, `a visitor and a ticket cookie (${cookies})`);
    for (const c of cookies) assert.match(c, /;\s*Secure/i, `Secure behind nginx: ${c}`);

    // X-User-Id never reaches an instance: waitroom refuses a repeated one
    // in every mode (400 duplicate_header), so it would show.
    const dupDirect = await rawHttpDirect(instances[0].port,
      'GET /api/products HTTP/1.1\r\nHost: x\r\nX-User-Id: alice\r\nX-User-Id: mallory\r\nConnection: close\r\n\r\n');
    assert.match(dupDirect, /^HTTP\/1\.1 400/, 'an instance refuses a repeated X-User-Id');
    const dupH2 = await h2(session, 'GET', '/api/products', { 'x-user-id': ['alice', 'mallory'] });
    assert.equal(dupH2.status, 200, `nginx removed X-User-Id (HTTP/2): ${dupH2.body}`);
    const dupH1 = await rawHttps(nginx.httpsPort,
      'GET /api/products HTTP/1.1\r\nHost: localhost\r\nX-User-Id: alice\r\nX-User-Id: mallory\r\nConnection: close\r\n\r\n');
    assert.equal(dupH1.status, 200, `nginx removed X-User-Id (HTTP/1.1): ${dupH1.body}`);

    // A ticket sent in the query string is not written to nginx's log (and
    // waitroom ignores it unless --ticket-in-query: without the ticket
    // cookie the poll is 401, with it 200).
    const { ticket } = JSON.parse(joined.body);
    assert.ok(ticket && ticket.length > 20);
    const visitorOnly = cookies.map((c) => c.split(';')[0]).filter((c) => /^(__Host-)?waitroom_visitor=/.test(c));
    assert.equal(visitorOnly.length, 1, `a visitor cookie: ${cookies}`);
    const queryOnly = await h2(session, 'GET', `/api/queues/default/position?ticket=${encodeURIComponent(ticket)}`, {
      cookie: visitorOnly.join('; '),
    });
    assert.equal(queryOnly.status, 401, `a ticket in the query is ignored: ${queryOnly.body}`);
    const polled = await h2(session, 'GET', `/api/queues/default/position?ticket=${encodeURIComponent(ticket)}`, {
      cookie: cookies.map((c) => c.split(';')[0]).join('; '),
    });
    assert.equal(polled.status, 200, polled.body);
  } finally {
    session.close();
  }
  await waitUntil('the poll is in the access log', () =>
    /GET \/api\/queues\/default\/position HTTP\/2\.0" 200/.test(readFileSync(path.join(work, 'access.log'), 'utf8')));
  const logged = readFileSync(path.join(work, 'access.log'), 'utf8');
  assert.doesNotMatch(logged, /ticket=/, 'no query string in the access log');
});

test('SIGTERM of the instance holding the stream mid-wait: the buyer reaches READY and orders through the other', { timeout: 90_000 }, async (t) => {
  await prefill(instances[0], 3);
  resumeAfter(t);
  await hold(instances[0], true);
  const context = await browser.newContext({ viewport: { width: 390, height: 844 }, colorScheme: 'dark' });
  t.after(() => context.close().catch(() => {}));
  const page = await context.newPage();
  // The stream cut by the stopping instance is the only error expected.
  const consoleWatch = watchConsole(page, { allow: ({ url }) => /\/api\/queues\/[^/]+\/events/.test(url) });
  const streamOpens = [];
  page.on('request', (req) => {
    if (/\/api\/queues\/[^/]+\/events$/.test(new URL(req.url()).pathname)) streamOpens.push(Date.now());
  });

  const openBefore = await Promise.all(instances.map((i) => metric(i, 'waitroom_streams_open')));
  await page.goto(`${origin}/`);
  await waitForState(page, 'waiting', 20_000);
  await page.waitForSelector('#conn[data-mode="live"]', { timeout: 10_000 });

  // The instance that holds the page's stream: the one with one stream more.
  let holder;
  await waitUntil('one instance holds the stream', async () => {
    const open = await Promise.all(instances.map((i) => metric(i, 'waitroom_streams_open')));
    holder = instances.find((_, n) => open[n] === openBefore[n] + 1);
    return holder;
  });
  const survivor = instances.find((i) => i !== holder);
  const survivorOpen = openBefore[instances.indexOf(survivor)];
  assert.equal(await page.getAttribute('body', 'data-state'), 'waiting', 'still waiting when the instance stops');
  const opensBefore = streamOpens.length;
  const stopped = Date.now();
  const { exit, hung } = await stop(holder, (DRAIN_SECS + 8) * 1000);
  assert.equal(hung, false, `${holder.name} exits on SIGTERM\n${holder.tail()}`);
  assert.equal(exit.code, 0, `${holder.name} exits 0\n${holder.tail()}`);
  assert.ok(Date.now() - stopped <= (DRAIN_SECS + 5) * 1000, 'within --drain-secs + 5 s');

  // The browser reconnects through nginx, which sends it to the survivor.
  await waitUntil('the page opens its stream again', () => streamOpens.length > opensBefore, { timeoutMs: 15_000 });
  await waitUntil('the survivor holds the stream', async () => (await metric(survivor, 'waitroom_streams_open')) > survivorOpen, {
    timeoutMs: 15_000,
  });
  await page.waitForSelector('#conn[data-mode="live"]', { timeout: 10_000 });
  assert.equal(await page.getAttribute('body', 'data-state'), 'waiting', 'the place survived the move');
  // Admission goes on through the instance left.
  await hold(survivor, false);
  await waitForState(page, 'ready', 30_000);
  await screenshot(page, 'deploy-nginx-phone-dark-ready-after-sigterm');
  const orderId = await orderFirstProduct(page);
  const visitor = await pageVisitor(page);
  const res = await fetch(`${survivor.base}/api/orders/${encodeURIComponent(orderId)}`, { headers: { cookie: visitor.cookie } });
  assert.equal(res.status, 200, 'the order is recorded');
  assertNoConsoleErrors(consoleWatch);
});

test('a flood of joins from one address is answered 429 by nginx, which waitroom never sees', { timeout: 30_000 }, async () => {
  const alive = instances.filter((i) => !i.exit);
  const sum = async (name) => (await Promise.all(alive.map((i) => metric(i, name)))).reduce((a, b) => a + b, 0);
  const entersBefore = await sum('waitroom_enters_total');
  const limitedBefore = await sum('waitroom_rate_limited_total');

  const flood = 60;
  const session = connectH2();
  let answers;
  try {
    answers = await Promise.all(Array.from({ length: flood }, () => h2(session, 'POST', '/api/queues/default/entries')));
  } finally {
    session.close();
  }
  const statuses = answers.map((a) => a.status);
  const limited = answers.filter((a) => a.status === 429);
  const joined = answers.filter((a) => a.status === 201);
  assert.equal(limited.length + joined.length, flood, `only 201 and 429: ${statuses}`);
  assert.ok(joined.length >= 1 && joined.length <= JOIN_BURST + 3, `at most the burst gets through (${joined.length} joined)`);
  for (const a of limited) {
    assert.equal(a.headers['retry-after'], '1');
    assert.equal(a.headers['strict-transport-security'], HSTS, 'nginx\'s own 429 too');
    assert.equal(JSON.parse(a.body).error, 'rate_limited', 'the page reads it as waitroom\'s own 429');
  }
  // waitroom counted exactly the joins that reached it, and refused none.
  assert.equal((await sum('waitroom_enters_total')) - entersBefore, joined.length);
  assert.equal((await sum('waitroom_rate_limited_total')) - limitedBefore, 0);
});
