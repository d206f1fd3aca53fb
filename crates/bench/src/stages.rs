//! The latency budget of a phase: the stage histograms the services export on `/metrics`
//! (`tocsin_*_stage_seconds`, and the request, `tocsin_dispatcher_attempt_duration_seconds`),
//! read before and after the phase, so that only the phase's own alerts count. Quantiles are
//! interpolated within a bucket, as Prometheus' `histogram_quantile` does; the mean is exact.

use std::collections::BTreeMap;

use serde::Serialize;

/// The stages of an alert's way, in order: (name in the report, metric, `stage` label; `None`:
/// every series of the metric together).
const STAGES: &[(&str, &str, Option<&str>)] = &[
    (
        "ingest: authenticate",
        "tocsin_ingest_stage_seconds",
        Some("authenticate"),
    ),
    (
        "ingest: transaction",
        "tocsin_ingest_stage_seconds",
        Some("transaction"),
    ),
    ("relay: wake", "tocsin_outbox_stage_seconds", Some("wake")),
    (
        "relay: publish",
        "tocsin_outbox_stage_seconds",
        Some("publish"),
    ),
    (
        "dispatcher: broker",
        "tocsin_dispatcher_stage_seconds",
        Some("broker"),
    ),
    (
        "dispatcher: fan_out",
        "tocsin_dispatcher_stage_seconds",
        Some("fan_out"),
    ),
    (
        "dispatcher: request",
        "tocsin_dispatcher_attempt_duration_seconds",
        None,
    ),
    (
        "dispatcher: outcome",
        "tocsin_dispatcher_stage_seconds",
        Some("outcome"),
    ),
];

/// One stage's figures over a phase, in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct StageFigures {
    pub stage: String,
    pub count: u64,
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
}

/// One histogram as read: cumulative bucket counts by upper bound, the sum and the count.
#[derive(Debug, Clone, Default, PartialEq)]
struct Histogram {
    buckets: BTreeMap<u64, (f64, f64)>,
    sum: f64,
    count: f64,
}

/// The stage histograms of every service, as read at one moment.
#[derive(Debug, Clone, Default)]
pub struct Reading {
    histograms: BTreeMap<&'static str, Histogram>,
}

impl Reading {
    /// Reads each URL's `/metrics` (a URL that does not answer adds nothing).
    pub async fn take(client: &reqwest::Client, urls: &[String]) -> Reading {
        let mut reading = Reading::default();
        for url in urls {
            let text = match client.get(url).send().await {
                Ok(response) if response.status().is_success() => {
                    response.text().await.unwrap_or_default()
                }
                _ => continue,
            };
            reading.add(&text);
        }
        reading
    }

    /// Adds the stage series of one exposition.
    fn add(&mut self, text: &str) {
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let (name, labels) = series.split_once('{').unwrap_or((series, ""));
            for (stage, metric, label) in STAGES {
                let Some(part) = name.strip_prefix(metric) else {
                    continue;
                };
                if let Some(label) = label {
                    if label_value(labels, "stage") != Some(label) {
                        continue;
                    }
                }
                let histogram = self.histograms.entry(stage).or_default();
                match part {
                    "_sum" => histogram.sum += value,
                    "_count" => histogram.count += value,
                    "_bucket" => {
                        let Some(le) = label_value(labels, "le") else {
                            continue;
                        };
                        let bound = if le == "+Inf" {
                            f64::INFINITY
                        } else {
                            match le.parse::<f64>() {
                                Ok(bound) => bound,
                                Err(_) => continue,
                            }
                        };
                        let entry = histogram.buckets.entry(bound.to_bits()).or_default();
                        *entry = (bound, entry.1 + value);
                    }
                    _ => {}
                }
            }
        }
    }

    /// How many times `stage` was counted between `before` and this reading.
    pub fn counted_since(&self, before: &Reading, stage: &str) -> u64 {
        let count = |reading: &Reading| reading.histograms.get(stage).map_or(0.0, |h| h.count);
        (count(self) - count(before)).max(0.0) as u64
    }

    /// Each stage's figures between `before` and this reading; stages with nothing counted
    /// are left out.
    pub fn since(&self, before: &Reading) -> Vec<StageFigures> {
        let empty = Histogram::default();
        STAGES
            .iter()
            .filter_map(|(stage, _, _)| {
                let after = self.histograms.get(stage)?;
                let before = before.histograms.get(stage).unwrap_or(&empty);
                let count = after.count - before.count;
                if count < 1.0 {
                    return None;
                }
                // Cumulative counts by bound, in increasing order of the bound.
                let mut buckets: Vec<(f64, f64)> = after
                    .buckets
                    .iter()
                    .map(|(bits, (bound, n))| {
                        let earlier = before.buckets.get(bits).map_or(0.0, |(_, n)| *n);
                        (*bound, n - earlier)
                    })
                    .collect();
                buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
                Some(StageFigures {
                    stage: (*stage).to_owned(),
                    count: count as u64,
                    mean: (after.sum - before.sum) / count * 1000.0,
                    p50: quantile(&buckets, count, 0.5) * 1000.0,
                    p99: quantile(&buckets, count, 0.99) * 1000.0,
                })
            })
            .collect()
    }
}

