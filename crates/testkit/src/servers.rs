//! Stopping and starting the shared PostgreSQL and RabbitMQ, for the fault tests only (they run
//! one at a time, after every other test). Uses the local servers' own control commands.

use std::process::Command;
use std::time::Duration;

/// Runs a control command on a blocking thread, so the test's other futures (a stream of
/// requests, say) keep running meanwhile.
async fn run(program: &'static str, args: &[&str]) {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || run_blocking(program, &args))
        .await
        .expect("the control command's thread");
}

fn run_blocking(program: &str, args: &[String]) {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn postgres_version() -> String {
    let mut versions: Vec<String> = std::fs::read_dir("/etc/postgresql")
        .expect("a local PostgreSQL under /etc/postgresql")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    versions.sort_by_key(|v| v.parse::<u32>().unwrap_or(0));
    versions.pop().expect("a PostgreSQL cluster")
}

/// Stops the local PostgreSQL (fast shutdown: connections are cut).
pub async fn stop_postgres() {
    run(
        "pg_ctlcluster",
        &[
            "--skip-systemctl-redirect",
            &postgres_version(),
            "main",
            "stop",
            "-m",
            "fast",
        ],
    )
    .await;
}

/// Starts the local PostgreSQL and waits until it accepts connections.
pub async fn start_postgres() {
    run(
        "pg_ctlcluster",
        &[
            "--skip-systemctl-redirect",
            &postgres_version(),
            "main",
            "start",
        ],
    )
    .await;
    crate::wait_until(
        "PostgreSQL to accept connections",
        Duration::from_secs(60),
        || async {
            tokio::net::TcpStream::connect("127.0.0.1:5432")
                .await
                .is_ok()
        },
    )
    .await;
}

/// Restarts the RabbitMQ application (every connection drops; durable queues stay) and waits
/// until it accepts connections again.
pub async fn restart_rabbitmq() {
    run("rabbitmqctl", &["stop_app"]).await;
    run("rabbitmqctl", &["start_app"]).await;
    run("rabbitmqctl", &["await_startup"]).await;
    crate::wait_until(
        "RabbitMQ to accept connections",
        Duration::from_secs(60),
        || async {
            tokio::net::TcpStream::connect("127.0.0.1:5672")
                .await
                .is_ok()
        },
    )
    .await;
}
