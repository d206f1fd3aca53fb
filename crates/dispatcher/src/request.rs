//! The HTTP exchange of an attempt: the signed `POST` to the webhook's URL, its answer read
//! within the webhook's timeout, and the attempt's result (success, status, error kind and
//! detail, the answer's body as far as it is kept).

use std::borrow::Cow;
use std::net::IpAddr;
use std::time::Instant;

use serde_json::{Map, Value};
use time::OffsetDateTime;
use tocsin_domain::delivery::AttemptError;
use tocsin_domain::signing::{self, headers};
use tocsin_storage::attempts::{AttemptResult, Job};
use tocsin_web::ssrf::{Blocked, DnsFailure};
use tracing::field::Empty;

use crate::context::Context;

/// Makes the HTTP request and describes it as the attempt's result. Its span is the attempt's
/// in a trace: webhook, delivery, attempt number, trigger, and how it went.
#[tracing::instrument(
    level = "debug",
    skip_all,
    fields(
        otel.kind = "client",
        webhook_id = %job.webhook.id,
        delivery_id = %job.delivery.id,
        attempt = job.number,
        trigger = job.trigger.as_str(),
        status = Empty,
        success = Empty,
        error = Empty,
        otel.status_code = Empty,
    )
)]
pub(crate) async fn send(ctx: &Context, job: &Job, started_at: OffsetDateTime) -> AttemptResult {
    let started = Instant::now();
    let id = job.delivery.id.to_string();
    let timestamp = started_at.unix_timestamp();
    let signature = signing::signature_header(
        job.webhook.signing_secrets(started_at),
        &id,
        timestamp,
        job.body.as_bytes(),
    );
    let mut sent: Vec<(&str, String)> = vec![
        ("content-type", "application/json".into()),
        (
            "user-agent",
            concat!("Tocsin/", env!("CARGO_PKG_VERSION")).into(),
        ),
        (headers::ID, id),
        (headers::TIMESTAMP, timestamp.to_string()),
        (headers::SIGNATURE, signature),
        ("tocsin-event", job.delivery.event.as_str().into()),
        ("tocsin-attempt", job.number.to_string()),
    ];
    if job.test {
        sent.push(("tocsin-test", "true".into()));
    }
    // The webhook's own headers follow Tocsin's (their names never collide: they are
    // reserved); the log shows their values masked.
    let request_headers = Value::Object(
        sent.iter()
            .map(|(name, value)| ((*name).to_owned(), Value::String(value.clone())))
            .chain(
                job.webhook
                    .headers
                    .masked()
                    .into_iter()
                    .map(|(name, masked)| (name, Value::String(masked))),
            )
            .collect::<Map<_, _>>(),
    );
    let exchange = exchange(ctx, job, &sent).await;
    let duration_ms = i32::try_from(started.elapsed().as_millis()).unwrap_or(i32::MAX);
    let mut result = AttemptResult {
        success: false,
        status_code: None,
        duration_ms,
        error: None,
        error_detail: None,
        request_headers,
        response_body: None,
        response_truncated: false,
    };
    match exchange {
        Ok(answer) => {
            let success = (200..300).contains(&answer.status);
            result.success = success;
            result.status_code = Some(answer.status);
            result.response_body = Some(answer.body);
            result.response_truncated = answer.truncated || answer.body_error.is_some();
            let mut detail = Vec::new();
            if !success {
                result.error = Some(if (300..400).contains(&answer.status) {
                    AttemptError::Redirect
                } else {
                    AttemptError::HttpStatus
                });
                detail.push(format!("the target answered {}", answer.status));
            }
            if let Some(body_error) = answer.body_error {
                detail.push(body_error);
            }
            result.error_detail = (!detail.is_empty()).then(|| detail.join("; "));
        }
        Err((kind, detail)) => {
            result.error = Some(kind);
            result.error_detail = Some(detail);
        }
    }
    // Error texts quote what the target sent (a status line, a TLS alert).
    if let Some(detail) = &mut result.error_detail {
        if let Cow::Owned(clean) = tocsin_domain::text::storable_str(detail) {
            *detail = clean;
        }
    }
    let span = tracing::Span::current();
    span.record("success", result.success);
    if let Some(status) = result.status_code {
        span.record("status", status);
    }
    if let Some(error) = result.error {
        span.record("error", error.as_str())
            .record("otel.status_code", "error");
    }
    result
}

