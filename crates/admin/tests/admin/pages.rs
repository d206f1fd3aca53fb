//! The settings pages over HTTP against the real PostgreSQL and RabbitMQ: signing in and out,
//! the session cookie's attributes, the sign-in rate limit, CSRF and Origin checks, every page
//! signed in and signed out, form errors beside their fields, HTML escaping, and each action
//! doing what the API does. (A real browser drives them in `crates/e2e/tests/e2e/browser.rs`.)

use diesel_async::AsyncPgConnection;
use reqwest::header::{COOKIE, LOCATION, ORIGIN, SET_COOKIE};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use time::OffsetDateTime;
use tocsin_domain::alerts::AlertAction;
use tocsin_domain::{EventKind, EventPayload, IncidentData, IncidentStatus, Severity};
use tocsin_storage::outbox::{self, NewEvent};
use tocsin_testkit::TestDb;

use crate::common::RunningAdmin;
use uuid::Uuid;

const ADMIN_TOKEN: &str = "pages-admin-token-0123456789";

/// The admin under test, with the page helpers of this module.
struct TestAdmin(RunningAdmin);

impl std::ops::Deref for TestAdmin {
    type Target = RunningAdmin;
    fn deref(&self) -> &RunningAdmin {
        &self.0
    }
}

/// A signed-in browser, as far as the server can tell: the session cookie and the CSRF token
/// its forms carry.
struct Browser {
    cookie: String,
    csrf: String,
}

/// An answer: status, headers and body text.
struct Page {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: String,
}

