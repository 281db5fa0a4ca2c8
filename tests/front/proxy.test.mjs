// The built-in reverse proxy (`--origin`) in real Chromium, in front of
// the shop of origin.mjs, which logs every request it receives:
// a visitor asks for /product/42?size=9, waits on the waiting page, is
// admitted, lands back on exactly /product/42?size=9 and browses; a second
// visitor waits behind and gets in; a third, with JavaScript off, waits on
// the server-rendered page and its meta refresh and gets in too. Then, one
// at a time (maxActive 1, a short idle time): a visitor browsing keeps the
// only slot while the next waits; gone idle, the slot is freed, the next
// visitor gets in and the idle one's pass is refused. The shop's log
// proves that no request without a pass reached it.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { setup, watchConsole, assertNoConsoleErrors, screenshot } from '../browser/lib/harness.js';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ADMIN = 'front-test-admin-token-0123456789';

async function startShop(t) {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'waitroom-shop-'));
  const log = path.join(dir, 'requests.jsonl');
  const child = spawn(process.execPath, [path.join(HERE, 'origin.mjs'), '--port', '0', '--log', log], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  t.after(() => child.kill('SIGKILL'));
  const first = await new Promise((resolve, reject) => {
    createInterface({ input: child.stdout }).once('line', resolve);
    child.once('exit', () => reject(new Error('the shop exited')));
  });
  const { listening } = JSON.parse(first);
  return {
    origin: `http://127.0.0.1:${listening}`,
    requests() {
      let text = '';
      try { text = readFileSync(log, 'utf8'); } catch { return []; }
      return text.split('\n').filter(Boolean).map((line) => JSON.parse(line));
    },
  };
}

async function admin(server, action) {
  const res = await fetch(`${server.admin}/api/admin/queues/default/${action}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${ADMIN}` },
  });
  assert.ok(res.ok, `${action}: ${res.status}`);
}

test('a visitor waits at the URL they asked, is let in and lands back on it; the shop sees only pass holders', async (t) => {
  const shop = await startShop(t);
  const { server, browser } = await setup(t, {
    serverArgs: ['--origin', shop.origin, '--admin-token', ADMIN, '--identity', 'visitor'],
  });
  await admin(server, 'pause');

  const first = await browser.newContext();
  const ann = await first.newPage();
  // The shop has no favicon: Chromium's ask for one is the shop's 404.
  const annConsole = watchConsole(ann, { allow: (e) => e.url.endsWith('/favicon.ico') });
  await ann.goto(`${server.base}/product/42?size=9`);
  // The waiting page, in place of the product, at the same URL.
  await ann.waitForSelector('body[data-state="waiting"]', { timeout: 20_000 });
  assert.equal(new URL(ann.url()).pathname + new URL(ann.url()).search, '/product/42?size=9');
  await screenshot(ann, 'front-waiting');

  // A second visitor, behind.
  const second = await browser.newContext();
  const bob = await second.newPage();
  await bob.goto(`${server.base}/product/7`);
  await bob.waitForSelector('body[data-state="waiting"]', { timeout: 20_000 });

  // A third, without JavaScript: the place is in the HTML.
  const third = await browser.newContext({ javaScriptEnabled: false });
  const cy = await third.newPage();
  await cy.goto(`${server.base}/product/9?colour=red`);
  const status = await cy.textContent('#front-status');
  assert.match(status, /number 3/, status);
  const refresh = await cy.getAttribute('meta[http-equiv="refresh"]', 'content');
  assert.ok(Number(refresh) >= 2 && Number(refresh) <= 5, `refresh ${refresh}`);
  assert.equal(shop.requests().length, 0, 'nobody reached the shop while the queue was held');

  await admin(server, 'resume');
  // Let in (one a pass: --admission-batch 1 every 700 ms), back on the URL asked.
  await ann.waitForSelector('#product[data-id="42"]', { timeout: 30_000 });
  assert.equal(new URL(ann.url()).pathname + new URL(ann.url()).search, '/product/42?size=9');
  assert.equal(await ann.textContent('#query'), 'size=9');
  await screenshot(ann, 'front-admitted');
  // Browses several pages of the shop.
  for (const next of ['43', '44', '45']) {
    await ann.click(`a.product-link[href="/product/${next}"]`);
    await ann.waitForSelector(`#product[data-id="${next}"]`, { timeout: 10_000 });
  }
  await bob.waitForSelector('#product[data-id="7"]', { timeout: 30_000 });
  // Without scripts, the meta refresh brings the visitor in.
  await cy.waitForSelector('#product[data-id="9"]', { timeout: 45_000 });
  assert.equal(new URL(cy.url()).search, '?colour=red');
  assertNoConsoleErrors(annConsole);

  const seen = shop.requests();
  assert.ok(seen.length >= 6, JSON.stringify(seen));
  for (const request of seen) {
    assert.ok(request.cookies.includes('waitroom_pass'), `reached the shop without a pass: ${JSON.stringify(request)}`);
    assert.ok(!request.path.startsWith('/_waitroom'), `a reserved path was forwarded: ${request.path}`);
  }
  assert.deepEqual(
    seen.filter((r) => r.path.startsWith('/product/42')).map((r) => r.path).slice(0, 1),
    ['/product/42?size=9'],
  );
});

