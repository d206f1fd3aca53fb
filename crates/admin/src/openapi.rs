//! `GET /api/v1/openapi.json`: the OpenAPI 3.1 document of the admin API, generated from the
//! handlers' `#[utoipa::path]` attributes and the request and response types. It also
//! describes ingest's `POST /api/v1/webhooks/alerts` and the health endpoints every service
//! serves, so one document covers what clients call.

use actix_web::HttpResponse;
use utoipa::openapi::header::Header;
use utoipa::openapi::path::Operation;
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr};
use utoipa::{Modify, OpenApi};

use crate::api::{admin_keys, audit_log, deliveries, incidents, tokens, webhooks};
use crate::schema;

/// Name of the admin token's security scheme.
pub const ADMIN_SCHEME: &str = "admin_token";
/// Name of the inbound token's security scheme (ingest).
pub const INGEST_SCHEME: &str = "inbound_token";

/// The admin API's OpenAPI document.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Tocsin admin API",
        description = "Configure outbound webhooks, read the delivery log, retry deliveries, \
            move incidents, issue inbound tokens and admin keys, and read the audit log. Every \
            /api/v1 call but this document needs `Authorization: Bearer <admin key>` (or the \
            bootstrap token, TOCSIN_ADMIN_TOKEN, unless it is turned off). Each operation needs \
            a role (`x-required-role`: `viewer`, `operator` or `admin`, each allowing what the \
            ones before it do); a key beyond its role gets 403. Lists are newest first and \
            paginated with `limit` and the opaque `cursor` handed out as `next_cursor`. \
            Errors share one body: {\"error\": {\"code\", \"message\", \"field\"}}."
    ),
    paths(
        webhooks::create,
        webhooks::list,
        webhooks::get,
        webhooks::update,
        webhooks::delete,
        webhooks::reveal_secret,
        webhooks::rotate_secret,
        webhooks::send_test_event,
        webhooks::recover,
        webhooks::replay,
        deliveries::list,
        deliveries::get,
        deliveries::retry,
        incidents::list,
        incidents::get,
        incidents::update,
        tokens::create,
        tokens::list,
        tokens::revoke,
        admin_keys::create,
        admin_keys::list,
        admin_keys::revoke,
        audit_log::list,
        openapi_json,
        ingest_alerts,
        healthz,
        readyz,
        metrics,
    ),
    components(schemas(
        schema::ErrorBody,
        schema::ErrorDetail,
        schema::EventKind,
        schema::IncidentStatus,
        schema::Severity,
        schema::AlertSource,
        schema::DeliveryState,
        schema::WaitReason,
        schema::Ordering,
        schema::AttemptTrigger,
        schema::AttemptError,
        schema::Role,
        AlertsAccepted,
        TouchedIncident,
    )),
    modifiers(&Security),
    tags(
        (name = "webhooks", description = "Outbound webhooks: where events go, signed with the webhook's secret"),
        (name = "deliveries", description = "The delivery log and manual retry"),
        (name = "incidents", description = "Incidents and their status"),
        (name = "tokens", description = "Inbound access tokens for the alert endpoint"),
        (name = "admin keys", description = "The keys people and scripts use with the admin API and pages, each with a role"),
        (name = "audit log", description = "Who changed what, or revealed which secret, when and from where"),
        (name = "ingest", description = "Served by tocsin-ingest, not by admin"),
        (name = "operations", description = "Health, readiness, metrics and this document"),
    )
)]
pub struct ApiDoc;

/// The document as JSON text, built once at start.
pub fn document() -> String {
    ApiDoc::openapi()
        .to_pretty_json()
        .expect("the OpenAPI document always serialises")
}

/// Serves the OpenAPI document (no token needed).
#[utoipa::path(
    get,
    path = "/api/v1/openapi.json",
    operation_id = "getOpenApiDocument",
    tag = "operations",
    responses((status = 200, description = "This document", content_type = "application/json"))
)]
pub async fn openapi_json(document: actix_web::web::Data<OpenApiJson>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(document.0.clone())
}

/// The rendered document, shared by the workers.
pub struct OpenApiJson(pub String);

