// A branded queue (--page-dir with queues/<queue>.json): its name, logo,
// colours and texts on the page, under the strict CSP (no violation, no
// console error); a file of the page directory overrides the embedded one;
// long words wrap on a narrow phone. Screenshots in screenshots/.

import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';
import { assertNoConsoleErrors, enterQueue, screenshot, setup, waitForState, watchConsole } from './lib/harness.js';

const LONG_WORD = 'Donaudampfschifffahrtsgesellschaftskapitänswitwenrentenversicherungsanstalt';
const LOGO = `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 64 32" width="64" height="32">
  <rect width="64" height="32" rx="6" fill="#e4002b"/><text x="32" y="22" font-size="16" text-anchor="middle" fill="#fff">ACME</text></svg>`;

/** A page directory: a branded `drop` queue, a long-word `long` queue, an overriding favicon. */
function pageDir(t) {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'waitroom-page-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  mkdirSync(path.join(dir, 'queues'));
  mkdirSync(path.join(dir, 'img'));
  writeFileSync(path.join(dir, 'img', 'acme.svg'), LOGO);
  writeFileSync(path.join(dir, 'favicon.svg'), '<svg xmlns="http://www.w3.org/2000/svg" data-brand="acme"/>');
  writeFileSync(
    path.join(dir, 'queues', 'drop.json'),
    JSON.stringify({
      name: 'Acme Sneakers',
      logo: 'img/acme.svg',
      colors: { accent: '#e4002b', accentText: '#fff', background: '#fff7f0' },
      texts: {
        en: { 'waiting.heading': 'You are in the Acme line', footer: 'Acme: one pair per buyer.' },
        ko: { 'waiting.heading': 'Acme 대기열에 계십니다' },
      },
    }),
  );
  writeFileSync(
    path.join(dir, 'queues', 'long.json'),
    JSON.stringify({
      name: `${LONG_WORD}Shop`,
      texts: { en: { 'waiting.heading': LONG_WORD, 'waiting.noteLead': `${LONG_WORD}${LONG_WORD}` } },
    }),
  );
  return dir;
}

/** Records CSP violations in the page (window.__csp). */
async function watchCsp(page) {
  await page.addInitScript(() => {
    window.__csp = [];
    document.addEventListener('securitypolicyviolation', (e) => window.__csp.push(`${e.violatedDirective} ${e.blockedURI}`));
  });
}

async function assertFits(page, name) {
  const { scrollWidth, innerWidth } = await page.evaluate(() => ({
    scrollWidth: document.documentElement.scrollWidth,
    innerWidth: window.innerWidth,
  }));
  assert.ok(scrollWidth <= innerWidth, `${name}: page is ${scrollWidth}px wide in a ${innerWidth}px viewport`);
}

test('a branded queue shows its name, logo, colours and texts under the CSP', { timeout: 120_000 }, async (t) => {
  const dir = pageDir(t);
  const { server, browser } = await setup(t, { serverArgs: ['--queues', 'default,drop,long', '--page-dir', dir] });

  // The branding over the API; none for an unbranded queue; a 404 for an unknown one.
  const brand = await (await fetch(`${server.base}/api/queues/drop/page`)).json();
  assert.equal(brand.name, 'Acme Sneakers');
  assert.deepEqual(await (await fetch(`${server.base}/api/queues/default/page`)).json(), {});
  assert.equal((await fetch(`${server.base}/api/queues/nope/page`)).status, 404);
  // The page directory's file wins over the embedded one; nothing outside it is served.
  assert.match(await (await fetch(`${server.base}/favicon.svg`)).text(), /data-brand="acme"/);
  assert.equal((await fetch(`${server.base}/img/acme.svg`)).status, 200);
  assert.equal((await fetch(`${server.base}/queues/drop.json`)).status, 404, 'brandings are read through the API only');
  assert.equal((await fetch(`${server.base}/img/..%2F..%2Fetc%2Fpasswd`)).status, 404);

  // Others ahead, so the page waits (one admission per 700 ms).
  for (let i = 0; i < 8; i += 1) await enterQueue(server.base, `ahead-${i}`, 'drop');
  const context = await browser.newContext({ locale: 'en-US', viewport: { width: 1024, height: 860 }, colorScheme: 'light' });
  const page = await context.newPage();
  const consoleWatch = watchConsole(page);
  await watchCsp(page);
  await page.goto(`${server.base}/?queue=drop`);
  await waitForState(page, 'waiting', 15_000);

  assert.equal(await page.textContent('.brand-name'), 'Acme Sneakers');
  assert.equal(await page.textContent('#waiting-heading'), 'You are in the Acme line');
  assert.equal(await page.textContent('.footer p'), 'Acme: one pair per buyer.');
  assert.equal(await page.$('.brand-mark'), null, 'the logo replaces the default mark');
  await page.waitForFunction(() => document.querySelector('img.brand-logo')?.naturalWidth > 0, null, { timeout: 5_000 });
  const colors = await page.evaluate(() => {
    const css = getComputedStyle(document.documentElement);
    return {
      accent: css.getPropertyValue('--accent').trim(),
      bg: css.getPropertyValue('--bg').trim(),
      body: getComputedStyle(document.body).backgroundColor,
      styleAttrs: [...document.querySelectorAll('[style]')].filter((n) => n !== document.documentElement).length,
    };
  });
  assert.equal(colors.accent, '#e4002b');
  assert.equal(colors.bg, '#fff7f0');
  assert.equal(colors.body, 'rgb(255, 247, 240)');
  await screenshot(page, 'brand-waiting-en');

  // The brand's Korean text replaces the Korean default; its name stays.
  await page.selectOption('#lang', 'ko');
  await page.waitForFunction(() => document.documentElement.lang === 'ko');
  assert.equal(await page.textContent('#waiting-heading'), 'Acme 대기열에 계십니다');
  assert.equal(await page.textContent('.brand-name'), 'Acme Sneakers');
  await screenshot(page, 'brand-waiting-ko');

  assert.deepEqual(await page.evaluate(() => window.__csp), [], 'no CSP violation');
  assertNoConsoleErrors(consoleWatch);
});

test('long words wrap on a narrow phone', { timeout: 120_000 }, async (t) => {
  const dir = pageDir(t);
  const { server, browser } = await setup(t, { serverArgs: ['--queues', 'default,drop,long', '--page-dir', dir] });
  for (let i = 0; i < 8; i += 1) await enterQueue(server.base, `ahead-${i}`, 'long');
  const context = await browser.newContext({
    locale: 'de-DE',
    viewport: { width: 320, height: 700 },
    deviceScaleFactor: 2,
    isMobile: true,
    hasTouch: true,
  });
  const page = await context.newPage();
  const consoleWatch = watchConsole(page);
  await watchCsp(page);
  await page.goto(`${server.base}/?queue=long`);
  await waitForState(page, 'waiting', 15_000);
  assert.equal(await page.textContent('#waiting-heading'), LONG_WORD);
  // German is not offered: English, with the switch to change it.
  assert.equal(await page.evaluate(() => document.documentElement.lang), 'en');
  await screenshot(page, 'brand-long-words-320');
  await assertFits(page, 'long words at 320 px');
  assert.deepEqual(await page.evaluate(() => window.__csp), [], 'no CSP violation');
  assertNoConsoleErrors(consoleWatch);
});
