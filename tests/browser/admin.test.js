// The operator console at /admin on the operator listener: the token typed
// once (kept in sessionStorage, never in a URL), the live feed, the charts,
// and every control, each checked against what the admin API then reports.
// Screenshots of the console in light and dark go to screenshots/.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { assertAccessible } from './lib/axe.js';
import { assertNoConsoleErrors, prefill, screenshot, setup, watchConsole } from './lib/harness.js';

const TOKEN = 'console-browser-test-admin-token-0123';

/** The admin API as the test sees it (not through the page). */
async function adminGet(server, path) {
  const res = await fetch(`${server.admin}${path}`, { headers: { Authorization: `Bearer ${TOKEN}` } });
  const body = await res.json();
  return { status: res.status, body };
}

/** Polls `check` until it returns truthy (the feed ticks once a second). */
async function until(what, check, timeout = 15_000) {
  const deadline = Date.now() + timeout;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(150);
  }
}

test('every console control changes what the admin API reports', { timeout: 150_000 }, async (t) => {
  const { server, browser } = await setup(t, { serverArgs: ['--admin-token', TOKEN] });
  await prefill(server.base, 40);

  const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, colorScheme: 'light' });
  const page = await context.newPage();
  // The two errors provoked on purpose: the browser logs the 401 of the
  // wrong token typed first, and the 400 of a refused batch.
  const watcher = watchConsole(page, {
    allow: (e) =>
      (/ 401 /.test(e.text) && e.url.endsWith('/api/admin/queues')) ||
      (/ 400 /.test(e.text) && e.url.endsWith('/api/admin/queues/default')),
  });
  const urls = [];
  page.on('request', (r) => urls.push(r.url()));

  await page.goto(`${server.admin}/admin`);
  await page.fill('#token', 'not-the-token');
  await page.click('#sign-in button[type="submit"]');
  await page.waitForSelector('#sign-in-error:has-text("refused")');
  assert.equal(await page.evaluate(() => sessionStorage.getItem('waitroom.adminToken')), null);

  await page.fill('#token', TOKEN);
  await page.click('#sign-in button[type="submit"]');
  await page.waitForSelector('#link[data-link="live"]', { timeout: 10_000 });
  const card = '.queue[data-queue="default"]';
  await page.waitForSelector(card);

  // The tiles show what the API says.
  const { body: before } = await adminGet(server, '/api/admin/queues');
  const waiting = before.queues.find((q) => q.queue === 'default').waiting;
  assert.ok(waiting >= 3, `buyers wait: ${waiting}`);
  await until('the waiting tile', async () => {
    const shown = await page.textContent(`${card} [data-k="waiting"]`);
    const { body } = await adminGet(server, '/api/admin/queues/default');
    const stats = (await adminGet(server, '/api/admin/queues')).body.queues.find((q) => q.queue === 'default');
    return body && Number(shown.replace(/\D/g, '')) === stats.waiting;
  });

  // Hold, then resume.
  await page.click(`${card} .hold`);
  await until('held', async () => (await adminGet(server, '/api/admin/queues/default')).body.paused === true);
  await page.waitForSelector(`${card}[data-paused="true"]`, { timeout: 5_000 });
  await page.click(`${card} .hold`);
  await until('resumed', async () => (await adminGet(server, '/api/admin/queues/default')).body.paused === false);
  await page.waitForSelector(`${card}[data-paused="false"]`, { timeout: 5_000 });

  // Rate and batch, maxActive.
  await page.fill(`${card} input[name="batch"]`, '4');
  await page.fill(`${card} input[name="intervalMs"]`, '500');
  await page.fill(`${card} input[name="maxActive"]`, '9');
  await page.click(`${card} form.settings button`);
  await until('the new settings', async () => {
    const { body } = await adminGet(server, '/api/admin/queues/default');
    return body.batch === 4 && body.intervalMs === 500 && body.maxActive === 9;
  });
  // Emptied, maxActive is unlimited again.
  await page.fill(`${card} input[name="maxActive"]`, '');
  await page.click(`${card} form.settings button`);
  await until('unlimited', async () => (await adminGet(server, '/api/admin/queues/default')).body.maxActive === null);
  // Refused input says why and changes nothing.
  await page.fill(`${card} input[name="batch"]`, '0');
  await page.evaluate((sel) => document.querySelector(sel).setAttribute('novalidate', ''), `${card} form.settings`);
  await page.click(`${card} form.settings button`);
  await page.waitForSelector('#notice:has-text("batch: 1-100000")');
  assert.equal((await adminGet(server, '/api/admin/queues/default')).body.batch, 4);

  // Restock the demo product.
  await page.waitForSelector('#product option', { state: 'attached' });
  await page.fill('#restock input[name="stock"]', '77');
  await page.click('#restock button');
  await until('restocked', async () => {
    const { body } = await adminGet(server, '/api/admin/products');
    return body.some((p) => p.stock === 77);
  });

  // Open a new queue, held: buyers can join it at once.
  await page.fill('#open-queue input[name="queue"]', 'popup');
  await page.fill('#open-queue input[name="batch"]', '3');
  await page.fill('#open-queue input[name="intervalMs"]', '800');
  await page.click('#open-queue button');
  await until('the new queue', async () => {
    const { status, body } = await adminGet(server, '/api/admin/queues/popup');
    return status === 200 && body.batch === 3 && body.intervalMs === 800 && body.paused === true;
  });
  await page.waitForSelector('.queue[data-queue="popup"]', { timeout: 5_000 });
  const joined = await fetch(`${server.base}/api/queues/popup/entries`, { method: 'POST' });
  assert.equal(joined.status, 201);

  // The streams report lists this instance.
  await page.waitForSelector('#instances tr:has-text("(this one)")', { timeout: 10_000 });

  // Charts have drawn a few seconds of history.
  await page.waitForSelector(`${card} svg[data-series="waiting"] polyline`, { timeout: 10_000 });
  await screenshot(page, 'admin-console-light');

  // The token stays in the tab (a reload keeps the console), never in a URL.
  await page.reload();
  await page.waitForSelector('#link[data-link="live"]', { timeout: 10_000 });
  assert.ok(urls.every((u) => !u.includes(TOKEN)), 'no URL carries the token');
  assert.equal(await page.evaluate(() => sessionStorage.getItem('waitroom.adminToken')), TOKEN);

  const dark = await browser.newContext({ viewport: { width: 820, height: 1100 }, colorScheme: 'dark' });
  const darkPage = await dark.newPage();
  const darkWatcher = watchConsole(darkPage);
  await darkPage.goto(`${server.admin}/admin`);
  await darkPage.fill('#token', TOKEN);
  await darkPage.click('#sign-in button[type="submit"]');
  await darkPage.waitForSelector('.queue[data-queue="popup"]', { timeout: 10_000 });
  await sleep(2_500);
  await screenshot(darkPage, 'admin-console-dark');

  await page.click('#sign-out');
  await page.waitForSelector('body[data-state="signed-out"]');
  assert.equal(await page.evaluate(() => sessionStorage.getItem('waitroom.adminToken')), null);
  assertNoConsoleErrors(watcher, darkWatcher);
  assert.equal(watcher.excused.length, 2, 'one 401 (wrong token), one 400 (refused batch)');
});

