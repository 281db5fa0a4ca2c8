// With the event stream blocked, the page falls back to polling and still
// gets its turn.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  assertNoConsoleErrors,
  fetchOrder,
  orderFirstProduct,
  pageVisitor,
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
      polls.push({ at: Date.now(), header: req.headers()['x-queue-ticket'], query: new URL(req.url()).search });
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
  // The ticket travels in its HttpOnly cookie: the page never holds it.
  assert.ok(polls.every((p) => !p.header && !p.query), 'polls carry the ticket in the cookie only');
  // Close to the front the server says 1 s; the page jitters by ±20 %, so
  // no two polls come closer than 0.8 s (a little slack for timers).
  const gaps = polls.slice(1).map((p, i) => p.at - polls[i].at);
  assert.ok(gaps.every((g) => g >= 750), `polls follow pollingIntervalSeconds: gaps ${gaps.join(', ')} ms`);

  const orderId = await orderFirstProduct(page);
  assert.equal((await fetchOrder(server.base, orderId, await pageVisitor(page))).status, 200);

  assertNoConsoleErrors(consoleWatch);
});

test('a 429 answer makes the page wait as long as Retry-After says, then carry on', { timeout: 90_000 }, async (t) => {
  const { server, browser } = await setup(t);

  await prefill(server.base, 6);
  const context = await browser.newContext();
  const page = await context.newPage();
  const POSITION_URL = /\/api\/queues\/[^/?#]+\/position(?:[?#]|$)/;
  const consoleWatch = watchConsole(page, {
    allow: ({ text, url }) =>
      (EVENTS_URL.test(url) && /net::ERR_FAILED/.test(text)) ||
      (POSITION_URL.test(url) && /status of 429/.test(text)),
  });
  await page.route('**/events**', (route) => route.abort());
  // The server limits this buyer twice, asking for four seconds each time.
  const polls = [];
  let limited = 0;
  await page.route('**/position', async (route) => {
    polls.push({ at: Date.now(), limited: limited < 2 });
    if (limited < 2) {
      limited += 1;
      return route.fulfill({
        status: 429,
        headers: { 'Retry-After': '4', 'Content-Type': 'application/json' },
        body: JSON.stringify({ error: 'rate_limited', message: 'too many requests' }),
      });
    }
    return route.continue();
  });

  await page.goto(`${server.base}/`);
  await waitForState(page, 'waiting', 10_000);
  await page.waitForFunction(() => document.body.dataset.state === 'ready', null, { timeout: 60_000 });
  assert.ok(polls.length >= 3, `polled on after the limit (${polls.length} polls)`);
  for (let i = 1; i <= 2; i += 1) {
    const gap = polls[i].at - polls[i - 1].at;
    assert.ok(gap >= 3_000, `after a 429 with Retry-After: 4 the page waited ${gap} ms`);
  }
  assertNoConsoleErrors(consoleWatch);
});
