// Unit tests of the page's pure formatting helpers (static/format.js).

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { BROWSER_DIR } from './lib/harness.js';

// static/ is plain browser code with no package.json of its own, so load the
// module from its source text.
const source = readFileSync(path.resolve(BROWSER_DIR, '../../static/format.js'), 'utf8');
const fmt = await import(`data:text/javascript;base64,${Buffer.from(source).toString('base64')}`);
const dictionary = (lang) => JSON.parse(readFileSync(path.resolve(BROWSER_DIR, `../../static/i18n/${lang}.json`), 'utf8'));
const speak = (lang) => fmt.useMessages(fmt.translator(dictionary(lang), lang), lang);
speak('en');

test('estimated waits read as rounded words', () => {
  assert.equal(fmt.waitInWords(null), 'working it out…');
  assert.equal(fmt.waitInWords(0), 'any moment now');
  assert.equal(fmt.waitInWords(12), 'less than a minute');
  assert.equal(fmt.waitInWords(59), 'less than a minute');
  assert.equal(fmt.waitInWords(60), 'about a minute');
  assert.equal(fmt.waitInWords(89), 'about a minute');
  assert.equal(fmt.waitInWords(180), 'about 3 minutes');
  assert.equal(fmt.waitInWords(200), 'about 3 minutes');
  assert.equal(fmt.waitInWords(60 * 54), 'about 54 minutes');
  assert.equal(fmt.waitInWords(60 * 70), 'about an hour');
  assert.equal(fmt.waitInWords(3600 * 3), 'about 3 hours');
  assert.equal(fmt.waitInWords(3600 * 30), 'more than a day');
});

test('people ahead and counts', () => {
  assert.equal(fmt.peopleAhead(0), 'No one');
  assert.equal(fmt.peopleAhead(1), '1 person');
  assert.equal(fmt.peopleAhead(7), '7 people');
  assert.equal(fmt.peopleAhead(null), '–');
  assert.equal(fmt.formatCount(undefined), '–');
});

test('the countdown clock rounds up and never goes negative', () => {
  assert.equal(fmt.formatClock(300_000), '5:00');
  assert.equal(fmt.formatClock(299_001), '5:00');
  assert.equal(fmt.formatClock(59_000), '0:59');
  assert.equal(fmt.formatClock(0), '0:00');
  assert.equal(fmt.formatClock(-5_000), '0:00');
  assert.equal(fmt.formatClock(3_661_000), '1:01:01');
  assert.equal(fmt.durationInWords(300), '5 minutes');
  assert.equal(fmt.durationInWords(61), '1 minute 1 second');
  assert.equal(fmt.durationInWords(0), '0 seconds');
});

test('announcement milestones are round numbers at or above the position', () => {
  assert.equal(fmt.milestone(1), 1);
  assert.equal(fmt.milestone(3), 3);
  assert.equal(fmt.milestone(4), 5);
  assert.equal(fmt.milestone(6), 10);
  assert.equal(fmt.milestone(10), 10);
  assert.equal(fmt.milestone(11), 20);
  assert.equal(fmt.milestone(47), 50);
  assert.equal(fmt.milestone(120), 200);
  assert.equal(fmt.milestone(4321), 5000);
  assert.equal(fmt.milestone(null), null);
  // Positions falling through 47, 45, 21, 20, 19 cross only 50 → 20.
  const marks = [47, 45, 21, 20, 19].map(fmt.milestone);
  assert.deepEqual(marks, [50, 50, 50, 20, 20]);
});

test('progress runs from where the buyer joined to the front', () => {
  assert.equal(fmt.progressFraction(5, 5), 0);
  assert.equal(fmt.progressFraction(5, 1), 0.8);
  assert.equal(fmt.progressFraction(1, 1), 0);
  assert.equal(fmt.progressFraction(10, 20), 0);
  assert.equal(fmt.progressFraction(null, 3), 0);
});

