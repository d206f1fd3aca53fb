//! What a scenario ends with, counted at the receivers and in the delivery log, and its row of
//! the fault table.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tocsin_testkit::Received;

use crate::stream::alert_index;
use crate::system::{Expect, System};

/// How long a scenario may take to settle after the stream stopped.
const SETTLE_DEADLINE: Duration = Duration::from_secs(240);

/// The columns of the fault table.
pub const HEADER: &str = "| scenario | accepted | delivered | lost | duplicates | unlogged requests | recovery s |\n|---|---|---|---|---|---|---|";

#[derive(Debug, Default, Clone)]
pub struct Tally {
    /// Alerts answered 202.
    pub accepted: usize,
    /// Deliveries (accepted alerts × webhooks) whose receiver got at least one request.
    pub delivered: usize,
    /// Deliveries whose receiver got no request.
    pub lost: usize,
    /// Requests answered 2xx for a `webhook-id` already answered 2xx.
    pub duplicates: usize,
    /// Requests a receiver got beyond the attempts the delivery log shows for that delivery.
    pub unlogged: usize,
    /// Deliveries not in the state their webhook must end in (or with the wrong attempt count).
    pub unfinished: usize,
    /// Per webhook: what was logged and received.
    pub notes: Vec<String>,
}

/// Waits until every accepted alert reached every receiver and every delivery is final (or the
/// deadline passed), then counts.
pub async fn settle(system: &System, accepted: &[usize]) -> Tally {
    let deadline = Instant::now() + SETTLE_DEADLINE;
    let mut poll = tokio::time::interval(Duration::from_millis(500));
    loop {
        poll.tick().await;
        let tally = count(system, accepted).await;
        if let Some(tally) = &tally {
            if tally.lost == 0 && tally.unfinished == 0 {
                return tally.clone();
            }
        }
        // Past the deadline the tally is returned unsettled, so that its row is still
        // recorded before `check` fails on it.
        if Instant::now() > deadline {
            return tally.expect("admin answers the delivery log");
        }
    }
}

async fn count(system: &System, accepted: &[usize]) -> Option<Tally> {
    let mut tally = Tally {
        accepted: accepted.len(),
        ..Tally::default()
    };
    for target in &system.targets {
        let log = system.deliveries(&target.webhook).await?;
        let requests = target.receiver.requests();
        let mut by_id: HashMap<String, Vec<&Received>> = HashMap::new();
        for request in &requests {
            let id = request.header("webhook-id").unwrap_or_default().to_owned();
            by_id.entry(id).or_default().push(request);
        }
        let seen: HashSet<usize> = requests.iter().filter_map(alert_index).collect();
        let missing = accepted.iter().filter(|i| !seen.contains(i)).count();
        tally.lost += missing;
        tally.delivered += accepted.len() - missing;
        tally.unfinished += log
            .values()
            .filter(|(state, attempts)| match target.expect {
                Expect::Succeeded => state != "succeeded",
                Expect::Failed { attempts: n } => state != "failed" || *attempts != n,
            })
            .count();
        for (id, requests) in &by_id {
            let logged = log.get(id).map_or(0, |(_, attempts)| *attempts as usize);
            tally.unlogged += requests.len().saturating_sub(logged);
            let ok = requests
                .iter()
                .filter(|r| r.answered.is_some_and(|s| (200..300).contains(&s)))
                .count();
            tally.duplicates += ok.saturating_sub(1);
        }
        // Attempts logged whose request never arrived: an attempt interrupted before its
        // request left, or one that failed to connect. Shown, not counted.
        let short = log
            .iter()
            .filter(|(id, (_, attempts))| by_id.get(*id).map_or(0, Vec::len) < *attempts as usize)
            .count();
        tally.notes.push(format!(
            "{}: {} deliveries logged, {} requests, {missing} alerts missing, {short} deliveries with fewer requests than attempts",
            target.name,
            log.len(),
            requests.len(),
        ));
    }
    Some(tally)
}

/// Prints the scenario's row of the fault table and writes it where `deploy/local/test`
/// gathers the rows into one table: `TOCSIN_FAULT_TABLE` (a folder), or `fault-table` in the
/// target's temporary folder. `order` places the row.
pub fn record(order: u8, scenario: &str, tally: &Tally, recovery: Option<Duration>) {
    let recovery = recovery.map_or("–".to_owned(), |d| format!("{:.1}", d.as_secs_f64()));
    let row = format!(
        "| {scenario} | {} | {} | {} | {} | {} | {recovery} |",
        tally.accepted, tally.delivered, tally.lost, tally.duplicates, tally.unlogged,
    );
    eprintln!("{HEADER}\n{row}\n{}", tally.notes.join("\n"));
    let folder = std::env::var_os("TOCSIN_FAULT_TABLE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fault-table"));
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("00-header.md"), format!("{HEADER}\n")).unwrap();
    std::fs::write(folder.join(format!("{order:02}.md")), format!("{row}\n")).unwrap();
}

/// Nothing lost, nothing unfinished, no request the delivery log does not show.
pub fn check(scenario: &str, tally: &Tally) {
    assert_eq!(tally.lost, 0, "{scenario}: lost deliveries: {tally:?}");
    assert_eq!(
        tally.unfinished, 0,
        "{scenario}: unfinished deliveries: {tally:?}"
    );
    assert_eq!(
        tally.unlogged, 0,
        "{scenario}: requests the delivery log does not show: {tally:?}"
    );
}
