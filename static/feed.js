// The live status feed of one place in line.
//
// One tab per buyer and queue (the leader, chosen with a Web Lock named
// `waitroom-stream-<queue>`) holds the Server-Sent Events stream and passes
// every update to the other tabs over a BroadcastChannel. When the stream
// cannot be had, the leader polls the position endpoint instead, honouring the
// server's polling interval with jitter, and keeps trying to get the stream
// back. An update is the server's QueueStatus as it comes, from a poll or
// an event (the same object with the same names, see README "The API"):
// status WAITING or READY, or NOT_ENTERED with the `reason` a `gone` event
// gives.
//
// `gone: replaced` is not an ending: the place stands, another stream of the
// same buyer (another browser, device or a window that lost its leadership)
// took over. The feed then yields: it closes its stream, keeps polling (which
// keeps the place marked as present, so it is never dropped as abandoned)
// and does not try the stream again by itself, which would take it back from
// the other window in turn; `takeBack()` does, when the buyer asks.

import { requestLeadership } from './tabs.js';

/** No message this long after opening (or losing) the stream: fall back to polling. */
const STREAM_SILENCE_MS = 10_000;
/** While polling, try the stream again after this long, doubling up to the maximum. */
const STREAM_RETRY_MIN_MS = 15_000;
const STREAM_RETRY_MAX_MS = 120_000;
const DEFAULT_POLL_SECONDS = 2;
const MAX_POLL_BACKOFF_MS = 30_000;
/** A new leader waits this long before opening its stream, so that a stop that is already on its way wins. */
const LEAD_SETTLE_MS = 50;

const jitter = (ms, spread = 0.2) => ms * (1 - spread + Math.random() * 2 * spread);

/**
 * The status each event stands for. The data says it too; the name is
 * taken first so an instance of the previous version, met during a rolling
 * deploy, still moves the page.
 */
const EVENT_STATUS = { waiting: 'WAITING', ready: 'READY', gone: 'NOT_ENTERED', prequeue: 'PRE_QUEUE' };

export class StatusFeed {
  /**
   * @param {object} o
   * @param {string} o.queue
   * @param {string} o.userId
   * @param {object} o.api            the API client (position, eventsUrl)
   * @param {import('./tabs.js').TabBus} o.bus
   * @param {() => string|null} o.getTicket
   * @param {(update, info) => void} o.onUpdate   info.viaOtherTab tells whether another tab holds the stream
   * @param {(mode, info) => void} o.onMode       'connecting' | 'live' | 'reconnecting' | 'polling'
   * @param {() => void} o.onAuthLost             the ticket was refused: join again for a fresh one
   * @param {(yielded: boolean) => void} [o.onYield] the stream was taken over elsewhere (true) or taken back (false)
   * @param {number} [o.pollingIntervalSeconds]
   */
  constructor(o) {
    Object.assign(this, o);
    this.pollSeconds = o.pollingIntervalSeconds || DEFAULT_POLL_SECONDS;
    this.running = false;
    this.leading = false;
    this.mode = null;
    this.last = null;
    this.es = null;
    this.polling = false;
    this.pollTimer = null;
    this.pollFailures = 0;
    this.lastPollAt = 0;
    this.streamRetryMs = STREAM_RETRY_MIN_MS;
    this.retryTimer = null;
    this.yielded = false;
    this.silenceTimer = null;
    this.unsubscribe = [];
    this.cancelLeadership = null;
    this.endLeadership = null;
  }

