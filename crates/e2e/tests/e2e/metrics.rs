//! The Grafana dashboard (`deploy/grafana/tocsin-dashboard.json`) and the Prometheus alert rules
//! (`deploy/prometheus/alerts.yml`) use only metrics the services really export: ingest,
//! dispatcher and admin run with a database and AMQP prefix of their own, are exercised until
//! their labelled series exist (an accepted alert, a 401, a delivery that succeeds, one that
//! fails with 500 until it is out of attempts, a manual retry), and every metric name of every
//! PromQL expression must be a series of a live `/metrics` scrape. A selector's equality
//! matchers (`outcome="accepted"`) must match a live series too.
//!
//! `deploy/ci/validate-manifests.sh` checks the same names against the source code; this test
//! checks them against what the running services answer, so a renamed metric, a histogram used
//! without its `_bucket`/`_sum`/`_count` suffix, or a label value that never occurs fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};
use tocsin_e2e::System;
use tocsin_testkit::{wait_for, wait_until, Behavior, Receiver, FAST_RETRY_DELAYS};

const DEADLINE: Duration = Duration::from_secs(30);

const DASHBOARD: &str = include_str!("../../../../deploy/grafana/tocsin-dashboard.json");
const ALERT_RULES: &str = include_str!("../../../../deploy/prometheus/alerts.yml");

/// Series that Prometheus itself adds to every target, not exported by the services: `up` is 1
/// when a scrape succeeded (the test checks that every `/metrics` answers).
const FROM_PROMETHEUS: &[&str] = &["up"];

// ------------------------------------------------------------------ the exposition format

/// One sample line of a scrape.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses the Prometheus text format (comments skipped).
fn parse_exposition(text: &str) -> Vec<Sample> {
    let mut samples = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name_end = line
            .find(|c: char| c == '{' || c.is_whitespace())
            .unwrap_or(line.len());
        let name = line[..name_end].to_owned();
        let mut rest = &line[name_end..];
        let mut labels = BTreeMap::new();
        if let Some(inner) = rest.strip_prefix('{') {
            let mut chars = inner.char_indices();
            let mut key = String::new();
            let mut end = inner.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '}' => {
                        end = i + 1;
                        break;
                    }
                    ',' | ' ' => {}
                    '=' => {
                        // A quoted value with \\, \" and \n escapes.
                        assert_eq!(chars.next().map(|(_, c)| c), Some('"'), "{line}");
                        let mut value = String::new();
                        while let Some((_, c)) = chars.next() {
                            match c {
                                '\\' => match chars.next().map(|(_, c)| c) {
                                    Some('n') => value.push('\n'),
                                    Some(other) => value.push(other),
                                    None => break,
                                },
                                '"' => break,
                                other => value.push(other),
                            }
                        }
                        labels.insert(std::mem::take(&mut key), value);
                    }
                    other => key.push(other),
                }
            }
            rest = &inner[end..];
        }
        let value = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no value in the sample line {line:?}"));
        samples.push(Sample {
            name,
            labels,
            value,
        });
    }
    samples
}

async fn scrape(system: &System, base: &str) -> Vec<Sample> {
    let response = system
        .client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("scraping /metrics");
    assert_eq!(response.status(), 200, "{base}/metrics");
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{base}/metrics answers the Prometheus text format, not {content_type:?}"
    );
    parse_exposition(&response.text().await.expect("metrics text"))
}

/// The sum of the samples called `name` whose labels include `labels`.
fn total(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .sum()
}

// ------------------------------------------------------------------ PromQL, just enough

/// A vector selector of an expression: the metric name and its `label="value"` matchers.
#[derive(Debug, Clone, PartialEq)]
struct Selector {
    name: String,
    equal: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Str(String),
    Punct(char),
    Other,
}

fn tokenize(expr: &str) -> Vec<Token> {
    let chars: Vec<char> = expr.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '"' || c == '\'' || c == '`' {
            let mut value = String::new();
            i += 1;
            while i < chars.len() && chars[i] != c {
                if chars[i] == '\\' && c != '`' && i + 1 < chars.len() {
                    i += 1;
                }
                value.push(chars[i]);
                i += 1;
            }
            assert!(i < chars.len(), "unterminated string in {expr}");
            i += 1;
            tokens.push(Token::Str(value));
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || "_:".contains(chars[i])) {
                i += 1;
            }
            tokens.push(Token::Ident(chars[start..i].iter().collect()));
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            // Numbers and durations: 0.95, 1e-9, 5m, 1h30m.
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric()
                    || chars[i] == '.'
                    || ("+-".contains(chars[i]) && "eE".contains(chars[i - 1])))
            {
                i += 1;
            }
            tokens.push(Token::Other);
        } else if c == '$' {
            // A Grafana variable ($__rate_interval, ${x}).
            i += 1;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || "_{}".contains(chars[i]))
            {
                i += 1;
            }
            tokens.push(Token::Other);
        } else {
            tokens.push(Token::Punct(c));
            i += 1;
        }
    }
    tokens
}

