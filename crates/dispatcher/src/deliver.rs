//! One attempt of one delivery, in four stages: take a slot of the webhook (or leave the
//! delivery `waiting`), claim the attempt (logged before its request is sent, guarded so that
//! no duplicate or late message sends twice), send the signed `POST`, and record its outcome
//! with the transition the state machine gives; a failed automatic attempt with attempts left
//! is scheduled through the retry queue of the next delay.

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use lapin::message::Delivery;
use serde_json::{Map, Value};
use time::OffsetDateTime;
use tocsin_broker::messages::{DeliveryMessage, ATTEMPT_HEADER, TRIGGER_HEADER};
use tocsin_broker::{header_int, header_str};
use tocsin_domain::delivery::{AttemptError, DeliveryState, Transition, Trigger};
use tocsin_domain::signing::{self, headers};
use tocsin_domain::WebhookOrdering;
use tocsin_storage::attempts::{AttemptResult, Claim, Completion, Job};
use tocsin_storage::deliveries::{self, Due};
use tocsin_web::telemetry::RemoteParent;
use tokio::sync::{oneshot, OwnedSemaphorePermit};
use tracing::field::Empty;
use tracing::Instrument;

use crate::context::{Context, Outcome};
use crate::slots::Slot;
use tocsin_web::ssrf::{Blocked, DnsFailure};

/// Handles a message of the delivery queue: an automatic attempt (a retry, one the sweeper
/// found overdue, one handed over by a stopping dispatcher) or a manual one.
pub(crate) async fn handle_delivery(ctx: Arc<Context>, message: Delivery) {
    let trigger = header_str(&message.properties, TRIGGER_HEADER)
        .and_then(|t| Trigger::parse(&t))
        .unwrap_or(Trigger::Automatic);
    let requested = header_int(&message.properties, ATTEMPT_HEADER)
        .and_then(|n| i32::try_from(n).ok())
        .unwrap_or(1);
    // A retry continues the trace of the attempt that scheduled it.
    let span = tracing::debug_span!(
        "delivery_message",
        trigger = trigger.as_str(),
        attempt = (trigger == Trigger::Automatic).then_some(requested)
    );
    RemoteParent::from_headers(|name| header_str(&message.properties, name)).adopt_by(&span);
    let outcome = delivery_message(&ctx, &message, trigger, requested)
        .instrument(span)
        .await;
    ctx.finish(message, outcome, "deliveries").await;
}

async fn delivery_message(
    ctx: &Arc<Context>,
    message: &Delivery,
    trigger: Trigger,
    requested: i32,
) -> Outcome {
    match DeliveryMessage::from_bytes(&message.data) {
        Ok(parsed) => match trigger {
            Trigger::Manual => {
                let claim = Claim {
                    delivery_id: parsed.delivery_id,
                    trigger,
                    expected_auto_attempts: 0,
                };
                attempt(ctx, claim, None, None).await
            }
            Trigger::Automatic => match due(ctx, &parsed, requested).await {
                Ok(due) => attempt_due(ctx, due, None).await,
                Err(outcome) => outcome,
            },
        },
        Err(error) => Outcome::Park(format!("unreadable delivery message: {error}")),
    }
}

/// The delivery a message asks automatic attempt `requested` of.
#[tracing::instrument(level = "debug", skip_all, fields(delivery_id = %message.delivery_id, attempt = requested))]
async fn due(
    ctx: &Arc<Context>,
    message: &DeliveryMessage,
    requested: i32,
) -> Result<Due, Outcome> {
    let webhook_id = match message.webhook_id {
        Some(webhook_id) => webhook_id,
        None => {
            let id = message.delivery_id;
            let loaded = ctx
                .retry_db(|| async {
                    let mut conn = ctx.pool.get().await?;
                    deliveries::get(&mut conn, id).await
                })
                .await;
            match loaded {
                Ok(delivery) => delivery.webhook_id,
                Err(Outcome::Park(reason)) => {
                    return Err(Outcome::Park(format!("delivery {id}: {reason}")))
                }
                Err(outcome) => return Err(outcome),
            }
        }
    };
    Ok(Due {
        delivery_id: message.delivery_id,
        webhook_id,
        auto_attempts: requested - 1,
    })
}

/// Starts the next automatic attempt of `due` in this dispatcher; the receiver resolves once
/// the attempt is claimed, the delivery is `waiting`, or the task ended without either (the
/// dispatcher is stopping).
pub(crate) fn start(ctx: &Arc<Context>, due: Due) -> oneshot::Receiver<()> {
    let (claimed, receiver) = oneshot::channel();
    let ctx = ctx.clone();
    ctx.tasks.clone().spawn(
        async move {
            if ctx.cancel.is_cancelled() {
                return;
            }
            attempt_due(&ctx, due, Some(claimed)).await;
        }
        .in_current_span(),
    );
    receiver
}

/// Tells whoever waits for it that an attempt is claimed (or will not be).
type Claimed = Option<oneshot::Sender<()>>;

