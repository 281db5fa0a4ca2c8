// With the event stream blocked, the page falls back to polling and still
// gets its turn.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  assertNoConsoleErrors,
  fetchOrder,
  orderFirstProduct,
  pageUserId,
  prefill,
  readPosition,
  setup,
  waitForState,
  watchConsole,
} from './lib/harness.js';

const EVENTS_URL = /\/api\/queues\/[^/?#]+\/events(?:[?#]|$)/;

test('without the event stream the page polls the position and still reaches its turn', { timeout: 90_000 }, async (t) => {
  const { server, browser } = await setup(t);

  await prefill(server.base, 10);
  const context = await browser.newContext();
  const page = await context.newPage();
  // Blocking the stream makes Chromium log the failed requests; excuse
  // exactly those and nothing else.
  const consoleWatch = watchConsole(page, {
    allow: ({ text, url }) => EVENTS_URL.test(url) && /net::ERR_FAILED/.test(text),
  });

  let streamAttempts = 0;
  await page.route('**/events**', (route) => {
    streamAttempts += 1;
    return route.abort();
  });
  const polls = [];
  page.on('request', (req) => {
    if (/\/api\/queues\/[^/]+\/position$/.test(new URL(req.url()).pathname)) {
      polls.push({ at: Date.now(), ticket: req.headers()['x-queue-ticket'] });
    }
  });

  await page.goto(`${server.base}/`);
  await waitForState(page, 'waiting', 10_000);
  assert.ok((await readPosition(page)) >= 2);

  // The fallback kicks in while still waiting, and the place keeps moving.
  await page.waitForSelector('body[data-state="waiting"] #conn[data-mode="polling"]', { timeout: 15_000 });
  const polled = await readPosition(page);
  await page.waitForFunction(
    (p) => Number(document.getElementById('position').dataset.position) < p || document.body.dataset.state === 'ready',
    polled,
    { timeout: 15_000 },
  );
  await waitForState(page, 'ready', 40_000);
  assert.ok(streamAttempts >= 1, 'the page tried the stream first');
  assert.ok(polls.length >= 2, `the page polled (${polls.length} polls)`);
  assert.ok(polls.every((p) => p.ticket), 'every poll sends X-Queue-Ticket');

  const orderId = await orderFirstProduct(page);
  const userId = await pageUserId(page);
  assert.equal((await fetchOrder(server.base, orderId, userId)).status, 200);

  assertNoConsoleErrors(consoleWatch);
});
