// The page's languages: picked from the browser's languages, switched with
// the visible switch (remembered across reloads), <html lang> following,
// every word of the view in the chosen language, the wait estimate's range
// shown once passes are observed. Screenshots in screenshots/.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import {
  BROWSER_DIR,
  assertNoConsoleErrors,
  prefill,
  screenshot,
  setup,
  waitForState,
  watchConsole,
} from './lib/harness.js';

const dictionary = (lang) => JSON.parse(readFileSync(path.resolve(BROWSER_DIR, `../../static/i18n/${lang}.json`), 'utf8'));
const ko = dictionary('ko');
const ja = dictionary('ja');
const en = dictionary('en');

/** Every data-i18n element's text, by key, that is visible now. */
function visibleTexts(page) {
  return page.evaluate(() =>
    [...document.querySelectorAll('[data-i18n]')]
      .filter((n) => n.offsetParent !== null && !n.closest('[hidden]'))
      .map((n) => [n.dataset.i18n, n.textContent]),
  );
}

test('a Korean browser gets Korean; the switch changes to Japanese and is remembered', { timeout: 120_000 }, async (t) => {
  const { server, browser } = await setup(t);
  await prefill(server.base, 40);
  const context = await browser.newContext({
    locale: 'ko-KR',
    viewport: { width: 390, height: 844 },
    deviceScaleFactor: 2,
    isMobile: true,
    hasTouch: true,
  });
  const page = await context.newPage();
  const consoleWatch = watchConsole(page);
  await page.goto(`${server.base}/`);
  await waitForState(page, 'waiting', 15_000);

  assert.equal(await page.evaluate(() => document.documentElement.lang), 'ko');
  assert.equal(await page.inputValue('#lang'), 'ko');
  assert.equal(await page.textContent('#waiting-heading'), ko['waiting.heading']);
  assert.equal(await page.textContent('#leave'), ko['leave.button']);
  assert.match(await page.textContent('#ahead'), /^[\d,]+명$/);
  assert.match(await page.title(), /대기실$/);
  for (const [key, text] of await visibleTexts(page)) {
    if (key === 'brand.name') continue;
    assert.notEqual(text, en[key], `${key} is still English`);
  }
  // The range, once passes are observed: Korean words, numbers from the API.
  await page.waitForFunction(() => document.getElementById('eta').dataset.high, null, { timeout: 20_000 });
  const eta = await page.textContent('#eta');
  assert.ok([ko['eta.now'], ko['eta.underMinute']].includes(eta) || /^(약|최대) /.test(eta), eta);
  await screenshot(page, 'i18n-ko-waiting');

  await page.selectOption('#lang', 'ja');
  await page.waitForFunction(() => document.documentElement.lang === 'ja');
  assert.equal(await page.textContent('#waiting-heading'), ja['waiting.heading']);
  assert.match(await page.textContent('#ahead'), /^[\d,]+人$/);
  assert.match(await page.textContent('#conn-text'), /^(ライブ|接続中…|再接続中…|自動更新)$/);
  for (const [key, text] of await visibleTexts(page)) {
    if (key === 'brand.name') continue;
    assert.notEqual(text, en[key], `${key} is still English`);
    assert.notEqual(text, ko[key], `${key} is still Korean`);
  }
  await screenshot(page, 'i18n-ja-waiting');

  // Remembered: a reload keeps Japanese (and the place).
  const position = await page.getAttribute('#position', 'data-position');
  await page.reload();
  await waitForState(page, 'waiting', 15_000);
  assert.equal(await page.evaluate(() => document.documentElement.lang), 'ja');
  assert.equal(await page.textContent('#waiting-heading'), ja['waiting.heading']);
  assert.ok(Number(await page.getAttribute('#position', 'data-position')) <= Number(position), 'the place is kept');

  // Leaving in Japanese: the ending's words are Japanese too.
  await page.click('#leave');
  await page.click('#leave-yes');
  await waitForState(page, 'ended', 10_000);
  assert.equal(await page.textContent('#ended-heading'), ja['ended.left.title']);
  await page.selectOption('#lang', 'en');
  await page.waitForFunction(() => document.documentElement.lang === 'en');
  assert.equal(await page.textContent('#ended-heading'), en['ended.left.title']);
  assert.equal(await page.textContent('#rejoin'), en['ended.left.action']);
  assertNoConsoleErrors(consoleWatch);
});

test('an English browser keeps the English page, and the range reads in minutes', { timeout: 120_000 }, async (t) => {
  const { server, browser } = await setup(t);
  // Far enough back for minutes: one admission per 700 ms.
  await prefill(server.base, 150);
  const context = await browser.newContext({ locale: 'en-GB', viewport: { width: 1024, height: 860 } });
  const page = await context.newPage();
  const consoleWatch = watchConsole(page);
  await page.goto(`${server.base}/`);
  await waitForState(page, 'waiting', 15_000);
  assert.equal(await page.evaluate(() => document.documentElement.lang), 'en');
  assert.equal(await page.textContent('#waiting-heading'), en['waiting.heading']);
  const options = await page.$$eval('#lang option', (o) => o.map((x) => x.value));
  assert.deepEqual(options, ['en', 'ko', 'ja']);
  await page.waitForFunction(() => document.getElementById('eta').dataset.high, null, { timeout: 20_000 });
  const { low, high } = await page.$eval('#eta', (e) => ({ low: Number(e.dataset.low), high: Number(e.dataset.high) }));
  assert.ok(low <= high, `${low}..${high}`);
  assert.ok(high >= 60, `${low}..${high} s with 100+ ahead`);
  const words = await page.textContent('#eta');
  assert.match(words, /^(up to \d+ minutes|about \d+–\d+ minutes|about (a|\d+) minutes?)$/);
  await screenshot(page, 'i18n-en-range');
  assertNoConsoleErrors(consoleWatch);
});
