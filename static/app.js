// The buyer-facing waiting-room page: join, wait, order.

import { api } from './api.js';
import { enterThroughDoor } from './challenge.js';
import { StatusFeed } from './feed.js';
import { TabBus } from './tabs.js';
import * as fmt from './format.js';
import { applyBrand } from './brand.js';
import { loadLanguage, onLanguageChange, startLanguage, t } from './i18n.js';

const QUEUE_NAME = /^[a-z0-9_-]{1,64}$/;
/** Most items one order may ask for, whatever the stock. */
const MAX_QUANTITY = 10;
/** A confirmed order is shown again on reload for this long, instead of joining anew. */
const ORDER_MEMORY_MS = 30 * 60 * 1000;
const JOIN_RETRY_MIN_MS = 2_000;
const JOIN_RETRY_MAX_MS = 30_000;
/** While sold out, how often the page looks for a restock (the place is kept). */
const SOLD_OUT_RECHECK_MS = 30_000;
const CURRENCY = document.querySelector('meta[name="waitroom-currency"]')?.content || 'USD';

const el = (id) => document.getElementById(id);
const VIEWS = ['joining', 'prequeue', 'waiting', 'ready', 'confirmed', 'ended', 'error'];

// --- storage ---------------------------------------------------------------

const storage = {
  get(area, key) {
    try {
      return globalThis[area].getItem(key);
    } catch {
      return null;
    }
  },
  set(area, key, value) {
    try {
      globalThis[area].setItem(key, value);
    } catch {
      // Private mode or a full quota: the page still works, it just forgets.
    }
  },
  remove(area, key) {
    try {
      globalThis[area].removeItem(key);
    } catch {
      // ignore
    }
  },
  getJSON(area, key) {
    const raw = this.get(area, key);
    if (!raw) return null;
    try {
      return JSON.parse(raw);
    } catch {
      return null;
    }
  },
  setJSON(area, key, value) {
    this.set(area, key, JSON.stringify(value));
  },
};

// In front of a site (the built-in proxy), the server names the room's
// queue and the URL the visitor asked for, which this page stands in for.
const front = document.querySelector('meta[name="waitroom-front"]')?.content ?? null;
const queue = document.querySelector('meta[name="waitroom-queue"]')?.content
  ?? new URLSearchParams(location.search).get('queue') ?? 'default';
// Sent here by a protected site's gateway (`?return=`): once admitted, the
// page takes the pass for that site and goes back to the page first asked
// for (the server checks the return URL; a foreign one is refused).
const protectedReturn = new URLSearchParams(location.search).get('return');
document.documentElement.dataset.queue = queue;

// The page never names the buyer: the server knows them by a cookie it
// set (its own visitor cookie, or the site's login), which every tab of
// this browser sends. So the tabs of this browser are one buyer, and they
// coordinate under one key. Ids made up by earlier versions are dropped.
storage.remove('localStorage', 'waitroom.userId');
const tabGroup = 'this-browser';

// The ticket travels in its HttpOnly cookie only: the page never keeps it
// where a script could read it later. (Earlier versions kept it in
// sessionStorage: drop what they left.)
storage.remove('sessionStorage', `waitroom.ticket.${queue}`);

const keys = {
  start: `waitroom.start.${queue}`,
  order: `waitroom.order.${queue}`,
  // Kept after the draw, leaving and joining again: it is what the buyer
  // checks the published seed against.
  lottery: `waitroom.lottery.${queue}`,
  // This browser's entry code for a lottery (sent with every join).
  nonce: `waitroom.nonce.${queue}`,
  // The signed arrival receipt of the current entry (`--fairness-log`).
  arrival: `waitroom.arrival.${queue}`,
};

/**
 * This browser's entry code for a lottery's draw: 16 random bytes, made
 * here and kept, so the server never chooses the code (and with it the
 * fingerprint the draw sorts). The server uses it only for a pre-queue.
 */
function browserNonce() {
  let nonce = storage.get('localStorage', keys.nonce);
  if (!/^[0-9a-f]{32}$/.test(nonce ?? '')) {
    const bytes = crypto.getRandomValues(new Uint8Array(16));
    nonce = Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
    storage.set('localStorage', keys.nonce, nonce);
  }
  return nonce;
}

/**
 * Keeps the join's signed arrival receipt on this device (the latest
 * entry's) and offers it to download, for `scripts/verify-queue`.
 */
function keepArrivalReceipt(status) {
  const box = el('arrival-receipt');
  if (typeof status?.receipt !== 'string') {
    box.hidden = true;
    return;
  }
  const kept = { queue, receipt: status.receipt, savedAt: new Date().toISOString() };
  storage.setJSON('localStorage', keys.arrival, kept);
  const link = el('arrival-receipt-download');
  link.href = `data:application/json;charset=utf-8,${encodeURIComponent(JSON.stringify(kept))}`;
  link.download = `waitroom-receipt-${queue}.json`;
  box.hidden = false;
}