/// The 202 body of the alert endpoint.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)] // describes tocsin-ingest's answer for the document; never built here
struct AlertsAccepted {
    #[schema(example = "accepted")]
    status: String,
    /// The detected (or `?format=`) format.
    #[schema(example = "alertmanager")]
    format: String,
    incidents: Vec<TouchedIncident>,
    /// PagerDuty senders only: the dedup key, generated when the event had none.
    dedup_key: Option<String>,
    /// A body that touched no incident: `subscription_confirmed` (an SNS subscription
    /// confirmation, fetched), `unsubscribed` (SNS's notice) or `ignored` (see `reason`).
    notice: Option<String>,
    /// Why an `ignored` body changed nothing (a test message, a state Tocsin does not act on).
    reason: Option<String>,
}

/// What an alert did to one incident.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)] // describes tocsin-ingest's answer for the document; never built here
struct TouchedIncident {
    /// `null` when an acknowledge or resolve found no open incident.
    id: Option<uuid::Uuid>,
    dedup_key: String,
    /// `trigger`, `acknowledge` or `resolve`.
    action: String,
    /// `opened`, `status_changed`, `unchanged` or `no_open_incident`.
    change: String,
    /// With `status_changed`: the status before.
    #[schema(value_type = Option<schema::IncidentStatus>)]
    from: Option<String>,
    #[schema(value_type = Option<schema::IncidentStatus>)]
    status: Option<String>,
    #[schema(value_type = Vec<schema::EventKind>)]
    events: Vec<String>,
}

/// Receives an alert from a monitoring tool (served by `tocsin-ingest`, documented here).
/// Prometheus Alertmanager, Grafana, PagerDuty Events API v2, Tocsin's generic JSON and the
/// vendor bodies that cannot be mistaken (SNS, Azure, Google Cloud Monitoring, Sentry, Uptime
/// Kuma) are detected from the body; a token bound to a source, or `?format=`, names it
/// instead (docs/ingest.md lists every source).
#[utoipa::path(
    post,
    path = "/api/v1/webhooks/alerts",
    operation_id = "receiveAlerts",
    tag = "ingest",
    params(
        ("format" = Option<schema::AlertSource>, Query, description = "The alert source; skips detection. A token bound to another source refuses it (422)"),
        ("token" = Option<String>, Query, description = "The inbound token, for tokens with `query_token` only"),
    ),
    request_body(content = Object, description = "The tool's own JSON body (at most 512 KiB by default)", content_type = "application/json"),
    responses(
        (status = 202, description = "Accepted: the incidents touched", body = AlertsAccepted),
        schema::JsonBodyErrors,
        (status = 401, description = "Missing, unknown or revoked inbound token, a credential the token does not accept, or a missing or wrong signature", body = schema::ErrorBody),
        (status = 422, description = "Invalid content; `field` names it", body = schema::ErrorBody),
        (status = 502, description = "An SNS subscription confirmation could not be fetched; SNS sends it again", body = schema::ErrorBody),
        (status = 429, description = "Over the token's rate limit; see Retry-After", body = schema::ErrorBody),
        (status = 503, description = "Storage unreachable; retry later", body = schema::ErrorBody),
    ),
    security(("inbound_token" = []))
)]
#[allow(dead_code)] // a path item of the document only: ingest serves it
fn ingest_alerts() {}

/// The process is alive.
#[utoipa::path(get, path = "/healthz", operation_id = "healthz", tag = "operations", responses((status = 200, description = "Alive")))]
#[allow(dead_code)] // served by tocsin_web::health
fn healthz() {}

/// PostgreSQL and RabbitMQ answer.
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "operations",
    responses(
        (status = 200, description = "Ready"),
        (status = 503, description = "PostgreSQL or RabbitMQ is unreachable; the body says which"),
    )
)]
#[allow(dead_code)] // served by tocsin_web::health
fn readyz() {}

/// Prometheus metrics in the text exposition format.
#[utoipa::path(get, path = "/metrics", operation_id = "metrics", tag = "operations", responses((status = 200, description = "Metrics", content_type = "text/plain")))]
#[allow(dead_code)] // served by tocsin_web::metrics
fn metrics() {}

