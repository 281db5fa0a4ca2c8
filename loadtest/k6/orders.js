// orders: admitted users buy; everyone else is turned away.
//
// Scenario `buyers`: BUYERS users join the queue (spread over SPREAD s), poll
// the position until READY (bounded by DURATION s and MAX_POLLS), then
// `POST /api/orders` with `X-User-Id` + `X-Entry-Token` and
// `{"productId": <first product of the queue>, "quantity": 1}` -> `201`, or
// `409 out_of_stock` once the stock is gone. Some buyers also try what must
// fail:
//   vu % 10 == 0  someone else's X-User-Id with the buyer's real token -> 401
//   vu % 10 == 1  two concurrent orders with one token -> at most one 201
//   vu % 10 == 2  a forged token for the buyer's own id first -> 401, then the
//                 real order must still work
// and after a 201 every buyer replays the spent token (-> 401) and reads the
// order back (own user -> 200, another user -> 4xx, no X-User-Id -> 4xx). After a 409
// out_of_stock the token must be kept: a retry is 409 again, not 401.
//
// Scenario `forgers`: ATTACK_RATE requests/s for ATTACK_SECONDS without a
// token, with a forged token, with an empty token, and without a token and
// with a bad body (token is checked before the body) -> all 401.
//
// `orders_without_token_accepted` counts every 2xx that came without a valid
// token of the requesting user; its threshold is count==0.
//
//   k6 run -e BASE_URL=http://127.0.0.1:8080 loadtest/k6/orders.js
//
// env: BASE_URL, QUEUE (default), PRODUCT_ID (first product of QUEUE),
//      BUYERS (1200), SPREAD (5), DURATION (40, polling deadline), MAX_POLLS (200),
//      ATTACK_RATE (50/s), ATTACK_SECONDS (20), ORDER_P95_MS (100),
//      ORDER_P99_MS (250), P95_MS (50, other requests), MAX_FAILED (0.01),
//      MIN_CHECKS (0.99), MIN_ADMITTED (0.95), RESULTS_DIR.
//
// The defaults are sized for the demo product (1,000 in stock) and the default
// admission (50/s): 1,200 buyers arrive at 240/s, so most of them wait in
// line, and the last ~200 find the product sold out. The product must have
// stock left: restart the server with a fresh --orders-db between runs.

import http from 'k6/http';
import { check, sleep } from 'k6';
import exec from 'k6/execution';
import { Counter, Gauge, Rate } from 'k6/metrics';
import {
  BASE_URL, QUEUE, SUMMARY_TREND_STATS, enter, envInt, envNum, forgedToken, json, newRunId, params,
  position, requireServer, stat, summarize, userId,
} from './common.js';

const BUYERS = envInt('BUYERS', 1200);
const SPREAD = envNum('SPREAD', 5);
const DURATION = envNum('DURATION', 40);
const MAX_POLLS = envInt('MAX_POLLS', 200);
const ATTACK_RATE = envInt('ATTACK_RATE', 50);
const ATTACK_SECONDS = envNum('ATTACK_SECONDS', 20);
const ORDER_P95_MS = envNum('ORDER_P95_MS', 100);
const ORDER_P99_MS = envNum('ORDER_P99_MS', 250);
const P95_MS = envNum('P95_MS', 50);
const MAX_FAILED = envNum('MAX_FAILED', 0.01);
const MIN_CHECKS = envNum('MIN_CHECKS', 0.99);
const MIN_ADMITTED = envNum('MIN_ADMITTED', 0.95);

if (BUYERS < 1 || SPREAD < 0 || SPREAD >= DURATION || ATTACK_RATE < 0 || ATTACK_SECONDS < 0) {
  throw new Error('need BUYERS >= 1, 0 <= SPREAD < DURATION, ATTACK_RATE >= 0, ATTACK_SECONDS >= 0');
}

const ordersCreated = new Counter('orders_created');
const ordersOutOfStock = new Counter('orders_out_of_stock');
const ordersUnexpected = new Counter('orders_unexpected_answer');
const withoutTokenAccepted = new Counter('orders_without_token_accepted');
const tokenReuseAccepted = new Counter('orders_token_reuse_accepted');
const tokenLostAfterRollback = new Counter('token_lost_after_rollback');
const orderVisibleToOther = new Counter('order_visible_to_other_user');
const buyersAdmitted = new Rate('buyers_admitted');
// How the losing order of a concurrent same-token pair was refused.
const pairLoser = {
  token_in_use: new Counter('concurrent_loser_409_token_in_use'),
  out_of_stock: new Counter('concurrent_loser_409_out_of_stock'),
  spent: new Counter('concurrent_loser_401'),
};
const stockBeforeG = new Gauge('stock_before');
const stockAfterG = new Gauge('stock_after');
const stockNegative = new Counter('stock_negative');
const stockSold = new Counter('stock_sold');

