// The page's languages. Every word the page shows comes from a dictionary,
// i18n/<lang>.json (the languages offered are the options of the switch in
// index.html; an operator's --page-dir may replace or add files), overlaid
// with the queue's branding texts. The language is the one the buyer
// picked with the switch (kept in localStorage), else the first of the
// browser's languages the page speaks, else English; <html lang> follows.

import { api } from './api.js';
import { translator, useMessages } from './format.js';

const STORAGE_KEY = 'waitroom.lang';
const FALLBACK = 'en';

let translate = (key) => key;
let brandTexts = {};
const listeners = [];

/** The message `key` in the page's language, with `{name}` placeholders filled from `vars`. */
export function t(key, vars) {
  return translate(key, vars);
}

/** Call `fn` after every language switch (to redraw what the page shows now). */
export function onLanguageChange(fn) {
  listeners.push(fn);
}

function stored() {
  try {
    return localStorage.getItem(STORAGE_KEY);
  } catch {
    return null;
  }
}

function store(tag) {
  try {
    localStorage.setItem(STORAGE_KEY, tag);
  } catch {
    // Private mode: the switch still works for this page.
  }
}

/** The first of `wanted` (language tags) the page speaks, by exact tag or by primary language. */
function pickLanguage(wanted, offered) {
  for (const tag of wanted) {
    if (typeof tag !== 'string') continue;
    if (offered.includes(tag)) return tag;
    const primary = tag.toLowerCase().split('-')[0];
    if (offered.includes(primary)) return primary;
  }
  return FALLBACK;
}

async function dictionary(tag) {
  try {
    return (await api.pageFile(`i18n/${tag}.json`)) ?? {};
  } catch {
    return {};
  }
}

/** The dictionaries `tag` needs, fetched at once: English under it (what a dictionary lacks), its own. */
function fetchWords(tag) {
  return Promise.all([dictionary(FALLBACK), tag === FALLBACK ? {} : dictionary(tag)]);
}

function use(tag, [base, own]) {
  // The brand's English texts stand in for the defaults, its texts in the
  // buyer's language for those: a brand that speaks only English does not
  // turn a Korean page English.
  // The queue's live texts (its settings, '*') stand over all of them, in
  // every language.
  const messages = {
    ...base,
    ...brandTexts[FALLBACK],
    ...own,
    ...(tag === FALLBACK ? {} : brandTexts[tag]),
    ...brandTexts['*'],
  };
  translate = translator(messages, tag);
  useMessages(translate, tag);
  document.documentElement.lang = tag;
  applyDom();
}

/** Fills every element marked data-i18n="key" (its text) and data-i18n-attr="attr:key;…". */
function applyDom(root = document) {
  for (const node of root.querySelectorAll('[data-i18n]')) {
    const text = t(node.dataset.i18n);
    if (node.textContent !== text) node.textContent = text;
  }
  for (const node of root.querySelectorAll('[data-i18n-attr]')) {
    for (const pair of node.dataset.i18nAttr.split(';')) {
      const [attr, key] = pair.split(':').map((s) => s.trim());
      if (attr && key) node.setAttribute(attr, t(key));
    }
  }
}

/** The languages the switch offers. */
function offered() {
  const select = document.getElementById('lang');
  return select ? [...select.options].map((o) => o.value) : [FALLBACK];
}

/** Switches to `tag`, remembers it, and redraws. */
async function setLanguage(tag) {
  if (!offered().includes(tag)) return;
  store(tag);
  use(tag, await fetchWords(tag));
  const select = document.getElementById('lang');
  if (select) select.value = tag;
  for (const fn of listeners) fn(tag);
}

/** The language to start in: the one picked before, else the browser's. */
export function startLanguage() {
  const languages = offered();
  const saved = stored();
  return saved && languages.includes(saved) ? saved : pickLanguage(navigator.languages ?? [navigator.language], languages);
}

/**
 * Starts fetching the words of `tag`; `ready(texts)` (the brand's texts,
 * per language) then puts them on the page and shows the switch.
 */
export function loadLanguage(tag) {
  const words = fetchWords(tag);
  return {
    async ready(texts = {}) {
      brandTexts = texts && typeof texts === 'object' ? texts : {};
      use(tag, await words);
      const select = document.getElementById('lang');
      if (!select) return;
      select.value = tag;
      select.addEventListener('change', () => setLanguage(select.value));
      select.closest('.lang-switch')?.removeAttribute('hidden');
    },
  };
}
