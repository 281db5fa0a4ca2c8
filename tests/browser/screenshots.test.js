// Screenshots of the waiting and READY states, on a phone in dark mode and on
// a desktop in light mode, written to screenshots/ for a person to look at.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  assertNoConsoleErrors,
  prefill,
  screenshot,
  setup,
  waitForState,
  waitForProducts,
  watchConsole,
} from './lib/harness.js';

const LOOKS = [
  { name: 'phone-dark', options: { viewport: { width: 390, height: 844 }, deviceScaleFactor: 2, isMobile: true, hasTouch: true, colorScheme: 'dark', reducedMotion: 'reduce' } },
  { name: 'desktop-light', options: { viewport: { width: 1280, height: 860 }, colorScheme: 'light' } },
];

test('the waiting and READY states render without overflow on a phone (dark) and a desktop (light)', { timeout: 120_000 }, async (t) => {
  const { server, browser } = await setup(t);

  await prefill(server.base, 6);
  const pages = [];
  for (const look of LOOKS) {
    const context = await browser.newContext(look.options);
    const page = await context.newPage();
    pages.push({ look, page, console: watchConsole(page) });
    await page.goto(`${server.base}/`);
  }

  for (const { look, page } of pages) {
    await waitForState(page, 'waiting', 10_000);
    await page.waitForSelector('#conn[data-mode="live"]', { timeout: 10_000 });
    await screenshot(page, `${look.name}-waiting`);
    await assertFits(page, look.name);
  }
  for (const { look, page } of pages) {
    await waitForState(page, 'ready', 40_000);
    await waitForProducts(page);
    await screenshot(page, `${look.name}-ready`);
    await assertFits(page, look.name);
  }
  assertNoConsoleErrors(...pages.map((p) => p.console));
});

/** Nothing sticks out sideways (a classic phone-layout bug). */
async function assertFits(page, name) {
  const { scrollWidth, innerWidth } = await page.evaluate(() => ({
    scrollWidth: document.documentElement.scrollWidth,
    innerWidth: window.innerWidth,
  }));
  assert.ok(scrollWidth <= innerWidth, `${name}: page is ${scrollWidth}px wide in a ${innerWidth}px viewport`);
}
