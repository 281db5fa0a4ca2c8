#!/usr/bin/env node
// A small shop that knows nothing of waitroom: the unmodified origin the
// front tests (the built-in proxy, nginx auth_request, Caddy forward_auth)
// put waitroom in front of. Node's standard library only.
//
//   node tests/front/origin.mjs --port 0 --log /tmp/origin.jsonl
//   ORIGIN_PORT=3000 ORIGIN_LOG=/tmp/origin.jsonl node tests/front/origin.mjs
//
// On start it prints one JSON line to stdout: {"listening":PORT}.
//
// Every request it receives (the WebSocket handshake too) is one JSON line
// in the log file: time, method, path with query, Host, the X-Forwarded-*
// and Forwarded headers, the names (never the values) of its cookies,
// whether it carried Authorization, and "upgrade":"websocket" for a
// WebSocket handshake. The test reads that file to prove what reached the
// shop and what did not. Requests to the shop's own control paths
// (/__origin/…, which a test calls directly on the shop's port) are not
// logged, so the log holds only what came through the front.
//
// Pages:
//   GET  /                      the home page, links to products
//   GET  /product/:id           a product page (its id and query in the HTML, links to other products)
//   GET  /headers               the request's headers as JSON
//   GET  /stream?chunks=N&ms=M  a chunked body that trickles: N chunks, M ms apart
//   POST /echo                  the request body streamed back as it arrives
//   GET  /slow?ms=M             answers after M ms
//   GET  /ws (Upgrade)          a WebSocket echo (text and binary frames, ping, close)
//   OPTIONS *                   204 with Allow
//   GET  /__origin/stats        the shop's own count of sessions (below), not logged
//   POST /__origin/reset        forgets sessions and counters, not logged
//
// Sessions: a session is named by a cookie (--session-cookie, default
// shop_sid; the shop sets shop_sid itself on a request without it). A
// session is concurrent while it made a request within the last
// --session-window-ms (default 5000). /__origin/stats reports the current
// and the peak number of concurrent sessions, the total, and each
// session's first request time (arrivals), so a benchmark can check a
// room's maxActive and admission rate from the shop's side.

import { createHash, randomBytes } from 'node:crypto';
import { openSync, writeSync } from 'node:fs';
import http from 'node:http';
import { parseArgs } from 'node:util';

const { values: opts } = parseArgs({
  options: {
    port: { type: 'string', default: process.env.ORIGIN_PORT ?? '0' },
    host: { type: 'string', default: process.env.ORIGIN_HOST ?? '127.0.0.1' },
    log: { type: 'string', default: process.env.ORIGIN_LOG ?? '' },
    'session-cookie': { type: 'string', default: process.env.ORIGIN_SESSION_COOKIE ?? 'shop_sid' },
    'session-window-ms': { type: 'string', default: process.env.ORIGIN_SESSION_WINDOW_MS ?? '5000' },
  },
});

const SESSION_COOKIE = opts['session-cookie'];
const SESSION_WINDOW_MS = Number(opts['session-window-ms']);
const OWN_COOKIE = 'shop_sid';
const logFd = opts.log ? openSync(opts.log, 'a') : null;

function record(entry) {
  if (logFd === null) return;
  // One write per line: lines from concurrent requests never interleave.
  writeSync(logFd, `${JSON.stringify(entry)}\n`);
}

function cookiesOf(req) {
  const jar = new Map();
  const header = req.headers.cookie;
  if (!header) return jar;
  for (const part of header.split(';')) {
    const eq = part.indexOf('=');
    if (eq <= 0) continue;
    jar.set(part.slice(0, eq).trim(), part.slice(eq + 1).trim());
  }
  return jar;
}

function forwardedHeaders(req) {
  const out = {};
  for (const [name, value] of Object.entries(req.headers)) {
    if (name.startsWith('x-forwarded-') || name === 'forwarded' || name === 'x-real-ip') {
      out[name] = value;
    }
  }
  return out;
}

// --- sessions -------------------------------------------------------------

const sessions = new Map(); // id -> { first, last }
let peak = 0;
let peakAt = 0;
let requests = 0;

function prune(now) {
  for (const [id, s] of sessions) {
    if (now - s.last > SESSION_WINDOW_MS) sessions.delete(id);
  }
}

const everSeen = new Map(); // id -> first request time (ms), kept until reset

function touchSession(id, now) {
  if (!id) return;
  prune(now);
  const s = sessions.get(id);
  if (s) {
    s.last = now;
  } else {
    sessions.set(id, { first: now, last: now });
    if (!everSeen.has(id)) everSeen.set(id, now);
  }
  if (sessions.size > peak) {
    peak = sessions.size;
    peakAt = now;
  }
}