/// Words that are never metric names: binary operators and aggregation modifiers.
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "atan2",
    "inf",
    "nan",
];
/// Keywords followed by a parenthesised list of label names.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The vector selectors of a PromQL expression. Functions and aggregations (an identifier
/// followed by `(`), keywords, label lists, strings, numbers and range brackets are skipped.
fn selectors(expr: &str) -> Vec<Selector> {
    let tokens = tokenize(expr);
    let mut found = Vec::new();
    let mut i = 0;
    let skip_group = |i: &mut usize, open: char, close: char| {
        assert_eq!(tokens.get(*i), Some(&Token::Punct(open)), "{expr}");
        let mut depth = 0;
        while let Some(token) = tokens.get(*i) {
            match token {
                Token::Punct(c) if *c == open => depth += 1,
                Token::Punct(c) if *c == close => {
                    depth -= 1;
                    if depth == 0 {
                        *i += 1;
                        return;
                    }
                }
                _ => {}
            }
            *i += 1;
        }
        panic!("unbalanced {open}{close} in {expr}");
    };
    while i < tokens.len() {
        match &tokens[i] {
            Token::Ident(word) if KEYWORDS.contains(&word.to_ascii_lowercase().as_str()) => {
                i += 1;
                if LABEL_LISTS.contains(&word.as_str()) && tokens.get(i) == Some(&Token::Punct('('))
                {
                    skip_group(&mut i, '(', ')');
                }
            }
            // A function or an aggregation: `rate(`, `sum(`, `sum by (job) (`.
            Token::Ident(_)
                if matches!(tokens.get(i + 1), Some(Token::Punct('(')))
                    || matches!(
                        tokens.get(i + 1),
                        Some(Token::Ident(word)) if word == "by" || word == "without"
                    ) =>
            {
                i += 1
            }
            Token::Ident(name) => {
                let mut selector = Selector {
                    name: name.clone(),
                    equal: Vec::new(),
                };
                i += 1;
                if tokens.get(i) == Some(&Token::Punct('{')) {
                    i += 1;
                    loop {
                        match (tokens.get(i), tokens.get(i + 1), tokens.get(i + 2)) {
                            (Some(Token::Punct('}')), _, _) => {
                                i += 1;
                                break;
                            }
                            (Some(Token::Punct(',')), _, _) => i += 1,
                            // label = "value"
                            (
                                Some(Token::Ident(label)),
                                Some(Token::Punct('=')),
                                Some(Token::Str(value)),
                            ) => {
                                selector.equal.push((label.clone(), value.clone()));
                                i += 3;
                            }
                            // label != "value", label =~ "re", label !~ "re"
                            (
                                Some(Token::Ident(_)),
                                Some(Token::Punct('!' | '=')),
                                Some(Token::Punct('=' | '~')),
                            ) if matches!(tokens.get(i + 3), Some(Token::Str(_))) => i += 4,
                            other => {
                                panic!("cannot read the label matchers at {other:?} in {expr}")
                            }
                        }
                    }
                }
                found.push(selector);
            }
            Token::Punct('{') => panic!("a selector without a metric name in {expr}"),
            Token::Punct('[') => skip_group(&mut i, '[', ']'),
            _ => i += 1,
        }
    }
    found
}

