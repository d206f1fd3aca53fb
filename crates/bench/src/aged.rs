//! `aged`: the system with months of history behind it. It fills the database to a number of
//! deliveries spread over past days ([`fill`]), then measures on it what `e2e` measures, the
//! delivery log's reads through the admin API (of the webhook holding the most deliveries, and
//! its oldest ones), and a retention pass that removes the oldest day, with a 20 alerts/s
//! stream's latency before that pass, again before it (the control), and during it.
//!
//! The fill writes what the services would have written, through the same tables and
//! partitions (`tocsin_storage::partitions::make_day` makes the past days' partitions): for
//! each event an incident (resolved) and one delivery to each of the aged webhooks, whose
//! attempts succeeded at once, or for `failed_share` of them failed five times with a 500. Ids
//! are UUIDv7s of the event's time, spread evenly over each day. The aged webhooks are made
//! through the admin API, subscribed to `incidents.resolved` only (the bench resolves nothing),
//! and kept between runs: a database already holding the deliveries asked for is not filled
//! again. After a fill the tables are vacuumed and analyzed and a checkpoint is taken, so that
//! the measures do not pay for writing the fill out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use diesel::sql_types::{Array, BigInt, Double, Timestamptz};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde_json::{json, Value};
use time::OffsetDateTime;
use tocsin_storage::partitions;

use crate::{Bench, Load, LoadConfig, Measure, Percentiles, Report};

/// Settings of `aged`.
#[derive(Debug, Clone)]
pub struct AgedConfig {
    pub database_url: String,
    /// Deliveries the database holds before the measures.
    pub deliveries: i64,
    /// Past days they are spread over (the last `days` days before today).
    pub days: i64,
    /// Aged webhooks the deliveries go to.
    pub webhooks: usize,
    /// Share of deliveries that failed after five attempts.
    pub failed_share: f64,
    /// The `e2e` load on the aged database.
    pub load: LoadConfig,
    /// Times each read is made.
    pub reads: usize,
    /// Retention passes, each removing the next oldest day.
    pub retention_passes: i64,
}

/// Events written per statement of the fill.
const FILL_CHUNK: i64 = 20_000;

/// Runs `aged`: fill, `e2e`, reads, retention.
pub async fn aged(bench: &Arc<Bench>, config: AgedConfig) -> anyhow::Result<Report> {
    let mut report = Report::new("aged");
    let mut conn = AsyncPgConnection::establish(&config.database_url)
        .await
        .context("connecting to the database to fill")?;
    let webhooks = aged_webhooks(bench, config.webhooks).await?;
    let started = Instant::now();
    let written = fill(&mut conn, &config, &webhooks).await?;
    report
        .figures
        .insert("fill seconds".into(), started.elapsed().as_secs_f64());
    report
        .figures
        .insert("deliveries written by the fill".into(), written as f64);
    report.figures.insert(
        "deliveries stored".into(),
        count(&mut conn, "SELECT count(*) AS n FROM deliveries").await? as f64,
    );

    let e2e = crate::e2e(bench, config.load).await?;
    report.phases.extend(e2e.phases);
    report.processes = e2e.processes;

    reads(bench, &mut conn, config.reads, &mut report).await?;
    retention(bench, &config, &mut report).await?;
    Ok(report)
}

/// The aged webhooks, made through the admin API unless they exist (by name).
async fn aged_webhooks(bench: &Bench, n: usize) -> anyhow::Result<Vec<uuid::Uuid>> {
    let listed = bench
        .admin_get("/api/v1/webhooks?limit=200")
        .await
        .context("listing webhooks")?;
    let mut ids = Vec::new();
    for i in 0..n {
        let name = format!("tocsin-bench aged {i}");
        let existing = listed["items"].as_array().and_then(|items| {
            items
                .iter()
                .find(|w| w["name"] == name.as_str())
                .and_then(|w| w["id"].as_str())
                .map(str::to_owned)
        });
        let id = match existing {
            Some(id) => id,
            None => {
                let body = json!({
                    "name": name,
                    "url": "http://127.0.0.1:9/aged",
                    "events": ["incidents.resolved"],
                });
                let answer = bench.admin_post("/api/v1/webhooks", &body).await?;
                answer["id"]
                    .as_str()
                    .context("no id in the webhook answer")?
                    .to_owned()
            }
        };
        ids.push(id.parse().context("a webhook id")?);
    }
    Ok(ids)
}

