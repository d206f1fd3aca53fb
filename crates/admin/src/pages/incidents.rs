//! Incidents: a list with status and severity, and buttons to acknowledge and resolve (which
//! emit events to the subscribed webhooks, as the API's status change does).

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use serde::Deserialize;
use tocsin_domain::alerts::AlertFormat;
use tocsin_domain::IncidentStatus;
use tocsin_storage::incidents::{self as repo, IncidentFilter};
use uuid::Uuid;

use super::session::{Session, SignedForm};
use super::templates::{IncidentRow, IncidentsPage, SelectOption, When};
use super::{given, notice, query_string, redirect, render, PageError};
use crate::actions;
use crate::error::AdminError;
use crate::params::{page, param};
use crate::state::AdminState;

/// Filter, paging and the notice of the incident list.
#[derive(Debug, Deserialize)]
pub struct ListQuery {
    status: Option<String>,
    cursor: Option<String>,
    notice: Option<String>,
}

/// `GET /settings/incidents`.
#[tracing::instrument(skip_all)]
pub async fn list(
    session: Session,
    query: web::Query<ListQuery>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, PageError> {
    let status = param("status", given(&query.status), str::parse::<IncidentStatus>)?;
    let filter = IncidentFilter {
        status,
        severity: None,
    };
    let page = page(None, given(&query.cursor))?;
    let mut conn = state.conn().await?;
    let (incidents, next) = repo::list(&mut conn, &filter, &page).await?;
    let rows = incidents
        .into_iter()
        .map(|incident| IncidentRow {
            id: incident.id.to_string(),
            action: format!("/settings/incidents/{}/status", incident.id),
            can_acknowledge: incident.status == IncidentStatus::Triggered,
            can_resolve: incident.status.is_open(),
            title: incident.title,
            severity: incident.severity.as_str(),
            status: incident.status.as_str(),
            format: AlertFormat::of_dedup_key(&incident.dedup_key).map(AlertFormat::as_str),
            source: incident.source,
            created: When::of(incident.created_at),
        })
        .collect();
    let selected = status.map(IncidentStatus::as_str).unwrap_or_default();
    render(
        StatusCode::OK,
        &IncidentsPage {
            layout: session.layout("incidents"),
            notice: notice(query.notice.as_deref(), None),
            status_options: IncidentStatus::ALL
                .iter()
                .map(|s| SelectOption {
                    value: s.as_str().to_owned(),
                    label: s.as_str().to_owned(),
                    selected: s.as_str() == selected,
                })
                .collect(),
            rows,
            next_page: next.map(|cursor| {
                let cursor = cursor.encode();
                format!(
                    "/settings/incidents?{}",
                    query_string([("status", selected), ("cursor", cursor.as_str())])
                )
            }),
        },
    )
}

/// `POST /settings/incidents/{id}/status`: moves the incident (`status` = `acknowledged`,
/// `resolved`, ...), then back to the list.
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn change_status(
    signed: SignedForm,
    id: web::Path<Uuid>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, PageError> {
    let form = signed.form;
    let to = form
        .get("status")
        .unwrap_or_default()
        .parse::<IncidentStatus>()
        .map_err(|e| AdminError::invalid("status", e))?;
    actions::change_incident_status(&state, &signed.session.actor, *id, to).await?;
    let key = match to {
        IncidentStatus::Acknowledged => "acknowledged",
        IncidentStatus::Resolved => "resolved",
        _ => "status",
    };
    Ok(redirect(&format!("/settings/incidents?notice={key}")))
}
