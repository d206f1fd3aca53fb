//! One attempt of one delivery: a signed `POST` of the event body (DESIGN §3), logged as an
//! attempt row; the delivery's state moves, and a failed automatic attempt with attempts left is
//! scheduled through the retry queue of the next delay. The message is acked only after the
//! attempt row is committed and any retry message is confirmed.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use lapin::message::Delivery;
use serde_json::{Map, Value};
use time::OffsetDateTime;
use tocsin_domain::amqp::messages::{
    DeliveryMessage, Trigger, ATTEMPT_HEADER, TRIGGER_HEADER, WEBHOOK_HEADER,
};
use tocsin_domain::amqp::{header_int, header_str};
use tocsin_domain::db::deliveries::{
    next_state, AttemptError, AttemptRecord, DeliveryJob, DeliveryState, NewAttempt,
};
use tocsin_domain::db::{self, DbError};
use tocsin_domain::signing::{self, headers};

use crate::slots::SLOT_WAIT;
use crate::ssrf::{Blocked, DnsFailure};
use crate::startup::{retry_db, Context, Outcome};

pub(crate) async fn handle_delivery(ctx: Arc<Context>, message: Delivery) {
    let trigger = header_str(&message.properties, TRIGGER_HEADER)
        .and_then(|t| Trigger::parse(&t))
        .unwrap_or(Trigger::Automatic);
    let requested = header_int(&message.properties, ATTEMPT_HEADER)
        .and_then(|n| i32::try_from(n).ok())
        .unwrap_or(1);
    // A webhook known to be slow gets its attempt deferred before anything is loaded for it.
    let slow = header_str(&message.properties, WEBHOOK_HEADER)
        .and_then(|id| id.parse().ok())
        .filter(|webhook| ctx.slots.is_slow(*webhook));
    let outcome = match (DeliveryMessage::from_bytes(&message.data), slow) {
        (Ok(_), Some(webhook)) => {
            ctx.note_slow(webhook);
            Outcome::Defer
        }
        (Ok(parsed), None) => process(&ctx, parsed, trigger, requested).await,
        (Err(error), _) => Outcome::Park(format!("unreadable delivery message: {error}")),
    };
    ctx.finish(message, outcome, "deliveries").await;
}

async fn process(
    ctx: &Context,
    message: DeliveryMessage,
    trigger: Trigger,
    requested: i32,
) -> Outcome {
    let id = message.delivery_id;
    let loaded = retry_db!(
        ctx,
        db::submit(&ctx.jobs, id)
            .await
            .and_then(|job| job.ok_or(DbError::NotFound))
    );
    let job = match loaded {
        Ok(job) => job,
        Err(Outcome::Park(reason)) => return Outcome::Park(format!("delivery {id}: {reason}")),
        Err(outcome) => return outcome,
    };
    let delivery = &job.delivery;
    if trigger == Trigger::Automatic {
        if delivery.state.is_finished() {
            return Outcome::Done;
        }
        if delivery.auto_attempts >= requested {
            // This attempt was made already (the message is a redelivery after a crash, or a
            // sweeper duplicate): make sure its follow-up is scheduled, and stop there.
            if delivery.state == DeliveryState::Retrying && delivery.auto_attempts == requested {
                return schedule_retry(ctx, &job, requested + 1).await;
            }
            return Outcome::Done;
        }
    }
    if job.webhook.is_deleted() || !job.webhook.enabled {
        tracing::info!(delivery_id = %id, webhook_id = %job.webhook.id, "webhook deleted or disabled; delivery stopped");
        return match retry_db!(ctx, db::submit(&ctx.stopped, id).await) {
            Ok(()) => Outcome::Done,
            Err(outcome) => outcome,
        };
    }

    let Some(slot) = ctx.slots.take(job.webhook.id, SLOT_WAIT).await else {
        if ctx.slots.should_hold(job.webhook.id) {
            ctx.note_slow(job.webhook.id);
        }
        tracing::debug!(delivery_id = %id, webhook_id = %job.webhook.id, "webhook at its in-flight limit; attempt deferred");
        return Outcome::Defer;
    };
    let auto_after = delivery.auto_attempts + i32::from(trigger == Trigger::Automatic);
    let first = delivery.attempt_count == 0;
    ctx.metrics.in_flight.inc();
    let attempt = attempt(ctx, &job, trigger, delivery.attempt_count + 1).await;
    ctx.metrics.in_flight.dec();
    drop(slot);
    if first {
        let lag = (attempt.started_at - job.occurred_at)
            .as_seconds_f64()
            .max(0.0);
        ctx.metrics.lag.observe(lag);
    }
    let outcome_label = if attempt.success {
        "success"
    } else {
        "failure"
    };
    ctx.metrics
        .attempts
        .with_label_values(&[
            outcome_label,
            attempt.error.map_or("none", AttemptError::as_str),
            trigger.as_str(),
        ])
        .inc();
    ctx.metrics
        .attempt_duration
        .with_label_values(&[outcome_label])
        .observe(f64::from(attempt.duration_ms) / 1000.0);

    let (state, next_attempt_at) = next_state(
        delivery,
        trigger,
        attempt.success,
        job.webhook.retry.max_attempts(),
        &ctx.schedule,
        OffsetDateTime::now_utc(),
    );
    let expected = (trigger == Trigger::Automatic).then_some(delivery.auto_attempts);
    let record = AttemptRecord {
        delivery_id: id,
        expected_auto_attempts: expected,
        attempt,
        state,
        next_attempt_at,
    };
    let recorded = retry_db!(ctx, db::submit(&ctx.attempt_log, record.clone()).await);
    match recorded {
        Ok(Some(_)) => {}
        // Another worker logged this attempt meanwhile (a duplicate message): nothing to add.
        Ok(None) => return Outcome::Done,
        Err(outcome) => return outcome,
    }
    if state.is_finished() {
        ctx.metrics
            .deliveries_finished
            .with_label_values(&[state.as_str()])
            .inc();
    }
    if trigger == Trigger::Automatic && state == DeliveryState::Retrying {
        return schedule_retry(ctx, &job, auto_after + 1).await;
    }
    Outcome::Done
}

