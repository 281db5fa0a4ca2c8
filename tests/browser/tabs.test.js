// Two tabs of one buyer share one event stream; when the tab holding it
// closes, the other takes over.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  assertNoConsoleErrors,
  prefill,
  readPosition,
  setup,
  waitForState,
  watchConsole,
} from './lib/harness.js';

test('two tabs of one buyer open a single event stream and both show the position', { timeout: 90_000 }, async (t) => {
  const { server, browser } = await setup(t);

  await prefill(server.base, 10);
  const context = await browser.newContext();
  const streams = [];
  const polls = [];
  const joins = [];
  context.on('response', (res) => {
    if (res.request().method() === 'POST' && /\/api\/queues\/[^/]+\/entries$/.test(new URL(res.url()).pathname)) {
      joins.push(res.status());
    }
  });
  context.on('request', (req) => {
    const { pathname } = new URL(req.url());
    if (/\/api\/queues\/[^/]+\/events$/.test(pathname)) streams.push(req);
    if (/\/api\/queues\/[^/]+\/position$/.test(pathname)) polls.push(req);
  });

  const first = await context.newPage();
  const firstConsole = watchConsole(first);
  await first.goto(`${server.base}/`);
  await waitForState(first, 'waiting', 10_000);
  await first.waitForSelector('#conn[data-mode="live"]', { timeout: 10_000 });

  const second = await context.newPage();
  const secondConsole = watchConsole(second);
  await second.goto(`${server.base}/`);
  await waitForState(second, 'waiting', 10_000);

  // Same buyer in both tabs: the browser's one visitor cookie, one place.
  const visitors = (await context.cookies()).filter((c) => c.name === 'waitroom_visitor');
  assert.equal(visitors.length, 1, 'one visitor cookie');
  assert.equal(joins.filter((s) => s === 201).length, 1, `one place for two tabs (joins: ${joins.join(', ')})`);

  // Both show a place in line, and the second shows the first tab's live feed.
  assert.ok((await readPosition(first)) >= 1);
  assert.ok((await readPosition(second)) >= 1);
  await second.waitForSelector('#conn[data-mode="live"][data-shared="true"]', { timeout: 5_000 });

  // Let the line move a little: both tabs follow, still over one stream.
  const before = await readPosition(second);
  await second.waitForFunction(
    (p) => Number(document.getElementById('position').dataset.position) < p,
    before,
    { timeout: 10_000 },
  );
  await first.waitForFunction(
    (p) => Number(document.getElementById('position').dataset.position) < p,
    before,
    { timeout: 5_000 },
  );
  assert.equal(streams.length, 1, `one /events request for two tabs, saw ${streams.length}`);
  assert.equal(streams[0].frame().page(), first, 'the first tab holds the stream');
  assert.equal(polls.length, 0, 'the second tab follows the shared stream instead of polling');

  // Close the tab holding the stream: the other takes over and gets its turn.
  await first.close();
  await waitForState(second, 'ready', 40_000);
  assert.equal(streams.length, 2, `the remaining tab opened its own stream, saw ${streams.length}`);
  assert.equal(streams[1].frame().page(), second);

  assertNoConsoleErrors(firstConsole, secondConsole);
});

test('when another device takes over the stream, the page keeps the place and can take it back', { timeout: 60_000 }, async (t) => {
  // Admission held (one slot, taken by the first ahead): everyone waits.
  const { server, browser } = await setup(t, { serverArgs: ['--admission-interval-ms', '600000'] });
  await prefill(server.base, 15);

  // Two browsers (contexts) as the same buyer: the laptop carries the
  // phone's identity cookie, as a login cookie would be on both devices.
  const devices = [];
  for (let i = 0; i < 2; i += 1) {
    const context = await browser.newContext();
    const page = await context.newPage();
    devices.push({ context, page, consoleWatch: watchConsole(page) });
  }
  const [phone, laptop] = devices.map((d) => d.page);
  const phonePolls = [];
  phone.on('request', (req) => {
    if (/\/api\/queues\/[^/]+\/position$/.test(new URL(req.url()).pathname)) phonePolls.push(Date.now());
  });

  await phone.goto(`${server.base}/`);
  await phone.waitForSelector('body[data-state="waiting"] #conn[data-mode="live"]', { timeout: 10_000 });
  const identity = (await devices[0].context.cookies()).filter((c) => c.name === 'waitroom_visitor');
  assert.equal(identity.length, 1, 'the phone has a visitor cookie');
  await devices[1].context.addCookies(identity);
  await laptop.goto(`${server.base}/`);
  await laptop.waitForSelector('body[data-state="waiting"] #conn[data-mode="live"]', { timeout: 10_000 });

  // The newer stream wins; the older page does not go quiet: it keeps its
  // place on screen, polls it (so the place counts as present) and offers
  // to take the live updates back.
  await phone.waitForSelector('#elsewhere:not([hidden])', { timeout: 10_000 });
  assert.equal(await phone.evaluate(() => document.body.dataset.state), 'waiting');
  assert.equal(await phone.getAttribute('#conn', 'data-mode'), 'polling');
  const yieldedAt = Date.now();
  await new Promise((resolve) => setTimeout(resolve, 4_000));
  assert.ok(phonePolls.some((at) => at >= yieldedAt), 'the phone keeps polling its place');
  assert.equal(await phone.evaluate(() => document.body.dataset.state), 'waiting', 'still waiting');
  assert.equal(await laptop.getAttribute('#conn', 'data-mode'), 'live', 'no ping-pong: the laptop stays live');

  await phone.click('#take-back');
  await phone.waitForSelector('body[data-state="waiting"] #conn[data-mode="live"]', { timeout: 10_000 });
  assert.equal(await phone.isHidden('#elsewhere'), true);
  await laptop.waitForSelector('#elsewhere:not([hidden])', { timeout: 10_000 });
  assert.equal(await laptop.evaluate(() => document.body.dataset.state), 'waiting');

  assertNoConsoleErrors(...devices.map((d) => d.consoleWatch));
});
