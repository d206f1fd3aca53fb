//! Every scenario of the bench against a whole Tocsin in this process, with small numbers, so
//! that the tool cannot rot. No timing assertions: only that nothing is lost and the reports
//! make sense.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tocsin_bench::{
    BacklogConfig, Bench, FanoutConfig, LatencyConfig, Load, LoadConfig, Report, SlowTargetConfig,
    Target,
};
use tocsin_e2e::{System, ADMIN_TOKEN};
use tocsin_testkit::audit::{Actor, Change};

fn closed(alerts: usize, concurrency: usize) -> LoadConfig {
    LoadConfig {
        alerts,
        load: Load::Closed { concurrency },
    }
}

fn check(report: &Report, delivering: bool) {
    let table = tocsin_bench::output::table(report);
    println!("{table}");
    assert!(!report.phases.is_empty(), "{table}");
    for phase in &report.phases {
        assert_eq!(phase.errors, 0, "{table}");
        assert_eq!(phase.alerts_accepted, phase.alerts_sent, "{table}");
        assert!(phase.alerts_sent > 0, "{table}");
        assert!(phase.accepted_per_sec > 0.0, "{table}");
        let ingest = phase.ingest_ms.as_ref().expect("ingest times");
        assert_eq!(ingest.count, phase.alerts_sent, "{table}");
        assert!(
            ingest.p50 <= ingest.p99 && ingest.p99 <= ingest.max,
            "{table}"
        );
        assert_eq!(phase.lost, 0, "{table}");
        assert_eq!(phase.duplicates, 0, "{table}");
        if delivering {
            assert_eq!(
                phase.received,
                phase.alerts_accepted * phase.webhooks,
                "{table}"
            );
            let latency = phase.latency_ms.as_ref().expect("latencies");
            assert_eq!(latency.count, phase.received, "{table}");
            assert!(latency.p50 <= latency.p99, "{table}");
            assert!(phase.deliveries_per_sec > 0.0, "{table}");
        }
    }
    let json = serde_json::to_value(report).expect("report as JSON");
    assert_eq!(json["scenario"], report.scenario.as_str());
}

/// A bench pointed at `system`, as `tocsin-bench` points at a deployment.
async fn bench_of(system: &System) -> Arc<Bench> {
    Arc::new(
        Bench::connect(Target {
            ingest_url: system.ingest.clone(),
            admin_url: system.admin.clone(),
            admin_token: ADMIN_TOKEN.into(),
            // Let the bench create its own, as it does by default.
            inbound_token: None,
            drain_timeout: Duration::from_secs(30),
            ordering: "none".into(),
            metrics_urls: [&system.ingest, &system.admin, &system.dispatcher]
                .map(|base| format!("{base}/metrics"))
                .to_vec(),
        })
        .await
        .expect("connecting the bench"),
    )
}