const bus = new TabBus(`waitroom-${queue}`);

const app = {
  view: null,
  feed: null,
  joining: false,
  joinFailures: 0,
  joinTimer: null,
  lastAuthRejoin: 0,
  start: null,
  lastMilestone: null,
  ready: null,
  countdownTimer: null,
  products: null,
  productsLoading: false,
  selectedId: null,
  ordering: false,
  /** An ending learnt while an order was in flight (its token was just used): shown only if the order fails. */
  goneWhileOrdering: null,
  /** Sets the current view's words again (after a language switch). */
  redraw: null,
};

// --- view plumbing ---------------------------------------------------------

function setView(name, { focus = false } = {}) {
  if (app.view === name) return false;
  app.view = name;
  if (name !== 'waiting' && name !== 'ready') showElsewhere(false);
  for (const v of VIEWS) el(`view-${v}`).hidden = v !== name;
  document.body.dataset.state = name;
  el('main').setAttribute('aria-busy', String(name === 'joining'));
  if (name !== 'ready') stopCountdown();
  if (name !== 'waiting') closeLeaveConfirm();
  if (focus) el(`${name}-heading`)?.focus();
  return true;
}

function setTitle(prefix) {
  document.title = prefix ? t('title.with', { prefix }) : t('title.base');
}

let announceTimer = null;
/** Say something politely to screen readers (the region is aria-live="polite"). */
function announce(text) {
  const region = el('announcer');
  clearTimeout(announceTimer);
  region.textContent = '';
  announceTimer = setTimeout(() => {
    region.textContent = text;
  }, 120);
}

function setText(id, text) {
  const node = el(id);
  if (node.textContent !== text) node.textContent = text;
}

// --- joining ---------------------------------------------------------------

async function join({ quiet = false } = {}) {
  clearTimeout(app.joinTimer);
  if (app.joining) return;
  app.joining = true;
  app.feed?.stop();
  app.feed = null;
  if (!quiet) {
    setView('joining');
    el('joining-retry').hidden = true;
    showJoining(['joining.heading'], ['joining.text']);
  }
  let status;
  try {
    const nonce = browserNonce();
    status = await enterThroughDoor(queue, (altcha) => api.enter(queue, altcha, nonce), { quiet });
  } catch (err) {
    app.joining = false;
    joinFailed(err, { quiet });
    return;
  }
  app.joining = false;
  app.joinFailures = 0;
  if (status?.status === 'SOLD_OUT') {
    showGone('sold_out');
    return;
  }
  if (!status || !['WAITING', 'READY', 'PRE_QUEUE'].includes(status.status)) {
    showGone('not_entered');
    return;
  }
  rememberStart(status);
  keepArrivalReceipt(status);
  startFeed(status);
  applyUpdate(status);
  bus.post('joined', { tabGroup });
}

/** The joining view's words, as message keys and their values. */
function showJoining(heading, text) {
  setText('joining-heading', t(...heading));
  setText('joining-text', t(...text));
  setTitle(t('title.joining'));
  app.redraw = () => showJoining(heading, text);
}

function joinFailed(err, { quiet }) {
  if (err.status === 404) {
    showError(['error.noQueue.title'], ['error.noQueue.text', { queue }], { retry: false });
    return;
  }
  if (!err.transient) {
    const message = err.message || t('error.refused.default');
    showError(['error.refused.title'], ['error.refused.text', { message }]);
    return;
  }
  app.joinFailures += 1;
  const backoff = Math.min(JOIN_RETRY_MAX_MS, JOIN_RETRY_MIN_MS * 2 ** (app.joinFailures - 1));
  const hinted = Number.isFinite(err.retryAfterSeconds) ? err.retryAfterSeconds * 1000 : 0;
  const delay = Math.max(backoff, hinted) * (0.8 + Math.random() * 0.4);
  if (quiet) {
    setMode('reconnecting', { viaOtherTab: false });
  } else {
    setView('joining');
    showJoining(
      [err.status === 0 ? 'joining.unreachable' : 'joining.busy'],
      ['joining.retryIn', { n: Math.max(1, Math.round(delay / 1000)) }],
    );
    el('joining-retry').hidden = false;
  }
  app.joinTimer = setTimeout(() => join({ quiet }), delay);
}

