// Tocsin's settings pages in Debian's headless Chromium, driven by Playwright against a running
// system. crates/e2e/tests/e2e/browser.rs starts the system and runs this file with:
//   ADMIN_URL, ADMIN_TOKEN       the admin service and its token
//   INGEST_URL, INBOUND_TOKEN    the ingest service and an inbound token
//   RECEIVER_OK_URL              a target that answers 200
//   RECEIVER_FAIL_URL            a target that answers 500
//   RECEIVER_EMPTY_URL           a target that answers 200 with an empty body
//   SCREENSHOT_DIR               where the screenshots go
//   CHROMIUM                     the browser (default /usr/bin/chromium)
//   AUDIT_FILE                   where to write the changes this file makes, with their actors,
//                                and the secrets it saw: browser.rs holds the audit log to them
// The steps run in order: each builds on the one before, as an operator's session would.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import path from "node:path";
import { chromium } from "playwright-core";

const env = (name) => {
  const value = process.env[name];
  assert.ok(value, `${name} must be set (crates/e2e/tests/e2e/browser.rs sets it)`);
  return value;
};

const ADMIN_URL = env("ADMIN_URL");
const ADMIN_TOKEN = env("ADMIN_TOKEN");
const INGEST_URL = env("INGEST_URL");
const INBOUND_TOKEN = env("INBOUND_TOKEN");
const RECEIVER_OK_URL = env("RECEIVER_OK_URL");
const RECEIVER_FAIL_URL = env("RECEIVER_FAIL_URL");
const RECEIVER_EMPTY_URL = env("RECEIVER_EMPTY_URL");
const SCREENSHOT_DIR = env("SCREENSHOT_DIR");
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const AUDIT_FILE = env("AUDIT_FILE");

const DESKTOP = { width: 1280, height: 860 };
const PHONE = { width: 375, height: 812 };
const WAIT_MS = 20000;
const WEBHOOK = "Ops pager";

let browser;
let context;
let page;
/** Script errors seen on any page: there must be none. */
const scriptErrors = [];
/** The first step that failed: the later ones are skipped, as they build on it. */
let broken = null;

/** The actors of the changes below, as the audit log names them. */
const ADMIN = { kind: "bootstrap", name: "bootstrap token (TOCSIN_ADMIN_TOKEN)" };
const OPERATOR = { kind: "key", name: "On-call Olga" };
/** Every change made here, and every secret shown: the audit log must hold the one, never the other. */
const audit = { changes: [], secrets: [] };
function changed(action, actor) {
  audit.changes.push({ action, actor });
}

async function step(t, name, body) {
  const skip = broken ? `skipped after the failure of "${broken}"` : false;
  await t.test(name, { skip }, async () => {
    try {
      await body();
    } catch (error) {
      broken = name;
      throw error;
    }
  });
}

before(async () => {
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
  context = await browser.newContext({ viewport: DESKTOP, baseURL: ADMIN_URL });
  await context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: ADMIN_URL });
  page = await context.newPage();
  page.setDefaultTimeout(WAIT_MS);
  page.on("pageerror", (error) => scriptErrors.push(`${page.url()}: ${error.message}`));
});

after(async () => {
  await browser?.close();
  writeFileSync(AUDIT_FILE, JSON.stringify(audit, null, 2));
});

async function screenshot(name, target = page) {
  await target.screenshot({ path: path.join(SCREENSHOT_DIR, `${name}.png`), fullPage: true });
}

