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
