// Coordination between the tabs of one buyer: a message bus
// (BroadcastChannel) and leader election (Web Locks, with a localStorage
// lease as a fallback where Web Locks are unavailable, e.g. plain-HTTP pages).

/** A small typed message bus over BroadcastChannel; a no-op where that is missing. */
export class TabBus {
  constructor(name) {
    this.handlers = new Map();
    try {
      this.channel = new BroadcastChannel(name);
      this.channel.onmessage = (event) => this.#dispatch(event.data);
    } catch {
      this.channel = null;
    }
  }

  /** Whether other tabs can hear this one. */
  get shared() {
    return this.channel !== null;
  }

  post(type, payload = {}) {
    if (!this.channel) return;
    try {
      this.channel.postMessage({ ...payload, type });
    } catch {
      // A closed channel or an uncloneable payload: nothing useful to do.
    }
  }

  /** Subscribe to one message type; returns the unsubscribe function. */
  on(type, handler) {
    if (!this.handlers.has(type)) this.handlers.set(type, new Set());
    this.handlers.get(type).add(handler);
    return () => this.handlers.get(type)?.delete(handler);
  }

  #dispatch(message) {
    if (!message || typeof message.type !== 'string') return;
    for (const handler of this.handlers.get(message.type) ?? []) {
      try {
        handler(message);
      } catch (err) {
        console.warn('waitroom: tab message handler failed', err);
      }
    }
  }
}

/**
 * Ask to become the one leader among this origin's tabs for `name`.
 * `onLead` runs once this tab is the leader and returns a promise; leadership
 * lasts until that promise settles (or the tab goes away), and then passes to
 * another waiting tab. Returns a function that withdraws a pending request.
 */
export function requestLeadership(name, onLead) {
  if (navigator.locks && typeof navigator.locks.request === 'function') {
    const controller = new AbortController();
    let cancelLease = null;
    navigator.locks
      .request(name, { signal: controller.signal }, () => onLead())
      .catch((err) => {
        if (err && err.name === 'AbortError') return;
        // Locks exist but refused us (e.g. a sandboxed frame): use the lease.
        console.warn('waitroom: Web Locks unavailable, using a storage lease', err);
        if (!controller.signal.aborted) cancelLease = leaseLeadership(name, onLead);
      });
    return () => {
      controller.abort();
      if (cancelLease) cancelLease();
    };
  }
  return leaseLeadership(name, onLead);
}

const LEASE_MS = 5_000;
const LEASE_RENEW_MS = 1_500;
const LEASE_CHECK_MS = 1_000;
const LEASE_SETTLE_MS = 80;

/**
 * Leader election over localStorage: the leader keeps a short lease fresh;
 * others take it over once it lapses. Weaker than Web Locks (a race can
 * briefly leave two leaders, which the server resolves with `replaced`),
 * but only used where Web Locks are missing.
 */
function leaseLeadership(name, onLead) {
  const key = `waitroom.lease.${name}`;
  const me = `${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 10)}`;
  let stopped = false;
  let leading = false;
  let timer = null;

  const read = () => {
    try {
      return JSON.parse(localStorage.getItem(key) || 'null');
    } catch {
      return null;
    }
  };
  const write = () => {
    try {
      localStorage.setItem(key, JSON.stringify({ owner: me, expires: Date.now() + LEASE_MS }));
    } catch {
      // Storage full or blocked: the lease just won't be visible to others.
    }
  };
  const release = () => {
    try {
      if (read()?.owner === me) localStorage.removeItem(key);
    } catch {
      // ignore
    }
  };
  const later = (fn, ms) => {
    clearTimeout(timer);
    timer = setTimeout(fn, ms);
  };
  const renew = () => {
    if (stopped || !leading) return;
    write();
    later(renew, LEASE_RENEW_MS);
  };
  const attempt = () => {
    if (stopped || leading) return;
    const current = read();
    if (current && current.owner !== me && current.expires > Date.now()) {
      later(attempt, LEASE_CHECK_MS * (0.5 + Math.random()));
      return;
    }
    write();
    later(() => {
      if (stopped) return;
      if (read()?.owner !== me) {
        later(attempt, LEASE_CHECK_MS * (0.5 + Math.random()));
        return;
      }
      leading = true;
      later(renew, LEASE_RENEW_MS);
      Promise.resolve()
        .then(onLead)
        .catch(() => {})
        .finally(() => {
          leading = false;
          clearTimeout(timer);
          release();
          if (!stopped) later(attempt, LEASE_CHECK_MS);
        });
    }, LEASE_SETTLE_MS);
  };
  const onStorage = (event) => {
    if (event.key === key && event.newValue === null && !leading && !stopped) later(attempt, Math.random() * 200);
  };
  const onPageHide = () => {
    if (leading) release();
  };

  addEventListener('storage', onStorage);
  addEventListener('pagehide', onPageHide);
  attempt();

  return () => {
    stopped = true;
    if (!leading) clearTimeout(timer);
    removeEventListener('storage', onStorage);
    removeEventListener('pagehide', onPageHide);
  };
}
