//! The pages' templates (askama, under `crates/admin/templates/`) and the view models they
//! read. Every value is prepared here as text and HTML-escaped by askama when rendered; no
//! template marks anything `safe`.

use std::time::Duration;
use tocsin_domain::Role;

use askama::Template;
use time::format_description::well_known::Rfc3339;
use time::macros::format_description;
use time::OffsetDateTime;
use tocsin_domain::{EventKind, RetrySchedule};
use tocsin_storage::deliveries::DeliveryState;

use super::assets;

/// What every page's frame needs: the current section, and for a signed-in page the CSRF token
/// of its forms (the sign-out button among them).
pub struct Layout {
    pub nav: &'static str,
    pub csrf: String,
    pub asset_version: &'static str,
    /// The signed-in key's role: pages show only the forms it allows.
    pub role: Role,
}

impl Layout {
    pub fn signed_in(nav: &'static str, csrf: &str, role: Role) -> Self {
        Layout {
            nav,
            csrf: csrf.to_owned(),
            asset_version: assets::version(),
            role,
        }
    }

    pub fn signed_out() -> Self {
        Layout {
            nav: "",
            csrf: String::new(),
            asset_version: assets::version(),
            role: Role::Viewer,
        }
    }

    /// The role may retry, replay, recover, send test events and change incidents.
    pub fn operates(&self) -> bool {
        self.role.allows(Role::Operator)
    }

    /// The role may change webhooks, secrets, tokens and keys.
    pub fn administers(&self) -> bool {
        self.role.allows(Role::Admin)
    }

    pub fn is_signed_in(&self) -> bool {
        !self.csrf.is_empty()
    }
}

/// A time as shown (UTC, to the second) and as machine-readable RFC 3339.
pub struct When {
    pub iso: String,
    pub text: String,
}

impl When {
    pub fn of(at: OffsetDateTime) -> Self {
        let utc = at.to_offset(time::UtcOffset::UTC);
        When {
            iso: utc.format(&Rfc3339).unwrap_or_default(),
            text: utc
                .format(format_description!(
                    "[year]-[month]-[day] [hour]:[minute]:[second] UTC"
                ))
                .unwrap_or_default(),
        }
    }
}

/// A duration for people: `200 ms`, `30 s`, `5 min`, `2 h`, `1 h 30 min`.
pub fn human_duration(duration: Duration) -> String {
    let ms = duration.as_millis();
    if ms < 1000 {
        return format!("{ms} ms");
    }
    let secs = duration.as_secs();
    if secs < 60 {
        return format!("{secs} s");
    }
    let (hours, minutes, seconds) = (secs / 3600, secs % 3600 / 60, secs % 60);
    let mut parts = Vec::new();
    if hours > 0 {
        parts.push(format!("{hours} h"));
    }
    if minutes > 0 {
        parts.push(format!("{minutes} min"));
    }
    if seconds > 0 {
        parts.push(format!("{seconds} s"));
    }
    parts.join(" ")
}

/// Each step of the retry schedule as shown: `immediately`, then `+1 min`, `+5 min`, ...
pub fn schedule_steps(schedule: &RetrySchedule) -> Vec<String> {
    schedule
        .delays()
        .iter()
        .enumerate()
        .map(|(i, delay)| {
            if i == 0 {
                "immediately".to_owned()
            } else {
                format!("+{}", human_duration(*delay))
            }
        })
        .collect()
}

/// The attempts `max_attempts` implies, as shown beside the field (`immediately, +1 min, ...`).
pub fn schedule_text(schedule: &RetrySchedule, max_attempts: u8) -> String {
    let steps = schedule_steps(schedule);
    let n = usize::from(max_attempts).clamp(1, steps.len().max(1));
    steps.into_iter().take(n).collect::<Vec<_>>().join(", ")
}