/// Declares the two bearer schemes, and puts every admin operation under the admin token with
/// the refusals any of them may answer.
struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            ADMIN_SCHEME,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("tak_<prefix>_<secret>")
                    .description(Some(
                        "An admin key (POST /api/v1/admin-keys), or the bootstrap token TOCSIN_ADMIN_TOKEN",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            INGEST_SCHEME,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("tsn_<prefix>_<secret>")
                    .description(Some(
                        "An inbound token issued by POST /api/v1/tokens (ingest only)",
                    ))
                    .build(),
            ),
        );
        let string = || ObjectBuilder::new().schema_type(Type::String);
        let integer = || ObjectBuilder::new().schema_type(Type::Integer);
        let responses = [
            (
                "Unauthorized",
                "Missing, unknown, revoked or expired admin key (or a wrong bootstrap token)",
                Some(("WWW-Authenticate", Header::new(string()))),
            ),
            (
                "Forbidden",
                "The key's role does not allow this operation; the message names the role needed",
                None,
            ),
            (
                "TooManyFailures",
                "This client address presented too many wrong admin tokens; retry after Retry-After seconds",
                Some(("Retry-After", Header::new(integer()))),
            ),
            ("Internal", "An unexpected error; it was logged", None),
            (
                "Unavailable",
                "Storage unreachable; retry after Retry-After seconds",
                Some(("Retry-After", Header::new(integer()))),
            ),
        ];
        for (name, description, header) in responses {
            components.responses.insert(
                name.to_owned(),
                RefOr::T(error_response(description, header)),
            );
        }
        for (path, item) in openapi.paths.paths.iter_mut() {
            let admin = path.starts_with("/api/v1/")
                && path != "/api/v1/openapi.json"
                && path != "/api/v1/webhooks/alerts";
            if !admin {
                continue;
            }
            let operations = [
                ("GET", &mut item.get),
                ("POST", &mut item.post),
                ("PUT", &mut item.put),
                ("PATCH", &mut item.patch),
                ("DELETE", &mut item.delete),
            ];
            for (method, operation) in operations {
                if let Some(operation) = operation {
                    let role = crate::roles::of_operation(method, path)
                        .expect("every admin operation has a row in roles::API");
                    protect(operation, role);
                }
            }
        }
    }
}

/// The extension naming the role an operation needs.
pub const ROLE_EXTENSION: &str = "x-required-role";

fn protect(operation: &mut Operation, role: tocsin_domain::Role) {
    let sentence = format!("Needs the `{role}` role.");
    operation.description = Some(match operation.description.take() {
        Some(text) if !text.is_empty() => format!("{text}\n\n{sentence}"),
        _ => sentence,
    });
    let mut extensions = utoipa::openapi::extensions::Extensions::default();
    extensions.insert(ROLE_EXTENSION.to_owned(), serde_json::json!(role.as_str()));
    operation.extensions = Some(extensions);
    operation.security = Some(vec![SecurityRequirement::new(
        ADMIN_SCHEME,
        Vec::<String>::new(),
    )]);
    for (status, name) in [
        ("401", "Unauthorized"),
        ("403", "Forbidden"),
        ("429", "TooManyFailures"),
        ("500", "Internal"),
        ("503", "Unavailable"),
    ] {
        operation
            .responses
            .responses
            .entry(status.to_owned())
            .or_insert_with(|| RefOr::Ref(Ref::from_response_name(name)));
    }
}

fn error_response(description: &str, header: Option<(&str, Header)>) -> Response {
    let mut response = ResponseBuilder::new().description(description).content(
        "application/json",
        ContentBuilder::new()
            .schema(Some(Ref::from_schema_name("ErrorBody")))
            .build(),
    );
    if let Some((name, header)) = header {
        response = response.header(name, header);
    }
    response.build()
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_ids_are_unique_and_every_admin_operation_is_protected() {
        let document: serde_json::Value = serde_json::from_str(&document()).unwrap();
        let mut ids = std::collections::BTreeSet::new();
        for (path, item) in document["paths"].as_object().unwrap() {
            for (method, operation) in item.as_object().unwrap() {
                let id = operation["operationId"].as_str().unwrap().to_owned();
                assert!(ids.insert(id.clone()), "{method} {path}: {id} twice");
                let protected = operation["security"] == serde_json::json!([{ADMIN_SCHEME: []}]);
                let role = operation[ROLE_EXTENSION].as_str();
                assert_eq!(role.is_some(), protected, "{method} {path}: {role:?}");
                let admin = path.starts_with("/api/v1/")
                    && path != "/api/v1/openapi.json"
                    && path != "/api/v1/webhooks/alerts";
                assert_eq!(protected, admin, "{method} {path}");
            }
        }
    }
}