function stats(withArrivals) {
  const now = Date.now();
  prune(now);
  const body = {
    requests,
    sessionCookie: SESSION_COOKIE,
    sessionWindowMs: SESSION_WINDOW_MS,
    current: sessions.size,
    peak,
    peakAt,
    total: everSeen.size,
  };
  if (withArrivals) body.arrivals = [...everSeen.values()].sort((a, b) => a - b);
  return body;
}

// --- pages ----------------------------------------------------------------

function page(title, body) {
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>${title}</title></head>
<body><header><a href="/">Tiny Shop</a></header>
<main>${body}</main></body></html>
`;
}

function escapeHtml(s) {
  return s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function productPage(id, query) {
  const n = Number.parseInt(id, 10);
  const others = Number.isFinite(n) ? [n + 1, n + 2, n + 3] : [1, 2, 3];
  const links = others.map((o) => `<li><a class="product-link" href="/product/${o}">Product ${o}</a></li>`).join('');
  return page(
    `Product ${escapeHtml(id)}`,
    `<h1 id="product" data-id="${escapeHtml(id)}">Product ${escapeHtml(id)}</h1>
<p id="query">${escapeHtml(query)}</p>
<ul id="others">${links}</ul>`,
  );
}

function send(res, status, type, body, extra = {}) {
  res.writeHead(status, { 'content-type': type, 'content-length': Buffer.byteLength(body), ...extra });
  res.end(body);
}

const server = http.createServer({ maxHeaderSize: 64 * 1024 }, (req, res) => {
  const url = new URL(req.url, 'http://origin.invalid');
  if (url.pathname.startsWith('/__origin/')) return control(req, res, url);

  const now = Date.now();
  requests += 1;
  const jar = cookiesOf(req);
  const extra = {};
  let sid = jar.get(SESSION_COOKIE);
  if (!jar.has(OWN_COOKIE)) {
    const fresh = randomBytes(9).toString('base64url');
    extra['set-cookie'] = `${OWN_COOKIE}=${fresh}; Path=/; HttpOnly; SameSite=Lax`;
    if (SESSION_COOKIE === OWN_COOKIE) sid = fresh;
  }
  touchSession(sid, now);
  record({
    t: now,
    method: req.method,
    path: req.url,
    host: req.headers.host ?? null,
    forwarded: forwardedHeaders(req),
    cookies: [...jar.keys()],
    authorization: req.headers.authorization !== undefined,
    upgrade: null,
    session: sid ?? null,
  });

  if (req.method === 'OPTIONS') {
    res.writeHead(204, { allow: 'GET, HEAD, POST, OPTIONS', ...extra });
    return res.end();
  }
  const product = /^\/product\/([^/]+)$/.exec(url.pathname);
  if ((req.method === 'GET' || req.method === 'HEAD') && product) {
    return send(res, 200, 'text/html; charset=utf-8', productPage(decodeURIComponent(product[1]), url.search.slice(1)), extra);
  }
  if ((req.method === 'GET' || req.method === 'HEAD') && url.pathname === '/') {
    const links = [1, 2, 3, 42].map((i) => `<li><a class="product-link" href="/product/${i}">Product ${i}</a></li>`).join('');
    return send(res, 200, 'text/html; charset=utf-8', page('Tiny Shop', `<h1 id="home">Tiny Shop</h1><ul>${links}</ul>`), extra);
  }
  if (req.method === 'GET' && url.pathname === '/headers') {
    return send(res, 200, 'application/json', JSON.stringify(req.headers), extra);
  }
  if (req.method === 'GET' && url.pathname === '/stream') {
    const chunks = Math.min(Number(url.searchParams.get('chunks') ?? 5), 1000);
    const ms = Math.min(Number(url.searchParams.get('ms') ?? 200), 10_000);
    res.writeHead(200, { 'content-type': 'text/plain; charset=utf-8', ...extra });
    let sent = 0;
    const tick = () => {
      if (res.destroyed) return;
      res.write(`chunk ${sent} ${Date.now()}\n`);
      sent += 1;
      if (sent >= chunks) res.end();
      else setTimeout(tick, ms);
    };
    return tick();
  }
  if (req.method === 'POST' && url.pathname === '/echo') {
    res.writeHead(200, { 'content-type': req.headers['content-type'] ?? 'application/octet-stream', ...extra });
    // Each chunk goes back as it arrives: nothing is buffered here.
    req.on('data', (chunk) => res.write(chunk));
    req.on('end', () => res.end());
    return undefined;
  }
  if (req.method === 'GET' && url.pathname === '/slow') {
    const ms = Math.min(Number(url.searchParams.get('ms') ?? 1000), 60_000);
    const timer = setTimeout(() => send(res, 200, 'text/plain', `slept ${ms}\n`, extra), ms);
    res.on('close', () => clearTimeout(timer));
    return undefined;
  }
  return send(res, 404, 'text/plain', 'not found\n', extra);
});

function control(req, res, url) {
  if (req.method === 'GET' && url.pathname === '/__origin/stats') {
    return send(res, 200, 'application/json', JSON.stringify(stats(url.searchParams.has('arrivals'))));
  }
  if (req.method === 'POST' && url.pathname === '/__origin/reset') {
    sessions.clear();
    everSeen.clear();
    peak = 0;
    peakAt = 0;
    requests = 0;
    return send(res, 204, 'text/plain', '');
  }
  return send(res, 404, 'text/plain', 'not found\n');
}

// --- WebSocket echo (RFC 6455, enough for an echo) -------------------------

const WS_GUID = '258EAFA5-E914-47DA-95CA-C5AB0DC85B11';

server.on('upgrade', (req, socket, head) => {
  const url = new URL(req.url, 'http://origin.invalid');
  const jar = cookiesOf(req);
  const now = Date.now();
  requests += 1;
  touchSession(jar.get(SESSION_COOKIE), now);
  record({
    t: now,
    method: req.method,
    path: req.url,
    host: req.headers.host ?? null,
    forwarded: forwardedHeaders(req),
    cookies: [...jar.keys()],
    authorization: req.headers.authorization !== undefined,
    upgrade: String(req.headers.upgrade ?? '').toLowerCase(),
    session: jar.get(SESSION_COOKIE) ?? null,
  });
  const key = req.headers['sec-websocket-key'];
  if (url.pathname !== '/ws' || String(req.headers.upgrade).toLowerCase() !== 'websocket' || !key) {
    socket.end('HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n');
    return;
  }
  const accept = createHash('sha1').update(key + WS_GUID).digest('base64');
  socket.write(
    'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n'
      + `Sec-WebSocket-Accept: ${accept}\r\n\r\n`,
  );
  let buffered = head && head.length ? Buffer.from(head) : Buffer.alloc(0);
  const onData = (chunk) => {
    buffered = Buffer.concat([buffered, chunk]);
    for (;;) {
      const frame = parseFrame(buffered);
      if (!frame) return;
      buffered = buffered.subarray(frame.length);
      if (frame.opcode === 0x8) {
        socket.end(encodeFrame(0x8, frame.payload));
        return;
      }
      if (frame.opcode === 0x9) socket.write(encodeFrame(0xa, frame.payload));
      else if (frame.opcode === 0x1 || frame.opcode === 0x2) socket.write(encodeFrame(frame.opcode, frame.payload));
    }
  };
  socket.on('data', onData);
  socket.on('error', () => socket.destroy());
  if (buffered.length) onData(Buffer.alloc(0));
});

function parseFrame(buf) {
  if (buf.length < 2) return null;
  const opcode = buf[0] & 0x0f;
  const masked = (buf[1] & 0x80) !== 0;
  let len = buf[1] & 0x7f;
  let offset = 2;
  if (len === 126) {
    if (buf.length < 4) return null;
    len = buf.readUInt16BE(2);
    offset = 4;
  } else if (len === 127) {
    if (buf.length < 10) return null;
    len = Number(buf.readBigUInt64BE(2));
    offset = 10;
  }
  const maskLen = masked ? 4 : 0;
  if (buf.length < offset + maskLen + len) return null;
  const payload = Buffer.from(buf.subarray(offset + maskLen, offset + maskLen + len));
  if (masked) {
    const mask = buf.subarray(offset, offset + 4);
    for (let i = 0; i < payload.length; i += 1) payload[i] ^= mask[i % 4];
  }
  return { opcode, payload, length: offset + maskLen + len };
}

function encodeFrame(opcode, payload) {
  const len = payload.length;
  let header;
  if (len < 126) {
    header = Buffer.from([0x80 | opcode, len]);
  } else if (len < 65536) {
    header = Buffer.alloc(4);
    header[0] = 0x80 | opcode;
    header[1] = 126;
    header.writeUInt16BE(len, 2);
  } else {
    header = Buffer.alloc(10);
    header[0] = 0x80 | opcode;
    header[1] = 127;
    header.writeBigUInt64BE(BigInt(len), 2);
  }
  return Buffer.concat([header, payload]);
}

// --------------------------------------------------------------------------

server.keepAliveTimeout = 75_000;
server.headersTimeout = 80_000;
server.listen(Number(opts.port), opts.host, () => {
  process.stdout.write(`${JSON.stringify({ listening: server.address().port })}\n`);
});

for (const signal of ['SIGINT', 'SIGTERM']) {
  process.on(signal, () => {
    server.close();
    server.closeAllConnections?.();
    process.exit(0);
  });
}