/** Remember where in line the buyer started, for the progress bar (kept across reloads). */
function rememberStart(status) {
  if (status.status !== 'WAITING') return;
  const saved = storage.getJSON('localStorage', keys.start);
  if (saved && saved.enteredAt && saved.enteredAt === status.enteredAt && Number.isFinite(saved.position)) {
    app.start = { ...saved, position: Math.max(saved.position, status.position ?? 0) };
  } else {
    app.start = { enteredAt: status.enteredAt ?? null, position: status.position };
  }
  storage.setJSON('localStorage', keys.start, app.start);
}

function startFeed(status) {
  app.feed?.stop();
  const feed = new StatusFeed({
    queue,
    userId: tabGroup,
    api,
    bus,
    pollingIntervalSeconds: status.pollingIntervalSeconds,
    // The cookie carries the ticket.
    getTicket: () => null,
    onUpdate: (update) => {
      if (app.feed === feed) applyUpdate(update);
    },
    onMode: (mode, info) => {
      if (app.feed === feed) setMode(mode, info);
    },
    onYield: (yielded) => {
      if (app.feed === feed) showElsewhere(yielded);
    },
    onAuthLost: () => {
      if (app.feed !== feed) return;
      if (Date.now() - app.lastAuthRejoin < 10_000) {
        feed.stop();
        showGone('not_entered');
        return;
      }
      app.lastAuthRejoin = Date.now();
      join({ quiet: true });
    },
  });
  app.feed = feed;
  setMode('connecting', { viaOtherTab: false });
  feed.start();
}

function applyUpdate(update) {
  if (!update || app.view === 'confirmed') return;
  switch (update.status) {
    case 'WAITING':
      showWaiting(update);
      break;
    case 'READY':
      showReady(update);
      break;
    case 'NOT_ENTERED':
      showGone(update.reason ?? 'not_entered');
      break;
    case 'SOLD_OUT':
      showGone('sold_out');
      break;
    case 'PRE_QUEUE':
      showPreQueue(update);
      break;
    default:
      break;
  }
}

// --- pre-queue (a scheduled opening with a lottery) ------------------------

/**
 * Before a scheduled opening: a countdown to the draw, the published
 * commitment and this buyer's fingerprint (what they look for in the list
 * published after the draw). The feed brings the waiting view at the draw.
 */
function showPreQueue(p) {
  const lottery = p.lottery || {};
  app.preQueue = {
    opensAt: lottery.opensAt,
    // Counted on this device's monotonic clock from the server's seconds,
    // so a wrong wall clock does not skew the countdown.
    deadline: performance.now() + (lottery.secondsToOpen ?? 0) * 1000,
  };
  const firstTime = setView('prequeue');
  setText('prequeue-fingerprint', lottery.fingerprint ?? '–');
  setText('prequeue-commitment', lottery.commitment ?? '–');
  setText('prequeue-nonce', lottery.nonce ?? '–');
  showReceipt(keepReceipt(lottery));
  setTitle(t('title.prequeue'));
  tickPreQueue();
  clearInterval(app.preQueueTimer);
  app.preQueueTimer = setInterval(tickPreQueue, 1000);
  app.redraw = () => showPreQueue(p);
  if (firstTime) announce(t('prequeue.announce'));
}

/**
 * The commitment as this page first showed it for this entry, kept on this
 * device before the draw. The documents published after the draw cannot
 * prove the seed on their own: a server that swapped the seed could publish
 * a commitment to match. So the first one seen is saved (and offered as a
 * receipt to copy or download, for `scripts/lottery-verify --commitment`),
 * never overwritten for the same entry code; a different one shown later is
 * flagged, not saved. Returns the receipt and whether the commitment shown
 * now differs from it; `null` without a commitment to keep.
 */
function keepReceipt(lottery) {
  if (!lottery.commitment || !lottery.nonce) return null;
  let receipt = storage.getJSON('localStorage', keys.lottery);
  if (receipt?.nonce !== lottery.nonce || !receipt?.commitment) {
    receipt = {
      queue,
      commitment: lottery.commitment,
      nonce: lottery.nonce,
      // Whether the code is the one this browser chose (the server could
      // otherwise have picked one that sorts first).
      ownCode: lottery.nonce === storage.get('localStorage', keys.nonce),
      fingerprint: lottery.fingerprint,
      opensAt: lottery.opensAt,
      savedAt: new Date().toISOString(),
    };
    storage.setJSON('localStorage', keys.lottery, receipt);
  }
  return { receipt, changed: receipt.commitment !== lottery.commitment };
}

/** The receipt as a text file: what was promised, and how to check it. */
function receiptText(receipt) {
  // The service's root as the page sees it (a base path included).
  const base = new URL('.', document.baseURI).href.replace(/\/$/, '');
  return [
    'waitroom lottery receipt',
    `queue: ${receipt.queue}`,
    `commitment (saved ${receipt.savedAt}, before the draw): ${receipt.commitment}`,
    `entry code: ${receipt.nonce}${receipt.ownCode ? ' (chosen by this browser)' : ' (NOT the code this browser chose)'}`,
    `fingerprint: ${receipt.fingerprint}`,
    '',
    'After the draw, check the published seed against the saved commitment:',
    `lottery-verify --url ${base} --queue ${receipt.queue} --nonce ${receipt.nonce} --commitment ${receipt.commitment}`,
    '',
  ].join('\n');
}