test('the console is not served on the public port', { timeout: 60_000 }, async (t) => {
  const { server } = await setup(t, { serverArgs: ['--admin-token', TOKEN] });
  for (const path of ['/admin', '/admin/', '/admin/admin.js', '/admin/index.html', '/api/admin/events']) {
    const res = await fetch(`${server.base}${path}`);
    assert.equal(res.status, 404, path);
  }
  const res = await fetch(`${server.admin}/admin`);
  assert.equal(res.status, 200);
});

/** A `datetime-local` value, in this machine's time zone, `ms` since the epoch. */
function localInput(ms) {
  const d = new Date(ms);
  const two = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${two(d.getMonth() + 1)}-${two(d.getDate())}T${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}`;
}

test('the console says why nobody is let in, reads the audit log and schedules a lottery', { timeout: 120_000 }, async (t) => {
  const { server, browser } = await setup(t, { serverArgs: ['--admin-token', TOKEN, '--admission-interval-ms', '600000'] });
  // One buyer on the fast track (the budget holds one), two waiting.
  await prefill(server.base, 3);
  const put = (path, body) =>
    fetch(`${server.admin}${path}`, {
      method: 'PUT',
      headers: { Authorization: `Bearer ${TOKEN}`, 'Content-Type': 'application/json' },
      body: JSON.stringify(body),
    });
  // One unit left, held by the one token holder: nobody more can be let in.
  assert.equal((await put('/api/admin/queues/default/stock', { remaining: 1 })).status, 200);

  const context = await browser.newContext({ viewport: { width: 1280, height: 1000 }, colorScheme: 'light' });
  const page = await context.newPage();
  const watcher = watchConsole(page);
  await page.goto(`${server.admin}/admin`);
  await page.fill('#token', TOKEN);
  await page.click('#sign-in button[type="submit"]');
  const card = '.queue[data-queue="default"]';
  await page.waitForSelector(`${card}[data-state="stockBlocked"]`, { timeout: 10_000 });
  assert.match(await page.textContent(`${card} .badge`), /stock blocks admission/);
  const why = await page.textContent(`${card} .why`);
  assert.match(why, /Nobody is let in: 1 unit left, enough for 1 buyer at 1 each, and 1 token holder/, why);
  assert.match(await page.textContent(`${card} [data-k="stock"]`), /^1 unit$/);
  assert.equal(await page.textContent(`${card} [data-k="wait"]`), '–', 'no wait while nobody can be let in');
  // The fast track counts as an admission, and says so.
  assert.match(await page.textContent(`${card} [data-k="split"]`), /pass 0 · fast track 1/);

  // The audit log, as the API has it: the admission had no pass.
  await page.selectOption('#audit-form select[name="kind"]', 'admitted');
  await page.click('#audit-form button[type="submit"]');
  await page.waitForSelector('#audit-rows tr[data-kind="admitted"]', { timeout: 5_000 });
  const rows = await page.$$eval('#audit-rows tr', (trs) => trs.map((tr) => [...tr.cells].map((c) => c.textContent)));
  const { body: audit } = await adminGet(server, '/api/admin/queues/default/audit?kind=admitted');
  assert.equal(rows.length, audit.entries.length);
  assert.deepEqual(
    rows.map((r) => r[4]),
    audit.entries.map((e) => (e.pass === null ? 'fast track' : String(e.pass))),
  );

  // A lottery scheduled from the console; its pre-queue shows, with how many wait in it.
  const opensAt = Math.floor((Date.now() + 3_600_000) / 1000) * 1000;
  await page.fill(`${card} form.lottery input[name="opensAt"]`, localInput(opensAt));
  await page.click(`${card} form.lottery button[type="submit"]`);
  await until('the lottery', async () => {
    const res = await fetch(`${server.base}/api/queues/default/lottery`);
    return res.status === 200 && (await res.json()).opensAt === opensAt;
  });
  await prefill(server.base, 2, 'pre');
  await page.waitForSelector(`${card}[data-state="preQueue"]`, { timeout: 10_000 });
  await page.waitForFunction(
    (sel) => document.querySelector(sel)?.textContent === '2',
    `${card} [data-k="preQueue"]`,
    { timeout: 10_000 },
  );
  assert.match(await page.textContent(`${card} .why`), /2 buyers in its pre-queue/);
  await assertAccessible(page, 'the console (light)');
  await screenshot(page, 'admin-console-why-light');

  const dark = await browser.newContext({ viewport: { width: 820, height: 1100 }, colorScheme: 'dark' });
  const darkPage = await dark.newPage();
  const darkWatcher = watchConsole(darkPage);
  await darkPage.goto(`${server.admin}/admin`);
  await darkPage.fill('#token', TOKEN);
  await darkPage.click('#sign-in button[type="submit"]');
  await darkPage.waitForSelector(`${card}[data-state="preQueue"]`, { timeout: 10_000 });
  await darkPage.waitForSelector(`${card} svg[data-series="waiting"] polyline`, { state: 'attached', timeout: 10_000 });
  await assertAccessible(darkPage, 'the console (dark)');

  // Cleared from the console: the pre-queue is not empty, so it is refused and said so.
  await page.click(`${card} .clear-lottery`);
  await page.waitForSelector('#notice:has-text("pre-queue")');
  assertNoConsoleErrors(
    { problems: watcher.problems.filter((p) => !/ 409 /.test(p)), excused: [] },
    darkWatcher,
  );
});