/// Makes the next automatic attempt of `due` if its webhook has room; otherwise the delivery
/// is `waiting` until it has. `claimed` is told once the attempt is claimed or the delivery
/// is waiting.
pub(crate) async fn attempt_due(ctx: &Arc<Context>, due: Due, claimed: Claimed) -> Outcome {
    let Some(slot) = ctx.slots.take(due.webhook_id).await else {
        let outcome = wait(ctx, due).await;
        tell(claimed);
        return outcome;
    };
    let claim = Claim {
        delivery_id: due.delivery_id,
        trigger: Trigger::Automatic,
        expected_auto_attempts: due.auto_attempts,
    };
    attempt(ctx, claim, Some(slot), claimed).await
}

fn tell(claimed: Claimed) {
    if let Some(claimed) = claimed {
        let _ = claimed.send(());
    }
}

#[tracing::instrument(level = "debug", skip_all, fields(delivery_id = %due.delivery_id, webhook_id = %due.webhook_id))]
async fn wait(ctx: &Arc<Context>, due: Due) -> Outcome {
    match ctx.retry_db(|| ctx.batched.wait(due)).await {
        Ok(true) => {
            ctx.metrics.waited.inc();
            tracing::debug!("webhook busy; delivery waiting");
            Outcome::Done
        }
        // Moved on meanwhile (a duplicate message): nothing to wait for.
        Ok(false) => Outcome::Done,
        Err(outcome) => outcome,
    }
}

/// Claims, makes and records one attempt. A manual attempt takes no slot of its webhook: an
/// operator asked for it now.
#[tracing::instrument(level = "debug", skip_all, fields(delivery_id = %claim.delivery_id, trigger = claim.trigger.as_str(), attempt, webhook_id))]
async fn attempt(
    ctx: &Arc<Context>,
    claim: Claim,
    slot: Option<Slot>,
    claimed: Claimed,
) -> Outcome {
    let Ok(request) = ctx.requests.clone().acquire_owned().await else {
        return Outcome::Requeue;
    };
    let job = ctx.retry_db(|| ctx.batched.claim(claim)).await;
    tell(claimed);
    let job = match job {
        Ok(Some(job)) => job,
        Ok(None) => return refused(ctx, claim).await,
        Err(Outcome::Park(reason)) => {
            return Outcome::Park(format!("delivery {}: {reason}", claim.delivery_id))
        }
        Err(outcome) => return outcome,
    };
    make(ctx, job, Room::Taken { slot, request }).await
}

/// Makes a first attempt claimed with its delivery by the fan-out: takes a slot of its webhook
/// in turn (the fan-out claimed no more than the room of a webhook that is not answering) and a
/// request permit, tells `started`, and makes it. Its lease lasts twice the webhook's timeout
/// plus [`crate::context::LEASE_MARGIN`] from the claim: the wait for room may take one timeout of it, the
/// request the other. An attempt that has no room by then is recorded as not sent
/// ([`AttemptError::NotSent`]) and follows the schedule: no request goes out past its lease.
#[tracing::instrument(level = "debug", skip_all, fields(delivery_id = %job.delivery.id, attempt = job.number, webhook_id = %job.webhook.id))]
pub(crate) async fn make_claimed(ctx: &Arc<Context>, job: Job, started: Claimed) -> Outcome {
    let room = async {
        let slot = ctx.slots.take_in_turn(job.webhook.id).await;
        let request = ctx.requests.clone().acquire_owned().await.ok()?;
        Some(Room::Taken { slot, request })
    };
    let room = match tokio::time::timeout(job.webhook.retry.timeout(), room).await {
        Ok(Some(room)) => room,
        // The permits are closed: the dispatcher is stopping.
        Ok(None) => return Outcome::Requeue,
        Err(_) => Room::None,
    };
    tell(started);
    make(ctx, job, room).await
}

/// What an attempt was given to be made in.
enum Room {
    /// A request permit of the dispatcher, and a slot of the webhook (none for a manual
    /// attempt); the permit is given back as soon as the request ends.
    Taken {
        slot: Option<Slot>,
        request: OwnedSemaphorePermit,
    },
    /// None within the attempt's lease: no request is sent.
    None,
}

