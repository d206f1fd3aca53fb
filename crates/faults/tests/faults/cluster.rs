//! The servers a cluster scenario starts for itself with the `deploy/local` scripts: a
//! three-node RabbitMQ cluster (`rabbitmq-cluster`) and a PostgreSQL primary with a synchronous
//! standby (`pg-standby`). They are stopped again when the scenario ends, even when it fails.

use std::path::PathBuf;
use std::process::Command;

fn path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../deploy/local/{name}"))
}

/// Runs a deploy/local script off the test's runtime (the receivers run on it and must keep
/// answering meanwhile: a node takes seconds to start); its standard output.
pub async fn script(name: &'static str, args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || run_script(name, &args))
        .await
        .expect("the script's thread")
}

fn run_script(name: &str, args: &[String]) -> String {
    let output = Command::new("bash")
        .arg(path(name))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {name}: {e}"));
    assert!(
        output.status.success(),
        "{name} {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// Servers started by a script; stopped when dropped.
pub struct Servers(&'static str);

impl Servers {
    pub fn start(name: &'static str) -> Servers {
        // Left over from an interrupted run: stop it first.
        stop(name);
        run_script(name, &["start".to_owned()]);
        Servers(name)
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        stop(self.0);
    }
}

fn stop(name: &str) {
    let _ = Command::new("bash").arg(path(name)).arg("stop").output();
}

/// A quorum queue of the local RabbitMQ cluster: (replicas online, members).
pub async fn replicas(queue: &str) -> (usize, usize) {
    let status = script("rabbitmq-cluster", &["status"]).await;
    // name, type, leader, online, members
    let Some(line) = status
        .lines()
        .find(|l| l.starts_with(&format!("{queue}\t")))
    else {
        return (0, 0);
    };
    let columns: Vec<&str> = line.split('\t').collect();
    let nodes = |i: usize| {
        columns
            .get(i)
            .map_or(0, |c| c.matches("tocsin-mq-").count())
    };
    (nodes(3), nodes(4))
}
