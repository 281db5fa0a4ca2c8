// A queue's branding (GET api/queues/<queue>/page, from the operator's
// --page-dir): its name and logo in the masthead, its colours as CSS custom
// properties. Under the page's policy (style-src 'self', no inline styles)
// only the CSS object model may set styles, which is what this does; the
// server has checked every colour is #rgb or #rrggbb, and it is checked
// again here before use.

const HEX = /^#([0-9a-f]{3}|[0-9a-f]{6})$/i;

/** #rgb as #rrggbb; null for anything that is not a hex colour. */
export function fullHex(color) {
  if (typeof color !== 'string' || !HEX.test(color)) return null;
  if (color.length === 7) return color.toLowerCase();
  return `#${[...color.slice(1)].map((c) => c + c).join('')}`.toLowerCase();
}

function applyColors(colors) {
  const root = document.documentElement.style;
  const accent = fullHex(colors?.accent);
  if (accent) {
    root.setProperty('--accent', accent);
    root.setProperty('--accent-strong', accent);
    root.setProperty('--accent-gradient', `linear-gradient(90deg, ${accent}, ${accent})`);
    root.setProperty('--accent-soft', `${accent}1f`);
    root.setProperty('--ring', `0 0 0 3px ${accent}59`);
  }
  const accentText = fullHex(colors?.accentText);
  if (accentText) root.setProperty('--accent-contrast', accentText);
  const background = fullHex(colors?.background);
  if (background) {
    root.setProperty('--bg', background);
    root.setProperty('--bg-glow-1', 'transparent');
    root.setProperty('--bg-glow-2', 'transparent');
  }
}

function applyLogo(logo) {
  if (typeof logo !== 'string' || !logo) return;
  const img = document.createElement('img');
  img.className = 'brand-logo';
  img.alt = '';
  img.src = new URL(logo.split('/').map(encodeURIComponent).join('/'), document.baseURI).href;
  document.querySelector('.brand-mark')?.replaceWith(img);
}

/**
 * Applies `brand` to the page. Its name and texts go through the
 * dictionaries (see i18n.js): the name becomes the "brand.name" message.
 * Returns the brand's texts per language, with the name folded in.
 */
export function applyBrand(brand) {
  if (!brand || typeof brand !== 'object') return {};
  applyColors(brand.colors);
  applyLogo(brand.logo);
  const texts = { ...(brand.texts ?? {}) };
  // The queue's live texts (PUT /api/admin/queues/<queue>): one set for
  // every language, over the branding's (i18n.js).
  if (brand.queueTexts && typeof brand.queueTexts === 'object') texts['*'] = { ...brand.queueTexts };
  if (typeof brand.name === 'string' && brand.name) {
    document.documentElement.dataset.branded = 'true';
    texts.en = { 'brand.name': brand.name, ...(texts.en ?? {}) };
  }
  return texts;
}