/// `aged` with small numbers: 3 000 deliveries over three past days (20 pages to read), `e2e`, the reads, and two
/// retention passes, each removing one day under its stream after a control stream, pooled.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aged_fills_reads_and_pools_its_retention_passes() {
    let system = System::start("0s,200ms").await;
    let bench = bench_of(&system).await;
    let config = tocsin_bench::aged::AgedConfig {
        database_url: system.db.url.clone(),
        deliveries: 3000,
        days: 3,
        webhooks: 1,
        failed_share: 0.05,
        load: closed(20, 4),
        reads: 2,
        retention_passes: 2,
    };
    let report = tocsin_bench::aged::aged(&bench, config)
        .await
        .expect("aged");
    check(&report, true);
    let table = tocsin_bench::output::table(&report);
    for pass in [1, 2] {
        for (figure, expected) in [("days dropped", 1.0), ("deliveries removed", 1000.0)] {
            let name = format!("retention {figure} (pass {pass})");
            assert_eq!(
                report.figures.get(&name),
                Some(&expected),
                "{name}: {table}"
            );
        }
    }
    // Each pass's streams (before, the control again before, during) and all passes pooled.
    for label in [" (pass 1)", " (pass 2)", ", all passes"] {
        let before = report.figures[&format!("20/s p99 before{label} ms")];
        for when in ["again before", "during"] {
            let ratio = report.figures[&format!("20/s p99 {when} over before{label}")];
            let p99 = report.figures[&format!("20/s p99 {when}{label} ms")];
            assert!(
                ratio > 0.0 && (ratio - p99 / before).abs() < 1e-9,
                "{when}{label}: {table}"
            );
        }
    }
    assert_eq!(
        report.phases.len(),
        1 + 3 * 2,
        "e2e and three streams a pass: {table}"
    );
    drop(bench);
    // The aged webhook is kept for the next run; the stream's is deleted.
    expect_the_benchs_changes(&system, 1).await;
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_scenario_runs_against_a_real_system() {
    let system = System::start("0s,200ms").await;
    let bench = bench_of(&system).await;

    let report = tocsin_bench::ingest(&bench, closed(50, 8))
        .await
        .expect("ingest");
    check(&report, false);

    let report = tocsin_bench::e2e(&bench, closed(50, 8)).await.expect("e2e");
    check(&report, true);
    assert_eq!(report.phases[0].received, 50);
    // The latency budget holds every stage of the way, each counted for this phase alone.
    let stages: Vec<(&str, u64)> = report.phases[0]
        .stages
        .iter()
        .map(|s| (s.stage.as_str(), s.count))
        .collect();
    let names: Vec<&str> = stages.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        names,
        [
            "ingest: authenticate",
            "ingest: transaction",
            "relay: wake",
            "relay: publish",
            "dispatcher: broker",
            "dispatcher: fan_out",
            "dispatcher: request",
            "dispatcher: outcome"
        ],
        "{}",
        tocsin_bench::output::table(&report)
    );
    for (name, count) in [stages[0], stages[1]] {
        assert_eq!(
            count,
            50,
            "{name}: {}",
            tocsin_bench::output::table(&report)
        );
    }
    // The events of the ingest scenario's alerts may still be fanning out, now to this
    // scenario's webhook too: the dispatcher's stages count them beside the phase's own.
    for (name, count) in [stages[4], stages[5], stages[6], stages[7]] {
        assert!(
            count >= 50,
            "{name}: {}",
            tocsin_bench::output::table(&report)
        );
    }

    let dir = std::env::temp_dir().join(format!("tocsin-bench-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    tocsin_bench::write_json(&report, &dir.join("e2e.json")).expect("json");
    tocsin_bench::output::svg(&report, &dir.join("e2e.svg")).expect("svg");
    let svg = std::fs::read_to_string(dir.join("e2e.svg")).expect("svg file");
    assert!(svg.contains("<svg") && svg.contains("polyline"), "{svg}");

    let report = tocsin_bench::latency(
        &bench,
        LatencyConfig {
            rates: vec![50.0],
            duration: Duration::from_secs(1),
        },
    )
    .await
    .expect("latency");
    check(&report, true);
    assert_eq!(report.phases[0].alerts_sent, 50);

    let report = tocsin_bench::fanout(
        &bench,
        FanoutConfig {
            webhooks: 20,
            alerts: 1,
        },
    )
    .await
    .expect("fanout");
    check(&report, true);
    assert_eq!(report.phases[0].received, 20);
    assert!(report.figures.contains_key("time_to_last_receipt_ms"));

    let report = tocsin_bench::slow_target(
        &bench,
        SlowTargetConfig {
            load: closed(50, 8),
            slow_timeout_ms: 1000,
        },
    )
    .await
    .expect("slow-target");
    check(&report, true);
    assert_eq!(report.phases.len(), 2);
    assert!(report.figures.contains_key("healthy_throughput_kept_pct"));

    let report = tocsin_bench::scale(&bench, closed(50, 8), Some(1))
        .await
        .expect("scale");
    check(&report, true);
    assert_eq!(report.label.as_deref(), Some("1 dispatcher(s)"));

    let report = tocsin_bench::backlog(
        &bench,
        BacklogConfig {
            load: closed(20, 8),
            hold: Duration::from_secs(1),
        },
    )
    .await
    .expect("backlog");
    check(&report, true);
    assert_eq!(report.phases[0].received, 20);

    let _ = std::fs::remove_dir_all(&dir);
    drop(bench);
    expect_the_benchs_changes(&system, 0).await;
    system.stop().await;
}

/// The bench is a client of its own, outside the test's audit ledger: its changes are its inbound
/// token and webhooks, made (and the webhooks deleted again) with the bootstrap token through the
/// API.
/// Each is noted in the ledger, which [`System::stop`] then holds to the log (with no secret in
/// it). All but `kept` of its webhooks are deleted again.
async fn expect_the_benchs_changes(system: &System, kept: usize) {
    let entries = system.ledger.entries(&system.client, &system.admin).await;
    let mut made = BTreeSet::new();
    let mut deleted = BTreeSet::new();
    for entry in &entries {
        let action = entry["action"].as_str().unwrap_or_default();
        let id = entry["resource_id"].as_str().unwrap_or_default().to_owned();
        match action {
            "webhook.create" => made.insert(id.clone()),
            "webhook.delete" => deleted.insert(id.clone()),
            "token.create" => true,
            _ => panic!("the bench made a change other than a webhook's: {entry}"),
        };
        system
            .ledger
            .expect(Change::new(action, Some(id), "api", Actor::bootstrap()));
    }
    assert!(!made.is_empty(), "the bench made no webhook");
    assert!(
        deleted.is_subset(&made),
        "the bench deleted webhooks not its own"
    );
    assert_eq!(
        made.len() - deleted.len(),
        kept,
        "the bench left webhooks behind"
    );
}
