// A queue linked to stock: when the stock is gone the waiting page shows the
// sold-out view at once (the stream's `gone: sold_out`), and a restock lets
// the buyer back into line in their place.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { assertNoConsoleErrors, prefill, readPosition, setup, waitForState, watchConsole } from './lib/harness.js';

const ADMIN = 'admin-token-for-sold-out-browser-test';

async function reportStock(server, remaining) {
  const r = await fetch(`${server.admin}/api/admin/queues/default/stock`, {
    method: 'PUT',
    headers: { Authorization: `Bearer ${ADMIN}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ remaining, maxPerBuyer: 1 }),
  });
  const text = await r.text();
  assert.equal(r.status, 200, text);
  return JSON.parse(text);
}

test('sold out shows at once, and a restock lets the buyer back in line', { timeout: 60_000 }, async (t) => {
  // No pass during the test: the page waits behind the one holder.
  const { server, browser } = await setup(t, {
    serverArgs: ['--admission-interval-ms', '600000', '--admin-token', ADMIN],
  });
  await reportStock(server, 1);
  await prefill(server.base, 2);
  const page = await browser.newPage();
  const consoleWatch = watchConsole(page);
  await page.goto(`${server.base}/`);
  await waitForState(page, 'waiting', 10_000);
  await page.waitForSelector('body[data-state="waiting"] #conn[data-mode="live"]', { timeout: 20_000 });

  const stock = await reportStock(server, 0);
  assert.equal(stock.soldOut, true);
  await waitForState(page, 'ended', 10_000);
  assert.equal(await page.getAttribute('#view-ended', 'data-reason'), 'sold_out');
  assert.match(await page.textContent('#ended-heading'), /sold out/i);

  // Units are back: checking again finds the place kept, not a new one.
  await reportStock(server, 3);
  await page.click('#rejoin');
  await waitForState(page, 'waiting', 10_000);
  assert.equal(await readPosition(page), 2, 'behind the one still ahead, in the place kept');
  assertNoConsoleErrors(consoleWatch);
});
