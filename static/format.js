// Pure formatting helpers for the waiting-room page. No DOM, no imports, so
// they can be exercised directly by unit tests.
//
// Every word comes from the language's messages (i18n/<lang>.json, see
// i18n.js), set with useMessages(); numbers, money and times follow the
// language through Intl.

/**
 * A translator for one dictionary: t(key, vars) with "{name}" placeholders;
 * a message may be plural forms ({"one": …, "other": …}) picked by vars.n
 * through Intl.PluralRules. A missing key reads as the key itself, so a gap
 * shows up instead of breaking the page.
 */
export function translator(messages, locale) {
  const plurals = new Intl.PluralRules(locale);
  const numbers = new Intl.NumberFormat(locale, { maximumFractionDigits: 0 });
  return (key, vars = {}) => {
    let message = messages[key];
    if (message && typeof message === 'object') {
      message = message[plurals.select(Number(vars.n))] ?? message.other;
    }
    if (typeof message !== 'string') return key;
    return message.replace(/\{(\w+)\}/g, (whole, name) => {
      const value = vars[name];
      if (value === undefined) return whole;
      return typeof value === 'number' ? numbers.format(value) : String(value);
    });
  };
}

let t = (key) => key;
let locale;
let integerFormat = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 });
const moneyFormats = new Map();

/** Use `translate` (from translator()) and `lang` for everything below. */
export function useMessages(translate, lang) {
  t = translate;
  locale = lang;
  integerFormat = new Intl.NumberFormat(lang, { maximumFractionDigits: 0 });
  moneyFormats.clear();
}

/** A whole number with the reader's grouping ("12,345"), or an en dash when unknown. */
export function formatCount(n) {
  return Number.isFinite(n) ? integerFormat.format(n) : '–';
}

/**
 * The estimated wait in words. Deliberately rounded: a waiting room that
 * promises "about 3 minutes" and keeps that promise reads calmer than one
 * that counts seconds.
 */
export function waitInWords(seconds) {
  if (seconds == null || !Number.isFinite(seconds) || seconds < 0) return t('eta.unknown');
  if (seconds === 0) return t('eta.now');
  if (seconds < 60) return t('eta.underMinute');
  const minutes = Math.round(seconds / 60);
  if (minutes <= 1) return t('eta.minutes', { n: 1 });
  if (minutes < 55) return t('eta.minutes', { n: minutes });
  if (minutes < 90) return t('eta.hour');
  const hours = Math.round(seconds / 3600);
  if (hours >= 24) return t('eta.days');
  return t('eta.hours', { n: hours });
}

/**
 * An 80 % range of the wait in words ("about 12–18 minutes"): whole
 * minutes under an hour and a half, else whole hours; the point estimate's
 * words when the range rounds to one value.
 */
export function waitRangeInWords(low, high) {
  if (!Number.isFinite(low) || !Number.isFinite(high) || low < 0 || high < low) return t('eta.unknown');
  if (high < 60) return high === 0 ? t('eta.now') : t('eta.underMinute');
  if (high < 90 * 60) {
    const lo = Math.floor(low / 60);
    const hi = Math.max(1, Math.ceil(high / 60));
    if (lo === hi) return t('eta.minutes', { n: hi });
    if (lo === 0) return t('eta.upToMinutes', { n: hi });
    return t('eta.rangeMinutes', { low: lo, high: hi, n: hi });
  }
  const lo = Math.max(1, Math.floor(low / 3600));
  const hi = Math.max(1, Math.ceil(high / 3600));
  if (lo >= 24) return t('eta.days');
  if (lo === hi) return t('eta.hours', { n: hi });
  return t('eta.rangeHours', { low: lo, high: hi, n: hi });
}

/** How many people are ahead, as a phrase ("No one", "1 person", "46 people"). */
export function peopleAhead(rank) {
  if (!Number.isFinite(rank)) return '–';
  if (rank <= 0) return t('ahead.none');
  return t('ahead.people', { n: rank });
}

/** A countdown clock "m:ss" (or "h:mm:ss"), rounding up so 0:00 means time is up. */
export function formatClock(ms) {
  const total = Math.max(0, Math.ceil(ms / 1000));
  const h = Math.floor(total / 3600);
  const m = Math.floor((total % 3600) / 60);
  const s = total % 60;
  const ss = String(s).padStart(2, '0');
  return h > 0 ? `${h}:${String(m).padStart(2, '0')}:${ss}` : `${m}:${ss}`;
}

/** Remaining time in words for screen readers ("4 minutes 30 seconds"). */
export function durationInWords(seconds) {
  const total = Math.max(0, Math.ceil(seconds));
  const m = Math.floor(total / 60);
  const s = total % 60;
  const parts = [];
  if (m > 0) parts.push(t('duration.minutes', { n: m }));
  if (s > 0 || m === 0) parts.push(t('duration.seconds', { n: s }));
  return parts.join(t('duration.join'));
}

/** Cents as money in the reader's locale ("$129.00"). */
export function formatMoney(cents, currency = 'USD') {
  if (!Number.isFinite(cents)) return '–';
  let f = moneyFormats.get(currency);
  if (!f) {
    f = new Intl.NumberFormat(locale, { style: 'currency', currency });
    moneyFormats.set(currency, f);
  }
  return f.format(cents / 100);
}

/** A date and time in the reader's language, or an en dash. */
export function formatTime(iso) {
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return '–';
  return date.toLocaleString(locale, { dateStyle: 'medium', timeStyle: 'short' });
}

/**
 * The round number a position counts as for announcements: the smallest
 * milestone at or above it. Announcing only when this changes keeps a screen
 * reader informed without reading out every tick.
 */
export function milestone(position) {
  if (!Number.isFinite(position) || position < 1) return null;
  if (position <= 3) return position;
  const steps = [1, 2, 5];
  for (let scale = 1; ; scale *= 10) {
    for (const step of steps) {
      const m = step * scale;
      if (m >= 5 && position <= m) return m;
    }
  }
}

/**
 * Share of the way from where the buyer joined to the front, 0..1.
 * Joined at #5 and now #1: four of five steps done.
 */
export function progressFraction(startPosition, position) {
  if (!Number.isFinite(startPosition) || !Number.isFinite(position) || startPosition < 1) return 0;
  const done = (startPosition - position) / startPosition;
  return Math.min(1, Math.max(0, done));
}

const ENDINGS = ['left', 'expired', 'invalid', 'consumed', 'abandoned', 'replaced', 'sold_out', 'not_entered'];

/** The reason a place ended, as a heading, an explanation and an action. */
export function endedCopy(reason) {
  const known = ENDINGS.includes(reason) ? reason : 'not_entered';
  return {
    title: t(`ended.${known}.title`),
    text: t(`ended.${known}.text`),
    action: t(`ended.${known}.action`),
  };
}
