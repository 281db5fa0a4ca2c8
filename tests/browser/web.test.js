// The page against what browsers enforce and what other pages try: the whole
// flow under the server's own Content-Security-Policy with no violation,
// no frame renders it, a sibling origin (same site, another port) can
// neither take the buyer's stream nor act for them, the ticket is never
// kept where scripts can read it, the used-pass view never flashes before
// the confirmation, and the page works below a base path.

import assert from 'node:assert/strict';
import http from 'node:http';
import { test } from 'node:test';
import {
  assertNoConsoleErrors,
  orderFirstProduct,
  prefill,
  setup,
  waitForState,
  watchConsole,
} from './lib/harness.js';

/**
 * Record, from the first script on, every CSP violation, every view the
 * page shows (body[data-state] and the ended view's reason) and every
 * screen-reader announcement.
 */
async function instrument(context) {
  await context.addInitScript(() => {
    window.__violations = [];
    window.__views = [];
    window.__announced = [];
    document.addEventListener('securitypolicyviolation', (e) => {
      window.__violations.push(`${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`);
    });
    const watch = () => {
      const view = () => {
        const state = document.body.dataset.state;
        const ended = document.getElementById('view-ended');
        const shown = state === 'ended' ? `ended:${ended?.dataset.reason ?? ''}` : state;
        if (window.__views.at(-1) !== shown) window.__views.push(shown);
      };
      view();
      new MutationObserver(view).observe(document.body, { attributes: true, subtree: true, attributeFilter: ['data-state', 'hidden', 'data-reason'] });
      const announcer = document.getElementById('announcer');
      new MutationObserver(() => {
        if (announcer.textContent) window.__announced.push(announcer.textContent);
      }).observe(announcer, { childList: true, characterData: true, subtree: true });
    };
    if (document.body) watch();
    else document.addEventListener('DOMContentLoaded', watch);
  });
}

/** Every value the page's storage holds, from the page itself. */
function storedValues(page) {
  return page.evaluate(() => {
    const all = [];
    for (const area of [localStorage, sessionStorage]) {
      for (let i = 0; i < area.length; i += 1) all.push(area.getItem(area.key(i)));
    }
    return all;
  });
}

