// A scheduled opening with a lottery: before `opensAt` the page shows the
// pre-queue view (a countdown, the commitment and the buyer's own
// fingerprint, which the buyer can recompute from the entry code shown);
// at the draw it moves to the waiting view by itself, on the one stream it
// opened in the pre-queue (no reconnect), and the published list holds that
// fingerprint. The page keeps the commitment it showed before the draw (on
// the device, and as a receipt to download) and flags a different one shown
// later. Screenshots of both views in screenshots/.

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
  // The commitment is kept before the draw, with a receipt for the script.
  assert.equal(await page.isVisible('#prequeue-receipt'), true);
  assert.equal(await page.isVisible('#prequeue-changed'), false);
  const kept = await page.evaluate(() => JSON.parse(localStorage.getItem('waitroom.lottery.default')));
  assert.equal(kept.commitment, scheduled.commitment);
  assert.equal(kept.nonce, nonce);
  const href = await page.getAttribute('#prequeue-download', 'href');
  const receipt = decodeURIComponent(href.slice(href.indexOf(',') + 1));
  assert.match(receipt, new RegExp(`--queue default --nonce ${nonce} --commitment ${scheduled.commitment}\\n`));
  assert.equal(await page.getAttribute('#prequeue-download', 'download'), 'waitroom-lottery-default.txt');
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
  const after = await page.evaluate(() => JSON.parse(localStorage.getItem('waitroom.lottery.default')));
  assert.equal(after.commitment, scheduled.commitment, 'still kept after the draw');
  assertNoConsoleErrors(consoleWatch);
});

test('a commitment other than the one saved before is flagged, and the saved one kept', { timeout: 60_000 }, async (t) => {
  const { server, browser } = await setup(t, {
    serverArgs: ['--admission-interval-ms', '600000', '--admin-token', ADMIN],
  });
  const r = await fetch(`${server.admin}/api/admin/queues/default/lottery`, {
    method: 'PUT',
    headers: { Authorization: `Bearer ${ADMIN}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ opensAt: Date.now() + 600_000 }),
  });
  const scheduled = JSON.parse(await r.text());
  assert.equal(r.status, 200, JSON.stringify(scheduled));
  const page = await browser.newPage();
  const consoleWatch = watchConsole(page);
  await page.goto(`${server.base}/`);
  await waitForState(page, 'prequeue', 10_000);
  // As if the page had been shown another commitment before: what the
  // server shows now no longer matches what was saved.
  const promised = 'f'.repeat(64);
  await page.evaluate((c) => {
    const kept = JSON.parse(localStorage.getItem('waitroom.lottery.default'));
    localStorage.setItem('waitroom.lottery.default', JSON.stringify({ ...kept, commitment: c }));
  }, promised);
  await page.reload();
  await waitForState(page, 'prequeue', 10_000);
  await page.waitForSelector('#prequeue-changed:not([hidden])', { timeout: 5_000 });
  assert.match(await page.textContent('#prequeue-changed'), new RegExp(promised));
  assert.equal((await page.textContent('#prequeue-commitment')).trim(), scheduled.commitment);
  const kept = await page.evaluate(() => JSON.parse(localStorage.getItem('waitroom.lottery.default')));
  assert.equal(kept.commitment, promised, 'the saved commitment is never overwritten');
  const href = await page.getAttribute('#prequeue-download', 'href');
  assert.ok(decodeURIComponent(href).includes(`--commitment ${promised}`), 'the receipt carries the saved one');
  await screenshot(page, 'lottery-commitment-changed');
  assertNoConsoleErrors(consoleWatch);
});