/// What the target answered.
struct Answer {
    status: u16,
    /// The body as read, at most the response body limit.
    body: String,
    /// The body was longer than the limit.
    truncated: bool,
    /// Why the body is incomplete, when it broke off or did not arrive within the timeout.
    body_error: Option<String>,
}

/// Sends the request. The webhook's timeout bounds the whole exchange: an answer whose status
/// line and headers come within it is the attempt's answer (its status decides success); its
/// body is read for the rest of the timeout, and a body that breaks off or is still arriving
/// then is kept as read and marked incomplete. No answer within the timeout is a timeout.
async fn exchange(
    ctx: &Context,
    job: &Job,
    sent: &[(&str, String)],
) -> Result<Answer, (AttemptError, String)> {
    let url = job.webhook.url.url();
    // IP-literal URLs never reach the resolver: check them here.
    if let Some(host) = url.host() {
        let literal: Option<IpAddr> = match host {
            url::Host::Ipv4(v4) => Some(v4.into()),
            url::Host::Ipv6(v6) => Some(v6.into()),
            url::Host::Domain(_) => None,
        };
        if let Some(ip) = literal {
            ctx.policy
                .check(ip)
                .map_err(|blocked| (AttemptError::Blocked, blocked.to_string()))?;
        }
    }
    let mut request = ctx.client.post(url.clone()).body(job.body.clone());
    for (name, value) in sent {
        request = request.header(*name, value);
    }
    for (name, value) in job.webhook.headers.iter() {
        request = request.header(name, value);
    }
    let timeout = job.webhook.retry.timeout();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut response = match tokio::time::timeout_at(deadline, request.send()).await {
        Err(_) => {
            return Err((
                AttemptError::Timeout,
                format!("no answer within {} ms", job.webhook.retry.timeout_ms()),
            ))
        }
        Ok(Err(error)) => return Err(classify(&error)),
        Ok(Ok(response)) => response,
    };
    let status = response.status().as_u16();
    let mut body = Vec::new();
    let mut truncated = false;
    let mut body_error = None;
    loop {
        match tokio::time::timeout_at(deadline, response.chunk()).await {
            Err(_) => {
                body_error = Some(format!(
                    "the response body was still arriving after {} ms; kept as read",
                    job.webhook.retry.timeout_ms()
                ));
                break;
            }
            Ok(Err(error)) => {
                body_error = Some(format!(
                    "the response body broke off: {error}; kept as read"
                ));
                break;
            }
            Ok(Ok(None)) => break,
            Ok(Ok(Some(chunk))) => {
                let room = ctx.response_limit.saturating_sub(body.len());
                if chunk.len() > room {
                    body.extend_from_slice(&chunk[..room]);
                    truncated = true;
                    break;
                }
                body.extend_from_slice(&chunk);
            }
        }
    }
    Ok(Answer {
        status,
        body: tocsin_domain::text::storable(&body),
        truncated,
        body_error,
    })
}

/// Names the kind of a transport failure from the error and its causes.
fn classify(error: &reqwest::Error) -> (AttemptError, String) {
    let mut chain = error.to_string();
    let mut kind = None;
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        chain.push_str(": ");
        chain.push_str(&cause.to_string());
        if cause.downcast_ref::<Blocked>().is_some() {
            kind = kind.or(Some(AttemptError::Blocked));
        } else if cause.downcast_ref::<DnsFailure>().is_some() {
            kind = kind.or(Some(AttemptError::Dns));
        }
        source = cause.source();
    }
    let lower = chain.to_ascii_lowercase();
    let kind = kind.unwrap_or(if error.is_timeout() {
        AttemptError::Timeout
    } else if lower.contains("certificate")
        || lower.contains("tls")
        || lower.contains("handshake")
        // rustls: the target answered the handshake with something that is not TLS.
        || lower.contains("corrupt message")
        || lower.contains("fatal alert")
    {
        AttemptError::Tls
    } else if lower.contains("message head") || lower.contains("invalid http") {
        // An answer the client cannot read as HTTP (hundreds of headers, a garbled status
        // line): the connection neither was refused nor broke.
        AttemptError::Other
    } else if error.is_connect() || error.is_request() || error.is_body() {
        AttemptError::Connect
    } else {
        AttemptError::Other
    });
    (kind, chain)
}
