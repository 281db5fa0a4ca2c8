// A ticket ends with its place: when the place ends elsewhere (another
// device left the queue, the place was released), the next answer is
// `401 ticket_ended`, and the page says the place has ended instead of
// quietly joining again at the back of the line.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { assertNoConsoleErrors, prefill, setup, waitForState, watchConsole } from './lib/harness.js';

const EVENTS_URL = /\/api\/queues\/[^/?#]+\/events(?:[?#]|$)/;
const POSITION_URL = /\/api\/queues\/[^/?#]+\/position(?:[?#]|$)/;

test('a place that ended elsewhere shows as ended, with no silent rejoin', { timeout: 60_000 }, async (t) => {
  // One admission, taken by the first of those ahead: the page keeps waiting.
  const { server, browser } = await setup(t, { serverArgs: ['--admission-interval-ms', '600000'] });
  await prefill(server.base, 3);
  const context = await browser.newContext();
  const page = await context.newPage();
  // The blocked stream and the refused poll are logged by Chromium; excuse
  // exactly those.
  const consoleWatch = watchConsole(page, {
    allow: ({ text, url }) =>
      (EVENTS_URL.test(url) && /net::ERR_FAILED/.test(text)) || (POSITION_URL.test(url) && /\b401\b/.test(text)),
  });
  // No stream: the page polls, so the end is learnt from a position answer.
  await page.route('**/events**', (route) => route.abort());

  await page.goto(`${server.base}/`);
  await waitForState(page, 'waiting', 10_000);
  await page.waitForSelector('body[data-state="waiting"] #conn[data-mode="polling"]', { timeout: 20_000 });

  // The ticket lives in its HttpOnly cookie only; it is good only with the
  // visitor cookie it was issued with.
  const cookies = await context.cookies();
  const ticket = cookies.find((c) => c.name === 'waitroom_ticket')?.value;
  assert.ok(ticket, 'the browser keeps the ticket cookie');
  const visitor = cookies.find((c) => c.name === 'waitroom_visitor')?.value;
  assert.ok(visitor, 'the browser keeps the visitor cookie');
  const joins = [];
  page.on('request', (req) => {
    if (req.method() === 'POST' && /\/entries$/.test(new URL(req.url()).pathname)) joins.push(req.url());
  });
  const refused = page.waitForResponse((r) => POSITION_URL.test(r.url()) && r.status() === 401, { timeout: 20_000 });
  // The place ends somewhere else (here: the same ticket leaves over HTTP).
  const left = await fetch(`${server.base}/api/queues/default/entries/me`, {
    method: 'DELETE',
    headers: { 'X-Queue-Ticket': ticket, Cookie: `waitroom_visitor=${visitor}` },
  });
  assert.equal(left.status, 204);

  const answer = await refused;
  assert.equal((await answer.json()).error, 'ticket_ended');
  await waitForState(page, 'ended', 10_000);
  assert.equal(await page.getAttribute('#view-ended', 'data-reason'), 'not_entered');
  assert.match(await page.textContent('#rejoin'), /join/i);
  assert.deepEqual(joins, [], 'the page did not join again by itself');

  // Joining again is the buyer's choice, and works.
  await page.click('#rejoin');
  await waitForState(page, 'waiting', 10_000);

  assertNoConsoleErrors(consoleWatch);
});