function showReceipt(kept) {
  const box = el('prequeue-receipt');
  box.hidden = !kept;
  if (!kept) return;
  const { receipt, changed } = kept;
  const text = receiptText(receipt);
  const download = el('prequeue-download');
  download.href = `data:text/plain;charset=utf-8,${encodeURIComponent(text)}`;
  download.download = `waitroom-lottery-${receipt.queue}.txt`;
  download.dataset.commitment = receipt.commitment;
  el('prequeue-copy').hidden = !navigator.clipboard;
  app.receiptText = text;
  const warning = el('prequeue-changed');
  warning.hidden = !changed;
  if (changed) setText('prequeue-changed', t('prequeue.changed', { saved: receipt.commitment }));
}

async function copyReceipt() {
  if (!app.receiptText) return;
  try {
    await navigator.clipboard.writeText(app.receiptText);
    announce(t('prequeue.copied'));
  } catch {
    // No permission: the download is still there.
  }
}

function tickPreQueue() {
  if (app.view !== 'prequeue' || !app.preQueue) {
    clearInterval(app.preQueueTimer);
    app.preQueueTimer = null;
    return;
  }
  const left = app.preQueue.deadline - performance.now();
  setText('prequeue-countdown', left > 0 ? fmt.formatClock(left) : t('prequeue.drawing'));
  el('prequeue-countdown').dataset.left = String(Math.max(0, Math.round(left / 1000)));
}

// --- waiting ---------------------------------------------------------------

/**
 * Another window (or device) of this buyer took the live stream: the place
 * stands and this page keeps polling it; say so, and offer to take the
 * updates back here.
 */
function showElsewhere(yielded) {
  const box = el('elsewhere');
  if (box.hidden === !yielded) return;
  box.hidden = !yielded;
  if (yielded) announce(t('elsewhere.announce'));
}

const MODES = ['connecting', 'live', 'reconnecting', 'polling'];

function setMode(mode, { viaOtherTab = false } = {}) {
  const conn = el('conn');
  if (!MODES.includes(mode)) return;
  conn.dataset.mode = mode;
  conn.dataset.shared = String(Boolean(viaOtherTab));
  setText('conn-text', t(`conn.${mode}`));
  conn.title = t(`conn.${mode}Title`) + (viaOtherTab ? t('conn.shared') : '');
}

function showWaiting(w) {
  app.ready = null;
  const position = Number.isFinite(w.position) ? w.position : null;
  if (!app.start || !Number.isFinite(app.start.position)) app.start = { enteredAt: null, position };
  if (position !== null && position > app.start.position) app.start = { ...app.start, position };

  const firstTime = setView('waiting');
  setText('position', fmt.formatCount(position));
  el('position').dataset.position = position === null ? '' : String(position);
  const rank = Number.isFinite(w.rank) ? w.rank : position === null ? null : position - 1;
  setText('ahead', fmt.peopleAhead(rank));
  const range = w.estimatedWaitRange;
  // Held by an operator: nobody is admitted, so there is no estimate to
  // give, only that the line is paused.
  const held = w.held === true;
  const wasHeld = el('view-waiting').dataset.held === 'true';
  el('view-waiting').dataset.held = String(held);
  el('held-note').hidden = !held;
  const words = held
    ? t('waiting.held')
    : range
      ? fmt.waitRangeInWords(range.low, range.high)
      : fmt.waitInWords(w.estimatedWaitSeconds);
  setText('eta', words);
  if (held !== wasHeld && !firstTime) announce(held ? t('waiting.heldNote') : t('waiting.resumed'));
  el('eta').dataset.low = range ? String(range.low) : '';
  el('eta').dataset.high = range ? String(range.high) : '';
  setText('total', fmt.formatCount(w.totalWaiting));

  const fraction = fmt.progressFraction(app.start.position, position);
  el('progress-fill').style.transform = `scaleX(${Math.max(0.015, fraction)})`;
  const progress = el('progress');
  progress.setAttribute('aria-valuenow', String(Math.round(fraction * 100)));
  progress.setAttribute('aria-valuetext', t('waiting.progressValue', { percent: Math.round(fraction * 100) }));
  setText('progress-start', t('waiting.joinedAtPosition', { position: fmt.formatCount(app.start.position) }));

  if (position !== null) setTitle(t('title.position', { position: fmt.formatCount(position) }));
  app.redraw = () => showWaiting(w);

  const mark = fmt.milestone(position);
  const spoken = fmt.formatCount(position);
  if (firstTime) {
    announce(t('waiting.announceJoined', { position: spoken, wait: words }));
    if (held) announce(t('waiting.heldNote'));
    app.lastMilestone = mark;
  } else if (mark !== null && (app.lastMilestone === null || mark < app.lastMilestone)) {
    announce(
      position === 1 ? t('waiting.announceNext') : t('waiting.announceMoved', { position: spoken, wait: words }),
    );
    app.lastMilestone = mark;
  }
}