/// A delivery's attempts in words that add up: all of them, then the automatic ones against
/// what its webhook allows, then the manual ones (retries an operator asked for, which the
/// schedule does not count): `2 attempts: 1 automatic of at most 1, 1 manual`.
pub fn attempts_text(attempts: i32, automatic: i32, max_attempts: u8) -> String {
    if attempts == 0 {
        return format!("No attempt yet (at most {max_attempts} automatic)");
    }
    let plural = if attempts == 1 { "" } else { "s" };
    // A webhook's max_attempts may have been lowered since its automatic attempts were made.
    let allowed = if automatic <= i32::from(max_attempts) {
        format!("of at most {max_attempts}")
    } else {
        format!("(its webhook now allows {max_attempts})")
    };
    let mut text = format!("{attempts} attempt{plural}: {automatic} automatic {allowed}");
    let manual = attempts - automatic;
    if manual > 0 {
        text.push_str(&format!(", {manual} manual"));
    }
    text
}

/// What each event kind means.
pub fn event_description(kind: EventKind) -> &'static str {
    match kind {
        EventKind::IncidentOpened => "a new incident was created",
        EventKind::IncidentStatusChanged => "the status of an incident was updated",
        EventKind::IncidentResolved => "an incident was resolved",
    }
}

/// A delivery state for people.
pub fn state_label(state: DeliveryState) -> &'static str {
    match state {
        DeliveryState::Pending => "Pending",
        DeliveryState::Waiting => "Waiting",
        DeliveryState::Retrying => "Retrying",
        DeliveryState::Succeeded => "Succeeded",
        DeliveryState::Failed => "Failed",
    }
}

/// An option of a `<select>`.
pub struct SelectOption {
    pub value: String,
    pub label: String,
    pub selected: bool,
}

/// `GET /settings/sign-in`.
#[derive(Template)]
#[template(path = "sign_in.html")]
pub struct SignInPage {
    pub layout: Layout,
    pub error: Option<&'static str>,
    /// Offer signing in through the OpenID Connect provider.
    pub oidc: bool,
}

/// After a sign-in through the identity provider: a page that moves on to the settings itself
/// (a same-site navigation, so that the `SameSite=Strict` session cookie goes with it, which a
/// redirect at the end of the provider's cross-site chain would not carry).
#[derive(Template)]
#[template(path = "signed_in.html")]
pub struct SignedInPage {
    pub layout: Layout,
    pub name: String,
}

/// A webhook's newest delivery, in the list.
pub struct LastDelivery {
    pub href: String,
    pub state: &'static str,
    pub label: &'static str,
    pub at: When,
}

/// One row of the webhook list.
pub struct WebhookRow {
    pub href: String,
    pub name: String,
    pub url: String,
    pub events: Vec<&'static str>,
    pub enabled: bool,
    pub health: HealthView,
    pub last: Option<LastDelivery>,
}

/// `GET /settings/`: the webhooks.
#[derive(Template)]
#[template(path = "webhooks.html")]
pub struct WebhookListPage {
    pub layout: Layout,
    pub notice: Option<String>,
    pub rows: Vec<WebhookRow>,
    pub next_page: Option<String>,
}

/// A checkbox of the event fieldset.
pub struct EventOption {
    pub id: String,
    pub value: &'static str,
    pub description: &'static str,
    pub checked: bool,
}

/// The webhook form's values as typed (shown again when the server refuses them).
#[derive(Default)]
pub struct WebhookFormValues {
    pub name: String,
    pub url: String,
    pub events: Vec<String>,
    pub max_attempts: String,
    pub timeout_ms: String,
    /// The severities checked; none checked receives every severity.
    pub severities: Vec<String>,
    /// Sources, comma-separated.
    pub sources: String,
    /// Labels, one `key=value` a line.
    pub labels: String,
    /// Headers, one `Name: value` a line (their real values: this is the form that sets them).
    pub headers: String,
    pub rate_limit: String,
    /// `none` or `incident`.
    pub ordering: String,
}