test('one at a time: a browsing visitor keeps the slot, gone idle frees it, and the next gets in', async (t) => {
  const shop = await startShop(t);
  const { server, browser } = await setup(t, {
    serverArgs: [
      '--origin', shop.origin, '--admin-token', ADMIN, '--identity', 'visitor',
      '--max-active', '1', '--session-idle-secs', '5', '--session-max-secs', '120',
    ],
  });
  const ann = await (await browser.newContext()).newPage();
  await ann.goto(`${server.base}/product/100?who=ann`);
  await ann.waitForSelector('#product[data-id="100"]', { timeout: 30_000 });

  const bob = await (await browser.newContext()).newPage();
  await bob.goto(`${server.base}/product/7?who=bob`);
  await bob.waitForSelector('body[data-state="waiting"]', { timeout: 20_000 });

  // Ann browses for twice the idle time: the slot stays hers, Bob waits.
  const started = Date.now();
  let at = 100;
  while (Date.now() - started < 10_000) {
    at += 1;
    await ann.click(`a.product-link[href="/product/${at}"]`);
    await ann.waitForSelector(`#product[data-id="${at}"]`, { timeout: 10_000 });
    await ann.waitForTimeout(400);
  }
  assert.equal(await bob.getAttribute('body', 'data-state'), 'waiting');
  const bobSeen = () => shop.requests().filter((r) => r.path.startsWith('/product/7'));
  assert.equal(bobSeen().length, 0, 'bob reached the shop while the room was full');

  // Ann goes idle: her session ends, its slot goes to Bob, who lands on
  // exactly the URL he asked for.
  await bob.waitForSelector('#product[data-id="7"]', { timeout: 30_000 });
  assert.equal(new URL(bob.url()).search, '?who=bob');
  await screenshot(bob, 'front-idle-slot-freed');
  // Bob keeps browsing (reloads) while Ann is checked, so his session
  // cannot go idle on a slow machine and hand the slot back to Ann.
  let checking = true;
  const keepBob = (async () => {
    while (checking) {
      await bob.reload();
      await bob.waitForSelector('#product[data-id="7"]', { timeout: 10_000 });
      await bob.waitForTimeout(1_000);
    }
  })();
  // Ann's pass is refused: her next click is the waiting page, not the shop.
  const annSeen = shop.requests().filter((r) => /^\/product\/1\d\d/.test(r.path)).length;
  await ann.click(`a.product-link[href="/product/${at + 1}"]`);
  await ann.waitForSelector('body[data-state="waiting"]', { timeout: 20_000 });
  assert.equal(shop.requests().filter((r) => /^\/product\/1\d\d/.test(r.path)).length, annSeen);
  checking = false;
  await keepBob;

  for (const request of shop.requests()) {
    assert.ok(request.cookies.includes('waitroom_pass'), `reached the shop without a pass: ${JSON.stringify(request)}`);
    assert.ok(!request.path.startsWith('/_waitroom'), `a reserved path was forwarded: ${request.path}`);
  }
  assert.ok(bobSeen().length >= 1, JSON.stringify(shop.requests()));
});
