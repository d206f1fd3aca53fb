// Signing in to the settings pages through a real OpenID Connect provider: `oidc-provider`
// (npm, certified), configured here, and Debian's headless Chromium driven by Playwright.
// crates/e2e/tests/e2e/oidc.rs runs it:
//   1. this script serves on a free port and prints `ISSUER <url>`;
//   2. the test starts admin with TOCSIN_OIDC_ISSUER=<url> and writes admin's URL on stdin;
//   3. this script registers admin's callback as the client's, then signs in as `olga`
//      (group `oncall`: operator), who acknowledges the incident the test recorded, and as
//      `nobody` (no mapped group: refused), and exits 0 when every check held, 1 otherwise.
// It reads OIDC_CLIENT_SECRET and CHROMIUM (default /usr/bin/chromium) from the environment.

import assert from "node:assert/strict";
import { generateKeyPairSync } from "node:crypto";
import http from "node:http";
import readline from "node:readline";
import Provider from "oidc-provider";
import { chromium } from "playwright-core";

const CLIENT_SECRET = process.env.OIDC_CLIENT_SECRET;
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const PEOPLE = {
  olga: { name: "Olga Oncall", groups: ["oncall", "staff"] },
  nobody: { name: "No Body", groups: ["staff"] },
};

let handler = null;
const server = http.createServer((req, res) => {
  if (handler) return handler(req, res);
  res.statusCode = 503;
  res.end();
});
await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
const issuer = `http://127.0.0.1:${server.address().port}`;
console.log(`ISSUER ${issuer}`);

const lines = readline.createInterface({ input: process.stdin });
const adminUrl = (await lines[Symbol.asyncIterator]().next()).value.trim();

/** A provider signing with a new RSA key named `kid`. */
function providerSigningWith(kid) {
  const { privateKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
  const signingKey = { ...privateKey.export({ format: "jwk" }), kid, use: "sig", alg: "RS256" };
  return new Provider(issuer, {
  clients: [
    {
      client_id: "tocsin",
      client_secret: CLIENT_SECRET,
      redirect_uris: [`${adminUrl}/settings/sign-in/oidc/callback`],
      grant_types: ["authorization_code"],
      response_types: ["code"],
      token_endpoint_auth_method: "client_secret_post",
    },
  ],
  jwks: { keys: [signingKey] },
  claims: { openid: ["sub"], profile: ["name", "groups"] },
  conformIdTokenClaims: false,
  findAccount: async (_ctx, id) => ({
    accountId: id,
    claims: async () => ({ sub: id, ...(PEOPLE[id] || { name: id, groups: [] }) }),
  }),
  cookies: { keys: ["tocsin-oidc-test-cookie-key"] },
  });
}
handler = providerSigningWith("test-key-1").callback();

const browser = await chromium.launch({
  executablePath: CHROMIUM,
  headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"],
});

/** Signs in as `login` through the provider's own login and consent pages. */
async function signInAs(page, login) {
  await page.goto(`${adminUrl}/settings/sign-in`);
  await page.getByRole("link", { name: "Sign in with your identity provider" }).click();
  await page.locator("input[name=login]").fill(login);
  await page.locator("input[name=password]").fill("any password");
  await page.locator("button[type=submit]").click();
  // The consent page, the first time this client asks.
  await page.locator("button[type=submit]").click();
}

let failed = false;
async function check(name, body) {
  const context = await browser.newContext();
  const page = await context.newPage();
  page.setDefaultTimeout(20000);
  try {
    await body(page);
    console.log(`ok ${name}`);
  } catch (error) {
    failed = true;
    console.log(`not ok ${name}: ${error.stack}\n  at ${page.url()}\n${(await page.content()).slice(0, 3000)}`);
  } finally {
    await context.close();
  }
}

await check("an operator signs in through the provider and sees only what an operator may", async (page) => {
  await signInAs(page, "olga");
  await page.getByRole("heading", { level: 1, name: "Webhooks" }).waitFor();
  assert.ok(page.url().startsWith(`${adminUrl}/settings/`), page.url());
  const nav = page.getByRole("navigation", { name: "Settings sections" });
  assert.equal(await nav.getByRole("link", { name: "Admin keys" }).count(), 0);
  const keys = await page.goto(`${adminUrl}/settings/admin-keys`);
  assert.equal(keys.status(), 403);
  await page.goto(`${adminUrl}/settings/incidents`);
  await page.getByRole("button", { name: "Acknowledge Disk full on db-1" }).click();
  await page.getByText("Incident acknowledged.").waitFor();
});

// The provider rotates its signing key: admin, which knows only the first one, fetches the keys
// again when an ID token names one it has not seen.
handler = providerSigningWith("test-key-2").callback();

await check("after the provider rotated its signing key, the operator signs in again", async (page) => {
  await signInAs(page, "olga");
  await page.getByRole("heading", { level: 1, name: "Webhooks" }).waitFor();
});

await check("an identity whose groups map to no role is refused", async (page) => {
  await signInAs(page, "nobody");
  await page.getByRole("heading", { level: 1, name: "Refused" }).waitFor();
  assert.match(await page.locator("main").textContent(), /no role in Tocsin/);
  await page.goto(`${adminUrl}/settings/`);
  assert.match(page.url(), /\/settings\/sign-in$/);
});

await check("a callback without the sign-in's state is refused", async (page) => {
  const answer = await page.goto(`${adminUrl}/settings/sign-in/oidc/callback?code=forged&state=forged`);
  assert.equal(answer.status(), 401);
  await page.goto(`${adminUrl}/settings/`);
  assert.match(page.url(), /\/settings\/sign-in$/);
});

await browser.close();
server.close();
process.exit(failed ? 1 : 0);