/// The server's refusals, one per form field.
#[derive(Default)]
pub struct FormErrors {
    pub name: Option<String>,
    pub url: Option<String>,
    pub events: Option<String>,
    pub max_attempts: Option<String>,
    pub timeout_ms: Option<String>,
    pub severities: Option<String>,
    pub sources: Option<String>,
    pub labels: Option<String>,
    pub headers: Option<String>,
    pub rate_limit: Option<String>,
    pub ordering: Option<String>,
}

/// One entry of the error summary above a refused form: the field's id, label and message.
pub struct SummaryItem {
    pub id: &'static str,
    pub label: &'static str,
    pub message: String,
}

impl FormErrors {
    /// Files an error under the form field its API field name belongs to (the first one wins).
    pub fn add(&mut self, api_field: &str, message: String) {
        let slot = match api_field {
            "name" => &mut self.name,
            "url" => &mut self.url,
            "retry.max_attempts" => &mut self.max_attempts,
            "retry.timeout_ms" => &mut self.timeout_ms,
            "rate_limit_per_second" => &mut self.rate_limit,
            "ordering" => &mut self.ordering,
            field if field.starts_with("filters.severities") => &mut self.severities,
            field if field.starts_with("filters.sources") => &mut self.sources,
            field if field.starts_with("filters.labels") => &mut self.labels,
            field if field.starts_with("headers") => &mut self.headers,
            _ => &mut self.events,
        };
        slot.get_or_insert(message);
    }

    pub fn is_empty(&self) -> bool {
        self.summary().is_empty()
    }

    /// Every error, in the order of the fields.
    pub fn summary(&self) -> Vec<SummaryItem> {
        [
            ("name", "Name", &self.name),
            ("url", "Target URL", &self.url),
            ("event-0", "Events", &self.events),
            ("max_attempts", "Max attempts", &self.max_attempts),
            ("timeout_ms", "Timeout", &self.timeout_ms),
            ("severity-0", "Severities", &self.severities),
            ("sources", "Sources", &self.sources),
            ("labels", "Labels", &self.labels),
            ("headers", "Headers", &self.headers),
            ("rate_limit", "Rate limit", &self.rate_limit),
            ("ordering", "Order", &self.ordering),
        ]
        .into_iter()
        .filter_map(|(id, label, message)| {
            message.as_ref().map(|message| SummaryItem {
                id,
                label,
                message: message.clone(),
            })
        })
        .collect()
    }
}