// Leaving the queue: a two-step button so a stray tap doesn't cost the place.

function openLeaveConfirm() {
  el('leave-confirm').hidden = false;
  el('leave').setAttribute('aria-expanded', 'true');
  el('leave').hidden = true;
  el('leave-error').hidden = true;
  el('leave-no').focus();
}

function closeLeaveConfirm({ focus = false } = {}) {
  el('leave-confirm').hidden = true;
  el('leave').hidden = false;
  el('leave').setAttribute('aria-expanded', 'false');
  if (focus) el('leave').focus();
}

async function leaveQueue() {
  const yes = el('leave-yes');
  yes.disabled = true;
  el('leave-no').disabled = true;
  el('leave-error').hidden = true;
  try {
    await api.leave(queue, null);
  } catch (err) {
    // 401/404: there was no place to give up, which is what was asked.
    if (err.status !== 401 && err.status !== 404) {
      const box = el('leave-error');
      box.textContent = err.transient ? t('leave.unreachable') : t('leave.failed', { message: err.message });
      box.hidden = false;
      return;
    }
  } finally {
    yes.disabled = false;
    el('leave-no').disabled = false;
  }
  bus.post('left', { tabGroup });
  showGone('left');
}

// --- ready -----------------------------------------------------------------

function showReady(r) {
  if (front) {
    // Admitted in front of a site: asking again for the URL the visitor
    // wanted makes the server hand out the pass and send them on to it.
    location.replace(front);
    return;
  }
  const seconds = Number.isFinite(r.tokenExpiresInSeconds) ? Math.max(0, r.tokenExpiresInSeconds) : 300;
  const isNew = !app.ready || app.ready.entryToken !== r.entryToken;
  app.ready = {
    entryToken: r.entryToken,
    deadline: performance.now() + seconds * 1000,
    total: isNew ? Math.max(seconds, 1) : app.ready.total,
    warned: isNew ? seconds <= 75 : app.ready.warned,
  };
  const firstTime = setView('ready', { focus: true });
  if (firstTime && protectedReturn) {
    location.assign(new URL(`api/queues/${encodeURIComponent(queue)}/pass?return=${encodeURIComponent(protectedReturn)}`, document.baseURI).href);
    return;
  }
  if (firstTime) {
    hideOrderError();
    setTitle(t('title.ready'));
    announce(t('ready.announce', { duration: fmt.durationInWords(seconds) }));
    if (app.shopUrl) {
      showShopHandoff(r.entryToken);
    } else {
      loadProducts();
      updateOrderButton();
    }
  } else if (app.shopUrl && isNew) {
    showShopHandoff(r.entryToken);
  }
  app.redraw = () => {
    setTitle(t('title.ready'));
    if (app.shopUrl) return;
    if (app.products) renderProducts();
    updateOrderButton();
  };
  startCountdown();
}

/**
 * The order service lives elsewhere (the queue's shop link): the buyer is
 * handed on with a link in place of the order form, the entry token (and
 * the queue) filled in where the operator's link has {token} ({queue}).
 */
function showShopHandoff(token) {
  const href = app.shopUrl
    .replaceAll('{token}', encodeURIComponent(token ?? ''))
    .replaceAll('{queue}', encodeURIComponent(queue));
  el('shop-link').href = href;
  el('shop-handoff').hidden = false;
  el('order-form').hidden = true;
}

function startCountdown() {
  if (!app.countdownTimer) app.countdownTimer = setInterval(tickCountdown, 250);
  tickCountdown();
}

function stopCountdown() {
  clearInterval(app.countdownTimer);
  app.countdownTimer = null;
}

function tickCountdown() {
  const r = app.ready;
  if (!r) {
    stopCountdown();
    return;
  }
  const left = r.deadline - performance.now();
  setText('countdown-time', fmt.formatClock(left));
  const share = Math.min(1, Math.max(0, left / 1000 / r.total));
  el('countdown-fill').style.transform = `scaleX(${share})`;
  const urgent = left <= 60_000;
  el('countdown').dataset.urgent = String(urgent);
  if (urgent && !r.warned && left > 0) {
    r.warned = true;
    announce(t('ready.oneMinute'));
  }
  if (left <= 0 && !app.ordering) {
    stopCountdown();
    showGone('expired');
  }
}