test('every way a place can end has words and an action', () => {
  for (const reason of ['left', 'expired', 'consumed', 'abandoned', 'replaced', 'not_entered', 'invalid', 'unheard-of']) {
    const copy = fmt.endedCopy(reason);
    assert.ok(copy.title && copy.text && copy.action, reason);
  }
  assert.match(fmt.endedCopy('replaced').text, /another/);
});

test('a wait range reads as rounded minutes or hours', () => {
  assert.equal(fmt.waitRangeInWords(720, 1080), 'about 12–18 minutes');
  assert.equal(fmt.waitRangeInWords(700, 1075), 'about 11–18 minutes', 'low rounds down, high up');
  assert.equal(fmt.waitRangeInWords(0, 150), 'up to 3 minutes');
  assert.equal(fmt.waitRangeInWords(0, 45), 'less than a minute');
  assert.equal(fmt.waitRangeInWords(0, 0), 'any moment now');
  assert.equal(fmt.waitRangeInWords(300, 300), 'about 5 minutes');
  assert.equal(fmt.waitRangeInWords(2 * 3600, 4 * 3600), 'about 2–4 hours');
  assert.equal(fmt.waitRangeInWords(30 * 3600, 40 * 3600), 'more than a day');
  assert.equal(fmt.waitRangeInWords(10, 5), 'working it out…');
  assert.equal(fmt.waitRangeInWords(null, 5), 'working it out…');
});

test('Korean and Japanese words, plurals and number formats', () => {
  try {
    speak('ko');
    assert.equal(fmt.waitRangeInWords(720, 1080), '약 12~18분');
    assert.equal(fmt.peopleAhead(1234), '1,234명');
    assert.equal(fmt.durationInWords(61), '1분 1초');
    assert.equal(fmt.endedCopy('left').title, '대기열에서 나가셨습니다');
    speak('ja');
    assert.equal(fmt.waitRangeInWords(720, 1080), '約12〜18分');
    assert.equal(fmt.waitInWords(180), '約3分');
    assert.equal(fmt.durationInWords(61), '1分1秒');
  } finally {
    speak('en');
  }
});

test('every language has every message, and every message the page asks for exists', () => {
  const en = dictionary('en');
  const staticDir = path.resolve(BROWSER_DIR, '../../static');
  const html = readFileSync(path.join(staticDir, 'index.html'), 'utf8');
  // The switch's options are the languages offered.
  const languages = [...html.matchAll(/<option value="([^"]+)"/g)].map((m) => m[1]);
  assert.deepEqual(languages.slice(0, 3), ['en', 'ko', 'ja']);
  for (const lang of languages) {
    const d = dictionary(lang);
    // The brand name is a name, not a word: only English carries the default.
    const missing = Object.keys(en).filter((k) => !(k in d) && k !== 'brand.name');
    const extra = Object.keys(d).filter((k) => !(k in en));
    assert.deepEqual([missing, extra], [[], []], lang);
  }
  const asked = new Set();
  for (const m of html.matchAll(/data-i18n="([^"]+)"/g)) asked.add(m[1]);
  for (const m of html.matchAll(/data-i18n-attr="([^"]+)"/g)) {
    for (const pair of m[1].split(';')) asked.add(pair.split(':')[1]);
  }
  for (const file of ['app.js', 'challenge.js', 'format.js']) {
    const js = readFileSync(path.join(staticDir, file), 'utf8');
    for (const m of js.matchAll(/\bt\(\s*'([a-z]\w*\.[\w.]+)'/g)) asked.add(m[1]);
    for (const m of js.matchAll(/\['([a-z]\w*\.[\w.]+)'[\],]/g)) asked.add(m[1]);
  }
  assert.ok(asked.size > 60, `${asked.size} keys found`);
  const unknown = [...asked].filter((k) => !(k in en));
  assert.deepEqual(unknown, [], 'keys the page asks for that English lacks');
});
