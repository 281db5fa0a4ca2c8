// waitroom in front of an unchanged shop (tests/front/origin.mjs) through a
// real gateway, driven by real Chromium: nginx `auth_request`
// (deploy/nginx-auth-request.conf) and Caddy 2 `forward_auth`
// (deploy/Caddyfile), each used as committed with only its ports replaced.
//
// The story, for each gateway: a visitor asks for /product/42?size=9, is
// sent to the waiting page, is admitted, lands back on /product/42?size=9,
// browses several pages; a second visitor waits meanwhile (maxActive 1);
// the first goes idle, the slot is freed, the second gets in at the page
// they asked for, and the first's next request goes to the waiting page.
// The shop's own log proves that every request it received carried a
// pass, and that none came from the visitor whose session had ended.
//
// Run by tests/front/gateway.sh (bounded).

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const BROWSER_DIR = path.join(ROOT, 'tests/browser');
const { chromium } = createRequire(path.join(BROWSER_DIR, 'package.json'))('playwright-core');
const BIN = process.env.WAITROOM_BIN || path.join(ROOT, 'target/debug/waitroom');
const NGINX = process.env.NGINX_PATH || '/usr/sbin/nginx';
const CADDY = process.env.CADDY_PATH || '/usr/bin/caddy';
const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
const IDLE_SECS = 3;

const work = mkdtempSync(path.join(os.tmpdir(), 'waitroom-gateway-'));
chmodSync(work, 0o755);
const children = new Set();
process.on('exit', () => {
  for (const child of children) child.kill('SIGKILL');
});
let browser;

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

function run(name, file, args, env = {}) {
  const clean = { ...process.env, ...env };
  for (const key of Object.keys(clean)) {
    if (key.startsWith('WAITROOM_') || key === 'REDIS_URL') delete clean[key];
  }
  const child = spawn(file, args, { env: clean, stdio: ['ignore', 'pipe', 'pipe'] });
  children.add(child);
  const log = [];
  const keep = (chunk) => {
    for (const line of chunk.toString().split('\n')) if (line) log.push(line);
    while (log.length > 200) log.shift();
  };
  child.stdout.on('data', keep);
  child.stderr.on('data', keep);
  child.on('exit', () => children.delete(child));
  return { name, child, log };
}

async function waitFor(url, what, ms = 20_000) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    try {
      const r = await fetch(url);
      if (r.status < 500) return;
    } catch {}
    await sleep(100);
  }
  throw new Error(`${what} did not answer at ${url}`);
}

/** The shop and waitroom behind it; the gateway is started per test. */
async function backends() {
  const originPort = await freePort();
  const waitroomPort = await freePort();
  const gatePort = await freePort();
  const originLog = path.join(work, `origin-${originPort}.jsonl`);
  const origin = run('origin', process.execPath, [
    path.join(ROOT, 'tests/front/origin.mjs'), '--port', String(originPort), '--log', originLog,
  ]);
  const waitroom = run('waitroom', BIN, [
    '--addr', `127.0.0.1:${waitroomPort}`,
    '--admin-addr', `127.0.0.1:${await freePort()}`,
    '--gate-addr', `127.0.0.1:${gatePort}`,
    '--base-path', '/waitroom',
    '--trusted-proxies', '127.0.0.1/32',
    '--cookie-secure', 'never',
    '--orders', 'off',
    '--max-active', '1',
    '--admission-interval-ms', '200',
    '--admission-batch', '1',
    '--session-idle-secs', String(IDLE_SECS),
    '--session-max-secs', '120',
  ]);
  await waitFor(`http://127.0.0.1:${originPort}/__origin/stats`, 'the shop');
  await waitFor(`http://127.0.0.1:${waitroomPort}/healthz`, 'waitroom');
  return { originPort, waitroomPort, gatePort, originLog, stop: () => { origin.child.kill(); waitroom.child.kill(); } };
}

/** The committed file with its addresses replaced. */
function siteConfig(file, { gatewayPort, originPort, waitroomPort, gatePort }) {
  const text = readFileSync(path.join(ROOT, file), 'utf8')
    .replaceAll('127.0.0.1:8080', `127.0.0.1:${waitroomPort}`)
    .replaceAll('127.0.0.1:8081', `127.0.0.1:${gatePort}`)
    .replaceAll('127.0.0.1:3000', `127.0.0.1:${originPort}`);
  if (file.endsWith('Caddyfile')) return text.replace('http://:80', `http://127.0.0.1:${gatewayPort}`);
  return text.replace('listen 80;', `listen 127.0.0.1:${gatewayPort};`);
}

