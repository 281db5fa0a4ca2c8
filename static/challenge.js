// Proof of work at the door: before joining, ask the server whether joins
// need a solved challenge (ALTCHA); if so, solve it in a Web Worker
// (altcha-worker.js) while the joining view shows "Checking your browser…"
// with a progress bar, then join with the solution in X-Altcha.
//
// Works under the page's strict CSP: no inline script or style, the worker
// is a file of the same origin, nothing is loaded from elsewhere.

import { api } from './api.js';
import { t } from './i18n.js';

const el = (id) => document.getElementById(id);

/** The ALTCHA payload the server checks, base64 of its JSON. */
function encodePayload(challenge, number, took) {
  const json = JSON.stringify({
    algorithm: challenge.algorithm,
    challenge: challenge.challenge,
    number,
    salt: challenge.salt,
    signature: challenge.signature,
    took,
  });
  return btoa(json);
}

/** Shows the check in the joining view; returns the progress updater and a cleanup. */
function showChecking(maxnumber) {
  const view = el('view-joining');
  const heading = el('joining-heading');
  const text = el('joining-text');
  const before = { heading: heading.textContent, text: text.textContent };
  heading.textContent = t('challenge.heading');
  text.textContent = t('challenge.text');
  document.title = t('title.with', { prefix: t('title.checking') });

  const progress = document.createElement('progress');
  progress.id = 'challenge-progress';
  progress.max = maxnumber + 1;
  progress.value = 0;
  progress.setAttribute('aria-label', t('challenge.label'));
  const status = document.createElement('p');
  status.id = 'challenge-status';
  status.className = 'lede';
  status.setAttribute('role', 'status');
  status.textContent = t('challenge.status');
  view.append(progress, status);
  return {
    update(tried) {
      progress.value = Math.min(tried, progress.max);
    },
    done(ok) {
      status.textContent = ok ? t('challenge.done') : '';
      progress.value = progress.max;
      progress.remove();
      status.remove();
      heading.textContent = before.heading;
      text.textContent = before.text;
    },
  };
}

/** Solves `challenge` in a worker; resolves to the X-Altcha value. */
function solve(challenge, onProgress) {
  return new Promise((resolve, reject) => {
    const worker = new Worker(new URL('altcha-worker.js', import.meta.url));
    const finish = (fn, value) => {
      worker.terminate();
      fn(value);
    };
    worker.onmessage = ({ data }) => {
      if (data.type === 'progress') onProgress(data.tried);
      else if (data.type === 'solved') finish(resolve, encodePayload(challenge, data.number, data.took));
      else finish(reject, new Error(t('challenge.failed')));
    };
    worker.onerror = (event) => {
      event.preventDefault();
      finish(reject, new Error(t('challenge.noRun')));
    };
    worker.postMessage({ challenge: challenge.challenge, salt: challenge.salt, maxnumber: challenge.maxnumber });
  });
}

/**
 * The X-Altcha value for the next join of `queue`, or null when joins need
 * no challenge now. `quiet`: solve without showing the check (the page is
 * already showing a place in line).
 */
export async function passDoor(queue, { quiet = false } = {}) {
  const challenge = await api.challenge(queue);
  if (!challenge) return null;
  const ui = quiet ? null : showChecking(challenge.maxnumber);
  try {
    const solution = await solve(challenge, (tried) => ui?.update(tried));
    ui?.done(true);
    return solution;
  } catch (err) {
    ui?.done(false);
    throw err;
  }
}

/** True for an answer that says the join needs a (new) solved challenge. */
function wantsChallenge(err) {
  return err && (err.status === 428 || (err.status === 403 && /^challenge_/.test(err.code || '')));
}

/**
 * Joins through the door: `enter(solution)` with a solution when one is
 * needed. If the server wants one after all (the `auto` switch turned on
 * in between, or the solution expired), solves a new one and tries once more.
 */
export async function enterThroughDoor(queue, enter, { quiet = false } = {}) {
  const solution = await passDoor(queue, { quiet });
  try {
    return await enter(solution);
  } catch (err) {
    if (!wantsChallenge(err)) throw err;
    const again = await passDoor(queue, { quiet });
    return enter(again);
  }
}