/** A page on another port of the same host: a sibling origin of the same site. */
async function siblingSite(html) {
  const server = http.createServer((req, res) => {
    res.writeHead(200, { 'content-type': 'text/html' });
    res.end(html);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { base: `http://127.0.0.1:${server.address().port}`, close: () => new Promise((r) => server.close(r)) };
}

test('the whole flow runs under the server CSP: no violation, no stored ticket, no flash of the used pass', { timeout: 90_000 }, async (t) => {
  const { server, browser } = await setup(t);
  await prefill(server.base, 3);
  const context = await browser.newContext();
  await instrument(context);
  const page = await context.newPage();
  const consoleWatch = watchConsole(page);

  const response = await page.goto(`${server.base}/`);
  const csp = response.headers()['content-security-policy'];
  assert.match(csp, /default-src 'none'/);
  assert.match(csp, /frame-ancestors 'none'/);
  assert.equal(response.headers()['x-frame-options'], 'DENY');

  await waitForState(page, 'ready', 40_000);
  // The stream is open, so the order's `gone: consumed` comes over it,
  // racing the order's own answer.
  await page.waitForResponse((r) => r.url().endsWith('/events'), { timeout: 5_000 }).catch(() => {});

  // The ticket exists (in its cookie) and nowhere a script could read it.
  const ticket = (await context.cookies()).find((c) => c.name === 'waitroom_ticket');
  assert.ok(ticket && ticket.httpOnly, 'the ticket cookie is HttpOnly');
  const stored = await storedValues(page);
  assert.ok(!stored.some((v) => v && v.includes(ticket.value)), `no storage holds the ticket: ${stored}`);
  assert.equal(await page.evaluate(() => document.cookie.includes('waitroom_ticket')), false);

  await orderFirstProduct(page);
  // Let a late `gone: consumed` arrive, if it is to change anything.
  await page.waitForTimeout(1_000);
  assert.equal(await page.evaluate(() => document.body.dataset.state), 'confirmed');
  const views = await page.evaluate(() => window.__views);
  assert.ok(!views.some((v) => v.startsWith('ended')), `the used-pass view never showed: ${views.join(' → ')}`);
  const announced = await page.evaluate(() => window.__announced);
  assert.ok(!announced.some((a) => /has been used/i.test(a)), `never announced as used: ${announced}`);

  // After the order, still nothing stored holds the ticket.
  const after = await storedValues(page);
  assert.ok(!after.some((v) => v && v.includes(ticket.value)));
  assert.deepEqual(await page.evaluate(() => window.__violations), [], 'no CSP violation');
  assertNoConsoleErrors(consoleWatch);
});

test('a frame on a sibling origin does not render the page', { timeout: 60_000 }, async (t) => {
  const { server, browser } = await setup(t);
  const sibling = await siblingSite(`<!doctype html><iframe id="f" src="${server.base}/" width="800" height="600"></iframe>`);
  t.after(() => sibling.close());
  const context = await browser.newContext();
  const page = await context.newPage();
  const joins = [];
  page.on('request', (req) => {
    if (req.method() === 'POST') joins.push(req.url());
  });
  await page.goto(`${sibling.base}/`);
  await page.waitForTimeout(2_000);
  const frame = page.frames().find((f) => f !== page.mainFrame());
  assert.ok(frame, 'the frame element exists');
  const rendered = await frame.evaluate(() => Boolean(document.getElementById('main'))).catch(() => false);
  assert.equal(rendered, false, `the framed page did not render (frame at ${frame.url()})`);
  assert.deepEqual(joins, [], 'nothing ran in the frame: no join');
});

test('a sibling origin can neither take the buyer stream nor leave for them', { timeout: 60_000 }, async (t) => {
  const { server, browser } = await setup(t, { serverArgs: ['--admission-interval-ms', '600000'] });
  await prefill(server.base, 3);
  const sibling = await siblingSite('<!doctype html><title>sibling</title>');
  t.after(() => sibling.close());
  const context = await browser.newContext();
  const page = await context.newPage();
  const consoleWatch = watchConsole(page);
  await page.goto(`${server.base}/`);
  await page.waitForSelector('body[data-state="waiting"] #conn[data-mode="live"]', { timeout: 10_000 });
  const position = await page.getAttribute('#position', 'data-position');

  // Same browser, so the same cookies (cookies do not tell ports apart).
  const attacker = await context.newPage();
  await attacker.goto(`${sibling.base}/`);
  const outcome = await attacker.evaluate(async (base) => {
    const stream = await new Promise((resolve) => {
      const es = new EventSource(`${base}/api/queues/default/events`, { withCredentials: true });
      es.onopen = () => resolve('opened');
      es.onerror = () => {
        resolve(es.readyState === EventSource.CLOSED ? 'refused' : 'retrying');
        es.close();
      };
      setTimeout(() => resolve('no answer'), 5_000);
    });
    // A credentialed leave and join: the answers are opaque here, what
    // counts is that the server changed nothing.
    await fetch(`${base}/api/queues/default/entries/me`, { method: 'DELETE', credentials: 'include', mode: 'no-cors' }).catch(() => {});
    await fetch(`${base}/api/queues/default/entries`, { method: 'POST', credentials: 'include', mode: 'no-cors' }).catch(() => {});
    return stream;
  }, server.base);
  assert.notEqual(outcome, 'opened', 'the sibling got no stream');

  // The buyer's page stays live, in the same place.
  await page.waitForTimeout(2_000);
  assert.equal(await page.evaluate(() => document.body.dataset.state), 'waiting');
  assert.equal(await page.getAttribute('#conn', 'data-mode'), 'live');
  assert.equal(await page.isHidden('#elsewhere'), true, 'the stream was not replaced');
  assert.equal(await page.getAttribute('#position', 'data-position'), position);
  assertNoConsoleErrors(consoleWatch);
});

test('below a base path the page joins, streams and orders', { timeout: 90_000 }, async (t) => {
  const { server, browser } = await setup(t, { serverArgs: ['--base-path', '/shop'] });
  const context = await browser.newContext();
  await instrument(context);
  const page = await context.newPage();
  const consoleWatch = watchConsole(page);
  const streams = [];
  page.on('request', (req) => {
    if (new URL(req.url()).pathname.endsWith('/events')) streams.push(new URL(req.url()).pathname);
  });
  // `/shop` redirects to `/shop/`, where the page's relative URLs resolve.
  await page.goto(`${server.base}/shop`);
  assert.equal(new URL(page.url()).pathname, '/shop/');
  await page.waitForSelector('#conn[data-mode="live"]', { state: 'attached', timeout: 15_000 });
  assert.deepEqual([...new Set(streams)], ['/shop/api/queues/default/events']);
  const ticket = (await context.cookies()).find((c) => c.name === 'waitroom_ticket');
  assert.equal(ticket.path, '/shop/api/queues/default');
  await waitForState(page, 'ready', 30_000);
  await orderFirstProduct(page);
  assert.deepEqual(await page.evaluate(() => window.__violations), []);
  assertNoConsoleErrors(consoleWatch);
});
