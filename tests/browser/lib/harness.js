// Shared plumbing for the browser tests: run a real waitroom server on a
// free loopback port, drive Debian's Chromium with playwright-core, and fail
// on console errors.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

export const BROWSER_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
export const SCREENSHOT_DIR = path.join(BROWSER_DIR, 'screenshots');

const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
const CHROMIUM_ARGS = [
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--no-first-run',
];
const HEALTH_TIMEOUT_MS = 20_000;
const STOP_TIMEOUT_MS = 8_000;

/** The server binary: $WAITROOM_BIN, else the debug build of this repo. */
export function serverBinary() {
  if (process.env.WAITROOM_BIN) return path.resolve(process.env.WAITROOM_BIN);
  return path.resolve(BROWSER_DIR, '../../target/debug/waitroom');
}

// Servers still running when this test process ends are killed with it.
const running = new Set();
process.on('exit', () => {
  for (const child of running) child.kill('SIGKILL');
});

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

/**
 * Start waitroom with the in-memory store on a free port and wait for
 * /healthz. Admission is slow (one buyer per 700 ms) so the page has to wait.
 */
export async function startServer({ args = [] } = {}) {
  for (let attempt = 1; ; attempt += 1) {
    try {
      return await startOnce(args);
    } catch (err) {
      // The port we picked can be taken between probing and binding.
      if (attempt >= 3 || !err.portTaken) throw err;
    }
  }
}

async function startOnce(extraArgs) {
  const port = await freePort();
  // The operator listener (metrics, admin API) on a port of its own.
  const adminPort = await freePort();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'waitroom-browser-'));
  const env = { ...process.env };
  for (const name of Object.keys(env)) {
    if (name.startsWith('WAITROOM_') || name === 'REDIS_URL') delete env[name];
  }
  const args = [
    '--addr', `127.0.0.1:${port}`,
    '--admin-addr', `127.0.0.1:${adminPort}`,
    '--admission-interval-ms', '700',
    '--admission-batch', '1',
    '--orders-db', path.join(dir, 'orders.db'),
    ...extraArgs,
  ];
  const child = spawn(serverBinary(), args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
  running.add(child);
  const log = [];
  const keep = (chunk) => {
    for (const line of chunk.toString().split('\n')) {
      if (!line) continue;
      log.push(line);
      if (log.length > 400) log.shift();
    }
  };
  child.stdout.on('data', keep);
  child.stderr.on('data', keep);
  let exited = null;
  const exit = new Promise((resolve) => {
    child.on('exit', (code, signal) => {
      exited = { code, signal };
      running.delete(child);
      resolve();
    });
    child.on('error', (error) => {
      exited = { error: error.message };
      running.delete(child);
      resolve();
    });
  });

  const base = `http://127.0.0.1:${port}`;
  // In front of a site (--origin) every path but the reserved prefix is
  // the site's: a probe of /healthz would join the queue as a visitor and,
  // admitted, hold a slot under maxActive until its entry expires.
  const healthPath = extraArgs.includes('--origin') ? '/_waitroom/healthz' : '/healthz';
  const server = {
    base,
    /** The operator listener: /metrics, /api/admin/*, /api/tokens/*. */
    admin: `http://127.0.0.1:${adminPort}`,
    port,
    log,
    async stop() {
      let hung = false;
      const stopping = !exited;
      if (stopping) {
        child.kill('SIGTERM');
        const timer = setTimeout(() => {
          hung = true;
          child.kill('SIGKILL');
        }, STOP_TIMEOUT_MS);
        await exit;
        clearTimeout(timer);
      }
      rmSync(dir, { recursive: true, force: true });
      // A server that does not stop on SIGTERM is a bug, not a detail.
      if (hung) {
        throw new Error(`waitroom did not exit within ${STOP_TIMEOUT_MS} ms of SIGTERM\n${log.slice(-20).join('\n')}`);
      }
      if (stopping && exited && exited.code !== 0) {
        throw new Error(`waitroom exited with code ${exited.code} after SIGTERM\n${log.slice(-20).join('\n')}`);
      }
    },
  };

  const deadline = Date.now() + HEALTH_TIMEOUT_MS;
  for (;;) {
    if (exited) {
      rmSync(dir, { recursive: true, force: true });
      const err = new Error(
        `waitroom (${serverBinary()}) exited before it was healthy: ${JSON.stringify(exited)}\n${log.join('\n')}`,
      );
      err.portTaken = log.some((line) => /address already in use|AddrInUse/i.test(line));
      throw err;
    }
    try {
      const res = await fetch(`${base}${healthPath}`, { signal: AbortSignal.timeout(1_000) });
      if (res.status === 200) return server;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      await server.stop();
      throw new Error(`waitroom did not answer /healthz within ${HEALTH_TIMEOUT_MS} ms\n${log.join('\n')}`);
    }
    await sleep(100);
  }
}

/**
 * Join the queue over plain HTTP, as another buyer would. The servers here
 * run in the default `visitor` identity mode, where `X-User-Id` is ignored
 * and a request without the visitor cookie is a new visitor: every call is
 * another buyer (the header names it for `--identity header` servers).
 */