#[derive(diesel::QueryableByName)]
struct N {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

async fn count(conn: &mut AsyncPgConnection, sql: &str) -> anyhow::Result<i64> {
    let rows: Vec<N> = diesel::sql_query(sql).load(conn).await?;
    Ok(rows.into_iter().next().map_or(0, |row| row.n))
}

/// Fills the past `days` days to `deliveries` deliveries in all (the aged webhooks' own),
/// unless they hold that many already; returns how many it wrote.
async fn fill(
    conn: &mut AsyncPgConnection,
    config: &AgedConfig,
    webhooks: &[uuid::Uuid],
) -> anyhow::Result<i64> {
    let ids: Vec<String> = webhooks.iter().map(|id| format!("'{id}'")).collect();
    let held = count(
        conn,
        &format!(
            "SELECT count(*) AS n FROM deliveries WHERE webhook_id IN ({})",
            ids.join(", ")
        ),
    )
    .await?;
    if held >= config.deliveries {
        return Ok(0);
    }
    if !partitions::partitioned(conn).await? {
        bail!("the delivery log is not in day partitions (run tocsin-admin reshape)");
    }
    let per_day = (config.deliveries - held) / config.days / webhooks.len() as i64;
    let today = OffsetDateTime::now_utc().date();
    let mut written = 0;
    for ago in (1..=config.days).rev() {
        let day = today - time::Duration::days(ago);
        for (table, _) in partitions::TABLES {
            partitions::make_day(conn, table, day)
                .await
                .with_context(|| format!("making the partitions of {day}"))?;
        }
        let mut left = per_day;
        while left > 0 {
            let events = left.min(FILL_CHUNK);
            diesel::sql_query(include_str!("aged_fill.sql"))
                .bind::<Timestamptz, _>(day.midnight().assume_utc())
                .bind::<BigInt, _>(events)
                .bind::<Array<diesel::sql_types::Uuid>, _>(webhooks)
                .bind::<Double, _>(config.failed_share)
                .execute(conn)
                .await
                .with_context(|| format!("filling {day}"))?;
            left -= events;
            written += events * webhooks.len() as i64;
        }
    }
    // Leave the tables as a database that lived through those days would be: vacuumed, with
    // statistics, and nothing of the fill left to write out while the measures run.
    for statement in [
        "VACUUM ANALYZE incidents, events, deliveries, attempts",
        "CHECKPOINT",
    ] {
        diesel::sql_query(statement).execute(conn).await?;
    }
    Ok(written)
}

/// Times each read of the delivery log `times` times through the admin API.
async fn reads(
    bench: &Bench,
    conn: &mut AsyncPgConnection,
    times: usize,
    report: &mut Report,
) -> anyhow::Result<()> {
    #[derive(diesel::QueryableByName)]
    struct Old {
        #[diesel(sql_type = diesel::sql_types::Uuid)]
        id: uuid::Uuid,
        #[diesel(sql_type = diesel::sql_types::Uuid)]
        incident_id: uuid::Uuid,
    }
    #[derive(diesel::QueryableByName)]
    struct Busiest {
        #[diesel(sql_type = diesel::sql_types::Uuid)]
        webhook_id: uuid::Uuid,
    }
    // The webhook holding the most deliveries, and its oldest ones.
    let busiest: Vec<Busiest> = diesel::sql_query(
        "SELECT webhook_id FROM deliveries GROUP BY webhook_id ORDER BY count(*) DESC LIMIT 1",
    )
    .load(conn)
    .await?;
    let webhook = busiest
        .into_iter()
        .next()
        .context("no delivery to read")?
        .webhook_id;
    let old: Vec<Old> = diesel::sql_query(format!(
        "SELECT id, incident_id FROM deliveries WHERE webhook_id = '{webhook}' \
         ORDER BY id LIMIT {times}"
    ))
    .load(conn)
    .await?;
    let mut cursor_path = format!("/api/v1/deliveries?webhook_id={webhook}&limit=50");
    for _ in 0..19 {
        let page = bench.admin_get(&cursor_path).await?;
        let next = page["next_cursor"]
            .as_str()
            .context("fewer than 20 pages")?;
        cursor_path = format!("/api/v1/deliveries?webhook_id={webhook}&limit=50&cursor={next}");
    }
    let fixed = [
        ("first page", "/api/v1/deliveries?limit=50".to_owned()),
        (
            "by webhook",
            format!("/api/v1/deliveries?webhook_id={webhook}&limit=50"),
        ),
        (
            "by state",
            "/api/v1/deliveries?state=failed&limit=50".to_owned(),
        ),
        ("20th page by cursor", cursor_path),
    ];
    for (name, path) in fixed {
        let mut took = Vec::with_capacity(times);
        for _ in 0..times {
            took.push(timed_get(bench, &path).await?);
        }
        insert_percentiles(report, &format!("read {name}"), took);
    }
    let mut by_incident = Vec::with_capacity(times);
    let mut one = Vec::with_capacity(times);
    for i in 0..times {
        let row = &old[i % old.len()];
        by_incident.push(
            timed_get(
                bench,
                &format!(
                    "/api/v1/deliveries?incident_id={}&limit=50",
                    row.incident_id
                ),
            )
            .await?,
        );
        one.push(timed_get(bench, &format!("/api/v1/deliveries/{}", row.id)).await?);
    }
    insert_percentiles(report, "read by incident", by_incident);
    insert_percentiles(report, "read one old delivery with its attempts", one);
    Ok(())
}

async fn timed_get(bench: &Bench, path: &str) -> anyhow::Result<f64> {
    let started = Instant::now();
    let answer = bench.admin_get(path).await?;
    let took = started.elapsed().as_secs_f64() * 1000.0;
    if answer.is_null() {
        bail!("{path}: no answer");
    }
    Ok(took)
}

fn insert_percentiles(report: &mut Report, name: &str, took: Vec<f64>) {
    if let Some(p) = Percentiles::of(took) {
        report.figures.insert(format!("{name} p50 ms"), p.p50);
        report.figures.insert(format!("{name} p99 ms"), p.p99);
    }
}

/// For each pass, a 20 alerts/s stream before, one again with no pass (the control: how far
/// two streams' p99 differ by chance), then one during a retention pass that removes the
/// oldest day left. With several passes the streams' latencies are also pooled (the p99 of 200
/// requests is their second worst).
async fn retention(
    bench: &Arc<Bench>,
    config: &AgedConfig,
    report: &mut Report,
) -> anyhow::Result<()> {
    let stream = |when: &'static str, label: String| async move {
        let load = LoadConfig {
            alerts: 200,
            load: Load::Open { rate: 20.0 },
        };
        let name = format!("20/s {when} retention{label}");
        bench.phase(&name, load, Some(Measure::new("ok", 1))).await
    };
    bench.create_webhook("/ok/aged", 5, 10_000).await?;
    let mut pooled: [Vec<f64>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    for pass in 0..config.retention_passes {
        let label = if config.retention_passes > 1 {
            format!(" (pass {})", pass + 1)
        } else {
            String::new()
        };
        let before = stream("before", label.clone()).await;
        let again = stream("again before", label.clone()).await;
        // The deliveries of the day the pass removes, counted outside the stream's phases: a
        // count of the whole log beside the stream (seconds of a parallel scan at 5 M
        // deliveries) was what its p99 measured.
        let mut conn = AsyncPgConnection::establish(&config.database_url).await?;
        let oldest = OffsetDateTime::now_utc().date() - time::Duration::days(config.days - pass);
        let cutoff = oldest + time::Duration::DAY;
        let expiring = format!(
            "SELECT count(*) AS n FROM deliveries WHERE id < '{}'",
            partitions::day_floor(cutoff)
        );
        let rows = count(&mut conn, &expiring).await?;
        let started_pass = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let started = Instant::now();
            let expired = partitions::expire(&mut conn, cutoff.midnight().assume_utc()).await?;
            anyhow::Ok((started.elapsed().as_secs_f64(), expired, conn))
        });
        let during = stream("during", label.clone()).await;
        let (took, expired, mut conn) = started_pass.await.context("the retention pass")??;
        let removed = rows - count(&mut conn, &expiring).await?;
        report
            .figures
            .insert(format!("retention of the oldest day{label} seconds"), took);
        report.figures.insert(
            format!("retention deliveries removed{label}"),
            removed as f64,
        );
        report.figures.insert(
            format!("retention days dropped{label}"),
            expired.dropped as f64,
        );
        let streams = [&before, &again, &during];
        for (samples, phase) in pooled.iter_mut().zip(streams) {
            samples.extend(phase.series.iter().map(|(_, latency)| latency));
        }
        let [b, a, d] = streams.map(|phase| phase.latency_ms.clone());
        insert_ratios(report, &label, b, a, d);
        report.phases.extend([before, again, during]);
    }
    if config.retention_passes > 1 {
        let [b, a, d] = pooled.map(Percentiles::of);
        insert_ratios(report, ", all passes", b, a, d);
    }
    bench.cleanup().await?;
    Ok(())
}

