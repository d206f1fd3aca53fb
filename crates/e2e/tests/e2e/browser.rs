//! The settings pages in a real browser: the whole system runs here (ingest, dispatcher, admin,
//! a receiver whose `/ok` answers 200, `/fail` 500 and `/empty` 200 with an empty body), and
//! `settings.spec.mjs` drives Debian's headless Chromium through Playwright against it — sign
//! in, create a webhook through the form (refused first for a bad URL and no events), an alert
//! through ingest, the delivery with its payload and response, a failing target, Retry (each
//! attempt card drawn by its own result, the attempts line, an empty answer's "empty body"),
//! rotation, incidents, deletion — taking the screenshots of docs/ on the way (into
//! `SCREENSHOT_DIR` when set). The spec writes down each change it makes, with its actor, and
//! each secret it was shown; admin's audit log must hold exactly those changes, and none of the
//! secrets.
//!
//! Needs `node`, `/usr/bin/chromium` and `npm ci` in `crates/e2e/tests/browser`:
//! `deploy/local/test` installs them. Missing, the test fails rather than skips.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tocsin_e2e::{System, ADMIN_TOKEN};
use tocsin_testkit::audit::{Actor, Change};
use tocsin_testkit::{Behavior, Receiver};

/// The retry schedule of the run: five attempts, 200 ms apart.
const DELAYS: &str = "0s,200ms,200ms,200ms,200ms";
/// How long the whole browser story may take.
const DEADLINE: Duration = Duration::from_secs(240);
pub(crate) const CHROMIUM: &str = "/usr/bin/chromium";
const INSTALL_HINT: &str = "deploy/local/test installs the browser tools (ensure_browser_tools in \
                            deploy/local/lib.sh): Debian's chromium, node and npm, then `npm ci \
                            --prefix crates/e2e/tests/browser`";

pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root")
}

/// Fails, naming what is missing and how to install it.
pub(crate) fn require_browser_tools(root: &Path) {
    let node = std::process::Command::new("node")
        .arg("--version")
        .output()
        .map(|out| out.status.success())
        .unwrap_or(false);
    assert!(node, "node is missing: {INSTALL_HINT}");
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: {INSTALL_HINT}"
    );
    let playwright = root.join("crates/e2e/tests/browser/node_modules/playwright-core");
    assert!(
        playwright.exists(),
        "{} is missing: {INSTALL_HINT}",
        playwright.display()
    );
}

#[tokio::test]
async fn the_settings_pages_work_in_a_real_browser() {
    let root = workspace_root();
    require_browser_tools(&root);
    let screenshots = std::env::var_os("SCREENSHOT_DIR")
        .map(PathBuf::from)
        .map(|dir| {
            if dir.is_absolute() {
                dir
            } else {
                root.join(dir)
            }
        })
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("screenshots"));
    std::fs::create_dir_all(&screenshots).expect("the screenshot folder");

    let system = System::start(DELAYS).await;
    let receiver = Receiver::start().await;
    receiver.set_path_behavior("/ok", Behavior::Status(200));
    receiver.set_path_behavior("/fail", Behavior::Status(500));
    receiver.set_path_behavior("/empty", Behavior::Body(200, 0));

    let audit_file = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("browser-audit-{}.json", system.prefix.prefix));
    let mut node = tokio::process::Command::new("node");
    node.current_dir(&root)
        .args([
            "--test",
            "--test-reporter=spec",
            "crates/e2e/tests/browser/settings.spec.mjs",
        ])
        .env("ADMIN_URL", &system.admin)
        .env("ADMIN_TOKEN", ADMIN_TOKEN)
        .env("INGEST_URL", &system.ingest)
        .env("INBOUND_TOKEN", &system.inbound_token)
        .env("RECEIVER_OK_URL", receiver.url("/ok"))
        .env("RECEIVER_FAIL_URL", receiver.url("/fail"))
        .env("RECEIVER_EMPTY_URL", receiver.url("/empty"))
        .env("SCREENSHOT_DIR", &screenshots)
        .env("CHROMIUM", CHROMIUM)
        .env("AUDIT_FILE", &audit_file)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(DEADLINE, node.output())
        .await
        .unwrap_or_else(|_| panic!("the browser test did not finish within {DEADLINE:?}"))
        .expect("running node");
    println!("{}", String::from_utf8_lossy(&output.stdout));
    eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    assert!(
        output.status.success(),
        "the browser test failed ({}); its output is above",
        output.status
    );
    println!("screenshots in {}", screenshots.display());
    expect_the_changes_of_the_spec(&system, &audit_file);
    system.stop().await;
}

/// Notes in the system's audit ledger the changes the spec wrote down (each through the pages,
/// by the actor it names) and the secrets it was shown.
fn expect_the_changes_of_the_spec(system: &System, file: &Path) {
    let text = std::fs::read_to_string(file).expect("the spec's list of changes");
    let _ = std::fs::remove_file(file);
    let audit: Value = serde_json::from_str(&text).expect("the spec's list of changes as JSON");
    let changes = audit["changes"].as_array().expect("changes");
    assert!(changes.len() >= 10, "the spec made its changes: {text}");
    for change in changes {
        let actor = &change["actor"];
        let actor = Actor {
            kind: actor["kind"].as_str().expect("an actor kind").to_owned(),
            name: actor["name"].as_str().expect("an actor name").to_owned(),
            id: None,
        };
        let action = change["action"].as_str().expect("an action");
        system
            .ledger
            .expect(Change::new(action, None, "pages", actor));
    }
    for secret in audit["secrets"].as_array().expect("secrets") {
        system.ledger.secret(secret.as_str().expect("a secret"));
    }
}
