// Thin client for the waitroom HTTP API. Every URL is relative to the page,
// so the page also works when the server is mounted under a path prefix.

const REQUEST_TIMEOUT_MS = 15_000;

/** An API answer that was not a success, or a request that never got one (status 0). */
export class ApiError extends Error {
  constructor(status, code, message, { retryAfterSeconds = null } = {}) {
    super(message || code || `HTTP ${status}`);
    this.name = 'ApiError';
    this.status = status;
    this.code = code;
    this.retryAfterSeconds = retryAfterSeconds;
  }

  /** Worth trying again later: network trouble, overload, rate limiting. */
  get transient() {
    return this.status === 0 || this.status === 429 || this.status >= 500;
  }
}

function url(path) {
  return new URL(path, document.baseURI).href;
}

function queuePath(queue) {
  return `api/queues/${encodeURIComponent(queue)}`;
}

function retryAfter(res) {
  const value = res.headers.get('Retry-After');
  if (!value) return null;
  const seconds = Number(value);
  if (Number.isFinite(seconds)) return Math.max(0, seconds);
  const date = Date.parse(value);
  return Number.isFinite(date) ? Math.max(0, (date - Date.now()) / 1000) : null;
}

async function request(method, path, { headers = {}, body } = {}) {
  let res;
  try {
    res = await fetch(url(path), {
      method,
      headers,
      body,
      credentials: 'same-origin',
      cache: 'no-store',
      signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
    });
  } catch (err) {
    throw new ApiError(0, 'network', 'The server could not be reached.');
  }
  if (res.status === 204) return null;
  let data = null;
  const text = await res.text().catch(() => '');
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (!res.ok) {
    throw new ApiError(
      res.status,
      data && typeof data.error === 'string' ? data.error : `http_${res.status}`,
      data && typeof data.message === 'string' ? data.message : res.statusText,
      { retryAfterSeconds: retryAfter(res) },
    );
  }
  return { status: res.status, data };
}

export const api = {
  /**
   * Join (idempotent). Resolves to the QueueStatus with its `ticket`. Who
   * joins is the server's business: its visitor cookie (set by the first
   * join) or the site's login, sent by the browser.
   */
  async enter(queue, altcha = null, lotteryNonce = null) {
    const headers = altcha ? { 'X-Altcha': altcha } : {};
    // The entry code a lottery draws, chosen here rather than by the server.
    if (lotteryNonce) headers['Content-Type'] = 'application/json';
    const body = lotteryNonce ? JSON.stringify({ lotteryNonce }) : undefined;
    const res = await request('POST', `${queuePath(queue)}/entries`, { headers, body });
    return res.data;
  },

  /** The join challenge to solve (ALTCHA JSON), or null when joins need none now (204). */
  async challenge(queue) {
    const res = await request('GET', `${queuePath(queue)}/challenge`);
    return res && res.data && typeof res.data.challenge === 'string' ? res.data : null;
  },

  /** Current QueueStatus for a ticket (the polling fallback). */
  async position(queue, ticket) {
    const headers = ticket ? { 'X-Queue-Ticket': ticket } : {};
    const res = await request('GET', `${queuePath(queue)}/position`, { headers });
    return res.data;
  },

  /** Give up the place in line. */
  async leave(queue, ticket) {
    const headers = {};
    if (ticket) headers['X-Queue-Ticket'] = ticket;
    await request('DELETE', `${queuePath(queue)}/entries/me`, { headers });
  },

  /** The queue's page branding ({} when it has none). */
  async page(queue) {
    const res = await request('GET', `${queuePath(queue)}/page`);
    return res && res.data && typeof res.data === 'object' ? res.data : {};
  },

  /** A JSON file of the page (a dictionary of i18n/), or null when it is missing. */
  async pageFile(path) {
    const res = await request('GET', path);
    return res && res.data && typeof res.data === 'object' ? res.data : null;
  },

  /** The SSE stream's URL; the ticket cookie set on enter authenticates it. */
  eventsUrl(queue) {
    return url(`${queuePath(queue)}/events`);
  },

  async products() {
    const res = await request('GET', 'api/products');
    return Array.isArray(res.data) ? res.data : [];
  },

  async order({ entryToken, productId, quantity }) {
    const res = await request('POST', 'api/orders', {
      headers: {
        'X-Entry-Token': entryToken,
        'Content-Type': 'application/json',
      },
      body: JSON.stringify({ productId, quantity }),
    });
    return res.data;
  },
};