// Products and the order form.

function selectedProduct() {
  return app.products?.find((p) => p.id === app.selectedId) ?? null;
}

function inStock(p) {
  return Number.isFinite(p.stock) ? p.stock > 0 : true;
}

async function loadProducts() {
  if (app.productsLoading) return;
  app.productsLoading = true;
  const box = el('products');
  box.setAttribute('aria-busy', 'true');
  if (!app.products) box.replaceChildren(statusLine(t('order.loading')));
  try {
    const all = await api.products();
    app.products = all.filter((p) => p && typeof p.id === 'string' && (p.queue ?? 'default') === queue);
    renderProducts();
  } catch (err) {
    if (!app.products) {
      const retry = document.createElement('button');
      retry.type = 'button';
      retry.className = 'button secondary small';
      retry.textContent = t('order.tryAgain');
      retry.addEventListener('click', () => loadProducts());
      const line = statusLine(t('order.loadFailed'));
      line.append(retry);
      box.replaceChildren(line);
    }
  } finally {
    app.productsLoading = false;
    box.setAttribute('aria-busy', 'false');
    updateOrderButton();
  }
}

function statusLine(text) {
  const line = document.createElement('div');
  line.className = 'products-status';
  const span = document.createElement('span');
  span.textContent = text;
  line.append(span);
  return line;
}

/** A pleasant tile colour per product, stable across visits. */
const TILE_HUES = [245, 200, 168, 330, 280, 18];
function hueOf(text) {
  let h = 0;
  for (const ch of text) h = (h * 31 + ch.codePointAt(0)) % 9973;
  return TILE_HUES[h % TILE_HUES.length];
}

function stockText(p) {
  if (!Number.isFinite(p.stock)) return t('stock.available');
  if (p.stock <= 0) return t('stock.soldOut');
  if (p.stock <= 20) return t('stock.few', { n: p.stock });
  return t('stock.many', { n: p.stock });
}

function renderProducts() {
  const box = el('products');
  const list = app.products ?? [];
  if (list.length === 0) {
    app.selectedId = null;
    box.replaceChildren(statusLine(t('order.nothing')));
    updateSummary();
    return;
  }
  const keep = list.find((p) => p.id === app.selectedId && inStock(p));
  app.selectedId = (keep ?? list.find(inStock))?.id ?? null;

  const nodes = list.map((p) => {
    const label = document.createElement('label');
    label.className = 'product';
    label.dataset.productId = p.id;

    const input = document.createElement('input');
    input.type = 'radio';
    input.name = 'product';
    input.value = p.id;
    input.className = 'product-radio';
    input.checked = p.id === app.selectedId;
    input.disabled = !inStock(p);
    input.addEventListener('change', () => {
      app.selectedId = p.id;
      hideOrderError();
      updateSummary();
    });

    const name = p.name || p.id;
    const tile = document.createElement('span');
    tile.className = 'product-tile';
    tile.setAttribute('aria-hidden', 'true');
    tile.style.setProperty('--hue', String(hueOf(p.id)));
    tile.textContent = [...name.trim()][0]?.toUpperCase() ?? '•';

    const body = document.createElement('span');
    body.className = 'product-body';
    const title = document.createElement('span');
    title.className = 'product-name';
    title.textContent = name;
    const stock = document.createElement('span');
    stock.className = 'product-stock';
    stock.dataset.low = String(Number.isFinite(p.stock) && p.stock > 0 && p.stock <= 20);
    stock.textContent = stockText(p);
    body.append(title, stock);

    const price = document.createElement('span');
    price.className = 'product-price';
    price.textContent = fmt.formatMoney(p.priceCents, CURRENCY);

    label.append(input, tile, body, price);
    return label;
  });
  box.replaceChildren(...nodes);
  updateSummary();
}

function maxQuantity() {
  const p = selectedProduct();
  if (!p || !Number.isFinite(p.stock)) return MAX_QUANTITY;
  return Math.max(1, Math.min(MAX_QUANTITY, p.stock));
}

/** Keep the quantity a whole number within 1..max; returns it. */
function clampQuantity() {
  const input = el('quantity');
  const max = maxQuantity();
  let q = Number.parseInt(input.value, 10);
  if (!Number.isFinite(q)) q = 1;
  q = Math.min(max, Math.max(1, q));
  if (input.value !== String(q)) input.value = String(q);
  input.max = String(max);
  el('qty-minus').disabled = q <= 1;
  el('qty-plus').disabled = q >= max;
  return q;
}