/// The value of `name` in a series' labels (`a="x",b="y"}`).
fn label_value<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    labels
        .trim_end_matches('}')
        .split(',')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix("=\""))
        .map(|value| value.trim_end_matches('"'))
}

/// The `q` quantile of cumulative `buckets` (upper bound, count) holding `count` values,
/// linear within its bucket; the highest finite bound when it falls in the last one.
fn quantile(buckets: &[(f64, f64)], count: f64, q: f64) -> f64 {
    let rank = q * count;
    let mut lower = (0.0, 0.0);
    for &(bound, cumulative) in buckets {
        if cumulative >= rank {
            if bound.is_infinite() {
                return lower.0;
            }
            let within = cumulative - lower.1;
            let share = if within > 0.0 {
                (rank - lower.1) / within
            } else {
                1.0
            };
            return lower.0 + (bound - lower.0) * share;
        }
        lower = (bound, cumulative);
    }
    lower.0
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = r#"# HELP tocsin_dispatcher_stage_seconds x
tocsin_dispatcher_stage_seconds_bucket{stage="fan_out",le="0.001"} 1
tocsin_dispatcher_stage_seconds_bucket{stage="fan_out",le="0.002"} 1
tocsin_dispatcher_stage_seconds_bucket{stage="fan_out",le="+Inf"} 1
tocsin_dispatcher_stage_seconds_sum{stage="fan_out"} 0.0005
tocsin_dispatcher_stage_seconds_count{stage="fan_out"} 1
"#;

    const AFTER: &str = r#"tocsin_dispatcher_stage_seconds_bucket{stage="fan_out",le="0.001"} 51
tocsin_dispatcher_stage_seconds_bucket{stage="fan_out",le="0.002"} 101
tocsin_dispatcher_stage_seconds_bucket{stage="fan_out",le="+Inf"} 101
tocsin_dispatcher_stage_seconds_sum{stage="fan_out"} 0.1505
tocsin_dispatcher_stage_seconds_count{stage="fan_out"} 101
tocsin_dispatcher_stage_seconds_bucket{stage="outcome",le="0.001"} 0
tocsin_dispatcher_stage_seconds_bucket{stage="outcome",le="+Inf"} 0
tocsin_dispatcher_stage_seconds_count{stage="outcome"} 0
tocsin_dispatcher_attempt_duration_seconds_bucket{outcome="success",le="0.001"} 3
tocsin_dispatcher_attempt_duration_seconds_bucket{outcome="success",le="+Inf"} 3
tocsin_dispatcher_attempt_duration_seconds_sum{outcome="success"} 0.0015
tocsin_dispatcher_attempt_duration_seconds_count{outcome="success"} 3
tocsin_dispatcher_attempt_duration_seconds_bucket{outcome="failure",le="0.001"} 0
tocsin_dispatcher_attempt_duration_seconds_bucket{outcome="failure",le="+Inf"} 1
tocsin_dispatcher_attempt_duration_seconds_sum{outcome="failure"} 2.0
tocsin_dispatcher_attempt_duration_seconds_count{outcome="failure"} 1
"#;

    fn reading(text: &str) -> Reading {
        let mut reading = Reading::default();
        reading.add(text);
        reading
    }

    #[test]
    fn a_phase_counts_only_what_it_added_and_interpolates_within_a_bucket() {
        let figures = reading(AFTER).since(&reading(BEFORE));
        let names: Vec<&str> = figures.iter().map(|f| f.stage.as_str()).collect();
        // Nothing counted for the outcome: left out.
        assert_eq!(names, ["dispatcher: fan_out", "dispatcher: request"]);
        let fan_out = &figures[0];
        assert_eq!(fan_out.count, 100);
        assert!((fan_out.mean - 1.5).abs() < 1e-9, "{}", fan_out.mean);
        // 50 in (0, 1 ms], 50 in (1, 2 ms]: the 50th value is at the first bucket's top.
        assert!((fan_out.p50 - 1.0).abs() < 1e-9, "{}", fan_out.p50);
        assert!((fan_out.p99 - 1.98).abs() < 1e-9, "{}", fan_out.p99);
        // Every outcome's series together; the last value, past every finite bound, is given
        // as the highest finite bound.
        let request = &figures[1];
        assert_eq!(request.count, 4);
        assert!((request.p99 - 1.0).abs() < 1e-9, "{}", request.p99);
    }

    #[test]
    fn labels_are_read_by_name() {
        assert_eq!(
            label_value(r#"stage="fan_out",le="0.5"}"#, "le"),
            Some("0.5")
        );
        assert_eq!(
            label_value(r#"stage="fan_out",le="0.5"}"#, "stage"),
            Some("fan_out")
        );
        assert_eq!(label_value(r#"outcome="x"}"#, "stage"), None);
    }
}
