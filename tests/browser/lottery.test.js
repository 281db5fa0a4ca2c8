// A scheduled opening with a lottery: before `opensAt` the page shows the
// pre-queue view (a countdown, the commitment and the buyer's own
// fingerprint, which the buyer can recompute from the entry code shown);
// at the draw it moves to the waiting view by itself, on the one stream it
// opened in the pre-queue (no reconnect), and the published list holds that
// fingerprint. Screenshots of both views in screenshots/.

import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { test } from 'node:test';
import { assertNoConsoleErrors, prefill, readPosition, screenshot, setup, waitForState, watchConsole } from './lib/harness.js';

const ADMIN = 'admin-token-for-lottery-browser-test';

test('the pre-queue shows a countdown and the fingerprint, then the drawn place', { timeout: 90_000 }, async (t) => {
  // No admission pass during the test: places stay as the draw made them.
  const { server, browser } = await setup(t, {
    serverArgs: ['--admission-interval-ms', '600000', '--admin-token', ADMIN],
  });
  const opensAt = Date.now() + 10_000;
  const r = await fetch(`${server.admin}/api/admin/queues/default/lottery`, {
    method: 'PUT',
    headers: { Authorization: `Bearer ${ADMIN}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ opensAt }),
  });
  const scheduled = JSON.parse(await r.text());
  assert.equal(r.status, 200, JSON.stringify(scheduled));
  await prefill(server.base, 2);

  const page = await browser.newPage();
  const consoleWatch = watchConsole(page);
  // Counts every connection an EventSource makes, its own reconnects too.
  await page.addInitScript(() => {
    const Real = window.EventSource;
    window.__streamOpens = 0;
    window.EventSource = class extends Real {
      constructor(...args) {
        super(...args);
        this.addEventListener('open', () => { window.__streamOpens += 1; });
      }
    };
  });
  await page.goto(`${server.base}/`);
  await waitForState(page, 'prequeue', 10_000);
  const fingerprint = (await page.textContent('#prequeue-fingerprint')).trim();
  const nonce = (await page.textContent('#prequeue-nonce')).trim();
  assert.match(fingerprint, /^[0-9a-f]{64}$/);
  const recomputed = createHash('sha256').update(`waitroom-lottery-v1\ndefault\n${nonce}`).digest('hex');
  assert.equal(fingerprint, recomputed, 'the buyer can recompute their fingerprint from the entry code');
  assert.equal((await page.textContent('#prequeue-commitment')).trim(), scheduled.commitment);
  const left = Number(await page.getAttribute('#prequeue-countdown', 'data-left'));
  assert.ok(left > 0 && left <= 10, `countdown ${left}s`);
  await screenshot(page, 'lottery-prequeue');

  // The draw: the page moves to the waiting view on its own.
  await waitForState(page, 'waiting', 30_000);
  assert.equal(await page.evaluate(() => window.__streamOpens), 1, 'countdown to waiting on the same stream');
  const position = await readPosition(page);
  assert.ok(position >= 1 && position <= 3, `drawn at ${position} of 3`);
  await screenshot(page, 'lottery-drawn');
  const drawn = await (await fetch(`${server.base}/api/queues/default/lottery`)).json();
  assert.equal(drawn.state, 'drawn');
  assert.equal(drawn.entries, 3);
  const list = await (await fetch(`${server.base}/api/queues/default/lottery/entries`)).text();
  assert.ok(list.split('\n').includes(fingerprint), 'the published list holds the buyer\'s fingerprint');
  assertNoConsoleErrors(consoleWatch);
});