const scenarios = {
  buyers: {
    executor: 'per-vu-iterations',
    exec: 'buyer',
    vus: BUYERS,
    iterations: 1,
    maxDuration: `${Math.ceil(DURATION + 10)}s`,
    gracefulStop: '5s',
  },
};
if (ATTACK_RATE > 0 && ATTACK_SECONDS > 0) {
  scenarios.forgers = {
    executor: 'constant-arrival-rate',
    exec: 'forger',
    rate: ATTACK_RATE,
    timeUnit: '1s',
    duration: `${Math.ceil(ATTACK_SECONDS)}s`,
    preAllocatedVUs: Math.max(10, Math.ceil(ATTACK_RATE / 4)),
    maxVUs: Math.max(20, ATTACK_RATE),
    gracefulStop: '5s',
  };
}

export const options = {
  scenarios,
  thresholds: {
    http_req_failed: [`rate<${MAX_FAILED}`],
    'http_req_duration{name:order}': [`p(95)<${ORDER_P95_MS}`, `p(99)<${ORDER_P99_MS}`],
    'http_req_duration{name:order_rejected}': [`p(95)<${P95_MS}`],
    'http_req_duration{name:position}': [`p(95)<${P95_MS}`],
    checks: [`rate>${MIN_CHECKS}`],
    orders_created: ['count>0'],
    orders_without_token_accepted: ['count==0'],
    orders_token_reuse_accepted: ['count==0'],
    order_visible_to_other_user: ['count==0'],
    token_lost_after_rollback: ['count==0'],
    stock_negative: ['count==0'],
    buyers_admitted: [`rate>=${MIN_ADMITTED}`],
  },
  summaryTrendStats: SUMMARY_TREND_STATS,
  setupTimeout: '20s',
  teardownTimeout: '10s',
};

function products() {
  const res = http.get(`${BASE_URL}/api/products`, params('products', {}, [200]));
  const list = json(res);
  if (res.status !== 200 || !Array.isArray(list)) {
    throw new Error(`GET /api/products -> ${res.status}: ${String(res.body).slice(0, 200)}`);
  }
  return list;
}

function pickProduct(list, id) {
  if (id !== undefined && id !== null && id !== '') return list.find((p) => String(p.id) === String(id));
  return list.find((p) => p.queue === QUEUE);
}

export function setup() {
  requireServer();
  const list = products();
  const p = pickProduct(list, __ENV.PRODUCT_ID);
  if (!p) throw new Error(`no product of queue "${QUEUE}" in GET /api/products: ${JSON.stringify(list).slice(0, 300)}`);
  const shapeOk = ['id', 'name', 'queue', 'priceCents', 'stock'].every((k) => k in p);
  if (!shapeOk) console.warn(`product lacks a contract field: ${JSON.stringify(p)}`);
  if (!(p.stock > 0)) {
    throw new Error(`product ${p.id} has no stock left (${p.stock}); restart the server with a fresh --orders-db`);
  }
  return { runId: newRunId(), productId: p.id, productName: p.name, stockBefore: p.stock };
}

// One POST /api/orders. `token` null = no X-Entry-Token header at all.
function order(uid, token, body, name, expected) {
  const headers = { 'Content-Type': 'application/json' };
  if (uid !== null) headers['X-User-Id'] = uid;
  if (token !== null) headers['X-Entry-Token'] = token;
  return {
    method: 'POST',
    url: `${BASE_URL}/api/orders`,
    body: typeof body === 'string' ? body : JSON.stringify(body),
    params: params(name, headers, expected),
  };
}

function send(req) {
  return http.request(req.method, req.url, req.body, req.params);
}

const is2xx = (r) => r.status >= 200 && r.status < 300;
const errCode = (r) => { const b = json(r); return b && b.error; };

