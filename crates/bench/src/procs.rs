//! CPU time and memory of the Tocsin processes on this machine, read from `/proc`.
//!
//! Processes are found by name (`/proc/*/comm` is `tocsin-ingest`, `tocsin-dispatch` (cut to
//! 15 bytes by the kernel) or `tocsin-admin`). CPU is `utime + stime` of `/proc/PID/stat`; peak memory is `VmHWM` and
//! current memory `VmRSS` of `/proc/PID/status`. When the services run inside the bench's own
//! process (the smoke test), none is found and the report says so.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

/// The process names the bench measures.
pub const SERVICES: [&str; 3] = ["tocsin-ingest", "tocsin-dispatcher", "tocsin-admin"];

/// One reading of one process.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub pid: u32,
    /// utime + stime, in seconds.
    pub cpu_seconds: f64,
    pub hwm_kb: u64,
    pub rss_kb: u64,
}

fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

fn status_kb(status: &str, key: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn read_one(pid: u32, name: &str, ticks: f64) -> Option<Sample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name may hold spaces and parentheses: the fields start after the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // Fields after the name start at field 3 (state); utime is field 14, stime 15.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(Sample {
        name: name.to_owned(),
        pid,
        cpu_seconds: (utime + stime) / ticks,
        hwm_kb: status_kb(&status, "VmHWM:"),
        rss_kb: status_kb(&status, "VmRSS:"),
    })
}

/// Every running Tocsin service process, by pid.
pub fn snapshot() -> BTreeMap<u32, Sample> {
    let ticks = clock_ticks();
    let mut found = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) else {
            continue;
        };
        let comm = comm.trim();
        // The kernel cuts `comm` to 15 bytes: `tocsin-dispatcher` reads `tocsin-dispatch`.
        let name = SERVICES
            .iter()
            .find(|name| comm == &name[..name.len().min(15)]);
        if let Some(name) = name {
            if let Some(sample) = read_one(pid, name, ticks) {
                found.insert(pid, sample);
            }
        }
    }
    found
}

/// How many processes of this name run now.
pub fn count(name: &str) -> usize {
    snapshot().values().filter(|s| s.name == name).count()
}

/// What one process cost during a scenario.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessCost {
    pub name: String,
    pub pid: u32,
    /// CPU seconds (user + system) spent during the scenario.
    pub cpu_seconds: f64,
    /// CPU milliseconds per delivery received (or per alert accepted when nothing is
    /// delivered).
    pub cpu_ms_per_unit: Option<f64>,
    /// Peak resident memory since the process started (VmHWM), MiB.
    pub peak_rss_mib: f64,
    /// Resident memory sampled every second during the scenario, MiB.
    pub rss_min_mib: f64,
    pub rss_max_mib: f64,
    pub rss_samples: usize,
}

/// Samples the processes every second until stopped.
pub struct Sampler {
    before: BTreeMap<u32, Sample>,
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    pub fn start() -> Sampler {
        let before = snapshot();
        let samples = Arc::new(Mutex::new(before.values().cloned().collect::<Vec<_>>()));
        let stop = CancellationToken::new();
        let (shared, stopping) = (samples.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stopping.cancelled() => break,
                    _ = tick.tick() => {}
                }
                let now = tokio::task::spawn_blocking(snapshot)
                    .await
                    .unwrap_or_default();
                shared.lock().expect("samples").extend(now.into_values());
            }
        });
        Sampler {
            before,
            samples,
            stop,
            task,
        }
    }

    /// Stops sampling; `units` is what the CPU is divided by (deliveries or alerts).
    pub async fn finish(self, units: usize) -> Vec<ProcessCost> {
        self.stop.cancel();
        let _ = self.task.await;
        let after = snapshot();
        let samples = self.samples.lock().expect("samples").clone();
        let mib = |kb: u64| kb as f64 / 1024.0;
        let mut costs = Vec::new();
        for (pid, last) in &after {
            let start_cpu = self.before.get(pid).map(|s| s.cpu_seconds).unwrap_or(0.0);
            let cpu = (last.cpu_seconds - start_cpu).max(0.0);
            let rss: Vec<u64> = samples
                .iter()
                .filter(|s| s.pid == *pid)
                .map(|s| s.rss_kb)
                .chain([last.rss_kb])
                .collect();
            costs.push(ProcessCost {
                name: last.name.clone(),
                pid: *pid,
                cpu_seconds: cpu,
                cpu_ms_per_unit: (units > 0).then(|| cpu * 1000.0 / units as f64),
                peak_rss_mib: mib(last.hwm_kb),
                rss_min_mib: mib(rss.iter().copied().min().unwrap_or(0)),
                rss_max_mib: mib(rss.iter().copied().max().unwrap_or(0)),
                rss_samples: rss.len(),
            });
        }
        costs.sort_by(|a, b| a.name.cmp(&b.name).then(a.pid.cmp(&b.pid)));
        costs
    }
}
