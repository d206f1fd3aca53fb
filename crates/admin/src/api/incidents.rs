//! `/api/v1/incidents`: reading incidents and moving their status, which emits
//! events through the outbox.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use tocsin_domain::alerts::AlertFormat;
use tocsin_domain::{EventKind, IncidentStatus, Severity};
use tocsin_storage::incidents::{self as repo, IncidentFilter};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::actor::Actor;
use crate::error::{AdminError, OrNotFound};
use crate::params::{page, param};
use crate::state::AdminState;
use crate::{actions, schema};

/// An incident.
#[derive(Debug, Serialize, ToSchema)]
pub struct Incident {
    pub id: Uuid,
    /// What identifies the incident across alert notifications (namespaced by source format).
    pub dedup_key: String,
    /// The alert source it came from (its dedup key's namespace), which webhook
    /// `filters.sources` match.
    #[schema(value_type = Option<schema::AlertSource>, example = "cloudwatch")]
    pub format: Option<&'static str>,
    pub title: String,
    #[schema(value_type = schema::Severity)]
    pub severity: Severity,
    #[schema(value_type = schema::IncidentStatus)]
    pub status: IncidentStatus,
    pub source: Option<String>,
    pub description: Option<String>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option")]
    pub resolved_at: Option<OffsetDateTime>,
    /// The labels of the alert that opened it, which webhook `filters.labels` match.
    #[schema(example = json!({"team": "db"}))]
    pub labels: std::collections::BTreeMap<String, String>,
}

impl From<repo::Incident> for Incident {
    fn from(i: repo::Incident) -> Self {
        Incident {
            id: i.id,
            format: AlertFormat::of_dedup_key(&i.dedup_key).map(AlertFormat::as_str),
            dedup_key: i.dedup_key,
            title: i.title,
            severity: i.severity,
            status: i.status,
            source: i.source,
            description: i.description,
            created_at: i.created_at,
            updated_at: i.updated_at,
            resolved_at: i.resolved_at,
            labels: i.labels,
        }
    }
}

/// A page of incidents, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct IncidentList {
    pub items: Vec<Incident>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// A status change.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StatusChange {
    #[schema(value_type = schema::IncidentStatus, example = "acknowledged")]
    pub status: String,
}

/// The incident after a status change, and the events it emitted.
#[derive(Debug, Serialize, ToSchema)]
pub struct IncidentChanged {
    #[serde(flatten)]
    pub incident: Incident,
    /// `incidents.status_changed`, plus `incidents.resolved` on a move to `resolved`; empty
    /// when the incident already had the status.
    #[schema(value_type = Vec<schema::EventKind>)]
    pub events: Vec<EventKind>,
}

/// Filters and paging of the incident list.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only incidents with this status.
    #[param(value_type = Option<schema::IncidentStatus>)]
    pub status: Option<String>,
    /// Only incidents with this severity.
    #[param(value_type = Option<schema::Severity>)]
    pub severity: Option<String>,
    /// Items per page, 1 to 200 (default 50).
    #[param(value_type = Option<u8>, minimum = 1, maximum = 200)]
    pub limit: Option<String>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// Lists incidents, newest first.
#[utoipa::path(
    get,
    path = "/api/v1/incidents",
    operation_id = "listIncidents",
    tag = "incidents",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of incidents", body = IncidentList),
        (status = 400, description = "A bad query parameter; `field` names it", body = schema::ErrorBody),
    )
)]
#[tracing::instrument(skip_all)]
pub async fn list(
    query: web::Query<ListQuery>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, AdminError> {
    let filter = IncidentFilter {
        status: param(
            "status",
            query.status.as_deref(),
            str::parse::<IncidentStatus>,
        )?,
        severity: param(
            "severity",
            query.severity.as_deref(),
            str::parse::<Severity>,
        )?,
    };
    let page = page(query.limit.as_deref(), query.cursor.as_deref())?;
    let mut conn = state.conn().await?;
    let (incidents, next) = repo::list(&mut conn, &filter, &page).await?;
    Ok(HttpResponse::Ok().json(IncidentList {
        items: incidents.into_iter().map(Incident::from).collect(),
        next_cursor: next.map(|c| c.encode()),
    }))
}

/// Reads one incident.
#[utoipa::path(
    get,
    path = "/api/v1/incidents/{id}",
    operation_id = "getIncident",
    tag = "incidents",
    params(("id" = Uuid, Path, description = "The incident's id")),
    responses(
        (status = 200, description = "The incident", body = Incident),
        (status = 404, description = "No such incident", body = schema::ErrorBody),
    )
)]
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn get(
    id: web::Path<Uuid>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, AdminError> {
    let mut conn = state.conn().await?;
    let incident = repo::get(&mut conn, *id).await.or_not_found("incident")?;
    Ok(HttpResponse::Ok().json(Incident::from(incident)))
}

/// Moves an incident to another status. Any unresolved status may move to any other;
/// `resolved` is final. Asking for the status it already has changes nothing.
#[utoipa::path(
    patch,
    path = "/api/v1/incidents/{id}",
    operation_id = "changeIncidentStatus",
    tag = "incidents",
    params(("id" = Uuid, Path, description = "The incident's id")),
    request_body = StatusChange,
    responses(
        (status = 200, description = "The incident and the events emitted", body = IncidentChanged),
        schema::JsonBodyErrors,
        (status = 404, description = "No such incident", body = schema::ErrorBody),
        (status = 409, description = "The incident is resolved, which is final", body = schema::ErrorBody),
        (status = 422, description = "Unknown status; `field` is `status`", body = schema::ErrorBody),
    )
)]
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn update(
    req: HttpRequest,
    id: web::Path<Uuid>,
    payload: web::Payload,
    state: web::Data<AdminState>,
    actor: Actor,
) -> Result<HttpResponse, AdminError> {
    let change: StatusChange = state.json(&req, payload).await?;
    let to = change
        .status
        .parse::<IncidentStatus>()
        .map_err(|e| AdminError::invalid("status", e))?;
    let (incident, events) = actions::change_incident_status(&state, &actor, *id, to).await?;
    Ok(HttpResponse::Ok().json(IncidentChanged {
        incident: incident.into(),
        events: events.iter().map(|e| e.kind).collect(),
    }))
}