impl Page {
    fn location(&self) -> &str {
        self.headers
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    fn set_cookie(&self) -> Option<&str> {
        self.headers.get(SET_COOKIE).and_then(|v| v.to_str().ok())
    }

    /// The element with this id: its opening tag and text, up to its closing tag.
    fn element(&self, id: &str) -> &str {
        let marker = format!("id=\"{id}\"");
        let at = self
            .body
            .find(&marker)
            .unwrap_or_else(|| panic!("no #{id} in the page:\n{}", self.body));
        let start = self.body[..at].rfind('<').unwrap();
        let end = self.body[at..].find("</").map(|e| at + e).unwrap();
        &self.body[start..end]
    }
}

impl TestAdmin {
    async fn start() -> Self {
        TestAdmin(RunningAdmin::start(TestDb::new().await, ADMIN_TOKEN, |_| {}).await)
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Page {
        let answer = self.exchange(request).await;
        Page {
            status: answer.status,
            headers: answer.headers,
            body: answer.text,
        }
    }

    async fn get(&self, path: &str, browser: Option<&Browser>) -> Page {
        let mut request = self.client.get(format!("{}{path}", self.base));
        if let Some(browser) = browser {
            request = request.header(COOKIE, &browser.cookie);
        }
        self.send(request).await
    }

    /// Posts a form; `csrf` is added from the browser unless the fields carry their own.
    async fn post(
        &self,
        path: &str,
        browser: Option<&Browser>,
        fields: &[(&str, &str)],
        origin: Option<&str>,
    ) -> Page {
        let mut fields: Vec<(&str, &str)> = fields.to_vec();
        let mut request = self.client.post(format!("{}{path}", self.base));
        if let Some(browser) = browser {
            request = request.header(COOKIE, &browser.cookie);
            if !fields.iter().any(|(name, _)| *name == "csrf") {
                fields.push(("csrf", &browser.csrf));
            }
        }
        if let Some(origin) = origin {
            request = request.header(ORIGIN, origin);
        }
        self.send(request.form(&fields)).await
    }

    async fn sign_in(&self) -> Browser {
        let answer = self
            .post("/settings/sign-in", None, &[("token", ADMIN_TOKEN)], None)
            .await;
        assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
        let set_cookie = answer.set_cookie().expect("a session cookie");
        let cookie = set_cookie.split(';').next().unwrap().to_owned();
        let mut browser = Browser {
            cookie,
            csrf: String::new(),
        };
        let page = self.get("/settings/webhooks/new", Some(&browser)).await;
        browser.csrf = csrf_of(&page.body);
        browser
    }

    async fn api(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(ADMIN_TOKEN);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer = self.exchange(request).await;
        (answer.status, answer.json())
    }

    async fn create_webhook(&self, name: &str) -> Uuid {
        let (status, body) = self
            .api(
                Method::POST,
                "/api/v1/webhooks",
                Some(json!({
                    "name": name,
                    "url": "https://hooks.example.com/tocsin",
                    "events": ["incidents.opened", "incidents.resolved"],
                })),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["id"].as_str().unwrap().parse().unwrap()
    }

    async fn webhook(&self, id: Uuid) -> (StatusCode, Value) {
        self.api(Method::GET, &format!("/api/v1/webhooks/{id}"), None)
            .await
    }

    async fn stop(self) {
        self.0.stop().await;
    }
}

fn csrf_of(html: &str) -> String {
    let marker = "name=\"csrf\" value=\"";
    let start = html.find(marker).expect("a csrf field") + marker.len();
    let end = html[start..].find('"').unwrap() + start;
    html[start..end].to_owned()
}

/// Records an event and its delivery to `webhook_id` with one attempt, as the dispatcher
/// would; returns the delivery's id.
async fn seed_delivery(conn: &mut AsyncPgConnection, webhook_id: Uuid, success: bool) -> Uuid {
    let incident_id = Uuid::now_v7();
    let payload = EventPayload {
        event: EventKind::IncidentOpened,
        timestamp: OffsetDateTime::now_utc(),
        data: IncidentData {
            id: incident_id,
            title: "Disk <full> on db-1".into(),
            severity: Severity::SEV2,
            status: IncidentStatus::Triggered,
            previous_status: None,
        },
    };
    let event = NewEvent::new(&payload, None);
    outbox::record_events(conn, std::slice::from_ref(&event), &outbox::Wake::Listeners)
        .await
        .unwrap();
    let id = tocsin_testkit::deliveries::create_delivery(
        conn,
        event.id,
        EventKind::IncidentOpened,
        incident_id,
        webhook_id,
    )
    .await;
    let status = if success { 200 } else { 500 };
    let mut result = tocsin_testkit::deliveries::answered(status);
    result.request_headers =
        json!({"webhook-id": id.to_string(), "content-type": "application/json"});
    result.response_body = Some("<b>answer</b>".into());
    tocsin_testkit::deliveries::record_attempt(conn, id, result).await;
    if !success {
        // As if every attempt had failed.
        tocsin_testkit::deliveries::mark_failed(conn, id).await;
    }
    id
}

async fn seed_incident(conn: &mut AsyncPgConnection) -> Uuid {
    let signal = tocsin_testkit::signal("disk", AlertAction::Trigger);
    let outcomes = tocsin_testkit::apply_signals(conn, &[signal], outbox::Wake::Listeners)
        .await
        .unwrap();
    outcomes[0].incident.as_ref().unwrap().id
}

#[tokio::test]
async fn signing_in_takes_the_admin_token_and_sets_a_strict_http_only_cookie() {
    let admin = TestAdmin::start().await;

    let root = admin.get("/", None).await;
    assert_eq!(root.status, StatusCode::SEE_OTHER);
    assert_eq!(root.location(), "/settings/");
    let settings = admin.get("/settings/", None).await;
    assert_eq!(settings.status, StatusCode::SEE_OTHER);
    assert_eq!(settings.location(), "/settings/sign-in");
    let form = admin.get("/settings/sign-in", None).await;
    assert_eq!(form.status, StatusCode::OK);
    assert!(form.body.contains("<label for=\"token\">"), "{}", form.body);

    let refused = admin
        .post(
            "/settings/sign-in",
            None,
            &[("token", "not-the-token-at-all")],
            None,
        )
        .await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        refused.set_cookie().is_none(),
        "no cookie for a wrong token"
    );
    assert!(refused
        .body
        .contains("That is not a live admin key or the admin token."));
    assert!(refused.body.contains("aria-invalid=\"true\""));

    let accepted = admin
        .post("/settings/sign-in", None, &[("token", ADMIN_TOKEN)], None)
        .await;
    assert_eq!(accepted.status, StatusCode::SEE_OTHER);
    assert_eq!(accepted.location(), "/settings/");
    let cookie = accepted.set_cookie().unwrap();
    for attribute in [
        "tocsin_session=",
        "HttpOnly",
        "SameSite=Strict",
        "Path=/settings",
        "Max-Age=43200",
    ] {
        assert!(cookie.contains(attribute), "{attribute} in {cookie}");
    }
    assert!(!cookie.contains("Secure"), "Secure only when configured");
    assert!(
        !cookie.contains(ADMIN_TOKEN),
        "the token never leaves in a cookie"
    );

    let browser = Browser {
        cookie: cookie.split(';').next().unwrap().to_owned(),
        csrf: String::new(),
    };
    let list = admin.get("/settings/", Some(&browser)).await;
    assert_eq!(list.status, StatusCode::OK);
    assert!(list.body.contains("<h1>Webhooks</h1>"));
    assert_eq!(
        admin
            .get("/settings/sign-in", Some(&browser))
            .await
            .location(),
        "/settings/",
        "signed in already"
    );

    // A forged or tampered cookie is no session.
    let (expiry, mac) = browser.cookie["tocsin_session=".len()..]
        .split_once('.')
        .unwrap();
    let later: i64 = expiry.parse::<i64>().unwrap() + 3600;
    for forged in [
        format!("tocsin_session={later}.{mac}"),
        format!("tocsin_session={expiry}.AAAA"),
        "tocsin_session=".to_owned(),
    ] {
        let forged = Browser {
            cookie: forged,
            csrf: String::new(),
        };
        let page = admin.get("/settings/", Some(&forged)).await;
        assert_eq!(page.status, StatusCode::SEE_OTHER, "{}", forged.cookie);
    }

    // Signing out removes the cookie.
    let browser = admin.sign_in().await;
    let out = admin
        .post("/settings/sign-out", Some(&browser), &[], None)
        .await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert_eq!(out.location(), "/settings/sign-in");
    let removal = out.set_cookie().unwrap();
    assert!(removal.starts_with("tocsin_session=;"), "{removal}");
    assert!(removal.contains("Max-Age=0"), "{removal}");
    admin.stop().await;
}

#[tokio::test]
async fn failed_sign_ins_are_limited_per_client_address_but_the_right_token_signs_in() {
    let admin = TestAdmin::start().await;
    let wrong = [("token", "wrong-token-0123456789")];
    for _ in 0..5 {
        let refused = admin.post("/settings/sign-in", None, &wrong, None).await;
        assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    }
    for _ in 5..12 {
        let limited = admin.post("/settings/sign-in", None, &wrong, None).await;
        assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(limited.headers.contains_key("retry-after"));
        assert!(limited.set_cookie().is_none());
        assert!(limited.body.contains("Too many failed sign-ins"));
    }
    // After twelve wrong tokens from this address, the right one still signs in.
    let signed_in = admin
        .post("/settings/sign-in", None, &[("token", ADMIN_TOKEN)], None)
        .await;
    assert_eq!(signed_in.status, StatusCode::SEE_OTHER);
    assert_eq!(signed_in.location(), "/settings/");
    let cookie = signed_in.set_cookie().expect("a session cookie");
    assert!(cookie.starts_with("tocsin_session="), "{cookie}");
    admin.stop().await;
}

#[tokio::test]
async fn forms_need_their_csrf_token_and_refuse_other_origins() {
    let admin = TestAdmin::start().await;
    let browser = admin.sign_in().await;
    let fields = [
        ("name", "ops"),
        ("url", "https://hooks.example.com/tocsin"),
        ("events", "incidents.opened"),
        ("max_attempts", "5"),
        ("timeout_ms", "10000"),
    ];
    let own_origin = admin.base.clone();

    let stranger = Browser {
        cookie: browser.cookie.clone(),
        csrf: String::new(),
    };
    let missing = admin
        .post("/settings/webhooks/new", Some(&stranger), &fields, None)
        .await;
    assert_eq!(missing.status, StatusCode::FORBIDDEN, "{}", missing.body);

    let mut wrong = fields.to_vec();
    wrong.push(("csrf", "bm90LXRoZS10b2tlbg"));
    let answer = admin
        .post("/settings/webhooks/new", Some(&browser), &wrong, None)
        .await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);

