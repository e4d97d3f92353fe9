// A page on another origin calls DELETE /plants/{id} with fetch, in Debian's Chromium: from
// the origin PLANTSTORE_CORS_ALLOWED_ORIGINS names, the page reads 204 and x-request-id;
// from any other origin, Chromium blocks the call before the DELETE is sent (the preflight
// gets no CORS headers). Run by tests/browser/run.sh, which checks the database after.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const { BASE, TOKEN, ALLOWED_PAGE, OTHER_PAGE, ALLOWED_PLANT, OTHER_PLANT, SHOTS } = process.env;
const profile = mkdtempSync(join(tmpdir(), 'plantstore-chromium-'));
const browser = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: [
    '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
    '--no-first-run',
  ],
});

function check(condition, what) {
  if (!condition) throw new Error(`cross-origin page: ${what}`);
  console.log(`ok: ${what}`);
}

async function shown(page, origin, plant, shot) {
  const query = new URLSearchParams({ api: BASE, token: TOKEN, plant });
  await page.goto(`${origin}/cross-origin.html?${query}`);
  const result = page.locator('#result');
  await result.filter({ hasNotText: 'pending' }).waitFor();
  await page.screenshot({ path: join(SHOTS, shot) });
  return (await result.textContent()).trim();
}

try {
  const page = browser.pages()[0] ?? (await browser.newPage());
  const console_ = [];
  page.on('console', (message) => console_.push(message.text()));
  const allowed = await shown(page, ALLOWED_PAGE, ALLOWED_PLANT, '6-cross-origin-allowed.png');
  check(/^status 204 request-id \S+/.test(allowed) && !allowed.includes('hidden'),
    `a page on ${ALLOWED_PAGE} deletes plant ${ALLOWED_PLANT} and reads 204 and its x-request-id (${allowed})`);
  const other = await shown(page, OTHER_PAGE, OTHER_PLANT, '7-cross-origin-blocked.png');
  const said = console_.find((text) => text.includes('blocked by CORS policy')) ?? '';
  check(other.startsWith('blocked:') && said.includes(OTHER_PAGE),
    `a page on ${OTHER_PAGE} is blocked by Chromium: ${said}`);
} finally {
  await browser.close();
  rmSync(profile, { recursive: true, force: true });
}
