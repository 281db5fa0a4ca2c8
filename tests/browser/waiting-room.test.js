// A buyer waits in line, is let in, orders, and sees the confirmation.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { assertAccessible } from './lib/axe.js';
import {
  assertNoConsoleErrors,
  fetchOrder,
  orderFirstProduct,
  pageVisitor,
  prefill,
  readPosition,
  screenshot,
  setup,
  waitForState,
  waitForProducts,
  watchConsole,
} from './lib/harness.js';

test('a buyer waits, sees the line move, is let in, orders and sees the confirmation', { timeout: 90_000 }, async (t) => {
  const { server, browser } = await setup(t);

  // Others are already in line, so the page has to wait.
  await prefill(server.base, 5);

  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  const consoleWatch = watchConsole(page);
  // A live page never polls: every change comes over the stream.
  const polls = [];
  page.on('request', (req) => {
    if (/\/api\/queues\/[^/]+\/position$/.test(new URL(req.url()).pathname)) polls.push(req.url());
  });

  await page.goto(`${server.base}/`);
  await waitForState(page, 'waiting', 10_000);
  const first = await readPosition(page);
  assert.ok(first >= 3, `expected to wait behind others, shown position ${first}`);
  assert.match(await page.textContent('#ahead'), /\d+ (people|person)/);
  assert.match(await page.textContent('#eta'), /minute|moment/i);

  // The stream is live and the position falls while still waiting.
  await page.waitForSelector('#conn[data-mode="live"]', { timeout: 10_000 });
  await page.waitForFunction(
    (p) => document.body.dataset.state === 'waiting' && Number(document.getElementById('position').dataset.position) < p,
    first,
    { timeout: 15_000 },
  );
  const later = await readPosition(page);
  assert.ok(later < first, `position fell from ${first} to ${later}`);
  const progress = Number(await page.getAttribute('#progress', 'aria-valuenow'));
  assert.ok(progress > 0, `the progress bar moved (${progress}%)`);
  await screenshot(page, 'desktop-light-waiting');

  // Its turn: a countdown and the order form.
  await waitForState(page, 'ready', 30_000);
  assert.equal(await page.getAttribute('#conn', 'data-mode'), 'live', 'still live at READY');
  assert.deepEqual(polls, [], 'the page stayed live from joining to READY: no polls');
  assert.match(await page.textContent('#ready-heading'), /your turn/i);
  assert.match(await page.textContent('#countdown-time'), /^\d+:\d{2}$/);
  await waitForProducts(page);
  await page.waitForFunction(() => /your turn/i.test(document.getElementById('announcer').textContent));
  await screenshot(page, 'desktop-light-ready');

  // Three of them, please: the total follows the quantity.
  const single = await page.textContent('#order-total');
  await page.click('#qty-plus');
  await page.click('#qty-plus');
  assert.equal(await page.inputValue('#quantity'), '3');
  assert.notEqual(await page.textContent('#order-total'), single);

  const orderId = await orderFirstProduct(page);
  assert.match(await page.textContent('#confirmed-heading'), /confirmed/i);
  await screenshot(page, 'desktop-light-confirmed');

  // The order really exists, and belongs to this buyer only.
  // The page made up no id: the server's visitor cookie is the buyer.
  assert.equal(await page.evaluate(() => localStorage.getItem('waitroom.userId')), null);
  assert.equal(await page.getAttribute('html', 'data-user-id'), null);
  const visitor = await pageVisitor(page);
  assert.match(visitor.id, /^[A-Za-z0-9_.:-]{1,64}$/);
  const mine = await fetchOrder(server.base, orderId, visitor);
  assert.equal(mine.status, 200, `GET /api/orders/${orderId}: ${JSON.stringify(mine.body)}`);
  assert.equal(mine.body.orderId, orderId);
  assert.equal(mine.body.userId, visitor.id);
  assert.equal(mine.body.quantity, 3);
  const theirs = await fetchOrder(server.base, orderId, null);
  assert.notEqual(theirs.status, 200, 'another visitor must not see the order');
  const forged = await fetchOrder(server.base, orderId, { cookie: `waitroom_visitor=${visitor.id}.forged` });
  assert.notEqual(forged.status, 200, 'nor someone who copies the id without its signature');

  // A reload shows the confirmation again rather than joining anew.
  await page.reload();
  await waitForState(page, 'confirmed', 10_000);
  assert.equal(await page.getAttribute('#receipt-id', 'data-order-id'), orderId);

  assertNoConsoleErrors(consoleWatch);
});

test('a reload keeps the place, and leaving the queue ends it and offers to join again', { timeout: 60_000 }, async (t) => {
  const { server, browser } = await setup(t);

  await prefill(server.base, 12);
  const context = await browser.newContext();
  const page = await context.newPage();
  const consoleWatch = watchConsole(page);

  await page.goto(`${server.base}/`);
  await waitForState(page, 'waiting', 10_000);
  const before = await readPosition(page);
  assert.ok(before >= 5, `expected a long wait, shown position ${before}`);

  await page.reload();
  await waitForState(page, 'waiting', 10_000);
  const after = await readPosition(page);
  assert.ok(after <= before, `a reload keeps the place (was ${before}, now ${after})`);

  await page.click('#leave');
  await page.waitForSelector('#leave-confirm:not([hidden])');
  const [response] = await Promise.all([
    page.waitForResponse((r) => r.request().method() === 'DELETE' && r.url().endsWith('/entries/me')),
    page.click('#leave-yes'),
  ]);
  assert.equal(response.status(), 204);
  await waitForState(page, 'ended', 10_000);
  assert.equal(await page.getAttribute('#view-ended', 'data-reason'), 'left');
  assert.match(await page.textContent('#ended-heading'), /left the queue/i);

  // Joining again puts the buyer at the back of the line.
  await page.click('#rejoin');
  await waitForState(page, 'waiting', 10_000);
  assert.ok((await readPosition(page)) >= 1);

  assertNoConsoleErrors(consoleWatch);
});