async function startNginx(ports) {
  const dir = path.join(work, `nginx-${ports.gatewayPort}`);
  mkdirSync(path.join(dir, 'tmp'), { recursive: true, mode: 0o777 });
  chmodSync(path.join(dir, 'tmp'), 0o777);
  writeFileSync(path.join(dir, 'site.conf'), siteConfig('deploy/nginx-auth-request.conf', ports));
  writeFileSync(path.join(dir, 'nginx.conf'), `
daemon off;
worker_processes 1;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log warn;
events { worker_connections 256; }
http {
  access_log off;
  client_body_temp_path ${dir}/tmp/body;
  proxy_temp_path ${dir}/tmp/proxy;
  fastcgi_temp_path ${dir}/tmp/fastcgi;
  uwsgi_temp_path ${dir}/tmp/uwsgi;
  scgi_temp_path ${dir}/tmp/scgi;
  include ${dir}/site.conf;
}
`);
  const nginx = run('nginx', NGINX, ['-c', path.join(dir, 'nginx.conf'), '-p', dir]);
  await waitFor(`http://127.0.0.1:${ports.gatewayPort}/waitroom/healthz`, 'nginx');
  return () => nginx.child.kill();
}

async function startCaddy(ports) {
  const dir = path.join(work, `caddy-${ports.gatewayPort}`);
  mkdirSync(dir, { recursive: true });
  const file = path.join(dir, 'Caddyfile');
  writeFileSync(file, siteConfig('deploy/Caddyfile', ports));
  const caddy = run('caddy', CADDY, ['run', '--config', file, '--adapter', 'caddyfile'], {
    HOME: dir, XDG_DATA_HOME: dir, XDG_CONFIG_HOME: dir,
  });
  await waitFor(`http://127.0.0.1:${ports.gatewayPort}/waitroom/healthz`, 'caddy');
  return () => caddy.child.kill();
}

function originRequests(file) {
  let text = '';
  try { text = readFileSync(file, 'utf8'); } catch {}
  return text.split('\n').filter(Boolean).map((line) => JSON.parse(line));
}

async function story(t, startGateway) {
  const b = await backends();
  const ports = { ...b, gatewayPort: await freePort() };
  const stopGateway = await startGateway(ports);
  const site = `http://127.0.0.1:${ports.gatewayPort}`;
  try {
    const alice = await (await browser.newContext()).newPage();
    const bob = await (await browser.newContext()).newPage();

    // Alice asks for a product page: the waiting page, then back where she asked.
    await alice.goto(`${site}/product/42?size=9`);
    await alice.waitForURL(`${site}/product/42?size=9`, { timeout: 20_000 });
    assert.match(await alice.content(), /42/);
    const firstLog = originRequests(b.originLog);
    assert.ok(firstLog.some((r) => r.path === '/product/42?size=9'), JSON.stringify(firstLog));

    // Bob asks meanwhile: the room is full (maxActive 1), he waits.
    await bob.goto(`${site}/product/1`);
    await bob.waitForURL(/\/waitroom\/\?queue=default&return=/, { timeout: 10_000 });
    assert.equal(new URL(bob.url()).searchParams.get('return'), '/product/1');

    // Alice browses for longer than the idle time: Bob still waits.
    for (const id of [7, 8, 9, 10, 11]) {
      await alice.goto(`${site}/product/${id}`);
      assert.equal(alice.url(), `${site}/product/${id}`);
      await sleep(1000);
    }
    assert.match(bob.url(), /\/waitroom\//, 'Bob let in while Alice browses');

    // Alice goes idle: her slot goes to Bob, who lands on his page.
    await bob.waitForURL(`${site}/product/1`, { timeout: (IDLE_SECS + 15) * 1000 });
    // Alice's next request: her session ended, back to the waiting page.
    await sleep(1500);
    await alice.goto(`${site}/product/99`);
    assert.match(alice.url(), /\/waitroom\/\?queue=default&return=%2Fproduct%2F99/);

    // The shop's log: every request carried a pass; nothing of Alice's
    // after her session ended.
    const log = originRequests(b.originLog);
    assert.ok(log.length >= 7, `the shop saw ${log.length} requests`);
    for (const r of log) {
      assert.ok((r.cookies ?? []).includes('waitroom_pass'), `a request without a pass reached the shop: ${JSON.stringify(r)}`);
    }
    assert.ok(!log.some((r) => r.path === '/product/99'), 'an ended session reached the shop');
    assert.equal(log.filter((r) => r.path === '/product/1').length, 1);
  } finally {
    stopGateway();
    b.stop();
  }
}

before(async () => {
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run'],
  });
});

after(async () => {
  await browser?.close();
  rmSync(work, { force: true, recursive: true });
});

test('nginx auth_request in front of an unchanged shop', async (t) => {
  await story(t, startNginx);
});

test('Caddy forward_auth in front of an unchanged shop', async (t) => {
  await story(t, startCaddy);
});