    let other_session = admin.sign_in().await;
    let mut borrowed = fields.to_vec();
    borrowed.push(("csrf", &other_session.csrf));
    if other_session.cookie != browser.cookie {
        let answer = admin
            .post("/settings/webhooks/new", Some(&browser), &borrowed, None)
            .await;
        assert_eq!(
            answer.status,
            StatusCode::FORBIDDEN,
            "a token of another session"
        );
    }

    let foreign = admin
        .post(
            "/settings/webhooks/new",
            Some(&browser),
            &fields,
            Some("https://evil.example"),
        )
        .await;
    assert_eq!(foreign.status, StatusCode::FORBIDDEN);
    assert!(foreign.body.contains("Cross-site requests are refused"));
    let sign_in = admin
        .post(
            "/settings/sign-in",
            None,
            &[("token", ADMIN_TOKEN)],
            Some("https://evil.example"),
        )
        .await;
    assert_eq!(sign_in.status, StatusCode::FORBIDDEN);
    assert!(sign_in.set_cookie().is_none());

    let (_, list) = admin.api(Method::GET, "/api/v1/webhooks", None).await;
    assert_eq!(
        list["items"].as_array().unwrap().len(),
        0,
        "nothing written"
    );

    let created = admin
        .post(
            "/settings/webhooks/new",
            Some(&browser),
            &fields,
            Some(&own_origin),
        )
        .await;
    assert_eq!(created.status, StatusCode::OK, "{}", created.body);
    assert!(created.body.contains("Webhook created"));
    let secret = created.element("secret");
    assert!(secret.contains("value=\"whsec_"), "{secret}");
    let (_, list) = admin.api(Method::GET, "/api/v1/webhooks", None).await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    admin.stop().await;
}

#[tokio::test]
async fn every_page_answers_signed_in_and_sends_to_sign_in_when_not() {
    let admin = TestAdmin::start().await;
    let browser = admin.sign_in().await;
    let webhook = admin.create_webhook("ops").await;
    let mut conn = admin.conn().await;
    let delivery = seed_delivery(&mut conn, webhook, true).await;
    seed_incident(&mut conn).await;

    let pages = [
        "/settings/".to_owned(),
        "/settings/webhooks/new".to_owned(),
        format!("/settings/webhooks/{webhook}"),
        format!("/settings/webhooks/{webhook}?state=succeeded&event=incidents.opened"),
        format!("/settings/webhooks/{webhook}/edit"),
        "/settings/deliveries".to_owned(),
        "/settings/deliveries?state=failed&event=".to_owned(),
        format!("/settings/deliveries?webhook_id={webhook}"),
        format!("/settings/deliveries/{delivery}"),
        "/settings/incidents".to_owned(),
        "/settings/incidents?status=triggered".to_owned(),
    ];
    for path in &pages {
        let page = admin.get(path, Some(&browser)).await;
        assert_eq!(page.status, StatusCode::OK, "{path}: {}", page.body);
        let content_type = page.headers.get("content-type").unwrap().to_str().unwrap();
        assert_eq!(content_type, "text/html; charset=utf-8", "{path}");
        let csp = page.headers.get("content-security-policy").unwrap();
        assert!(
            csp.to_str().unwrap().contains("script-src 'self'"),
            "{path}"
        );
        assert_eq!(page.headers.get("cache-control").unwrap(), "no-store");
        assert!(page.body.contains("<meta name=\"viewport\""), "{path}");
        assert!(page.body.contains("href=\"#main\""), "{path}: a skip link");

        let signed_out = admin.get(path, None).await;
        assert_eq!(signed_out.status, StatusCode::SEE_OTHER, "{path}");
        assert_eq!(signed_out.location(), "/settings/sign-in", "{path}");
    }

    let posts = [
        "/settings/webhooks/new".to_owned(),
        format!("/settings/webhooks/{webhook}/edit"),
        format!("/settings/webhooks/{webhook}/disable"),
        format!("/settings/webhooks/{webhook}/delete"),
        format!("/settings/deliveries/{delivery}/retry"),
    ];
    for path in &posts {
        let answer = admin.post(path, None, &[("confirmed", "yes")], None).await;
        assert_eq!(answer.status, StatusCode::SEE_OTHER, "{path}");
        assert_eq!(answer.location(), "/settings/sign-in", "{path}");
    }
    let (_, still) = admin.webhook(webhook).await;
    assert_eq!(still["enabled"], true, "nothing happened signed out");

    let delivery_page = admin
        .get(&format!("/settings/deliveries/{delivery}"), Some(&browser))
        .await;
    assert!(
        delivery_page
            .body
            .contains("  &#34;title&#34;: &#34;Disk &#60;full&#62; on db-1&#34;"),
        "the payload, pretty-printed and escaped: {}",
        delivery_page.body
    );
    assert!(
        delivery_page.body.contains("&#60;b&#62;answer&#60;/b&#62;"),
        "the response body"
    );
    assert!(delivery_page.body.contains("data-attempt=\"1\""));

    let css = admin.get("/settings/assets/settings.css", None).await;
    assert_eq!(css.status, StatusCode::OK);
    assert!(css.headers["cache-control"]
        .to_str()
        .unwrap()
        .contains("max-age=31536000"));
    let js = admin.get("/settings/assets/settings.js", None).await;
    assert_eq!(js.status, StatusCode::OK);
    assert!(js.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/javascript"));

    for missing in [
        "/settings/nope".to_owned(),
        "/settings/webhooks/not-a-uuid".to_owned(),
        format!("/settings/webhooks/{}", Uuid::now_v7()),
        format!("/settings/deliveries/{}", Uuid::now_v7()),
        "/settings/assets/other.js".to_owned(),
    ] {
        let page = admin.get(&missing, Some(&browser)).await;
        assert_eq!(page.status, StatusCode::NOT_FOUND, "{missing}");
    }
    let bad_filter = admin
        .get("/settings/deliveries?state=lost", Some(&browser))
        .await;
    assert_eq!(bad_filter.status, StatusCode::BAD_REQUEST);
    assert!(
        bad_filter.body.contains("state must be one of"),
        "{}",
        bad_filter.body
    );

    // The API is as it was, bearer token and all.
    let (status, _) = admin.api(Method::GET, "/api/v1/webhooks", None).await;
    assert_eq!(status, StatusCode::OK);
    let unauthorized = admin.get("/api/v1/webhooks", Some(&browser)).await;
    assert_eq!(
        unauthorized.status,
        StatusCode::UNAUTHORIZED,
        "a session is no API token"
    );
    admin.stop().await;
}

#[tokio::test]
async fn refused_fields_are_shown_beside_them_with_422() {
    let admin = TestAdmin::start().await;
    let browser = admin.sign_in().await;

    let page = admin
        .post(
            "/settings/webhooks/new",
            Some(&browser),
            &[
                ("name", "ops pager"),
                ("url", "not a url"),
                ("max_attempts", "9"),
                ("timeout_ms", "soon"),
            ],
            None,
        )
        .await;
    assert_eq!(page.status, StatusCode::UNPROCESSABLE_ENTITY);
    let url_error = page.element("url-error");
    assert!(url_error.contains("must be an absolute URL"), "{url_error}");
    assert!(!url_error.contains("hidden"), "{url_error}");
    let events_error = page.element("events-error");
    assert!(
        events_error.contains("must list at least one event kind"),
        "{events_error}"
    );
    assert!(page
        .element("max_attempts-error")
        .contains("between 1 and 5"));
    assert!(page
        .element("timeout_ms-error")
        .contains("between 1000 and 30000"));
    assert!(
        page.element("name-error").contains("hidden"),
        "the name was fine"
    );
    assert!(
        page.body.contains("value=\"ops pager\""),
        "typed values come back"
    );
    assert!(page.body.contains("value=\"not a url\""));
    assert!(page.body.contains("id=\"error-summary\""));
    assert!(
        page.body.contains("href=\"#url\""),
        "the summary links to the field"
    );
    assert!(page
        .body
        .contains("aria-describedby=\"url-hint url-error\" aria-invalid=\"true\""));

    // The server's own rules, which a browser cannot check.
    let page = admin
        .post(
            "/settings/webhooks/new",
            Some(&browser),
            &[
                ("name", "ops"),
                ("url", "https://user:pw@hooks.example.com/"),
                ("events", "incidents.opened"),
            ],
            None,
        )
        .await;
    assert_eq!(page.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(page
        .element("url-error")
        .contains("must not carry a user name or password"));

    // The edit form refuses the same way and keeps the webhook as it was.
    let webhook = admin.create_webhook("ops").await;
    let page = admin
        .post(
            &format!("/settings/webhooks/{webhook}/edit"),
            Some(&browser),
            &[("name", ""), ("url", "ftp://example.com/")],
            None,
        )
        .await;
    assert_eq!(page.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(page.element("name-error").contains("must not be empty"));
    assert!(page
        .element("url-error")
        .contains("scheme must be http or https"));
    assert!(page
        .element("events-error")
        .contains("at least one event kind"));
    let (_, unchanged) = admin.webhook(webhook).await;
    assert_eq!(unchanged["name"], "ops");
    admin.stop().await;
}

#[tokio::test]
async fn names_and_logged_text_are_html_escaped() {
    let admin = TestAdmin::start().await;
    let browser = admin.sign_in().await;
    let name = "<script>alert(1)</script>";
    let created = admin
        .post(
            "/settings/webhooks/new",
            Some(&browser),
            &[
                ("name", name),
                ("url", "https://hooks.example.com/?a=1&b=\"2\""),
                ("events", "incidents.opened"),
            ],
            None,
        )
        .await;
    assert_eq!(created.status, StatusCode::OK, "{}", created.body);
    let (_, list) = admin.api(Method::GET, "/api/v1/webhooks", None).await;
    let id = list["items"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(list["items"][0]["name"], name, "stored as typed");

    for path in [
        "/settings/".to_owned(),
        format!("/settings/webhooks/{id}"),
        format!("/settings/webhooks/{id}/edit"),
    ] {
        let page = admin.get(&path, Some(&browser)).await;
        assert_eq!(page.status, StatusCode::OK, "{path}");
        assert!(!page.body.contains(name), "{path}: unescaped name");
        assert!(!page.body.contains("b=\"2\""), "{path}: unescaped URL");
        assert!(
            page.body
                .contains("&#60;script&#62;alert(1)&#60;/script&#62;"),
            "{path}: {}",
            page.body
        );
    }
    let form = admin
        .post(
            "/settings/webhooks/new",
            Some(&browser),
            &[("name", name), ("url", "\"><script>x</script>")],
            None,
        )
        .await;
    assert_eq!(form.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(!form.body.contains("<script>"), "{}", form.body);
    admin.stop().await;
}

#[tokio::test]
async fn each_action_does_what_the_api_does() {
    let admin = TestAdmin::start().await;
    let browser = admin.sign_in().await;
    let webhook = admin.create_webhook("ops").await;
    let href = format!("/settings/webhooks/{webhook}");

    // Edit.
    let saved = admin
        .post(
            &format!("{href}/edit"),
            Some(&browser),
            &[
                ("name", "ops pager"),
                ("url", "https://hooks.example.com/new"),
                ("events", "incidents.resolved"),
                ("events", "incidents.status_changed"),
                ("max_attempts", "3"),
                ("timeout_ms", "5000"),
            ],
            None,
        )
        .await;
    assert_eq!(saved.status, StatusCode::SEE_OTHER, "{}", saved.body);
    assert_eq!(saved.location(), format!("{href}?notice=updated"));
    let (_, changed) = admin.webhook(webhook).await;
    assert_eq!(changed["name"], "ops pager");
    assert_eq!(changed["url"], "https://hooks.example.com/new");
    assert_eq!(
        changed["events"],
        json!(["incidents.status_changed", "incidents.resolved"])
    );
    assert_eq!(
        changed["retry"],
        json!({"max_attempts": 3, "timeout_ms": 5000})
    );
    let page = admin.get(saved.location(), Some(&browser)).await;
    assert!(page.body.contains("Webhook saved."));
    assert!(page
        .body
        .contains("3 attempts: immediately, +1 min, +5 min"));

    // Disable, enable.
    let answer = admin
        .post(&format!("{href}/disable"), Some(&browser), &[], None)
        .await;
    assert_eq!(answer.location(), format!("{href}?notice=disabled"));
    assert_eq!(admin.webhook(webhook).await.1["enabled"], false);
    let answer = admin
        .post(&format!("{href}/test"), Some(&browser), &[], None)
        .await;
    assert_eq!(
        answer.status,
        StatusCode::CONFLICT,
        "no test event while disabled"
    );
    let answer = admin
        .post(&format!("{href}/enable"), Some(&browser), &[], None)
        .await;
    assert_eq!(answer.location(), format!("{href}?notice=enabled"));
    assert_eq!(admin.webhook(webhook).await.1["enabled"], true);

    // Test event.
    let answer = admin
        .post(&format!("{href}/test"), Some(&browser), &[], None)
        .await;
    assert_eq!(answer.location(), format!("{href}?notice=test"));

    // Rotate: the new secret is shown once and the old one has a grace period.
    let (_, before) = admin
        .api(
            Method::POST,
            &format!("/api/v1/webhooks/{webhook}/reveal-secret"),
            None,
        )
        .await;
    let rotated = admin
        .post(&format!("{href}/rotate-secret"), Some(&browser), &[], None)
        .await;
    assert_eq!(rotated.status, StatusCode::OK);
    let (_, after) = admin
        .api(
            Method::POST,
            &format!("/api/v1/webhooks/{webhook}/reveal-secret"),
            None,
        )
        .await;
    assert_ne!(before["secret"], after["secret"]);
    let shown = format!("value=\"{}\"", after["secret"].as_str().unwrap());
    assert!(rotated.element("secret").contains(&shown));
    assert!(rotated
        .body
        .contains("The previous secret keeps signing beside it until"));

    // Retry a failed delivery: JSON for the script, a redirect without it.
    let mut conn = admin.conn().await;
    let failed = seed_delivery(&mut conn, webhook, false).await;
    let retry = format!("/settings/deliveries/{failed}/retry");
    let answer = admin.post(&retry, Some(&browser), &[], None).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER);
    assert_eq!(
        answer.location(),
        format!("/settings/deliveries/{failed}?notice=retried")
    );
    let json_answer = admin
        .send(
            admin
                .client
                .post(format!("{}{retry}", admin.base))
                .header(COOKIE, &browser.cookie)
                .header("accept", "application/json")
                .form(&[("csrf", browser.csrf.as_str())]),
        )
        .await;
    assert_eq!(json_answer.status, StatusCode::ACCEPTED);
    let body: Value = serde_json::from_str(&json_answer.body).unwrap();
    assert_eq!(
        body,
        json!({"delivery_id": failed.to_string(), "status": "enqueued"})
    );

    // Recover failed since a time (the browser's local format, taken as UTC).
    let answer = admin
        .post(
            &format!("{href}/recover"),
            Some(&browser),
            &[("since", "2000-01-01T00:00")],
            None,
        )
        .await;
    assert_eq!(
        answer.location(),
        format!("{href}?notice=recovered&count=1")
    );
    let page = admin.get(answer.location(), Some(&browser)).await;
    assert!(page
        .body
        .contains("1 delivery enqueued: a failed one retried, or one that waited sent."));
    let bad = admin
        .post(
            &format!("{href}/recover"),
            Some(&browser),
            &[("since", "last week")],
            None,
        )
        .await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);

    // Incidents: acknowledge, then resolve.
    let incident = seed_incident(&mut conn).await;
    let status_path = format!("/settings/incidents/{incident}/status");
    let answer = admin
        .post(
            &status_path,
            Some(&browser),
            &[("status", "acknowledged")],
            None,
        )
        .await;
    assert_eq!(answer.location(), "/settings/incidents?notice=acknowledged");
    let answer = admin
        .post(
            &status_path,
            Some(&browser),
            &[("status", "resolved")],
            None,
        )
        .await;
    assert_eq!(answer.location(), "/settings/incidents?notice=resolved");
    let (_, read) = admin
        .api(Method::GET, &format!("/api/v1/incidents/{incident}"), None)
        .await;
    assert_eq!(read["status"], "resolved");
    let answer = admin
        .post(
            &status_path,
            Some(&browser),
            &[("status", "acknowledged")],
            None,
        )
        .await;
    assert_eq!(answer.status, StatusCode::CONFLICT, "resolved is final");
    let answer = admin
        .post(&status_path, Some(&browser), &[("status", "gone")], None)
        .await;
    assert_eq!(answer.status, StatusCode::UNPROCESSABLE_ENTITY);

    // Delete: a confirmation page first when the script did not confirm, then gone.
    let confirm = admin
        .post(&format!("{href}/delete"), Some(&browser), &[], None)
        .await;
    assert_eq!(confirm.status, StatusCode::OK);
    assert!(confirm.body.contains("Delete ops pager?"));
    assert_eq!(admin.webhook(webhook).await.0, StatusCode::OK, "not yet");
    let deleted = admin
        .post(
            &format!("{href}/delete"),
            Some(&browser),
            &[("confirmed", "yes")],
            None,
        )
        .await;
    assert_eq!(deleted.location(), "/settings/?notice=deleted");
    assert_eq!(admin.webhook(webhook).await.0, StatusCode::NOT_FOUND);
    let page = admin.get(&href, Some(&browser)).await;
    assert_eq!(page.status, StatusCode::OK, "its log stays readable");
    assert!(page.body.contains("This webhook was deleted"));
    let retry_page = admin
        .get(&format!("/settings/deliveries/{failed}"), Some(&browser))
        .await;
    assert!(retry_page.body.contains("Its webhook was deleted"));
    assert!(!retry_page.body.contains("data-retry"));
    admin.stop().await;
}

#[tokio::test]
async fn the_tokens_page_issues_a_bound_token_once_and_revokes_it() {
    let admin = TestAdmin::start().await;
    let browser = admin.sign_in().await;
    let page = admin.get("/settings/tokens", Some(&browser)).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("No tokens yet."));
    // Every source is offered.
    for format in tocsin_domain::alerts::AlertFormat::ALL {
        assert!(
            page.body.contains(&format!("<option value=\"{format}\"")),
            "{format}"
        );
    }

    let refused = admin
        .post(
            "/settings/tokens",
            Some(&browser),
            &[
                ("name", "sns"),
                ("source", "cloudwatch"),
                ("signing_secret", "s"),
            ],
            None,
        )
        .await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(refused.body.contains("id=\"error-summary\""));
    assert!(refused.body.contains("href=\"#signing_secret\""));
    // The form keeps what was chosen.
    assert!(refused
        .body
        .contains("<option value=\"cloudwatch\" selected>"));
    assert!(
        !refused.body.contains("value=\"s\""),
        "the secret is not shown back"
    );

    let issued = admin
        .post(
            "/settings/tokens",
            Some(&browser),
            &[
                ("name", "sns-prod"),
                ("source", "cloudwatch"),
                ("basic_auth", "on"),
                ("sns_signature", "on"),
            ],
            None,
        )
        .await;
    assert_eq!(issued.status, StatusCode::OK, "{}", issued.body);
    let marker = "data-secret";
    assert!(issued.body.contains(marker));
    let token = issued
        .body
        .split("value=\"")
        .find_map(|part| part.strip_prefix("tsn_"))
        .and_then(|rest| rest.split('"').next())
        .map(|rest| format!("tsn_{rest}"))
        .expect("the token, shown once");
    assert!(issued.body.contains("https://tocsin:&lt;token&gt;@"));
    assert!(issued.body.contains("Amazon SNS's valid signature"));
    let presented = tocsin_domain::AccessToken::from_presented(&token).expect("a token");
    let mut conn = admin.conn().await;
    let live = tocsin_storage::tokens::authenticate_all(&mut conn, &[presented])
        .await
        .unwrap()
        .remove(0)
        .expect("the token is live");
    assert_eq!(
        live.source,
        Some(tocsin_domain::alerts::AlertFormat::CloudWatch)
    );
    assert!(live.basic_auth && !live.query_token && live.sns_signature);

    let page = admin.get("/settings/tokens", Some(&browser)).await;
    let table = &page.body[page.body.find("id=\"tokens\"").expect("the token table")..];
    assert!(
        table.contains("sns-prod")
            && table.contains("<code>cloudwatch</code>")
            && table.contains("basic auth")
            && table.contains("SNS signature checked"),
        "{table}"
    );
    assert!(
        !page.body.contains(&token[17..]),
        "the token is shown only once"
    );

    let (_, list) = admin.api(Method::GET, "/api/v1/tokens", None).await;
    let id = list["items"][0]["id"].as_str().unwrap().to_owned();
    let revoked = admin
        .post(
            &format!("/settings/tokens/{id}/revoke"),
            Some(&browser),
            &[],
            None,
        )
        .await;
    assert_eq!(revoked.status, StatusCode::SEE_OTHER);
    assert_eq!(revoked.location(), "/settings/tokens?notice=revoked");
    let (_, list) = admin.api(Method::GET, "/api/v1/tokens", None).await;
    assert!(list["items"][0]["revoked_at"].is_string());
    admin.stop().await;
}
