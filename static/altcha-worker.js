// Solves one ALTCHA challenge off the page's main thread: finds the number n
// in 0..maxnumber with hex(SHA-256(salt + n)) === challenge.
//
// A classic worker served from the page's own origin (the page's CSP allows
// scripts from 'self' only: no blob: worker, no eval). Hashes with
// crypto.subtle, a batch at a time, and reports progress after each batch.
//
// In:  { challenge, salt, maxnumber }
// Out: { type: 'progress', tried } …, then { type: 'solved', number, took }
//      or { type: 'failed', reason }.

'use strict';

const BATCH = 2000;

function hexToBytes(hex) {
  const out = new Uint8Array(hex.length / 2);
  for (let i = 0; i < out.length; i += 1) out[i] = parseInt(hex.slice(2 * i, 2 * i + 2), 16);
  return out;
}

function same(buffer, target) {
  const bytes = new Uint8Array(buffer);
  if (bytes[0] !== target[0]) return false;
  for (let i = 1; i < target.length; i += 1) if (bytes[i] !== target[i]) return false;
  return true;
}

self.onmessage = async (event) => {
  const { challenge, salt, maxnumber } = event.data || {};
  if (!self.crypto || !self.crypto.subtle) {
    self.postMessage({ type: 'failed', reason: 'This browser cannot run the check here (no Web Crypto).' });
    return;
  }
  if (typeof challenge !== 'string' || !/^[0-9a-f]{64}$/.test(challenge) || typeof salt !== 'string'
      || !Number.isSafeInteger(maxnumber) || maxnumber < 0) {
    self.postMessage({ type: 'failed', reason: 'The check the server sent is not one this page understands.' });
    return;
  }
  const target = hexToBytes(challenge);
  const encoder = new TextEncoder();
  const started = performance.now();
  for (let start = 0; start <= maxnumber; start += BATCH) {
    const end = Math.min(maxnumber, start + BATCH - 1);
    const hashes = [];
    for (let n = start; n <= end; n += 1) hashes.push(crypto.subtle.digest('SHA-256', encoder.encode(salt + n)));
    const done = await Promise.all(hashes);
    for (let i = 0; i < done.length; i += 1) {
      if (same(done[i], target)) {
        self.postMessage({ type: 'solved', number: start + i, took: Math.round(performance.now() - started) });
        return;
      }
    }
    self.postMessage({ type: 'progress', tried: end + 1 });
  }
  self.postMessage({ type: 'failed', reason: 'The check could not be completed.' });
};