  start() {
    if (this.running) return;
    this.running = true;
    this.#on(document, 'visibilitychange', () => {
      if (document.visibilityState === 'visible' && this.polling && Date.now() - this.lastPollAt > 2_000) this.#pollSoon(0);
    });
    this.#on(window, 'online', () => {
      if (this.polling) this.#retryStreamSoon(0);
    });

    if (!this.bus.shared) {
      // No way to talk to other tabs: every tab keeps its own stream.
      this.#lead();
      return;
    }
    this.unsubscribe.push(
      this.bus.on('update', (m) => {
        if (m.userId === this.userId && !this.leading) this.#deliver(m.update, true);
      }),
      this.bus.on('mode', (m) => {
        if (m.userId === this.userId && !this.leading && this.running) this.onMode(m.mode, { viaOtherTab: true });
      }),
      this.bus.on('hello', (m) => {
        if (m.userId === this.userId && this.leading) this.#answerHello();
      }),
    );
    this.cancelLeadership = requestLeadership(`waitroom-stream-${this.queue}`, () => this.#lead());
    // If another tab already leads, ask it for the latest news.
    this.bus.post('hello', { userId: this.userId });
  }

  /** Stop for good: close the stream, stop polling, hand leadership on. */
  stop() {
    if (!this.running) return;
    this.running = false;
    this.cancelLeadership?.();
    this.cancelLeadership = null;
    this.leading = false;
    this.#closeStream();
    this.#stopPolling();
    clearTimeout(this.silenceTimer);
    for (const off of this.unsubscribe) off();
    this.unsubscribe = [];
    const end = this.endLeadership;
    this.endLeadership = null;
    end?.();
  }

  /** Take the stream back after it was replaced elsewhere (the buyer asked). */
  takeBack() {
    if (!this.running || !this.yielded) return;
    this.yielded = false;
    this.onYield?.(false);
    if (this.leading) this.#openStream();
  }

  /** The stream was replaced: poll on (presence), without the stream. */
  #yield() {
    this.yielded = true;
    this.#closeStream();
    clearTimeout(this.retryTimer);
    this.retryTimer = null;
    this.polling = true;
    this.#setMode('polling');
    this.#pollSoon(jitter(this.pollSeconds * 1000));
    this.onYield?.(true);
  }

  /** The server said how often to poll (from a QueueStatus). */
  setPollingInterval(seconds) {
    if (Number.isFinite(seconds) && seconds > 0) this.pollSeconds = seconds;
  }

  // --- leadership -----------------------------------------------------------

  async #lead() {
    if (!this.running) return;
    await new Promise((resolve) => setTimeout(resolve, LEAD_SETTLE_MS));
    if (!this.running) return;
    this.leading = true;
    const held = new Promise((resolve) => {
      this.endLeadership = resolve;
    });
    this.#openStream();
    await held;
  }

  #answerHello() {
    if (this.mode) this.bus.post('mode', { userId: this.userId, mode: this.mode });
    if (!this.last) return;
    let update = this.last.update;
    if (update.status === 'READY' && Number.isFinite(update.tokenExpiresInSeconds)) {
      const elapsed = (Date.now() - this.last.at) / 1000;
      update = { ...update, tokenExpiresInSeconds: Math.max(0, Math.round(update.tokenExpiresInSeconds - elapsed)) };
    }
    this.bus.post('update', { userId: this.userId, update });
  }

  #deliver(update, viaOtherTab = false) {
    if (!this.running || !update) return;
    this.last = { update, at: Date.now() };
    if (this.leading && this.bus.shared) this.bus.post('update', { userId: this.userId, update });
    if (update.status === 'NOT_ENTERED') this.stop();
    this.onUpdate(update, { viaOtherTab });
  }

  #setMode(mode) {
    if (this.mode === mode || !this.running) return;
    this.mode = mode;
    if (this.leading && this.bus.shared) this.bus.post('mode', { userId: this.userId, mode });
    this.onMode(mode, { viaOtherTab: false });
  }

  // --- the stream -----------------------------------------------------------

  #openStream() {
    if (!this.running || !this.leading) return;
    this.#closeStream();
    let es;
    try {
      es = new EventSource(this.api.eventsUrl(this.queue));
    } catch {
      this.#streamFailed();
      return;
    }
    this.es = es;
    let errorsInARow = 0;
    if (!this.polling) this.#setMode(this.mode === 'live' ? 'reconnecting' : 'connecting');
    this.#armSilence(es);

    const onEvent = (event) => {
      if (this.es !== es || !this.running) return;
      let data;
      try {
        data = JSON.parse(event.data);
      } catch {
        return;
      }
      if (!data || typeof data !== 'object') return;
      errorsInARow = 0;
      clearTimeout(this.silenceTimer);
      if (event.type === 'gone' && data.reason === 'replaced') {
        this.#yield();
        return;
      }
      if (this.polling) this.#stopPolling();
      this.streamRetryMs = STREAM_RETRY_MIN_MS;
      this.#setMode('live');
      this.#deliver({ ...data, status: EVENT_STATUS[event.type] });
    };
    for (const type of ['waiting', 'ready', 'gone', 'prequeue']) es.addEventListener(type, onEvent);

    es.onerror = () => {
      if (this.es !== es || !this.running) return;
      if (es.readyState === EventSource.CLOSED) {
        // The server refused the stream for good (e.g. 401: the ticket's
        // place has ended). Polling finds out what that means.
        this.#streamFailed({ pollNow: true });
        return;
      }
      // CONNECTING: the browser is retrying by itself.
      errorsInARow += 1;
      if (this.polling || errorsInARow >= 2) {
        this.#streamFailed();
        return;
      }
      this.#setMode('reconnecting');
      this.#armSilence(es);
    };
  }

  #armSilence(es) {
    clearTimeout(this.silenceTimer);
    this.silenceTimer = setTimeout(() => {
      if (this.es === es && this.running) this.#streamFailed();
    }, STREAM_SILENCE_MS);
  }

  #closeStream() {
    clearTimeout(this.silenceTimer);
    if (this.es) {
      this.es.onerror = null;
      this.es.close();
      this.es = null;
    }
  }

  #streamFailed({ pollNow = false } = {}) {
    this.#closeStream();
    if (!this.running || !this.leading) return;
    if (this.polling) {
      // A retry while polling did not work out; polling carries on.
      this.#retryStreamSoon();
      if (pollNow) this.#pollSoon(0);
      return;
    }
    this.polling = true;
    this.#setMode('polling');
    this.#pollSoon(0);
    this.#retryStreamSoon();
  }

  #retryStreamSoon(delayMs) {
    clearTimeout(this.retryTimer);
    if (this.yielded) return;
    const delay = delayMs ?? jitter(this.streamRetryMs);
    if (delayMs === undefined) this.streamRetryMs = Math.min(this.streamRetryMs * 2, STREAM_RETRY_MAX_MS);
    this.retryTimer = setTimeout(() => {
      if (this.running && this.leading && this.polling) this.#openStream();
    }, delay);
  }

  // --- polling --------------------------------------------------------------

  #pollSoon(delayMs) {
    clearTimeout(this.pollTimer);
    this.pollTimer = setTimeout(() => this.#pollOnce(), delayMs);
  }

  #stopPolling() {
    this.polling = false;
    clearTimeout(this.pollTimer);
    clearTimeout(this.retryTimer);
    this.pollTimer = null;
    this.retryTimer = null;
    this.pollFailures = 0;
  }

  async #pollOnce() {
    this.pollTimer = null;
    if (!this.running || !this.polling) return;
    this.lastPollAt = Date.now();
    let next;
    try {
      const status = await this.api.position(this.queue, this.getTicket());
      if (!this.running || !this.polling) return;
      this.pollFailures = 0;
      this.setPollingInterval(status && status.pollingIntervalSeconds);
      this.#setMode('polling');
      this.#deliver(status);
      next = jitter(this.pollSeconds * 1000);
    } catch (err) {
      if (!this.running || !this.polling) return;
      if (err && err.status === 401 && err.code === 'ticket_ended') {
        // The place this ticket stood for is over (left, dropped, token
        // used or expired): say so; joining again is the buyer's choice.
        this.#deliver({ status: 'NOT_ENTERED', reason: 'not_entered' });
        return;
      }
      if (err && err.status === 401) {
        // The ticket is no longer accepted (expired, or the server was
        // restarted with a new secret): the page joins again, which keeps
        // the place if there is one and replaces this feed.
        this.onAuthLost();
        return;
      }
      this.pollFailures += 1;
      this.#setMode('reconnecting');
      const backoff = Math.min(MAX_POLL_BACKOFF_MS, this.pollSeconds * 1000 * 2 ** this.pollFailures);
      const hinted = err && Number.isFinite(err.retryAfterSeconds) ? err.retryAfterSeconds * 1000 : 0;
      next = jitter(Math.max(backoff, hinted));
    }
    if (this.running && this.polling && this.pollTimer === null) this.#pollSoon(next);
  }

  #on(target, type, handler) {
    target.addEventListener(type, handler);
    this.unsubscribe.push(() => target.removeEventListener(type, handler));
  }
}