/// The p99 of the streams before, again before and during retention (pooled or one pass's,
/// by `label`), and the control's and the pass's over the first.
fn insert_ratios(
    report: &mut Report,
    label: &str,
    before: Option<Percentiles>,
    again: Option<Percentiles>,
    during: Option<Percentiles>,
) {
    let (Some(before), Some(again), Some(during)) = (before, again, during) else {
        return;
    };
    for (when, p) in [
        ("before", &before),
        ("again before", &again),
        ("during", &during),
    ] {
        report
            .figures
            .insert(format!("20/s p99 {when}{label} ms"), p.p99);
    }
    for (when, p) in [("again before", &again), ("during", &during)] {
        report.figures.insert(
            format!("20/s p99 {when} over before{label}"),
            p.p99 / before.p99,
        );
    }
}

impl Bench {
    /// A GET of the admin API, answered 200 with JSON.
    pub(crate) async fn admin_get(&self, path: &str) -> anyhow::Result<Value> {
        let request = self.client.get(format!("{}{path}", self.target.admin_url));
        self.admin_json(request, &format!("GET {path}")).await
    }

    /// A POST of the admin API, answered 2xx with JSON.
    pub(crate) async fn admin_post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let request = self
            .client
            .post(format!("{}{path}", self.target.admin_url))
            .json(body);
        self.admin_json(request, &format!("POST {path}")).await
    }

    async fn admin_json(
        &self,
        request: reqwest::RequestBuilder,
        what: &str,
    ) -> anyhow::Result<Value> {
        let response = request.bearer_auth(&self.target.admin_token).send().await?;
        let status = response.status();
        let answer: Value = response.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bail!("{what}: admin answered {status}: {answer}");
        }
        Ok(answer)
    }
}
