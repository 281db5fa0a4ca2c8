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
  context.on('request', (req) => {
    if (/\/api\/queues\/[^/]+\/events$/.test(new URL(req.url()).pathname)) streams.push(req);
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

  // Same buyer in both tabs.
  const ids = await Promise.all([first, second].map((p) => p.getAttribute('html', 'data-user-id')));
  assert.equal(ids[0], ids[1]);

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

  // Close the tab holding the stream: the other takes over and gets its turn.
  await first.close();
  await waitForState(second, 'ready', 40_000);
  assert.equal(streams.length, 2, `the remaining tab opened its own stream, saw ${streams.length}`);
  assert.equal(streams[1].frame().page(), second);

  assertNoConsoleErrors(firstConsole, secondConsole);
});