// Enter, then poll until READY. Returns the entry token or null.
function admit(uid) {
  const deadline = exec.scenario.startTime + DURATION * 1000;
  const e = enter(uid);
  check(e.res, { 'enter: 201 + ticket': (r) => r.status === 201 && !!e.body && !!e.body.ticket });
  if (!e.body || !e.body.ticket) return null;
  let last = e.body;
  for (let polls = 0; last.status === 'WAITING' && polls < MAX_POLLS; polls++) {
    const left = deadline - Date.now();
    if (left <= 0) break;
    sleep(Math.min(last.pollingIntervalSeconds > 0 ? last.pollingIntervalSeconds : 1, left / 1000));
    if (Date.now() >= deadline) break;
    const p = position(uid, e.body.ticket);
    check(p.res, { 'position: 200': (r) => r.status === 200 });
    if (p.res.status === 200 && p.body) last = p.body;
    else if (p.res.status === 401) break;
  }
  return last.status === 'READY' && last.entryToken ? last.entryToken : null;
}

export function buyer(data) {
  sleep(((exec.vu.idInTest - 1) / BUYERS) * SPREAD);
  const uid = userId(data.runId);
  const token = admit(uid);
  buyersAdmitted.add(token !== null);
  if (token === null) return;

  const body = { productId: data.productId, quantity: 1 };
  const variant = exec.vu.idInTest % 10;

  if (variant === 0) {
    // A stolen token: the buyer's real token under someone else's id.
    const r = send(order(`${uid}-thief`, token, body, 'order_rejected', [401]));
    if (is2xx(r)) withoutTokenAccepted.add(1);
    check(r, { 'stolen token (other X-User-Id): 401': (x) => x.status === 401 });
  } else if (variant === 2) {
    const r = send(order(uid, forgedToken(), body, 'order_rejected', [401]));
    if (is2xx(r)) withoutTokenAccepted.add(1);
    check(r, { 'forged token for a READY user: 401 invalid_token': (x) => x.status === 401 && errCode(x) === 'invalid_token' });
  }

  let res;
  if (variant === 1) {
    // Two orders with one token at the same moment: one may win, never both.
    const answers = http.batch([
      order(uid, token, body, 'order', [201, 401, 409]),
      order(uid, token, body, 'order', [201, 401, 409]),
    ]);
    const wins = answers.filter((r) => r.status === 201).length;
    if (wins > 1) tokenReuseAccepted.add(wins - 1);
    if (wins === 1) {
      const loser = answers.find((r) => r.status !== 201);
      if (loser.status === 401) pairLoser.spent.add(1);
      else if (loser.status === 409 && pairLoser[errCode(loser)]) pairLoser[errCode(loser)].add(1);
    }
    check(answers, {
      'concurrent same-token orders: at most one 201': () => wins <= 1,
      'concurrent same-token orders: loser gets 409 token_in_use/out_of_stock or 401': (a) => a.every(
        (r) => r.status === 201 || r.status === 401 || (r.status === 409 && ['token_in_use', 'out_of_stock'].includes(errCode(r)))),
    });
    res = answers.find((r) => r.status === 201) || answers.find((r) => r.status === 409 && errCode(r) === 'out_of_stock') || answers[0];
  } else {
    res = send(order(uid, token, body, 'order', [201, 409]));
  }

  const created = res.status === 201;
  const soldOut = res.status === 409 && errCode(res) === 'out_of_stock';
  if (created) ordersCreated.add(1);
  else if (soldOut) ordersOutOfStock.add(1);
  else ordersUnexpected.add(1);
  check(res, { 'order: 201 or 409 out_of_stock': () => created || soldOut });

  if (created) {
    const b = json(res);
    check(res, { 'order: 201 body has orderId': () => !!b && b.orderId !== undefined && b.orderId !== null });
    // The token is spent: using it again must be refused.
    const again = send(order(uid, token, body, 'order_rejected', [401]));
    if (is2xx(again)) tokenReuseAccepted.add(1);
    check(again, { 'spent token: 401 invalid_token': (r) => r.status === 401 && errCode(r) === 'invalid_token' });

    if (b && b.orderId !== undefined && b.orderId !== null) {
      const url = `${BASE_URL}/api/orders/${encodeURIComponent(b.orderId)}`;
      const own = http.get(url, params('order_get', { 'X-User-Id': uid }, [200]));
      check(own, { 'GET own order: 200': (r) => r.status === 200 });
      // Order ids are 128-bit random capabilities; with an X-User-Id (which
      // the auth gateway always sets in production) only the owner reads it.
      const other = http.get(url, params('order_get_other', { 'X-User-Id': `${uid}-other` }, [401, 403, 404]));
      if (is2xx(other)) orderVisibleToOther.add(1);
      check(other, { "GET someone else's order: 4xx": (r) => r.status >= 400 && r.status < 500 });
    }
  } else if (soldOut) {
    // Rolled back: the token is kept, so a retry is judged on stock again.
    const retry = send(order(uid, token, body, 'order', [201, 409]));
    if (retry.status === 401) tokenLostAfterRollback.add(1);
    if (retry.status === 201) ordersCreated.add(1);
    check(retry, { 'after out_of_stock the token is kept (retry not 401)': (r) => r.status !== 401 });
  }
}

