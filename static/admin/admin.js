// The operator console. The admin token is typed once and kept in this
// tab's sessionStorage; it only ever travels in an Authorization header
// (never a URL, so never a log line). The live feed is read with fetch()
// streaming, since EventSource cannot send that header.

const TOKEN_KEY = 'waitroom.adminToken';
const HISTORY_MS = 30 * 60 * 1000;
const RECONNECT_MS = 2000;

const $ = (id) => document.getElementById(id);
const fmt = new Intl.NumberFormat();

/** Per queue: { el, history: [{at, waiting, active, admitted}] }. */
const queues = new Map();
let feed = null; // AbortController of the running feed

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

/** Calls the admin API; resolves to the JSON body, rejects with its message. */
async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${token()}` };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const data = await res.json().catch(() => null);
  if (!res.ok) {
    if (res.status === 401) signOut('The token was refused.');
    const err = new Error(data?.message || `${res.status} ${res.statusText}`);
    err.status = res.status;
    err.code = data?.error;
    throw err;
  }
  return data;
}

function notice(text, kind = 'error') {
  const el = $('notice');
  el.textContent = text;
  el.dataset.kind = kind;
  el.hidden = !text;
}

/** Runs a control: disables its button meanwhile, reports the outcome. */
async function control(button, what, action) {
  button.disabled = true;
  try {
    await action();
    notice(`${what}: done.`, 'ok');
  } catch (err) {
    notice(`${what}: ${err.message}`);
  } finally {
    button.disabled = false;
  }
}

// --- Signing in and out -------------------------------------------------

function signOut(reason = '') {
  sessionStorage.removeItem(TOKEN_KEY);
  feed?.abort();
  feed = null;
  document.body.dataset.state = 'signed-out';
  $('console').hidden = true;
  $('sign-in').hidden = false;
  $('sign-out').hidden = true;
  $('sign-in-error').textContent = reason;
  setLink('off', 'not connected');
}

function signedIn() {
  document.body.dataset.state = 'signed-in';
  $('sign-in').hidden = true;
  $('console').hidden = false;
  $('sign-out').hidden = false;
  $('sign-in-error').textContent = '';
  connect();
  loadProducts();
}

function setLink(state, text) {
  const el = $('link');
  el.dataset.link = state;
  el.textContent = text;
}

// --- The live feed ----------------------------------------------------------

async function connect() {
  feed?.abort();
  const controller = new AbortController();
  feed = controller;
  while (feed === controller) {
    try {
      const res = await fetch('/api/admin/events', {
        headers: { Authorization: `Bearer ${token()}`, Accept: 'text/event-stream' },
        signal: controller.signal,
      });
      if (res.status === 401) {
        signOut('The token was refused.');
        return;
      }
      if (!res.ok || !res.body) throw new Error(`feed: ${res.status}`);
      setLink('live', 'live');
      await readEvents(res.body, onSnapshot);
    } catch (err) {
      if (controller.signal.aborted) return;
    }
    if (feed !== controller) return;
    setLink('lost', 'reconnecting…');
    await new Promise((resolve) => setTimeout(resolve, RECONNECT_MS));
  }
}

/** Reads a text/event-stream body, calling `handle` with each event's JSON data. */
async function readEvents(body, handle) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = frame
        .split('\n')
        .filter((l) => l.startsWith('data: '))
        .map((l) => l.slice(6))
        .join('\n');
      if (data) handle(JSON.parse(data));
    }
  }
}

function onSnapshot(s) {
  $('streams').textContent = `${fmt.format(s.streamsOpen)} / ${fmt.format(s.maxStreams)}`;
  $('orders').textContent = fmt.format(s.ordersCommitted);
  $('released').textContent = fmt.format(s.tokensReleased);
  $('errors').textContent = fmt.format(s.errors);
  showInstances(s);
  const seen = new Set();
  for (const q of s.queues) {
    seen.add(q.queue);
    showQueue(q, s.at);
  }
  for (const [name, entry] of queues) {
    if (!seen.has(name)) {
      entry.el.remove();
      queues.delete(name);
    }
  }
  document.body.dataset.queues = [...queues.keys()].join(' ');
  auditQueues([...queues.keys()]);
}

function showInstances(s) {
  const rows = (s.instances ?? [{ instance: s.instance, streams: s.streamsOpen }]).map((i) => {
    const row = document.createElement('tr');
    row.dataset.instance = i.instance;
    const name = document.createElement('td');
    name.textContent = i.instance === s.instance ? `${i.instance} (this one)` : i.instance;
    const streams = document.createElement('td');
    streams.textContent = fmt.format(i.streams);
    row.append(name, streams);
    return row;
  });
  $('instances').replaceChildren(...rows);
}

// --- One queue ------------------------------------------------------------

function queueCard(name) {
  let entry = queues.get(name);
  if (entry) return entry;
  const el = $('queue-template').content.firstElementChild.cloneNode(true);
  el.dataset.queue = name;
  el.querySelector('.name').textContent = name;
  entry = { el, history: [], settingsVersion: -1 };
  el.querySelector('.hold').addEventListener('click', (ev) => {
    const holding = el.dataset.paused !== 'true';
    control(ev.currentTarget, holding ? `Hold ${name}` : `Resume ${name}`, () =>
      api('POST', `/api/admin/queues/${name}/${holding ? 'pause' : 'resume'}`));
  });
  el.querySelector('form.settings').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const form = ev.currentTarget;
    const maxActive = form.maxActive.value.trim();
    const change = {
      batch: Number(form.batch.value),
      intervalMs: Number(form.intervalMs.value),
      maxActive: maxActive === '' ? null : Number(maxActive),
    };
    control(form.querySelector('button'), `Settings of ${name}`, async () => {
      const stored = await api('PUT', `/api/admin/queues/${name}`, change);
      fillSettings(entry, stored, true);
    });
  });
  el.querySelector('form.lottery').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const form = ev.currentTarget;
    // The operator's local time, as the datetime field shows it.
    const opensAt = new Date(form.opensAt.value).getTime();
    control(form.querySelector('button[type="submit"]'), `Lottery of ${name}`, () =>
      api('PUT', `/api/admin/queues/${name}/lottery`, { opensAt }));
  });
  el.querySelector('.clear-lottery').addEventListener('click', (ev) => {
    control(ev.currentTarget, `Clearing the lottery of ${name}`, () =>
      api('DELETE', `/api/admin/queues/${name}/lottery`));
  });
  el.querySelector('form.settings').addEventListener('input', (ev) => {
    const form = ev.currentTarget;
    form.dataset.dirty = 'true';
    rateHint(form);
  });
  $('queues').append(el);
  queues.set(name, entry);
  return entry;
}

function rateHint(form) {
  const perMinute = (Number(form.batch.value) * 60000) / Math.max(1, Number(form.intervalMs.value));
  form.querySelector('.rate-hint').textContent = Number.isFinite(perMinute)
    ? `≈ ${fmt.format(Math.round(perMinute))} / min`
    : '';
}

/** Shows stored settings in the form, unless the operator is editing it. */
function fillSettings(entry, settings, force = false) {
  const form = entry.el.querySelector('form.settings');
  if (!force && (form.dataset.dirty === 'true' || settings.version === entry.settingsVersion)) return;
  entry.settingsVersion = settings.version;
  form.dataset.dirty = 'false';
  form.batch.value = settings.batch;
  form.intervalMs.value = settings.intervalMs;
  form.maxActive.value = settings.maxActive ?? '';
  entry.el.dataset.version = settings.version;
  rateHint(form);
}

function showQueue(q, at) {
  const entry = queueCard(q.queue);
  const { el, history } = entry;
  history.push({ at, waiting: q.waiting, active: q.active, admitted: q.admittedSeen });
  while (history.length && history[0].at < at - HISTORY_MS) history.shift();
  const perMinute = admittedPerMinute(history);
  const set = (k, v) => {
    el.querySelector(`[data-k="${k}"]`).textContent = v;
  };
  const n = (v) => (v === null || v === undefined ? '–' : fmt.format(v));
  set('waiting', n(q.waiting));
  set('active', n(q.active));
  set('perMinute', n(perMinute));
  // Both paths count: passes, and the fast track of joins into an empty line.
  const byPath = q.admittedByPath ?? { pass: 0, fastTrack: 0 };
  set('split', `pass ${fmt.format(byPath.pass)} · fast track ${fmt.format(byPath.fastTrack)} (since start)`);
  set('rate', q.observedRate.toFixed(2));
  // Held, nobody is admitted: no estimate.
  set('wait', q.waitForLastSecs === null || q.paused ? '–' : duration(q.waitForLastSecs));
  set('streams', n(q.streamsOnThisInstance));
  set('orders', n(q.ordersCommitted));
  set('released', `${fmt.format(q.tokensReleased ?? 0)} tokens released`);
  const stock = q.stock;
  el.querySelector('[data-tile="stock"]').hidden = !stock;
  if (stock) {
    set('stock', count(stock.remaining, 'unit'));
    set('stockBuyers', `enough for ${count(stock.buyersServed, 'buyer')} (${fmt.format(stock.maxPerBuyer)} each) · ${fmt.format(stock.admissible)} more may be let in`);
  }
  const lottery = q.lottery && q.lottery.state === 'scheduled' ? q.lottery : null;
  el.querySelector('[data-tile="prequeue"]').hidden = !lottery;
  if (lottery) {
    set('preQueue', n(lottery.entries));
    set('opensAt', `draw at ${new Date(lottery.opensAt).toLocaleString()}`);
  }
  const paused = q.paused === true;
  el.dataset.paused = String(paused);
  el.dataset.state = q.state;
  const why = el.querySelector('.why');
  const reason = explain(q);
  // Written only when it changes: a status region re-reads what is written.
  if (why.textContent !== reason) why.textContent = reason;
  why.hidden = !reason;
  // With adaptive admission on, the stored batch (the rate shown in the
  // settings) is the controller's: say so, with its bounds.
  const adaptive = q.settings && q.settings.adaptive && q.settings.adaptive.enabled ? q.settings.adaptive : null;
  const follows = adaptive ? ` · adaptive ${adaptive.floorPerSec}–${adaptive.ceilingPerSec}/s` : '';
  el.querySelector('.badge').textContent = (STATES[q.state] ?? q.state) + follows;
  el.querySelector('.hold').textContent = paused ? 'Resume' : 'Hold';
  fillSettings(entry, q.settings);
  history[history.length - 1].perMinute = perMinute;
  for (const svg of el.querySelectorAll('svg.chart')) draw(svg, history, svg.dataset.series, at);
}

/** `n` and a noun, plural unless one. */
function count(n, noun) {
  return `${fmt.format(n)} ${noun}${n === 1 ? '' : 's'}`;
}

/** What the badge says for each admission state of the feed. */
const STATES = {
  admitting: 'admitting',
  held: 'held',
  preQueue: 'lottery pre-queue',
  soldOut: 'sold out',
  stockBlocked: 'stock blocks admission',
  full: 'max active reached',
  storeAway: 'store away',
};

/** Why nobody is let in, in units and buyers where stock is the reason; '' while admitting. */
function explain(q) {
  const s = q.stock;
  switch (q.state) {
    case 'held':
      return 'Admission is held: nobody is let in until you resume. Buyers in line are told the line is paused.';
    case 'preQueue':
      return `A lottery is scheduled: ${count(q.lottery.entries, 'buyer')} in its pre-queue, placed in line at the draw (${new Date(q.lottery.opensAt).toLocaleString()}).`;
    case 'soldOut':
      return 'Sold out: nothing is left, those in line are told so and keep their places for a restock.';
    case 'stockBlocked':
      return `Nobody is let in: ${count(s.remaining, 'unit')} left, enough for ${count(s.buyersServed, 'buyer')} at ${fmt.format(s.maxPerBuyer)} each, and ${count(s.holders, 'token holder')} (plus ${count(s.consumedSinceReport, 'order')} since the last report) may take them all.`;
    case 'full':
      return `Nobody is let in: ${fmt.format(q.active)} buyers hold tokens, the most maxActive allows.`;
    case 'storeAway':
      return 'The store does not answer: nobody is let in until it is back.';
    default:
      return '';
  }
}

/** Admissions over the last minute of history (scaled up while it is shorter). */
function admittedPerMinute(history) {
  const last = history[history.length - 1];
  const from = history.find((h) => h.at >= last.at - 60_000) ?? last;
  const span = last.at - from.at;
  if (span < 5_000) return null;
  return Math.round(((last.admitted - from.admitted) * 60_000) / span);
}

function duration(secs) {
  if (secs < 90) return `${secs} s`;
  if (secs < 5400) return `${Math.round(secs / 60)} min`;
  return `${(secs / 3600).toFixed(1)} h`;
}

// --- Charts: hand-drawn SVG, up to 30 minutes wide ------------------------

const SVG = 'http://www.w3.org/2000/svg';
const W = 300;
const H = 90;

function draw(svg, history, key, now) {
  const points = history.filter((h) => typeof h[key] === 'number');
  const max = Math.max(1, ...points.map((p) => p[key]));
  // The chart spans what has been seen, from a minute up to 30 minutes.
  const span = Math.min(HISTORY_MS, Math.max(60_000, now - (history[0]?.at ?? now)));
  const x = (at) => W - ((now - at) / span) * W;
  const y = (v) => H - 12 - (v / max) * (H - 20);
  svg.replaceChildren();
  for (const frac of [0, 0.5, 1]) {
    const line = document.createElementNS(SVG, 'line');
    line.setAttribute('class', 'grid');
    line.setAttribute('x1', '0');
    line.setAttribute('x2', String(W));
    line.setAttribute('y1', String(y(max * frac)));
    line.setAttribute('y2', String(y(max * frac)));
    svg.append(line);
  }
  const label = document.createElementNS(SVG, 'text');
  label.setAttribute('x', '3');
  label.setAttribute('y', '10');
  label.textContent = fmt.format(max);
  svg.append(label);
  const ago = document.createElementNS(SVG, 'text');
  ago.setAttribute('x', '3');
  ago.setAttribute('y', String(H - 2));
  ago.textContent = `−${Math.round(span / 60_000)} min`;
  svg.append(ago);
  svg.dataset.points = String(points.length);
  svg.dataset.last = points.length ? String(points[points.length - 1][key]) : '';
  // A chart is an image: its name says what it shows and where it stands.
  const last = points.length ? fmt.format(points[points.length - 1][key]) : 'no data yet';
  svg.setAttribute('aria-label', `${svg.dataset.name} over the last ${Math.round(span / 60_000)} min: now ${last}, peak ${fmt.format(max)}`);
  if (points.length < 2) return;
  const coords = points.map((p) => `${x(p.at).toFixed(1)},${y(p[key]).toFixed(1)}`);
  const area = document.createElementNS(SVG, 'path');
  area.setAttribute('class', 'area');
  area.setAttribute('d', `M${x(points[0].at).toFixed(1)},${y(0)} L${coords.join(' L')} L${x(points[points.length - 1].at).toFixed(1)},${y(0)} Z`);
  const line = document.createElementNS(SVG, 'polyline');
  line.setAttribute('class', 'line');
  line.setAttribute('points', coords.join(' '));
  svg.append(area, line);
}

// --- Products and new queues ----------------------------------------------

async function loadProducts() {
  const select = $('product');
  try {
    const products = await api('GET', '/api/admin/products');
    select.replaceChildren(
      ...products.map((p) => {
        const option = document.createElement('option');
        option.value = p.id;
        option.textContent = `${p.name} (${fmt.format(p.stock)} left)`;
        option.product = p;
        return option;
      }),
    );
    $('restock').hidden = false;
    $('products-off').hidden = true;
  } catch (err) {
    if (err.code !== 'orders_disabled') throw err;
    $('restock').hidden = true;
    $('products-off').hidden = false;
  }
}

$('restock').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const form = ev.currentTarget;
  const product = form.product.selectedOptions[0]?.product;
  if (!product) return;
  control(form.querySelector('button'), `Restock ${product.name}`, async () => {
    await api('PUT', `/api/admin/products/${encodeURIComponent(product.id)}`, {
      name: product.name,
      queue: product.queue,
      priceCents: product.priceCents,
      stock: Number(form.stock.value),
    });
    form.reset();
    await loadProducts();
  });
});

$('open-queue').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const form = ev.currentTarget;
  const name = form.queue.value.trim();
  control(form.querySelector('button'), `Open ${name}`, async () => {
    await api('PUT', `/api/admin/queues/${encodeURIComponent(name)}`, {
      batch: Number(form.batch.value),
      intervalMs: Number(form.intervalMs.value),
      paused: form.paused.checked,
    });
    form.queue.value = '';
  });
});

// --- The audit log --------------------------------------------------------

let auditNext = null;

/** Keeps the audit form's queue list in step with the feed's queues. */
function auditQueues(names) {
  const select = $('audit-queue');
  const have = [...select.options].map((o) => o.value);
  if (have.join(' ') === names.join(' ')) return;
  const chosen = select.value;
  select.replaceChildren(
    ...names.map((name) => {
      const option = document.createElement('option');
      option.value = name;
      option.textContent = name;
      return option;
    }),
  );
  if (names.includes(chosen)) select.value = chosen;
}

async function readAudit(button, after) {
  const form = $('audit-form');
  const params = new URLSearchParams({ limit: '100' });
  if (form.kind.value) params.set('kind', form.kind.value);
  if (after) params.set('after', after);
  const queue = form.queue.value;
  button.disabled = true;
  try {
    const page = await api('GET', `/api/admin/queues/${encodeURIComponent(queue)}/audit?${params}`);
    const rows = page.entries.map((e) => {
      const row = document.createElement('tr');
      row.dataset.kind = e.kind;
      for (const text of [new Date(e.at).toLocaleString(), e.kind, e.user ?? '–', e.entry ?? '–', e.pass ?? (e.kind === 'admitted' ? 'fast track' : '–')]) {
        const cell = document.createElement('td');
        cell.textContent = String(text);
        row.append(cell);
      }
      return row;
    });
    if (after) $('audit-rows').append(...rows);
    else $('audit-rows').replaceChildren(...rows);
    $('audit-table').hidden = $('audit-rows').children.length === 0;
    auditNext = page.next;
    $('audit-more').hidden = !auditNext;
    $('audit-status').textContent = `${fmt.format($('audit-rows').children.length)} entries of ${queue}${auditNext ? '; more follow' : ''}.`;
  } catch (err) {
    $('audit-status').textContent = `Audit log: ${err.message}`;
  } finally {
    button.disabled = false;
  }
}

$('audit-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  readAudit(ev.currentTarget.querySelector('button[type="submit"]'), null);
});
$('audit-more').addEventListener('click', (ev) => readAudit(ev.currentTarget, auditNext));

$('sign-in').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const typed = $('token').value.trim();
  $('token').value = '';
  sessionStorage.setItem(TOKEN_KEY, typed);
  try {
    await api('GET', '/api/admin/queues');
    signedIn();
  } catch (err) {
    if (err.status !== 401) signOut(`Cannot reach the admin API: ${err.message}`);
  }
});

$('sign-out').addEventListener('click', () => signOut());

if (token()) signedIn();
else signOut();