/// `GET /settings/webhooks/new` and `/settings/webhooks/{id}/edit`.
#[derive(Template)]
#[template(path = "webhook_form.html")]
pub struct WebhookFormPage {
    pub layout: Layout,
    pub heading: String,
    pub breadcrumb: Option<(String, String)>,
    pub action: String,
    pub submit_label: &'static str,
    pub cancel_href: String,
    pub values: WebhookFormValues,
    pub errors: FormErrors,
    pub event_options: Vec<EventOption>,
    /// `SEV1`..`SEV5`, each with whether it is checked.
    pub severity_options: Vec<(String, &'static str, bool)>,
    /// The schedule's steps joined by `|`, for the script that updates the hint.
    pub schedule_steps: String,
    pub schedule_text: String,
    pub max_attempts_limit: u8,
}

/// The signing secret, shown once after creation or rotation.
#[derive(Template)]
#[template(path = "secret.html")]
pub struct SecretPage {
    pub layout: Layout,
    pub heading: &'static str,
    pub intro: &'static str,
    pub webhook_name: String,
    pub webhook_href: String,
    pub secret: String,
    pub previous_expires: Option<When>,
}

/// A webhook as its page shows it.
pub struct WebhookView {
    pub id: String,
    pub href: String,
    pub name: String,
    pub url: String,
    pub events: Vec<&'static str>,
    pub enabled: bool,
    pub deleted: bool,
    pub max_attempts: u8,
    pub schedule_text: String,
    pub timeout: String,
    pub created: When,
    pub updated: When,
    pub previous_secret_expires: Option<When>,
    pub disabled_reason: Option<String>,
    pub disabled_at: Option<When>,
    pub health: HealthView,
    /// The filters in words, one line each; empty when there are none.
    pub filters: Vec<String>,
    /// Header names (their values are not shown here).
    pub header_names: Vec<String>,
    pub rate_limit: Option<u32>,
    /// `none` or `incident`.
    pub ordering: &'static str,
}

/// A webhook's health as the pages show it: a badge and its figures.
pub struct HealthView {
    /// `healthy`, `failing` or `unknown` (no attempt yet): the badge's class.
    pub badge: &'static str,
    pub label: String,
    pub consecutive_failures: i32,
    pub last_success: Option<When>,
    pub last_failure: Option<When>,
    pub last_error: Option<String>,
    pub rate_1h: String,
    pub rate_24h: String,
}

impl HealthView {
    pub fn of(health: &tocsin_storage::health::WebhookHealth) -> Self {
        let rate =
            |r: Option<f64>| r.map_or("no attempts".to_owned(), |r| format!("{:.1} %", r * 100.0));
        let (badge, label) = if health.consecutive_failures > 0 {
            let n = health.consecutive_failures;
            ("failing", format!("Failing ({n} in a row)"))
        } else if health.last_success_at.is_some() {
            ("healthy", "Healthy".to_owned())
        } else {
            ("unknown", "No attempts yet".to_owned())
        };
        HealthView {
            badge,
            label,
            consecutive_failures: health.consecutive_failures,
            last_success: health.last_success_at.map(When::of),
            last_failure: health.last_failure_at.map(When::of),
            last_error: health.last_error.clone(),
            rate_1h: rate(health.success_rate_1h),
            rate_24h: rate(health.success_rate_24h),
        }
    }
}

/// One row of a delivery log.
pub struct DeliveryRow {
    pub href: String,
    pub created: When,
    pub event: &'static str,
    pub incident_id: String,
    pub incident_short: String,
    pub state: &'static str,
    pub state_label: &'static str,
    pub next_attempt: Option<When>,
    /// Why it is waiting, for people.
    pub wait_reason: Option<&'static str>,
    /// Made by a replay of past events.
    pub replayed: bool,
    pub attempts: i32,
    pub webhook: Option<(String, String)>,
}

/// A delivery log with its filters and paging (on a webhook's page and on its own).
pub struct DeliveryLog {
    pub action: String,
    pub hidden: Vec<(&'static str, String)>,
    pub state_options: Vec<SelectOption>,
    pub event_options: Vec<SelectOption>,
    pub filtered: bool,
    /// The log without its filters.
    pub clear_href: String,
    pub rows: Vec<DeliveryRow>,
    pub next_page: Option<String>,
    pub show_webhook: bool,
}

/// `GET /settings/webhooks/{id}`.
#[derive(Template)]
#[template(path = "webhook.html")]
pub struct WebhookPage {
    pub layout: Layout,
    pub notice: Option<String>,
    pub webhook: WebhookView,
    pub log: DeliveryLog,
    pub recover_since: String,
}

/// The confirmation a delete asks for when the page's script did not.
#[derive(Template)]
#[template(path = "confirm_delete.html")]
pub struct ConfirmDeletePage {
    pub layout: Layout,
    pub name: String,
    pub action: String,
    pub cancel_href: String,
}

/// `GET /settings/deliveries`.
#[derive(Template)]
#[template(path = "deliveries.html")]
pub struct DeliveriesPage {
    pub layout: Layout,
    pub webhook_filter: Option<(String, String)>,
    pub log: DeliveryLog,
}

/// A delivery as its page shows it.
pub struct DeliverySummary {
    pub id: String,
    pub event: &'static str,
    pub incident_id: String,
    pub title: Option<String>,
    pub state: &'static str,
    pub state_label: &'static str,
    /// Its attempts, automatic and manual ([`attempts_text`]).
    pub attempts: String,
    pub next_attempt: Option<When>,
    /// Why it is waiting, for people.
    pub wait_reason: Option<&'static str>,
    /// The id of the delivery it waits for, when it waits for its incident's order.
    pub waits_for: Option<String>,
    /// Made by a replay of past events.
    pub replayed: bool,
    pub created: When,
    pub updated: When,
    pub webhook_name: String,
    pub webhook_href: String,
}

/// One attempt of a delivery.
pub struct AttemptView {
    pub number: i32,
    pub trigger: String,
    pub started: When,
    /// `succeeded`, `failed` or `under-way`.
    pub result: &'static str,
    pub result_label: &'static str,
    pub status_code: Option<i32>,
    pub duration_ms: Option<i32>,
    pub error: Option<String>,
    pub headers: Vec<(String, String)>,
    pub payload: String,
    pub response_body: Option<String>,
    pub response_truncated: bool,
    pub open: bool,
}

/// `GET /settings/deliveries/{id}`.
#[derive(Template)]
#[template(path = "delivery.html")]
pub struct DeliveryPage {
    pub layout: Layout,
    pub notice: Option<String>,
    pub delivery: DeliverySummary,
    pub attempts: Vec<AttemptView>,
    pub retry_action: Option<String>,
    pub retry_blocked: Option<&'static str>,
}

/// One row of the incident list.
pub struct IncidentRow {
    pub id: String,
    pub title: String,
    pub severity: &'static str,
    pub status: &'static str,
    /// The alert source (format) it came from.
    pub format: Option<&'static str>,
    pub source: Option<String>,
    pub created: When,
    pub action: String,
    pub can_acknowledge: bool,
    pub can_resolve: bool,
}

/// `GET /settings/incidents`.
#[derive(Template)]
#[template(path = "incidents.html")]
pub struct IncidentsPage {
    pub layout: Layout,
    pub notice: Option<String>,
    pub status_options: Vec<SelectOption>,
    pub rows: Vec<IncidentRow>,
    pub next_page: Option<String>,
}

/// An error, as a page.
#[derive(Template)]
#[template(path = "error.html")]
pub struct ErrorPage {
    pub layout: Layout,
    pub status: u16,
    pub title: &'static str,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    #[test]
    fn durations_and_schedules_read_well() {
        assert_eq!(human_duration(Duration::from_millis(200)), "200 ms");
        assert_eq!(human_duration(Duration::from_secs(30)), "30 s");
        assert_eq!(human_duration(Duration::from_secs(300)), "5 min");
        assert_eq!(human_duration(Duration::from_secs(5400)), "1 h 30 min");
        let schedule = RetrySchedule::default();
        assert_eq!(schedule_text(&schedule, 1), "immediately");
        assert_eq!(
            schedule_text(&schedule, 5),
            "immediately, +1 min, +5 min, +30 min, +2 h"
        );
    }