export function forger(data) {
  const uid = userId(data.runId, 'f');
  const body = { productId: data.productId, quantity: 1 };
  let req;
  let want;
  switch (exec.scenario.iterationInTest % 4) {
    case 0:
      req = order(uid, null, body, 'order_rejected', [401]);
      want = ['missing_token'];
      break;
    case 1:
      req = order(uid, forgedToken(), body, 'order_rejected', [401]);
      want = ['invalid_token'];
      break;
    case 2:
      req = order(uid, '', body, 'order_rejected', [401]);
      want = ['missing_token', 'invalid_token'];
      break;
    default:
      // Bad body and no token: the token is checked first, so 401, not 400.
      req = order(uid, null, '{"productId": ', 'order_rejected', [401]);
      want = ['missing_token'];
  }
  const r = send(req);
  if (is2xx(r)) withoutTokenAccepted.add(1);
  check(r, {
    'no/forged token: 401': (x) => x.status === 401,
    'no/forged token: error code': (x) => want.includes(errCode(x)),
  });
}

export function teardown(data) {
  stockBeforeG.add(data.stockBefore);
  const p = pickProduct(products(), data.productId);
  if (!p) return;
  stockAfterG.add(p.stock);
  if (p.stock < 0) stockNegative.add(1);
  stockSold.add(data.stockBefore - p.stock);
}

export function handleSummary(data) {
  const created = stat(data, 'orders_created', 'count') || 0;
  const sold = stat(data, 'stock_sold', 'count');
  const figures = {
    product_id: data.setup_data ? data.setup_data.productId : null,
    buyers: BUYERS,
    buyers_admitted_rate: stat(data, 'buyers_admitted', 'rate'),
    orders_created: created,
    orders_out_of_stock: stat(data, 'orders_out_of_stock', 'count') || 0,
    orders_unexpected_answer: stat(data, 'orders_unexpected_answer', 'count') || 0,
    orders_without_token_accepted: stat(data, 'orders_without_token_accepted', 'count') || 0,
    orders_token_reuse_accepted: stat(data, 'orders_token_reuse_accepted', 'count') || 0,
    order_visible_to_other_user: stat(data, 'order_visible_to_other_user', 'count') || 0,
    token_lost_after_rollback: stat(data, 'token_lost_after_rollback', 'count') || 0,
    concurrent_loser_409_token_in_use: stat(data, 'concurrent_loser_409_token_in_use', 'count') || 0,
    concurrent_loser_401: stat(data, 'concurrent_loser_401', 'count') || 0,
    rejected_requests: stat(data, 'http_req_duration{name:order_rejected}', 'count') || 0,
    stock_before: stat(data, 'stock_before', 'value'),
    stock_after: stat(data, 'stock_after', 'value'),
    stock_sold: sold,
    stock_sold_matches_orders_created: sold === null ? null : sold === created,
    order_p50_ms: stat(data, 'http_req_duration{name:order}', 'med'),
    order_p95_ms: stat(data, 'http_req_duration{name:order}', 'p(95)'),
    order_p99_ms: stat(data, 'http_req_duration{name:order}', 'p(99)'),
    rejected_p95_ms: stat(data, 'http_req_duration{name:order_rejected}', 'p(95)'),
    position_p95_ms: stat(data, 'http_req_duration{name:position}', 'p(95)'),
    http_req_failed_rate: stat(data, 'http_req_failed', 'rate'),
    checks_rate: stat(data, 'checks', 'rate'),
  };
  return summarize('orders', data, figures, {
    baseUrl: BASE_URL, queue: QUEUE, buyers: BUYERS, spreadSeconds: SPREAD, durationSeconds: DURATION,
    attackRate: ATTACK_RATE, attackSeconds: ATTACK_SECONDS, orderP95Ms: ORDER_P95_MS, orderP99Ms: ORDER_P99_MS,
  });
}
