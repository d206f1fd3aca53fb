//! Building the dispatcher: its context, the two consumers, the waiting pass, the sweeper and
//! the health and metrics server.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use actix_web::web;
use anyhow::Context as _;
use lapin::message::Delivery;
use tocsin_broker::{run_consumer, ConsumerOptions};
use tocsin_storage::attempts::{self, ClaimRules};
use tocsin_storage::fan_out::{self, FanOutRules};
use tocsin_web::config::Foundation;
use tocsin_web::{Background, Readiness, Service};
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::batched::Batched;
use crate::config::Config;
use crate::context::{Context, LEASE_MARGIN};
use crate::metrics::DispatcherMetrics;
use crate::slots::WebhookSlots;
use tocsin_web::ssrf::{GuardedResolver, TargetPolicy};

/// The running dispatcher.
pub type App = Service;

/// How early a retry message may claim its attempt (the broker's TTL is not exact).
const EARLY: Duration = Duration::from_secs(1);

/// The HTTP client of every attempt: no redirects, no proxy, the SSRF-guarded resolver,
/// pooled keep-alive connections per target.
fn http_client(policy: Arc<TargetPolicy>) -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .user_agent(concat!("Tocsin/", env!("CARGO_PKG_VERSION")))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .dns_resolver(Arc::new(GuardedResolver::new(policy)))
        .connect_timeout(Duration::from_secs(10))
        .pool_idle_timeout(Duration::from_secs(60))
        .tcp_nodelay(true)
        .build()
        .context("building the HTTP client")
}

/// What the dispatcher's two consumers share: the context their handlers get, and the
/// instance that tells this process's consumer tags from other dispatchers'.
struct Consumers {
    context: Arc<Context>,
    instance: String,
    drain_timeout: Duration,
}

/// How a consumer is named: its task, and the word of its tag in RabbitMQ
/// (`tocsin-dispatcher-{tag}-{instance}`).
struct ConsumerName {
    task: &'static str,
    tag: &'static str,
}

const FANOUT: ConsumerName = ConsumerName {
    task: "fanout-consumer",
    tag: "fanout",
};
const DELIVERIES: ConsumerName = ConsumerName {
    task: "delivery-consumer",
    tag: "deliveries",
};

impl Consumers {
    /// Consumes `queue` with `prefetch` messages unacknowledged at most, handling each with
    /// `handle`, as the task and with the tag `name` gives. The context's tasks count it, so the
    /// last health write waits for its drain.
    fn start<Fut>(
        &self,
        background: &mut Background,
        name: ConsumerName,
        (queue, prefetch): (String, u16),
        handle: fn(Arc<Context>, Delivery) -> Fut,
    ) where
        Fut: Future<Output = ()> + Send + 'static,
    {
        let options = ConsumerOptions {
            queue,
            prefetch,
            tag: format!("tocsin-dispatcher-{}-{}", name.tag, self.instance),
            drain_timeout: self.drain_timeout,
        };
        let ctx = self.context.clone();
        let consumer = run_consumer(
            ctx.broker.clone(),
            options,
            background.token(),
            move |message| handle(ctx.clone(), message),
        );
        let task = self.context.tasks.track_future(consumer);
        background.spawn(name.task, task);
    }
}

/// Migrates the database, then builds the dispatcher.
pub async fn build(config: Config) -> anyhow::Result<App> {
    let common = &config.common;
    let Foundation {
        pool,
        broker,
        registry,
        http_metrics,
    } = common.foundation("dispatcher").await?;
    let policy = Arc::new(config.allowed_targets.clone());
    let mut background = Background::new();
    let schedule = common.retry_delays.clone();
    let schedule_attempts = schedule.attempts();
    let claim_rules = ClaimRules {
        schedule_attempts,
        lease_margin: LEASE_MARGIN,
        early: EARLY,
    };
    // Connections open and the fan-out, claim and outcome statements planned before the
    // first event: a plan made on an event's way cost it up to 11 ms.
    tocsin_storage::warm(&pool, |conn| {
        Box::pin(async move {
            let rules = FanOutRules {
                claim: true,
                lease_margin: LEASE_MARGIN,
                replay_to: None,
            };
            fan_out::fan_out(conn, &[], &[], rules).await?;
            attempts::prepare(conn, claim_rules).await
        })
    })
    .await;
    let context = Arc::new(Context {
        pool: pool.clone(),
        broker: broker.clone(),
        schedule: schedule.clone(),
        client: http_client(policy.clone())?,
        policy,
        metrics: DispatcherMetrics::new(&registry)?,
        response_limit: config.response_body_limit,
        cancel: background.token(),
        slots: WebhookSlots::new(usize::from(config.webhook_concurrency)),
        requests: Arc::new(Semaphore::new(usize::from(config.concurrency))),
        tasks: TaskTracker::new(),
        batched: Batched::start(&pool, claim_rules, schedule_attempts),
        health: Default::default(),
    });

    let readiness = Readiness {
        pool,
        broker: broker.clone(),
    };
    let listener = tocsin_web::service::bind(&config.addr, "TOCSIN_DISPATCHER_ADDR")?;
    let port = listener.local_addr()?.port();
    // Health and metrics only: one worker is plenty.
    let server = tocsin_web::service::serve(
        listener,
        |_: &mut web::ServiceConfig| {},
        http_metrics,
        readiness,
        Duration::from_secs(2),
        Some(1),
        common.client_timeout,
    )?;

    let consumers = Consumers {
        context: context.clone(),
        instance: format!("{}-{}", std::process::id(), Uuid::now_v7().simple()),
        drain_timeout: common.shutdown_timeout,
    };
    let topology = broker.topology();
    consumers.start(
        &mut background,
        FANOUT,
        (topology.fanout_queue(), config.fanout_prefetch),
        crate::fan_out::handle_event,
    );
    consumers.start(
        &mut background,
        DELIVERIES,
        (topology.delivery_queue(), config.concurrency),
        crate::attempt::handle_delivery,
    );
    background.spawn(
        "gauges",
        crate::gauges::refresh_gauges(context.clone(), Duration::from_secs(15), background.token()),
    );
    background.spawn(
        "prune",
        crate::sweeper::prune(
            context.clone(),
            config.prune_interval,
            config.retention,
            background.token(),
        ),
    );
    background.spawn(
        "waiting",
        crate::waiting::run(context.clone(), background.token()),
    );
    background.spawn(
        "replays",
        crate::replays::run(context.clone(), background.token()),
    );
    {
        let ctx = context.clone();
        let cancel = background.token();
        let drain = common.shutdown_timeout;
        background.spawn("attempts", async move {
            cancel.cancelled().await;
            ctx.tasks.close();
            if tokio::time::timeout(drain, ctx.tasks.wait()).await.is_err() {
                tracing::warn!("the consumers and attempts under way did not finish within the drain bound; the sweeper records the attempts as interrupted");
            }
        });
    }
    background.spawn(
        "health",
        crate::health::run(
            context.health.clone(),
            context.pool.clone(),
            context.tasks.clone(),
            common.shutdown_timeout,
            background.token(),
        ),
    );
    background.spawn(
        "sweeper",
        crate::sweeper::run(
            context,
            config.sweep_interval,
            config.sweep_grace,
            config.auto_disable_after,
            background.token(),
        ),
    );
    Ok(Service::new(
        "dispatcher",
        server,
        port,
        background,
        common.shutdown_timeout,
    ))
}