/// Publishes automatic attempt `attempt` to the retry queue of its delay, confirmed.
async fn schedule_retry(ctx: &Context, job: &DeliveryJob, attempt: i32) -> Outcome {
    let delay = u8::try_from(attempt)
        .ok()
        .and_then(|n| ctx.schedule.delay_before(n))
        .unwrap_or_default();
    match ctx
        .broker
        .publish(ctx.retry_message(job.delivery.id, attempt, delay))
        .await
    {
        Ok(()) => Outcome::Done,
        Err(error) => {
            // Not acked: the message comes back, finds the attempt made, and schedules again.
            tracing::warn!(%error, delivery_id = %job.delivery.id, "could not schedule the retry");
            Outcome::Requeue
        }
    }
}

/// Makes the HTTP request and describes it as an attempt row.
async fn attempt(ctx: &Context, job: &DeliveryJob, trigger: Trigger, number: i32) -> NewAttempt {
    let started_at = OffsetDateTime::now_utc();
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
        ("tocsin-attempt", number.to_string()),
    ];
    if job.test {
        sent.push(("tocsin-test", "true".into()));
    }
    let request_headers = Value::Object(
        sent.iter()
            .map(|(name, value)| ((*name).to_owned(), Value::String(value.clone())))
            .collect::<Map<_, _>>(),
    );
    let result = send(ctx, job, &sent).await;
    let duration_ms = i32::try_from(started.elapsed().as_millis()).unwrap_or(i32::MAX);
    let mut attempt = NewAttempt {
        trigger,
        started_at,
        success: false,
        status_code: None,
        duration_ms,
        error: None,
        error_detail: None,
        request_headers,
        response_body: None,
        response_truncated: false,
    };
    match result {
        Ok(answer) => {
            let success = (200..300).contains(&answer.status);
            attempt.success = success;
            attempt.status_code = Some(answer.status);
            attempt.response_body = Some(answer.body);
            attempt.response_truncated = answer.truncated;
            if !success {
                let kind = if (300..400).contains(&answer.status) {
                    AttemptError::Redirect
                } else {
                    AttemptError::HttpStatus
                };
                attempt.error = Some(kind);
                attempt.error_detail = Some(format!("the target answered {}", answer.status));
            }
        }
        Err((kind, detail)) => {
            attempt.error = Some(kind);
            attempt.error_detail = Some(detail);
        }
    }
    attempt
}

struct Answer {
    status: u16,
    body: String,
    truncated: bool,
}

async fn send(
    ctx: &Context,
    job: &DeliveryJob,
    sent: &[(&str, String)],
) -> Result<Answer, (AttemptError, String)> {
    let url = reqwest::Url::parse(&job.webhook.url)
        .map_err(|e| (AttemptError::Other, format!("bad URL: {e}")))?;
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
    let mut request = ctx.client.post(url).body(job.body.clone());
    for (name, value) in sent {
        request = request.header(*name, value);
    }
    let exchange = async {
        let mut response = request.send().await?;
        let status = response.status().as_u16();
        let mut body = Vec::new();
        let mut truncated = false;
        while let Some(chunk) = response.chunk().await? {
            let room = ctx.response_limit.saturating_sub(body.len());
            if chunk.len() > room {
                body.extend_from_slice(&chunk[..room]);
                truncated = true;
                break;
            }
            body.extend_from_slice(&chunk);
        }
        Ok::<_, reqwest::Error>(Answer {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
            truncated,
        })
    };
    match tokio::time::timeout(job.webhook.retry.timeout(), exchange).await {
        Err(_) => Err((
            AttemptError::Timeout,
            format!("no answer within {} ms", job.webhook.retry.timeout_ms()),
        )),
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(error)) => Err(classify(&error)),
    }
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
    } else if lower.contains("certificate") || lower.contains("tls") || lower.contains("handshake")
    {
        AttemptError::Tls
    } else if error.is_connect() || error.is_request() || error.is_body() {
        AttemptError::Connect
    } else {
        AttemptError::Other
    });
    (kind, chain)
}