function updateSummary() {
  const q = clampQuantity();
  const p = selectedProduct();
  setText('order-total', p && Number.isFinite(p.priceCents) ? fmt.formatMoney(p.priceCents * q, CURRENCY) : '–');
  updateOrderButton();
}

function updateOrderButton() {
  const button = el('place-order');
  button.disabled = app.ordering || !selectedProduct();
  button.setAttribute('aria-busy', String(app.ordering));
  setText('place-order', app.ordering ? t('order.placing') : t('order.place'));
}

function showOrderError(text) {
  const box = el('order-error');
  box.textContent = text;
  box.hidden = false;
}

function hideOrderError() {
  el('order-error').hidden = true;
}

async function placeOrder(event) {
  event.preventDefault();
  if (app.ordering || !app.ready) return;
  const product = selectedProduct();
  if (!product) {
    showOrderError(t('order.chooseFirst'));
    return;
  }
  const quantity = clampQuantity();
  app.ordering = true;
  hideOrderError();
  updateOrderButton();
  try {
    const order = await api.order({ entryToken: app.ready.entryToken, productId: product.id, quantity });
    const record = {
      orderId: String(order.orderId),
      productId: product.id,
      productName: product.name || product.id,
      quantity: Number.isFinite(order.quantity) ? order.quantity : quantity,
      totalCents: Number.isFinite(product.priceCents) ? product.priceCents * quantity : null,
      createdAt: order.createdAt ?? new Date().toISOString(),
      savedAt: Date.now(),
    };
    storage.setJSON('localStorage', keys.order, record);
    bus.post('order', { tabGroup, record });
    app.ordering = false;
    app.goneWhileOrdering = null;
    showConfirmed(record);
  } catch (err) {
    app.ordering = false;
    const gone = app.goneWhileOrdering;
    app.goneWhileOrdering = null;
    if (gone) {
      // The token was used (perhaps by this very order, its answer lost).
      showGone(gone);
      return;
    }
    updateOrderButton();
    orderFailed(err, product, quantity);
  }
}

async function orderFailed(err, product, quantity) {
  switch (err.code) {
    case 'out_of_stock': {
      await loadProducts();
      const now = app.products?.find((p) => p.id === product.id);
      if (now && Number.isFinite(now.stock) && now.stock > 0) {
        showOrderError(t('order.notEnough', { quantity, n: now.stock }));
      } else {
        showOrderError(t('order.soldOut', { product: product.name || product.id }));
      }
      return;
    }
    case 'token_in_use':
      showOrderError(t('order.inUse'));
      return;
    case 'invalid_token':
    case 'missing_token':
      showGone('invalid');
      return;
    case 'unknown_product':
      await loadProducts();
      showOrderError(t('order.unknownProduct'));
      return;
    case 'invalid_body':
      showOrderError(t('order.invalid', { message: err.message }));
      return;
    default:
      break;
  }
  if (err.status === 401) {
    showGone('invalid');
  } else if (err.status === 0) {
    showOrderError(t('order.unreachable'));
  } else if (err.status === 503 || err.status === 429 || err.status >= 500) {
    showOrderError(t('order.busy'));
  } else {
    showOrderError(t('order.failed', { message: err.message }));
  }
}

// --- confirmed, ended, error -------------------------------------------------

function loadOrderRecord() {
  const record = storage.getJSON('localStorage', keys.order);
  if (!record || typeof record.orderId !== 'string') return null;
  if (!Number.isFinite(record.savedAt) || Date.now() - record.savedAt > ORDER_MEMORY_MS) {
    storage.remove('localStorage', keys.order);
    return null;
  }
  return record;
}

function showConfirmed(record) {
  app.feed?.stop();
  app.ready = null;
  app.ordering = false;
  setText('receipt-id', record.orderId);
  el('receipt-id').dataset.orderId = record.orderId;
  setText('receipt-item', record.productName ?? record.productId);
  setText('receipt-quantity', fmt.formatCount(record.quantity));
  setText('receipt-total', Number.isFinite(record.totalCents) ? fmt.formatMoney(record.totalCents, CURRENCY) : '–');
  setText('receipt-time', fmt.formatTime(record.createdAt));
  const changed = setView('confirmed', { focus: true });
  setTitle(t('title.confirmed'));
  app.redraw = () => showConfirmed(record);
  if (changed) announce(t('confirmed.announce', { id: record.orderId }));
}