export async function enterQueue(base, userId, queue = 'default') {
  const res = await fetch(`${base}/api/queues/${queue}/entries`, {
    method: 'POST',
    headers: { 'X-User-Id': userId },
  });
  const body = await res.text();
  assert.ok(res.status === 201 || res.status === 200, `enter ${userId}: ${res.status} ${body}`);
  return JSON.parse(body);
}

/** Put `count` other buyers in line ahead of the page. */
export async function prefill(base, count, prefix = 'ahead') {
  const tag = Math.random().toString(36).slice(2, 8);
  for (let i = 0; i < count; i += 1) await enterQueue(base, `${prefix}-${tag}-${i}`);
}

export function launchBrowser() {
  return chromium.launch({ executablePath: CHROMIUM, headless: true, args: CHROMIUM_ARGS, timeout: 30_000 });
}

/**
 * Collect console errors and uncaught page errors. `allow(entry)` may excuse
 * specific expected ones ({text, url}); everything else fails the test via
 * assertNoConsoleErrors.
 */
export function watchConsole(page, { allow = () => false } = {}) {
  const problems = [];
  const excused = [];
  page.on('console', (msg) => {
    if (msg.type() !== 'error') return;
    const entry = { text: msg.text(), url: msg.location()?.url ?? '' };
    if (allow(entry)) excused.push(entry);
    else problems.push(`console error: ${entry.text}${entry.url ? ` (at ${entry.url})` : ''}`);
  });
  page.on('pageerror', (err) => problems.push(`uncaught page error: ${err.message}`));
  return { problems, excused };
}

export function assertNoConsoleErrors(...watchers) {
  const problems = watchers.flatMap((w) => w.problems);
  assert.deepEqual(problems, [], `the page logged errors:\n${problems.join('\n')}`);
}

/** The page's displayed place in line (1-based), or null. */
export async function readPosition(page) {
  const raw = await page.getAttribute('#position', 'data-position');
  return raw ? Number(raw) : null;
}

export async function waitForState(page, state, timeout = 30_000) {
  await page.waitForSelector(`body[data-state="${state}"]`, { timeout });
}

export async function screenshot(page, name) {
  mkdirSync(SCREENSHOT_DIR, { recursive: true });
  const file = path.join(SCREENSHOT_DIR, `${name}.png`);
  await page.screenshot({ path: file, fullPage: true, animations: 'disabled' });
  return file;
}

/**
 * The visitor the server made for the page's browser (the page itself
 * never sees it: the cookie is HttpOnly): `{ cookie, id }`, where `cookie`
 * is the `name=value` pair to send as that buyer and `id` the user id
 * orders are recorded under.
 */
export async function pageVisitor(page) {
  const cookies = await page.context().cookies();
  // `__Host-waitroom_visitor` when the page was served over HTTPS.
  const visitor = cookies.find((c) => c.name === 'waitroom_visitor' || c.name === '__Host-waitroom_visitor');
  assert.ok(visitor, `the server set a visitor cookie (cookies: ${cookies.map((c) => c.name).join(', ')})`);
  assert.equal(visitor.httpOnly, true, 'the visitor cookie is HttpOnly');
  assert.equal(visitor.sameSite, 'Lax', 'the visitor cookie is SameSite=Lax');
  return { cookie: `${visitor.name}=${visitor.value}`, id: visitor.value.slice(0, visitor.value.lastIndexOf('.')) };
}

/** Place an order from the READY view and return the order id it shows. */
export async function orderFirstProduct(page) {
  await waitForProducts(page);
  await page.waitForSelector('.product input:checked', { state: 'attached', timeout: 5_000 });
  await page.click('#place-order');
  await waitForState(page, 'confirmed', 15_000);
  const orderId = await page.getAttribute('#receipt-id', 'data-order-id');
  assert.ok(orderId, 'the confirmation shows an order id');
  return orderId;
}

/** Wait until the READY view lists products; on failure, say what it shows instead. */
export async function waitForProducts(page, timeout = 10_000) {
  try {
    await page.waitForSelector('.product', { timeout });
  } catch (err) {
    const shown = await page
      .evaluate(() => `state=${document.body.dataset.state} products=${document.getElementById('products').textContent.trim()}`)
      .catch(() => 'page gone');
    err.message += `\n  the page shows: ${shown}`;
    throw err;
  }
}

/** Ask the server for an order as a given visitor (`{ cookie }`, or `null` for none). */
export async function fetchOrder(base, orderId, visitor) {
  const res = await fetch(`${base}/api/orders/${encodeURIComponent(orderId)}`, {
    headers: visitor ? { Cookie: visitor.cookie } : {},
  });
  const text = await res.text();
  let body = null;
  try {
    body = JSON.parse(text);
  } catch {
    body = text;
  }
  return { status: res.status, body };
}

/**
 * A fresh server and browser for one test, torn down after it (the browser
 * first, so the server does not wait on open streams while draining).
 */
export async function setup(t, { serverArgs = [] } = {}) {
  const server = await startServer({ args: serverArgs });
  let browser = null;
  t.after(async () => {
    if (browser) await browser.close().catch(() => {});
    await server.stop();
  });
  browser = await launchBrowser();
  return { server, browser };
}
