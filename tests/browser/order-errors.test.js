// When an order fails, the buyer keeps the turn and is told what to do.
// The failures are injected in the browser (Playwright routes) on top of the
// real server, which then takes the final order.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  assertNoConsoleErrors,
  fetchOrder,
  pageVisitor,
  setup,
  waitForProducts,
  waitForState,
  watchConsole,
} from './lib/harness.js';

test('a failed order keeps the turn: too few left, a busy store, then success', { timeout: 60_000 }, async (t) => {
  const { server, browser } = await setup(t);
  const context = await browser.newContext();
  const page = await context.newPage();
  // The injected failures make Chromium log "Failed to load resource: … 409/503".
  const consoleWatch = watchConsole(page, {
    allow: ({ text, url }) => new URL(url || 'about:blank').pathname === '/api/orders' && /status of (409|503)/.test(text),
  });

  await page.goto(`${server.base}/`);
  await waitForState(page, 'ready', 10_000);
  await waitForProducts(page);
  await page.click('#qty-plus');
  await page.click('#qty-plus');
  assert.equal(await page.inputValue('#quantity'), '3');

  // Someone else bought most of the stock: only two are left.
  await page.route('**/api/products', async (route) => {
    const res = await route.fetch();
    const products = (await res.json()).map((p) => ({ ...p, stock: 2 }));
    await route.fulfill({ response: res, json: products });
  });
  await page.route(
    '**/api/orders',
    (route) => route.fulfill({ status: 409, json: { error: 'out_of_stock', message: 'not enough stock' } }),
    { times: 1 },
  );
  await page.click('#place-order');
  await page.waitForSelector('#order-error:not([hidden])');
  assert.match(await page.textContent('#order-error'), /only 2/i);
  assert.equal(await page.inputValue('#quantity'), '2', 'the quantity is capped to what is left');
  assert.match(await page.textContent('.product-stock'), /only 2 left/i);
  assert.equal(await page.getAttribute('body', 'data-state'), 'ready');

  // The store is briefly overloaded.
  await page.route(
    '**/api/orders',
    (route) => route.fulfill({ status: 503, json: { error: 'store_unavailable', message: 'try later' } }),
    { times: 1 },
  );
  await page.click('#place-order');
  await page.waitForFunction(() => /busy/i.test(document.getElementById('order-error').textContent));
  assert.equal(await page.getAttribute('body', 'data-state'), 'ready');
  assert.equal(await page.isEnabled('#place-order'), true);

  // Third time lucky, with the real server.
  await page.click('#place-order');
  await waitForState(page, 'confirmed', 10_000);
  const orderId = await page.getAttribute('#receipt-id', 'data-order-id');
  const order = await fetchOrder(server.base, orderId, await pageVisitor(page));
  assert.equal(order.status, 200);
  assert.equal(order.body.quantity, 2);

  assertNoConsoleErrors(consoleWatch);
});