/** Posts an alert to ingest, as a monitoring tool would. */
async function alert(body) {
  const response = await fetch(`${INGEST_URL}/api/v1/webhooks/alerts`, {
    method: "POST",
    headers: { Authorization: `Bearer ${INBOUND_TOKEN}`, "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  const answer = await response.text();
  assert.equal(response.status, 202, answer);
  return JSON.parse(answer);
}

/** Reloads the page until `selector` matches, within a deadline. */
async function reloadUntil(selector, what, timeoutMs = WAIT_MS) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const found = page.locator(selector);
    if ((await found.count()) > 0) return found.first();
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what} on ${page.url()}`);
    }
    await page.waitForTimeout(250);
    await page.reload();
  }
}

/** The colours of the settings stylesheet's results, as the browser computes them. */
const EDGE = { succeeded: "rgb(22, 101, 52)", failed: "rgb(185, 28, 28)" };

/** The colour of an attempt card's left edge, as drawn. */
async function edge(number) {
  return page
    .locator(`[data-attempt="${number}"]`)
    .evaluate((card) => getComputedStyle(card).borderLeftColor);
}

async function text(selector) {
  return (await page.locator(selector).first().textContent()).trim();
}

async function openWebhook(name = WEBHOOK) {
  await page.goto("/settings/");
  await page.getByRole("link", { name, exact: true }).click();
  await page.getByRole("heading", { level: 1, name }).waitFor();
}

let firstSecret;
let failedDeliveryUrl;
let operatorKey;

/** Signs out, then in with an admin key (or the admin token). */
async function signInWith(credential) {
  await page.getByRole("button", { name: "Sign out" }).click();
  await page.getByRole("heading", { level: 1, name: "Sign in to the settings" }).waitFor();
  await page.getByLabel("Admin key").fill(credential);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("heading", { level: 1, name: "Webhooks" }).waitFor();
}

/** Issues an admin key on Settings → Admin keys; returns it, shown this once. */
async function issueKey(name, role) {
  await page.goto("/settings/admin-keys");
  await page.getByLabel("Name").fill(name);
  await page.getByLabel("Role").selectOption(role);
  await page.getByRole("button", { name: "Issue key" }).click();
  await page.getByRole("heading", { level: 1, name: "Admin key issued" }).waitFor();
  const key = await page.locator("#secret").inputValue();
  assert.match(key, /^tak_/);
  changed("admin_key.create", ADMIN);
  audit.secrets.push(key);
  return key;
}

test("the settings pages, from sign-in to deleting a webhook", async (t) => {
  await step(t, "/ leads to the sign-in page, which refuses a wrong token", async () => {
    await page.goto("/");
    assert.match(page.url(), /\/settings\/sign-in$/);
    await page.getByLabel("Admin key").fill("not-the-admin-token");
    await page.getByRole("button", { name: "Sign in" }).click();
    assert.equal(await text("[role=alert]"), "That is not a live admin key or the admin token.");
    assert.equal(await page.locator("#token").getAttribute("aria-invalid"), "true");
    assert.equal((await context.cookies()).length, 0);
  });

  await step(t, "signing in sets an HttpOnly, SameSite=Strict session cookie", async () => {
    await page.getByLabel("Admin key").fill(ADMIN_TOKEN);
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.getByRole("heading", { level: 1, name: "Webhooks" }).waitFor();
    const [cookie] = await context.cookies();
    assert.equal(cookie.name, "tocsin_session");
    assert.equal(cookie.httpOnly, true);
    assert.equal(cookie.sameSite, "Strict");
    assert.equal(cookie.path, "/settings");
    // The first Tab reaches the skip link.
    await page.keyboard.press("Tab");
    assert.equal(await page.evaluate(() => document.activeElement.textContent), "Skip to main content");
  });

  await step(t, "the create form refuses a bad URL and no events before sending", async () => {
    await page.getByRole("link", { name: "Create outbound webhook" }).click();
    await page.getByRole("heading", { level: 1, name: "Create outbound webhook" }).waitFor();
    await page.getByLabel("Name").fill(WEBHOOK);
    await page.getByLabel("Target URL").fill("not a url");
    await page.getByRole("button", { name: "Create webhook" }).click();
    await page.locator("#url-error").waitFor({ state: "visible" });
    assert.match(await text("#url-error"), /must be an absolute URL/);
    assert.match(await text("#events-error"), /must list at least one event kind/);
    assert.ok(await page.locator("#name-error").isHidden(), "the name was fine");
    assert.match(page.url(), /\/settings\/webhooks\/new$/, "nothing was sent");
    assert.equal(await page.evaluate(() => document.activeElement.id), "url");
  });

  await step(t, "without JavaScript the server refuses them, each error beside its field", async () => {
    const plain = await browser.newContext({ viewport: DESKTOP, baseURL: ADMIN_URL, javaScriptEnabled: false });
    await plain.addCookies(await context.cookies());
    const noScript = await plain.newPage();
    await noScript.goto("/settings/webhooks/new");
    await noScript.getByLabel("Name").fill(WEBHOOK);
    await noScript.getByLabel("Target URL").fill("not a url");
    const [response] = await Promise.all([
      noScript.waitForResponse((r) => r.request().method() === "POST"),
      noScript.getByRole("button", { name: "Create webhook" }).click(),
    ]);
    assert.equal(response.status(), 422);
    await noScript.locator("#error-summary").waitFor();
    assert.match(await noScript.locator("#url-error").textContent(), /must be an absolute URL/);
    assert.match(await noScript.locator("#events-error").textContent(), /must list at least one event kind/);
    assert.equal(await noScript.locator("#url").getAttribute("aria-invalid"), "true");
    assert.equal(await noScript.locator("#name").inputValue(), WEBHOOK, "typed values come back");
    await screenshot("create-webhook-errors", noScript);
    await plain.close();
  });

  await step(t, "a valid form creates the webhook and shows its secret once", async () => {
    await page.getByLabel("Target URL").fill(RECEIVER_OK_URL);
    await page.getByLabel("incidents.opened").check();
    await page.getByLabel("incidents.resolved").check();
    assert.ok(await page.locator("#events-error").isHidden(), "the events error clears as they are chosen");
    assert.equal(await text("#schedule"), "immediately, +200 ms, +200 ms, +200 ms, +200 ms");
    await page.getByLabel("Max attempts").fill("2");
    assert.equal(await text("#schedule"), "immediately, +200 ms");
    await page.getByLabel("Max attempts").fill("5");
    await page.getByRole("button", { name: "Create webhook" }).click();
    await page.getByRole("heading", { level: 1, name: "Webhook created" }).waitFor();
    firstSecret = await page.locator("#secret").inputValue();
    assert.match(firstSecret, /^whsec_[A-Za-z0-9+/=]+$/);
    changed("webhook.create", ADMIN);
    audit.secrets.push(firstSecret);
    await page.getByRole("button", { name: "Copy" }).click();
    // The copy handler awaits the clipboard before it writes its status.
    await page.waitForFunction(() => document.getElementById("copy-status").textContent.trim() !== "");
    assert.equal(await text("#copy-status"), "Copied to the clipboard.");
    assert.equal(await page.evaluate(() => navigator.clipboard.readText()), firstSecret);
    await page.getByRole("heading", { name: "How to verify a delivery" }).waitFor();
    await page.getByRole("link", { name: "Go to the webhook" }).click();
    await page.getByRole("heading", { level: 1, name: WEBHOOK }).waitFor();
  });

  await step(t, "a second webhook, subscribed to every event", async () => {
    await page.goto("/settings/webhooks/new");
    await page.getByLabel("Name").fill("Status page");
    await page.getByLabel("Target URL").fill(RECEIVER_OK_URL);
    for (const event of ["incidents.opened", "incidents.status_changed", "incidents.resolved"]) {
      await page.getByLabel(event).check();
    }
    await page.getByLabel("Max attempts").fill("3");
    await page.getByRole("button", { name: "Create webhook" }).click();
    await page.getByRole("heading", { level: 1, name: "Webhook created" }).waitFor();
    changed("webhook.create", ADMIN);
    audit.secrets.push(await page.locator("#secret").inputValue());
  });

  await step(t, "an alert through ingest is delivered, and the log shows payload and response", async () => {
    await alert({ title: "Checkout latency above 2s", dedup_key: "checkout", severity: "critical" });
    await openWebhook();
    const row = await reloadUntil(
      'tr[data-state="succeeded"][data-event="incidents.opened"]',
      "a succeeded incidents.opened delivery"
    );
    assert.equal((await row.locator('td[data-label="Attempts"]').textContent()).trim(), "1");
    await row.getByRole("link").click();
    await page.getByRole("heading", { level: 1, name: "Delivery of incidents.opened" }).waitFor();
    const attempt = page.locator('[data-attempt="1"]');
    assert.equal(await attempt.getAttribute("data-result"), "succeeded");
    assert.equal(await attempt.getAttribute("data-trigger"), "automatic");
    assert.equal((await attempt.locator("[data-status-code]").textContent()).trim(), "200");
    const payload = await attempt.locator("[data-payload]").textContent();
    assert.match(payload, /"event": "incidents.opened"/);
    assert.match(payload, /"title": "Checkout latency above 2s"/);
    assert.match(payload, /"severity": "SEV1"/);
    assert.equal((await attempt.locator("[data-response]").textContent()).trim(), "answer 200");
    assert.ok(await attempt.getByRole("rowheader", { name: "webhook-signature" }).isVisible());
  });

  await step(t, "the target fails: the attempts are logged until the delivery is failed", async () => {
    await openWebhook();
    await page.getByRole("link", { name: "Edit" }).click();
    await page.getByLabel("Target URL").fill(RECEIVER_FAIL_URL);
    await page.getByRole("button", { name: "Save changes" }).click();
    assert.equal(await text("[role=status].alert"), "Webhook saved.");
    assert.equal(await text(".details .url"), RECEIVER_FAIL_URL);
    changed("webhook.update", ADMIN);

    await alert({ title: "Checkout latency above 2s", dedup_key: "checkout", status: "resolved" });
    const row = await reloadUntil(
      'tr[data-state="failed"][data-event="incidents.resolved"]',
      "a failed incidents.resolved delivery"
    );
    assert.equal((await row.locator('td[data-label="Attempts"]').textContent()).trim(), "5");
    // The state filter keeps only the failed one.
    await page.getByLabel("State").selectOption("failed");
    await page.getByRole("button", { name: "Filter" }).click();
    assert.equal(await page.locator("tr[data-state]").count(), 1);
    await page.getByRole("link", { name: "Clear filters" }).click();
    assert.equal(await page.locator("tr[data-state]").count(), 2);
    // Health follows within a second (each dispatcher writes its tallies once a second).
    const failing = await reloadUntil("#health-heading .health--failing", "the health badge saying Failing");
    assert.match((await failing.textContent()).trim(), /^Failing \(\d+ in a row\)$/);
    await screenshot("webhook-detail");

    await page.locator('tr[data-state="failed"]').getByRole("link").click();
    failedDeliveryUrl = page.url();
    assert.equal(await text("[data-delivery-state]"), "Failed");
    const attempts = page.locator("[data-attempt]");
    assert.equal(await attempts.count(), 5);
    for (let i = 0; i < 5; i++) {
      assert.equal(await attempts.nth(i).getAttribute("data-result"), "failed");
      assert.equal((await attempts.nth(i).locator("[data-status-code]").textContent()).trim(), "500");
    }
    assert.equal((await page.locator('[data-attempt="5"] [data-response]').textContent()).trim(), "answer 500");
  });

  await step(t, "a viewer sees the failed delivery, but no Retry button and no form", async () => {
    const viewerKey = await issueKey("Viewer Vic", "viewer");
    operatorKey = await issueKey("On-call Olga", "operator");
    await signInWith(viewerKey);
    const nav = page.getByRole("navigation", { name: "Settings sections" });
    assert.equal(await nav.getByRole("link", { name: "Admin keys" }).count(), 0);
    await page.goto(failedDeliveryUrl);
    assert.equal(await text("[data-delivery-state]"), "Failed");
    assert.equal(await page.getByRole("button", { name: "Retry" }).count(), 0);
    assert.equal(await page.locator("main form[method=post]").count(), 0);
    await openWebhook();
    assert.equal(await page.locator("main form[method=post]").count(), 0);
    assert.equal(await page.getByRole("link", { name: "Edit" }).count(), 0);
  });

  await step(t, "an operator signs in and sees Retry", async () => {
    await signInWith(operatorKey);
    await page.goto(failedDeliveryUrl);
    assert.equal(await page.getByRole("button", { name: "Retry" }).count(), 1);
  });

  await step(t, "Retry makes a manual attempt that appears without a reload", async () => {
    await page.evaluate(() => {
      window.__sameDocument = true;
    });
    await page.getByRole("button", { name: "Retry" }).click();
    await page.locator('[data-attempt="6"][data-trigger="manual"]').waitFor();
    assert.equal(await page.evaluate(() => window.__sameDocument), true, "the page was not reloaded");
    assert.equal(await text("#retry-status"), "Attempt 6 (manual) failed with HTTP 500.");
    changed("delivery.retry", OPERATOR);
    assert.equal(await text("[data-delivery-state]"), "Failed");
    assert.equal(await text("[data-attempts]"), "6 attempts: 5 automatic of at most 5, 1 manual");
    assert.equal(await edge(6), EDGE.failed);
    await screenshot("delivery-detail");
  });

  await step(t, "back as the admin", async () => {
    await signInWith(ADMIN_TOKEN);
  });

  await step(t, "with the target fixed, Retry delivers it, and the page draws that as a success", async () => {
    await openWebhook();
    await page.getByRole("link", { name: "Edit" }).click();
    // The fixed target answers 200 with an empty body.
    await page.getByLabel("Target URL").fill(RECEIVER_EMPTY_URL);
    await page.getByRole("button", { name: "Save changes" }).click();
    assert.equal(await text("[role=status].alert"), "Webhook saved.");
    changed("webhook.update", ADMIN);
    await page.goto(failedDeliveryUrl);
    await page.getByRole("button", { name: "Retry" }).click();
    await page.locator('[data-attempt="7"][data-result="succeeded"]').waitFor();
    changed("delivery.retry", ADMIN);
    assert.equal(await text("#retry-status"), "Attempt 7 (manual) succeeded with HTTP 200.");
    assert.equal(await text("[data-delivery-state]"), "Succeeded");
    // Each card's edge is its own result: the manual success green, the failures before it red.
    assert.equal(await edge(7), EDGE.succeeded);
    assert.equal(await edge(6), EDGE.failed);
    assert.equal(await edge(1), EDGE.failed);
    // The attempts line counts automatic and manual attempts apart.
    assert.equal(await text("[data-attempts]"), "7 attempts: 5 automatic of at most 5, 2 manual");
    // An empty answer says so, where a body would be.
    assert.equal(await text('[data-attempt="7"] [data-response]'), "empty body");
    assert.equal(await page.locator('[data-attempt="7"] pre[data-response]').count(), 0);
    // Reloaded, the server draws the same (and offers no Retry for a succeeded delivery).
    await page.reload();
    assert.equal(await edge(7), EDGE.succeeded);
    assert.equal(await edge(6), EDGE.failed);
    assert.equal(await text('[data-attempt="7"] [data-response]'), "empty body");
    assert.equal(await page.getByRole("button", { name: "Retry" }).count(), 0);
    await screenshot("delivery-retried");
  });

  await step(t, "rotating the secret shows the new one, the old one signing for a while", async () => {
    await openWebhook();
    await page.getByRole("button", { name: "Rotate secret" }).click();
    await page.getByRole("heading", { level: 1, name: "Signing secret rotated" }).waitFor();
    const secret = await page.locator("#secret").inputValue();
    assert.match(secret, /^whsec_/);
    assert.notEqual(secret, firstSecret);
    changed("webhook.rotate_secret", ADMIN);
    audit.secrets.push(secret);
    await page.getByText("The previous secret keeps signing beside it until").waitFor();
  });

  await step(t, "incidents: listed with status and severity, acknowledged from the list", async () => {
    await alert({ title: "Queue consumer stuck", dedup_key: "queue", severity: "warning" });
    await page.getByRole("link", { name: "Incidents" }).click();
    const row = page.locator("tr", { hasText: "Queue consumer stuck" });
    assert.equal(await row.getAttribute("data-status"), "triggered");
    assert.equal((await row.locator('td[data-label="Severity"]').textContent()).trim(), "SEV3");
    const resolved = page.locator("tr", { hasText: "Checkout latency above 2s" });
    assert.equal(await resolved.getAttribute("data-status"), "resolved");
    await row.getByRole("button", { name: "Acknowledge Queue consumer stuck" }).click();
    assert.equal(await text("[role=status].alert"), "Incident acknowledged.");
    changed("incident.change_status", ADMIN);
    const acknowledged = page.locator("tr", { hasText: "Queue consumer stuck" });
    assert.equal(await acknowledged.getAttribute("data-status"), "acknowledged");
    await screenshot("incidents");
  });

  await step(t, "a webhook with filters, headers and a rate limit: reserved headers are refused", async () => {
    await page.goto("/settings/webhooks/new");
    await page.getByLabel("Name").fill("DB pager");
    await page.getByLabel("Target URL").fill(RECEIVER_OK_URL);
    await page.getByLabel("incidents.opened").check();
    await page.getByLabel("SEV1").check();
    await page.getByLabel("Sources").fill("generic");
    await page.getByLabel("Labels").fill("team=db");
    await page.getByLabel("Headers").fill("Content-Type: text/plain");
    await page.getByLabel("Rate limit (attempts a second)").fill("5");
    await page.getByRole("button", { name: "Create webhook" }).click();
    await page.locator("#error-summary").waitFor();
    assert.match(await text("#headers-error"), /is reserved/);
    assert.equal(await page.locator("#labels").inputValue(), "team=db", "typed values come back");
    await page.getByLabel("Headers").fill("X-Team-Key: k1");
    await page.getByRole("button", { name: "Create webhook" }).click();
    await page.getByRole("heading", { level: 1, name: "Webhook created" }).waitFor();
    changed("webhook.create", ADMIN);
    audit.secrets.push(await page.locator("#secret").inputValue());
    await page.getByRole("link", { name: "Go to the webhook" }).click();
    await page.getByRole("heading", { level: 1, name: "DB pager" }).waitFor();
    const details = await text(".details");
    assert.match(details, /Severity is SEV1/);
    assert.match(details, /Format or source is generic/);
    assert.match(details, /Labels include team=db/);
    assert.match(details, /x-team-key: \*\*\*/);
    assert.doesNotMatch(details, /k1/, "the header's value is not shown");
    assert.match(details, /5 attempts a second/);
    assert.equal(await text("#health-heading .health"), "No attempts yet");
    // The form that sets the headers shows their values.
    await page.getByRole("link", { name: "Edit" }).click();
    assert.equal(await page.locator("#headers").inputValue(), "x-team-key: k1");
    assert.ok(await page.getByLabel("SEV1").isChecked());
    await screenshot("webhook-form-filters");
  });

  await step(t, "disabled, its events wait, listed; enabled and recovered, they are sent", async () => {
    await openWebhook("DB pager");
    await page.getByRole("button", { name: "Disable" }).click();
    assert.match(await text("#disabled-reason"), /disabled by an operator/);
    changed("webhook.update", ADMIN);
    await alert({ title: "Replica lag on db-2", dedup_key: "db-lag", severity: "critical", labels: { team: "db" } });
    const waiting = await reloadUntil('tr[data-state="waiting"]', "a waiting delivery");
    assert.match(await waiting.locator("[data-wait-reason]").textContent(), /webhook was disabled/);
    await screenshot("webhook-disabled");
    await page.getByRole("button", { name: "Enable" }).click();
    await page.getByRole("button", { name: "Recover since…" }).waitFor();
    changed("webhook.update", ADMIN);
    await page.getByRole("button", { name: "Recover since…" }).click();
    await reloadUntil('tr[data-state="succeeded"]', "the recovered delivery, succeeded");
    changed("webhook.recover", ADMIN);
    await reloadUntil("#health-heading .health--healthy", "the health badge saying Healthy");
  });

  await step(t, "the webhook list, on a desktop and at phone width", async () => {
    await page.getByRole("navigation", { name: "Settings sections" }).getByRole("link", { name: "Webhooks" }).click();
    const row = page.locator("tr", { hasText: WEBHOOK });
    assert.match(await row.textContent(), /Succeeded/);
    await reloadUntil(`tr:has-text("${WEBHOOK}") td[data-label="Health"] .health--healthy`, "Ops pager healthy");
    await screenshot("webhooks");
    await page.setViewportSize(PHONE);
    await page.reload();
    const width = await page.evaluate(() => document.documentElement.scrollWidth);
    assert.ok(width <= PHONE.width, `no sideways scrolling at 375 px (content is ${width} px wide)`);
    assert.ok(await page.getByRole("link", { name: WEBHOOK }).isVisible());
    await screenshot("webhooks-phone");
    await page.setViewportSize(DESKTOP);
  });

  await step(t, "deleting asks for confirmation", async () => {
    await openWebhook();
    page.once("dialog", (dialog) => dialog.dismiss());
    await page.getByRole("button", { name: "Delete" }).click();
    await page.getByRole("heading", { level: 1, name: WEBHOOK }).waitFor();
    assert.doesNotMatch(page.url(), /notice=deleted/);

    let asked = "";
    page.once("dialog", (dialog) => {
      asked = dialog.message();
      dialog.accept();
    });
    await page.getByRole("button", { name: "Delete" }).click();
    await page.waitForURL(/\/settings\/\?notice=deleted$/);
    changed("webhook.delete", ADMIN);
    assert.match(asked, /Delete the webhook “Ops pager”\?/);
    assert.equal(await text("[role=status].alert"), "Webhook deleted. Its delivery log stays readable.");
    assert.equal(await page.getByRole("link", { name: WEBHOOK, exact: true }).count(), 0);
    assert.equal(await page.getByRole("link", { name: "Status page" }).count(), 1);
  });

  await step(t, "the audit log names who made each change, and from where", async () => {
    await page.goto("/settings/audit-log");
    const rows = page.locator("#audit-log tbody tr");
    for (const action of ["webhook.create", "webhook.update", "webhook.rotate_secret", "webhook.delete",
                          "incident.change_status", "admin_key.create"]) {
      const row = rows.filter({ hasText: action }).first();
      assert.match(await row.textContent(), /bootstrap token \(TOCSIN_ADMIN_TOKEN\)\s*pages/, action);
    }
    await page.getByLabel("Action").fill("delivery.retry");
    await page.getByRole("button", { name: "Filter" }).click();
    const retries = await rows.allTextContents();
    assert.equal(retries.length, 2, retries.join("\n"));
    assert.match(retries[1], /On-call Olga\s*pages/);
    assert.match(retries[0], /bootstrap token/);
  });

  await step(t, "signing out ends the session", async () => {
    await page.getByRole("button", { name: "Sign out" }).click();
    await page.getByRole("heading", { level: 1, name: "Sign in to the settings" }).waitFor();
    await page.goto("/settings/deliveries");
    assert.match(page.url(), /\/settings\/sign-in$/);
  });

  await step(t, "no page had a script error", async () => {
    assert.deepEqual(scriptErrors, []);
  });
});