/// Every `expr` of the dashboard, with where it is.
fn dashboard_exprs() -> Vec<(String, String)> {
    fn walk(value: &Value, title: &str, out: &mut Vec<(String, String)>) {
        match value {
            Value::Object(map) => {
                let title = map
                    .get("title")
                    .and_then(Value::as_str)
                    .unwrap_or(title)
                    .to_owned();
                for (key, child) in map {
                    match (key.as_str(), child) {
                        ("expr", Value::String(expr)) => {
                            out.push((format!("dashboard panel {title:?}"), expr.clone()))
                        }
                        _ => walk(child, &title, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|item| walk(item, title, out)),
            _ => {}
        }
    }
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    // Template variables that query Prometheus would hold metric names outside `expr`.
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        assert_ne!(
            variable["type"], "query",
            "the dashboard has a query variable ({}): teach this test to read it",
            variable["name"]
        );
    }
    let mut out = Vec::new();
    walk(&dashboard, "", &mut out);
    out
}

/// Every `expr` of the alert rules, with its rule. Reads the subset of YAML the file uses: an
/// inline (plain or quoted) scalar, or a folded or literal block (`>-`, `|`) after `expr:`.
fn alert_exprs() -> Vec<(String, String)> {
    let lines: Vec<&str> = ALERT_RULES.lines().collect();
    let mut rule = String::new();
    let mut rules = 0;
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start().trim_start_matches("- ");
        let indent = line.len() - line.trim_start().len();
        i += 1;
        if let Some(name) = trimmed
            .strip_prefix("alert:")
            .or_else(|| trimmed.strip_prefix("record:"))
        {
            rule = name.trim().to_owned();
            rules += 1;
            continue;
        }
        let Some(value) = trimmed.strip_prefix("expr:") else {
            continue;
        };
        let value = value.trim();
        let expr = if value.starts_with('>') || value.starts_with('|') {
            let mut block = Vec::new();
            while i < lines.len()
                && (lines[i].trim().is_empty()
                    || lines[i].len() - lines[i].trim_start().len() > indent)
            {
                block.push(lines[i].trim());
                i += 1;
            }
            block.join(" ")
        } else if let Some(quoted) = value.strip_prefix('"') {
            quoted
                .strip_suffix('"')
                .expect("a closed double-quoted expr")
                .replace("\\\\", "\u{0}")
                .replace("\\\"", "\"")
                .replace('\u{0}', "\\")
        } else if let Some(quoted) = value.strip_prefix('\'') {
            quoted
                .strip_suffix('\'')
                .expect("a closed single-quoted expr")
                .replace("''", "'")
        } else {
            value.to_owned()
        };
        out.push((format!("alert rule {rule}"), expr));
    }
    assert_eq!(
        out.len(),
        rules,
        "one expr per rule was read from alerts.yml"
    );
    out
}

#[test]
fn the_promql_reader_finds_metric_names_and_nothing_else() {
    let found = selectors(
        r#"1 - sum by (le, job) (rate(foo_bucket{le=~"10(\\.0)?", a="b", c!="d"}[$__rate_interval])) / on(job) group_left(x) sum(rate(bar_total[5m:1m] offset 1h)) or vector(0) and count(up{job=~"tocsin-(a|b)"} == 1) > bool 1e-9"#,
    );
    assert_eq!(
        found,
        vec![
            Selector {
                name: "foo_bucket".into(),
                equal: vec![("a".into(), "b".into())],
            },
            Selector {
                name: "bar_total".into(),
                equal: vec![],
            },
            Selector {
                name: "up".into(),
                equal: vec![],
            },
        ]
    );
    let samples = parse_exposition(
        "# HELP x help\n# TYPE x counter\nx_total{a=\"1\",b=\"q\\\"uote\"} 3\ny 4.5\nz_bucket{le=\"+Inf\"} 7\n",
    );
    assert_eq!(samples.len(), 3);
    assert_eq!(samples[0].name, "x_total");
    assert_eq!(samples[0].labels["b"], "q\"uote");
    assert_eq!(samples[0].value, 3.0);
    assert_eq!(samples[1].name, "y");
    assert_eq!(samples[2].labels["le"], "+Inf");
    let rules = alert_exprs();
    assert!(rules.len() >= 10, "{rules:?}");
    assert!(
        rules.iter().all(|(_, expr)| !expr.trim().is_empty()),
        "{rules:?}"
    );
}

#[tokio::test]
async fn dashboard_and_alert_rules_use_only_metrics_the_services_export() {
    let system = System::start(FAST_RETRY_DELAYS).await;
    let receiver = Receiver::start().await;
    receiver.set_path_behavior("/fail", Behavior::Status(500));
    for (name, path, attempts) in [("ok", "/ok", 5), ("failing", "/fail", 2)] {
        let (status, body) = system
            .api(
                Method::POST,
                "/api/v1/webhooks",
                Some(json!({
                    "name": name,
                    "url": receiver.url(path),
                    "events": ["incidents.opened"],
                    "retry": {"max_attempts": attempts, "timeout_ms": 5_000},
                })),
            )
            .await;
        assert_eq!(status, 201, "{body}");
    }

    // Ingest: an accepted alert and a refused token.
    let (status, body) = system
        .alert(&json!({"title": "Metrics check", "dedup_key": "metrics-check"}))
        .await;
    assert_eq!(status, 202, "{body}");
    let refused = system
        .client
        .post(format!("{}/api/v1/webhooks/alerts", system.ingest))
        .bearer_auth("tsn_not_a_token")
        .json(&json!({"title": "nope"}))
        .send()
        .await
        .expect("calling ingest");
    assert_eq!(refused.status(), 401);

    // The dispatcher: one delivery succeeds, one fails twice with 500 and is out of attempts.
    wait_until(
        "one delivery succeeded and one failed",
        DEADLINE,
        || async {
            let samples = scrape(&system, &system.dispatcher).await;
            let finished = "tocsin_dispatcher_deliveries_finished_total";
            total(&samples, finished, &[("state", "succeeded")]) >= 1.0
                && total(&samples, finished, &[("state", "failed")]) >= 1.0
        },
    )
    .await;
    // A manual retry of the failed delivery.
    let failed = wait_for("the failed delivery in the log", DEADLINE, || async {
        let (_, body) = system
            .api(Method::GET, "/api/v1/deliveries?state=failed", None)
            .await;
        body["items"][0]["id"].as_str().map(str::to_owned)
    })
    .await;
    let (status, body) = system
        .api(
            Method::POST,
            &format!("/api/v1/deliveries/{failed}/retry"),
            None,
        )
        .await;
    assert_eq!(status, 202, "{body}");
    wait_until(
        "the manual attempt and the gauges on the dispatcher",
        DEADLINE,
        || async {
            let samples = scrape(&system, &system.dispatcher).await;
            total(
                &samples,
                "tocsin_dispatcher_attempts_total",
                &[("trigger", "manual")],
            ) >= 1.0
                && samples.iter().any(|s| s.name == "tocsin_queue_messages")
                && samples
                    .iter()
                    .any(|s| s.name == "tocsin_deliveries_unfinished")
        },
    )
    .await;
    assert!(
        receiver.count() >= 4,
        "1 success, 2 automatic and 1 manual failure"
    );

    // Every service's scrape, as Prometheus would take it.
    let mut live: Vec<Sample> = Vec::new();
    let mut per_service = Vec::new();
    for (service, base) in [
        ("ingest", &system.ingest),
        ("dispatcher", &system.dispatcher),
        ("admin", &system.admin),
    ] {
        let samples = scrape(&system, base).await;
        let names: BTreeSet<&str> = samples.iter().map(|s| s.name.as_str()).collect();
        per_service.push(format!("{service}: {} series names", names.len()));
        live.extend(samples);
    }
    let exported: BTreeSet<&str> = live.iter().map(|s| s.name.as_str()).collect();

    let exprs: Vec<(String, String)> = dashboard_exprs().into_iter().chain(alert_exprs()).collect();
    let mut used = BTreeSet::new();
    let mut problems = Vec::new();
    for (place, expr) in &exprs {
        let found = selectors(expr);
        if found.is_empty() {
            problems.push(format!("{place}: no metric found in {expr}"));
        }
        for selector in found {
            used.insert(selector.name.clone());
            if FROM_PROMETHEUS.contains(&selector.name.as_str()) {
                continue;
            }
            if !exported.contains(selector.name.as_str()) {
                problems.push(format!(
                    "{place}: {} is not exported by any service ({expr})",
                    selector.name
                ));
                continue;
            }
            for (label, value) in &selector.equal {
                let matched = live
                    .iter()
                    .any(|s| s.name == selector.name && s.labels.get(label) == Some(value));
                if !matched {
                    problems.push(format!(
                        "{place}: no series {}{{{label}=\"{value}\"}} is exported ({expr})",
                        selector.name
                    ));
                }
            }
        }
    }
    let unused: Vec<&str> = exported
        .iter()
        .copied()
        .filter(|name| name.starts_with("tocsin_") && !used.contains(*name))
        .collect();
    eprintln!(
        "{} expressions, {} metric names used, {} series names exported ({}); exported but unused: {unused:?}",
        exprs.len(),
        used.len(),
        exported.len(),
        per_service.join(", "),
    );
    assert!(
        problems.is_empty(),
        "the dashboard or the alert rules use metrics the services do not export:\n{}",
        problems.join("\n")
    );
    // The reader cannot have missed everything: the files use well over a dozen names.
    assert!(used.len() >= 15, "only {used:?} found");
    assert!(exprs.len() >= 40, "only {} expressions found", exprs.len());
    system.stop().await;
}
