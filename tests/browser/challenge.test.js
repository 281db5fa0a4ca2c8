// Proof of work at the door: with `--join-challenge always`, the page (in
// the default visitor mode) asks for a challenge, shows "Checking your
// browser…" with a progress bar while a Web Worker solves it, joins with the
// solution, waits and reaches READY — under the strict CSP the page is
// served with, with no console error.

import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { assertNoConsoleErrors, screenshot, setup, waitForState, watchConsole } from './lib/harness.js';

/** The page's Content-Security-Policy (the server's own, if it sends one). */
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
  + "img-src 'self' data:; frame-ancestors 'none'";

const ADMIN = 'challenge-test-admin-token';

/** Solves an ALTCHA challenge the way a bot would (node's SHA-256). */
function solve(c) {
  for (let n = 0; n <= c.maxnumber; n += 1) {
    if (createHash('sha256').update(c.salt + n).digest('hex') === c.challenge) {
      const payload = { algorithm: c.algorithm, challenge: c.challenge, number: n, salt: c.salt, signature: c.signature };
      return Buffer.from(JSON.stringify(payload)).toString('base64');
    }
  }
  throw new Error('unsolvable challenge');
}

/** Another buyer joins through the door (a fresh visitor: no cookie). */
async function joinSolved(base) {
  const res = await fetch(`${base}/api/queues/default/challenge`);
  assert.equal(res.status, 200, 'a challenge is needed');
  const altcha = solve(await res.json());
  const joined = await fetch(`${base}/api/queues/default/entries`, { method: 'POST', headers: { 'X-Altcha': altcha } });
  assert.equal(joined.status, 201, await joined.text());
  // The same solution again is refused.
  const replay = await fetch(`${base}/api/queues/default/entries`, { method: 'POST', headers: { 'X-Altcha': altcha } });
  assert.equal(replay.status, 403);
  assert.equal((await replay.json()).error, 'challenge_replayed');
}

async function passedChallenges(adminBase) {
  const text = await (await fetch(`${adminBase}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith('waitroom_join_challenges_total{result="passed"}'));
  return line ? Number(line.split(' ').pop()) : 0;
}

test('with --join-challenge always the page checks the browser, joins, waits and reaches READY', { timeout: 120_000 }, async (t) => {
  // Admission is held while the page joins (however long its check takes,
  // it must wait behind the others), then resumed.
  const { server, browser } = await setup(t, {
    serverArgs: ['--join-challenge', 'always', '--admin-token', ADMIN],
  });
  const admin = (what) => fetch(`${server.admin}/api/admin/queues/default/${what}`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${ADMIN}` },
  });

  // Without a solution, a join is refused with where to get one.
  const bare = await fetch(`${server.base}/api/queues/default/entries`, { method: 'POST' });
  assert.equal(bare.status, 428);
  assert.deepEqual(
    { ...(await bare.json()), message: undefined },
    { error: 'challenge_required', challengeUrl: '/api/queues/default/challenge', message: undefined },
  );
  // Others are in line first, so the page has to wait.
  assert.equal((await admin('pause')).status, 200);
  for (let i = 0; i < 3; i += 1) await joinSolved(server.base);

  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  const consoleWatch = watchConsole(page);
  const violations = [];
  page.on('console', (msg) => {
    if (/Content.Security.Policy/i.test(msg.text())) violations.push(msg.text());
  });
  // The page document carries the strict CSP (added here if the server does not send one yet).
  await page.route(`${server.base}/`, async (route) => {
    const response = await route.fetch();
    const headers = { ...response.headers() };
    if (!headers['content-security-policy']) headers['content-security-policy'] = CSP;
    await route.fulfill({ response, headers });
  });
  // Hold the worker script back a little, so the check is seen on screen.
  let workerLoads = 0;
  await page.route('**/altcha-worker.js', async (route) => {
    workerLoads += 1;
    await sleep(1_500);
    await route.continue();
  });
  const requests = [];
  page.on('request', (req) => requests.push(`${req.method()} ${new URL(req.url()).pathname}`));

  await page.goto(`${server.base}/`);
  await page.waitForSelector('#challenge-progress', { timeout: 10_000 });
  assert.equal(await page.textContent('#joining-heading'), 'Checking your browser…');
  assert.equal(await page.getAttribute('#challenge-progress', 'aria-label'), 'Checking your browser');
  assert.equal(await page.getAttribute('#challenge-status', 'role'), 'status');
  assert.equal(await page.getAttribute('body', 'data-state'), 'joining');
  await screenshot(page, 'challenge-checking');

  await waitForState(page, 'waiting', 30_000);
  assert.equal(await page.$('#challenge-progress'), null, 'the check is gone once in line');
  const position = Number(await page.getAttribute('#position', 'data-position'));
  assert.equal(position, 4, 'behind the three others');
  await screenshot(page, 'challenge-waiting');
  assert.equal((await admin('resume')).status, 200);

  await waitForState(page, 'ready', 40_000);
  await screenshot(page, 'challenge-ready');

  assert.equal(workerLoads, 1, 'one worker solved one challenge');
  const order = requests.filter((r) => /\/api\/queues\/default\/(challenge|entries)$/.test(r));
  assert.deepEqual(order.slice(0, 2), ['GET /api/queues/default/challenge', 'POST /api/queues/default/entries']);
  assert.equal(await passedChallenges(server.admin), 4, 'three others and the page each passed the door once');
  assert.deepEqual(violations, [], 'no CSP violation');
  assertNoConsoleErrors(consoleWatch);
  await context.close();
});
