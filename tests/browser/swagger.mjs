// Swagger UI as a user drives it, in Debian's Chromium: Authorize with a token, "Try it
// out" on DELETE /plants/{id} for a seeded plant (204 on the page), again (404 and the
// Error body), another plant with an Idempotency-Key twice (204, then 204 with
// Idempotent-Replayed), then logged out (401). Screenshots of each step go to $SHOTS.
// Run by tests/browser/run.sh, which starts the server and checks the database after.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const { BASE, TOKEN, PLANT, KEYED_PLANT, KEY, SHOTS } = process.env;
const profile = mkdtempSync(join(tmpdir(), 'plantstore-chromium-'));
const browser = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  viewport: { width: 1280, height: 1100 },
  args: [
    '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
    '--no-first-run',
  ],
});

function check(condition, what) {
  if (!condition) throw new Error(`Swagger UI: ${what}`);
  console.log(`ok: ${what}`);
}

try {
  const page = browser.pages()[0] ?? (await browser.newPage());
  await page.goto(`${BASE}/docs`);
  const operation = page.locator('#operations-plants-deletePlant');
  await operation.waitFor();

  const authorize = async (token) => {
    await page.locator('.auth-wrapper .authorize').click();
    const modal = page.locator('.modal-ux');
    if (token) {
      await modal.locator('input').fill(token);
      await modal.locator('.auth-btn-wrapper .authorize').click();
    } else {
      await modal.locator('.auth-btn-wrapper button', { hasText: 'Logout' }).click();
    }
    await modal.locator('.btn-done').click();
  };
  const execute = async (shot) => {
    const responses = operation.locator('.live-responses-table');
    await operation.locator('.execute, .btn-clear').first().waitFor();
    if (await operation.locator('.btn-clear').count()) await operation.locator('.btn-clear').click();
    await operation.locator('.execute').click();
    const status = responses.locator('.response .response-col_status').first();
    await status.waitFor();
    // The curl line shows the token: masked.
    await page.screenshot({ path: join(SHOTS, shot), fullPage: true, mask: [page.locator('.curl-command')], maskColor: '#333' });
    const body = (await responses.locator('.response-col_description pre, .response-col_description code').first().textContent().catch(() => '')) ?? '';
    const all = (await responses.locator('.response .response-col_description').first().textContent()) ?? '';
    return { status: (await status.textContent()).trim(), body, all };
  };

  await authorize(TOKEN);
  await operation.locator('.opblock-summary').click();
  await operation.locator('.try-out__btn').click();
  await operation.locator('input[placeholder="id"]').fill(PLANT);

  const deleted = await execute('1-deleted-204.png');
  check(deleted.status === '204', `first Execute shows 204 (saw ${deleted.status})`);

  const again = await execute('2-again-404.png');
  // The picture in the README: the operation and its live 404, as a user sees it.
  await operation.locator('.opblock-summary').evaluate((summary) => summary.scrollIntoView());
  await page.screenshot({ path: join(SHOTS, 'swagger-ui.png'), mask: [page.locator('.curl-command')], maskColor: '#333' });
  check(again.status === '404', `second Execute shows 404 (saw ${again.status})`);
  check(again.body.includes(`No plant with id ${PLANT} exists.`), `the 404 shows the Error body: ${again.body.trim()}`);

  await operation.locator('input[placeholder="id"]').fill(KEYED_PLANT);
  await operation.locator('input[placeholder="Idempotency-Key"]').fill(KEY);
  const keyed = await execute('3-keyed-204.png');
  check(keyed.status === '204' && !keyed.all.includes('idempotent-replayed'), `Execute with an Idempotency-Key shows 204 (saw ${keyed.status})`);
  const retried = await execute('4-retried-204-replayed.png');
  check(retried.status === '204', `the same key again shows 204 (saw ${retried.status})`);
  check(retried.all.includes('idempotent-replayed: true'), 'and the header idempotent-replayed: true');

  await authorize(null);
  const anonymous = await execute('5-no-token-401.png');
  check(anonymous.status === '401', `without a token Execute shows 401 (saw ${anonymous.status})`);
  check(anonymous.body.includes('"error": 401'), 'the 401 shows the Error body');
} finally {
  await browser.close();
  rmSync(profile, { recursive: true, force: true });
}