test('when the turn runs out unused, the page says so and offers to join again', { timeout: 60_000 }, async (t) => {
  const { server, browser } = await setup(t, { serverArgs: ['--token-ttl-secs', '4'] });
  const context = await browser.newContext();
  const page = await context.newPage();
  const consoleWatch = watchConsole(page);
  // The page's clock is ours: once READY it stops, so the page's own
  // countdown can never run out and "expired" can only come from the server.
  await page.clock.install();

  // Nobody else is waiting: straight to READY, with a four-second pass.
  await page.goto(`${server.base}/`);
  await waitForState(page, 'ready', 10_000);
  assert.match(await page.textContent('#countdown-time'), /^0:0[0-4]$/);
  await page.clock.pauseAt(Date.now() + 50);
  const frozen = await page.textContent('#countdown-time');

  await waitForState(page, 'ended', 15_000);
  assert.equal(await page.textContent('#countdown-time'), frozen, "the page's countdown stood still");
  await page.clock.resume();
  assert.equal(await page.getAttribute('#view-ended', 'data-reason'), 'expired');
  assert.match(await page.textContent('#ended-heading'), /turn has ended/i);

  await page.click('#rejoin');
  await page.waitForSelector('body[data-state="ready"], body[data-state="waiting"]', { timeout: 10_000 });

  assertNoConsoleErrors(consoleWatch);
});

const ADMIN = 'waiting-room-browser-admin-token-01234';

/** An admin API call on `server`'s operator listener: the status code. */
async function adminCall(server, method, path, body) {
  const res = await fetch(`${server.admin}${path}`, {
    method,
    headers: { Authorization: `Bearer ${ADMIN}`, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return res.status;
}

test('a held queue tells its buyers it is paused, with no estimate, and accessibly so in light and dark', { timeout: 90_000 }, async (t) => {
  const { server, browser } = await setup(t, { serverArgs: ['--admin-token', ADMIN] });
  await prefill(server.base, 3);
  assert.equal(await adminCall(server, 'POST', '/api/admin/queues/default/pause'), 200);
  for (const colorScheme of ['light', 'dark']) {
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, colorScheme, reducedMotion: 'reduce' });
    const page = await context.newPage();
    const watch = watchConsole(page);
    await page.goto(`${server.base}/`);
    await waitForState(page, 'waiting', 10_000);
    await page.waitForSelector('#held-note:not([hidden])', { timeout: 10_000 });
    assert.equal(await page.textContent('#eta'), 'Paused');
    assert.match(await page.textContent('#held-note'), /paused/i);
    await assertAccessible(page, `the waiting page, held (${colorScheme})`);
    await screenshot(page, `waiting-held-${colorScheme}`);
    assertNoConsoleErrors(watch);
    await context.close();
  }
  // Released: the estimate is back, the note gone.
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, reducedMotion: 'reduce' });
  const page = await context.newPage();
  await page.goto(`${server.base}/`);
  await page.waitForSelector('#held-note:not([hidden])', { timeout: 10_000 });
  assert.equal(await adminCall(server, 'POST', '/api/admin/queues/default/resume'), 200);
  await page.waitForSelector('#held-note', { state: 'hidden', timeout: 10_000 });
  assert.notEqual(await page.textContent('#eta'), 'Paused');
  await assertAccessible(page, 'the waiting page (light)');
});

test('with the order service elsewhere, READY hands the buyer on with the token, and live texts show', { timeout: 90_000 }, async (t) => {
  const { server, browser } = await setup(t, {
    serverArgs: ['--admin-token', ADMIN, '--orders', 'off', '--shop-url', 'https://shop.example/buy#token={token}&q={queue}'],
  });
  assert.equal(
    await adminCall(server, 'PUT', '/api/admin/queues/default', { texts: { 'ready.heading': 'Sneakers are waiting for you' } }),
    200,
  );
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  const watch = watchConsole(page);
  // Nobody else waits: the fast track to READY.
  await page.goto(`${server.base}/`);
  await waitForState(page, 'ready', 15_000);
  assert.equal(await page.textContent('#ready-heading'), 'Sneakers are waiting for you');
  await page.waitForSelector('#shop-handoff:not([hidden])', { timeout: 5_000 });
  assert.equal(await page.isHidden('#order-form'), true, 'no dead-end order form');
  const token = await page.evaluate(async () => {
    const res = await fetch('api/queues/default/position');
    return (await res.json()).entryToken;
  });
  assert.ok(token, 'READY with a token');
  assert.equal(
    await page.getAttribute('#shop-link', 'href'),
    `https://shop.example/buy#token=${encodeURIComponent(token)}&q=default`,
  );
  assert.equal(await page.getAttribute('#shop-link', 'rel'), 'noreferrer');
  await screenshot(page, 'ready-shop-handoff');
  assertNoConsoleErrors(watch);
});
