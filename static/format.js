// Pure formatting helpers for the waiting-room page. No DOM, no imports, so
// they can be exercised directly by unit tests.

const integerFormat = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 });

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
  if (seconds == null || !Number.isFinite(seconds) || seconds < 0) return 'working it out…';
  if (seconds === 0) return 'any moment now';
  if (seconds < 60) return 'less than a minute';
  const minutes = Math.round(seconds / 60);
  if (minutes <= 1) return 'about a minute';
  if (minutes < 55) return `about ${minutes} minutes`;
  if (minutes < 90) return 'about an hour';
  const hours = Math.round(seconds / 3600);
  if (hours >= 24) return 'more than a day';
  return `about ${hours} hours`;
}

/** How many people are ahead, as a phrase ("No one", "1 person", "46 people"). */
export function peopleAhead(rank) {
  if (!Number.isFinite(rank)) return '–';
  if (rank <= 0) return 'No one';
  if (rank === 1) return '1 person';
  return `${formatCount(rank)} people`;
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
  if (m > 0) parts.push(m === 1 ? '1 minute' : `${m} minutes`);
  if (s > 0 || m === 0) parts.push(s === 1 ? '1 second' : `${s} seconds`);
  return parts.join(' ');
}

const moneyFormats = new Map();

/** Cents as money in the reader's locale ("$129.00"). */
export function formatMoney(cents, currency = 'USD') {
  if (!Number.isFinite(cents)) return '–';
  let f = moneyFormats.get(currency);
  if (!f) {
    f = new Intl.NumberFormat(undefined, { style: 'currency', currency });
    moneyFormats.set(currency, f);
  }
  return f.format(cents / 100);
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

/** The reason a place ended, as a heading, an explanation and an action. */
export function endedCopy(reason) {
  switch (reason) {
    case 'left':
      return {
        title: "You've left the queue",
        text: "Your place has been given up. If you change your mind you're welcome back — you'll join at the end of the line.",
        action: 'Join the queue again',
      };
    case 'expired':
      return {
        title: 'Your turn has ended',
        text: "The time to place an order ran out, so your spot went to the next person in line. You can join the queue again.",
        action: 'Join the queue again',
      };
    case 'invalid':
      return {
        title: 'Your turn has ended',
        text: 'Your entry pass is no longer valid — it may have run out or already been used. You can join the queue again.',
        action: 'Join the queue again',
      };
    case 'consumed':
      return {
        title: 'Your entry pass has been used',
        text: 'An order was placed with your pass, perhaps in another tab or on another device. To buy again, join the queue again.',
        action: 'Join the queue again',
      };
    case 'abandoned':
      return {
        title: 'Your place was released',
        text: "We didn't hear from this page for a while, so your place went to the people behind you. Join again to get back in line.",
        action: 'Join the queue again',
      };
    case 'replaced':
      return {
        title: 'You continued somewhere else',
        text: 'The waiting room was opened in another browser or on another device, and that one is now keeping your place. You can carry on there, or continue here instead.',
        action: 'Continue here instead',
      };
    // --- stock: sold out (English strings of the sold-out view) ---
    case 'sold_out':
      return {
        title: 'Sold out',
        text: "Everything has been sold, so there is nothing left to wait for. We'll keep your place in case more stock arrives — this page checks now and then.",
        action: 'Check again',
      };
    // --- end of stock strings ---
    case 'not_entered':
    default:
      return {
        title: "You're not in the queue",
        text: "We couldn't find your place in line — it may have been released. Join the queue to get a place.",
        action: 'Join the queue',
      };
  }
}