    #[test]
    fn attempts_add_up_in_words() {
        for (attempts, automatic, max_attempts, text) in [
            (0, 0, 5, "No attempt yet (at most 5 automatic)"),
            (1, 1, 3, "1 attempt: 1 automatic of at most 3"),
            (2, 1, 1, "2 attempts: 1 automatic of at most 1, 1 manual"),
            (7, 5, 5, "7 attempts: 5 automatic of at most 5, 2 manual"),
            (
                3,
                3,
                1,
                "3 attempts: 3 automatic (its webhook now allows 1)",
            ),
        ] {
            assert_eq!(attempts_text(attempts, automatic, max_attempts), text);
        }
    }

    #[test]
    fn times_are_shown_in_utc() {
        let when = When::of(datetime!(2026-11-22 02:32:05 +01:00));
        assert_eq!(when.text, "2026-11-22 01:32:05 UTC");
        assert_eq!(when.iso, "2026-11-22T01:32:05Z");
    }

    #[test]
    fn values_are_escaped() {
        let page = ErrorPage {
            layout: Layout::signed_out(),
            status: 404,
            title: "Not found",
            message: "<script>alert(1)</script> & \"quotes\"".into(),
        };
        let html = page.render().unwrap();
        assert!(!html.contains("<script>alert(1)"), "{html}");
        assert!(
            html.contains("&#60;script&#62;alert(1)&#60;/script&#62;"),
            "{html}"
        );
    }
}