function showGone(reason) {
  // An order is on its way: its token being used ends the place, and the
  // order's answer (its confirmation) is moments away. Showing the ending
  // now would flash it (and announce it) before the confirmation.
  if (app.ordering && (reason === 'consumed' || reason === 'not_entered')) {
    app.goneWhileOrdering = reason;
    app.feed?.stop();
    return;
  }
  const wasReady = app.view === 'ready';
  app.feed?.stop();
  app.ready = null;
  stopCountdown();
  if (reason === 'consumed' || reason === 'not_entered') {
    const record = loadOrderRecord();
    if (record) {
      showConfirmed(record);
      return;
    }
  }
  const shown = reason === 'not_entered' && wasReady ? 'invalid' : reason;
  const copy = showEnded(shown);
  el('view-ended').dataset.reason = shown;
  if (reason === 'sold_out') {
    // The place is kept while sold out: a restock answers WAITING again.
    clearTimeout(app.joinTimer);
    app.joinTimer = setTimeout(() => join({ quiet: true }), SOLD_OUT_RECHECK_MS);
  }
  const changed = setView('ended', { focus: true });
  if (changed) announce(`${copy.title}. ${copy.text}`);
}

function showEnded(reason) {
  const copy = fmt.endedCopy(reason);
  setText('ended-heading', copy.title);
  setText('ended-text', copy.text);
  setText('rejoin', copy.action);
  setTitle(copy.title);
  app.redraw = () => showEnded(reason);
  return copy;
}

/** The error view; `title` and `text` are message keys with their values. */
function showError(title, text, { retry = true } = {}) {
  app.feed?.stop();
  el('error-retry').hidden = !retry;
  const words = () => {
    setText('error-heading', t(...title));
    setText('error-text', t(...text));
    setTitle(t(...title));
  };
  words();
  app.redraw = words;
  setView('error', { focus: true });
  announce(`${t(...title)}. ${t(...text)}`);
}

function joinAgain() {
  storage.remove('localStorage', keys.order);
  storage.remove('localStorage', keys.start);
  app.start = null;
  app.lastMilestone = null;
  join();
}

// --- other tabs ------------------------------------------------------------

bus.on('order', (m) => {
  if (m.tabGroup !== tabGroup || !m.record) return;
  showConfirmed(m.record);
});

bus.on('left', (m) => {
  if (m.tabGroup !== tabGroup) return;
  if (app.view === 'waiting' || app.view === 'ready' || app.view === 'joining') showGone('left');
});

bus.on('joined', (m) => {
  if (m.tabGroup !== tabGroup) return;
  // Another tab joined again: follow it rather than keep showing an old ending.
  if (app.view === 'ended' || app.view === 'confirmed') {
    storage.remove('localStorage', keys.order);
    join();
  }
});

// --- wiring ----------------------------------------------------------------

/** After a language switch: the connection badge and the current view's words. */
function redraw() {
  const conn = el('conn');
  setMode(conn.dataset.mode, { viaOtherTab: conn.dataset.shared === 'true' });
  app.redraw?.();
}

async function boot() {
  const valid = QUEUE_NAME.test(queue);
  // The queue's branding, then the words: the page shows its own defaults
  // (English, unbranded) until both are in, and keeps them if either fails.
  const words = loadLanguage(startLanguage());
  const brand = valid ? await api.page(queue).catch(() => ({})) : {};
  // Checked again here: only an absolute http(s) link is followed.
  app.shopUrl = typeof brand?.shopUrl === 'string' && /^https?:\/\/[^/?#]/.test(brand.shopUrl) ? brand.shopUrl : null;
  await words.ready(applyBrand(brand));
  onLanguageChange(redraw);
  if (queue !== 'default') {
    setText('queue-name', queue);
    el('queue-chip').hidden = false;
  }

  el('leave').addEventListener('click', openLeaveConfirm);
  el('take-back').addEventListener('click', () => {
    showElsewhere(false);
    app.feed?.takeBack();
  });
  el('leave-no').addEventListener('click', () => closeLeaveConfirm({ focus: true }));
  el('leave-yes').addEventListener('click', leaveQueue);
  el('rejoin').addEventListener('click', joinAgain);
  el('confirmed-rejoin').addEventListener('click', joinAgain);
  el('error-retry').addEventListener('click', () => join());
  el('joining-retry').addEventListener('click', () => join());
  el('prequeue-copy').addEventListener('click', copyReceipt);
  el('order-form').addEventListener('submit', placeOrder);
  el('qty-minus').addEventListener('click', () => {
    el('quantity').value = String(clampQuantity() - 1);
    updateSummary();
  });
  el('qty-plus').addEventListener('click', () => {
    el('quantity').value = String(clampQuantity() + 1);
    updateSummary();
  });
  el('quantity').addEventListener('change', updateSummary);
  el('quantity').addEventListener('input', () => {
    if (/^\d+$/.test(el('quantity').value)) updateSummary();
  });

  if (!valid) {
    showError(['error.badLink.title'], ['error.badLink.text'], { retry: false });
    return;
  }

  const record = loadOrderRecord();
  if (record) {
    showConfirmed(record);
    return;
  }
  join();
}

boot();