/// Sends a claimed attempt (unless it has no room), records its outcome, and schedules the
/// next one.
async fn make(ctx: &Arc<Context>, job: Job, room: Room) -> Outcome {
    tracing::Span::current()
        .record("attempt", job.number)
        .record("webhook_id", tracing::field::display(job.webhook.id));
    let started = OffsetDateTime::now_utc();
    let result = match room {
        Room::Taken { slot, request } => {
            ctx.metrics.in_flight.inc();
            let result = send(ctx, &job, started).await;
            ctx.metrics.in_flight.dec();
            if let (Some(slot), Some(_)) = (&slot, result.status_code) {
                slot.answered();
            }
            // The request is over: its slot and permit go to the next attempt now, not after
            // the outcome is recorded.
            drop((slot, request));
            result
        }
        Room::None => AttemptResult::not_sent(job.webhook.retry.timeout_ms()),
    };
    // A request never sent says nothing of the target: no health of it (nor lag or duration).
    let sent = result.error != Some(AttemptError::NotSent);
    observe(ctx, &job, &result, started);
    tracing::debug!(
        status = result.status_code,
        success = result.success,
        "attempt made"
    );

    let auto_number = (job.trigger == Trigger::Automatic).then_some(job.delivery.auto_attempts);
    let transition = Transition::after_attempt(
        job.trigger,
        job.delivery.auto_attempts,
        result.success,
        job.webhook.retry.max_attempts(),
        &ctx.schedule,
    );
    let completion = Completion {
        delivery_id: job.delivery.id,
        number: job.number,
        auto_number,
        result,
        transition,
    };
    let completed = match ctx
        .retry_db(|| ctx.batched.complete(completion.clone()))
        .await
    {
        Ok(Some(completed)) => completed,
        // Recorded as interrupted meanwhile (this dispatcher outlived its lease).
        Ok(None) => return Outcome::Done,
        Err(Outcome::Park(reason)) => {
            // This outcome's own error: it fails alone. The attempt stays under way until its
            // lease ends, and the sweeper records it as interrupted.
            tracing::error!(
                delivery_id = %job.delivery.id,
                attempt = job.number,
                %reason,
                "the attempt's outcome could not be recorded; the sweeper will record it as interrupted"
            );
            return Outcome::Done;
        }
        Err(outcome) => return outcome,
    };
    if sent {
        ctx.health.add(job.webhook.id, &completion.result);
    }
    if !completed.moved {
        return Outcome::Done;
    }
    if let Some(state) = completed.state.filter(|s| s.is_finished()) {
        ctx.metrics
            .deliveries_finished
            .with_label_values(&[state.as_str()])
            .inc();
        if job.webhook.ordering == WebhookOrdering::Incident {
            start_next_in_order(ctx, job.delivery.id).await;
        }
    }
    if let (Transition::Retry { delay }, Some(DeliveryState::Retrying)) =
        (transition, completed.state)
    {
        let next = Due {
            delivery_id: job.delivery.id,
            webhook_id: job.webhook.id,
            auto_attempts: job.delivery.auto_attempts,
        };
        if let Err(error) = ctx.broker.publish(ctx.attempt_message(&next, delay)).await {
            // The delivery is `retrying` with its next attempt time: once that is overdue, the
            // sweeper sends it.
            tracing::warn!(
                delivery_id = %job.delivery.id,
                %error,
                "could not schedule the retry; the sweeper will send it"
            );
        }
    }
    Outcome::Done
}

/// Starts the delivery that comes next in its incident's order now that `finished` has
/// finished, if one waits for it. Should this fail, the waiting pass starts it within a second.
async fn start_next_in_order(ctx: &Arc<Context>, finished: uuid::Uuid) {
    let next = async {
        let mut conn = ctx.pool.get().await?;
        deliveries::next_in_order(&mut conn, finished).await
    };
    match next.await {
        Ok(Some(due)) => drop(start(ctx, due)),
        Ok(None) => {}
        Err(error) => tracing::warn!(
            delivery_id = %finished,
            %error,
            "could not start the next delivery in its incident's order; the waiting pass will"
        ),
    }
}

/// A claim its guard refused: a duplicate or late message, or a delivery that can get no more
/// automatic attempt, which is failed now (its webhook disabled or deleted, its schedule used
/// up). Its log lines name the delivery themselves: the stage spans are `debug` ones.
async fn refused(ctx: &Arc<Context>, claim: Claim) -> Outcome {
    if claim.trigger == Trigger::Manual {
        tracing::info!(
            delivery_id = %claim.delivery_id,
            "manual attempt refused: the delivery succeeded, or its webhook is disabled or deleted"
        );
        return Outcome::Done;
    }
    match ctx.retry_db(|| ctx.batched.stop(claim.delivery_id)).await {
        Ok(stopped) => {
            if stopped {
                tracing::info!(
                    delivery_id = %claim.delivery_id,
                    "no further attempt allowed; delivery failed"
                );
                ctx.metrics
                    .deliveries_finished
                    .with_label_values(&[DeliveryState::Failed.as_str()])
                    .inc();
            }
            Outcome::Done
        }
        Err(outcome) => outcome,
    }
}

/// Counts an attempt; the lag of a first attempt and the duration only of one that was sent.
fn observe(ctx: &Context, job: &Job, result: &AttemptResult, started: OffsetDateTime) {
    let sent = result.error != Some(AttemptError::NotSent);
    if sent && job.number == 1 {
        let lag = (started - job.occurred_at).as_seconds_f64().max(0.0);
        ctx.metrics.lag.observe(lag);
    }
    let outcome = if result.success { "success" } else { "failure" };
    ctx.metrics
        .attempts
        .with_label_values(&[
            outcome,
            result.error.map_or("none", AttemptError::as_str),
            job.trigger.as_str(),
        ])
        .inc();
    if sent {
        ctx.metrics
            .attempt_duration
            .with_label_values(&[outcome])
            .observe(f64::from(result.duration_ms) / 1000.0);
    }
}

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
async fn send(ctx: &Context, job: &Job, started_at: OffsetDateTime) -> AttemptResult {
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
