// Accessibility checks with axe-core, injected into the page under test.
// It is evaluated through the DevTools protocol, which the page's Content
// Security Policy does not govern, so the page is tested with its real
// policy in force and nothing is loaded from outside.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const AXE_SOURCE = readFileSync(require.resolve('axe-core/axe.min.js'), 'utf8');

/** The serious and critical violations axe-core finds in `page` as it is now. */
export async function seriousViolations(page) {
  await page.evaluate(AXE_SOURCE);
  const result = await page.evaluate(() =>
    // eslint-disable-next-line no-undef
    axe.run(document, { resultTypes: ['violations'] }),
  );
  return result.violations
    .filter((v) => v.impact === 'serious' || v.impact === 'critical')
    .map((v) => ({
      id: v.id,
      impact: v.impact,
      help: v.help,
      nodes: v.nodes.slice(0, 5).map((n) => `${n.target.join(' ')}: ${n.failureSummary}`),
    }));
}

/** Fails with what axe-core found, naming `what`, unless nothing serious. */
export async function assertAccessible(page, what) {
  const found = await seriousViolations(page);
  assert.deepEqual(found, [], `${what}: serious accessibility violations\n${JSON.stringify(found, null, 2)}`);
}
