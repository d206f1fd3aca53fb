//! Tocsin's binaries as real processes, for tests of signals, crashes and restarts.

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

/// A port that was free a moment ago (for processes that must be told their port).
///
/// It is picked at random below the kernel's ephemeral range, never from it: the servers and
/// clients that other tests start meanwhile on port 0 take their ports from that range, and
/// one of them could take a port handed out here before its process binds it (a test then
/// talks to another test's server). Falls back to an ephemeral port where no other is free.
pub fn free_port() -> u16 {
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    const LOWEST: u16 = 10_000;
    if ephemeral_start > LOWEST {
        let span = u128::from(ephemeral_start - LOWEST);
        for _ in 0..100 {
            let port = LOWEST + (uuid::Uuid::new_v4().as_u128() % span) as u16;
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// The path of a workspace binary (`tocsin-ingest`, ...) built beside the running test, in
/// `target/<profile>/`. Cargo builds every workspace binary when it builds the whole workspace
/// (`cargo nextest run --workspace`); with `-p`, build them first (`cargo build --bins`).
pub fn binary(name: &str) -> String {
    let exe = std::env::current_exe().expect("the test's path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not built: run `cargo build --bins` first, or the tests with `cargo nextest run --workspace`",
        path.display()
    );
    path.display().to_string()
}

/// Waits until the service on `port` answers `GET /readyz` with 200 (PostgreSQL and RabbitMQ
/// reachable), up to `deadline`.
pub async fn wait_ready(port: u16, deadline: Duration) {
    crate::wait_until(
        &format!("the service on port {port} to be ready"),
        deadline,
        || async move {
            reqwest::get(format!("http://127.0.0.1:{port}/readyz"))
                .await
                .is_ok_and(|r| r.status().is_success())
        },
    )
    .await;
}

/// A running service binary; killed when dropped.
pub struct ServiceProcess {
    child: Child,
    pub name: String,
}

impl ServiceProcess {
    /// Starts `binary` with `env` (added to a cleared environment but for `PATH` and `HOME`),
    /// its output going to the test's output.
    pub fn spawn(binary: &str, env: &[(&str, String)]) -> ServiceProcess {
        Self::spawn_logged(binary, env, None)
    }

    /// Like [`ServiceProcess::spawn`], with stdout and stderr appended to `log` when given.
    pub fn spawn_logged(
        binary: &str,
        env: &[(&str, String)],
        log: Option<&std::path::Path>,
    ) -> ServiceProcess {
        let mut command = Command::new(binary);
        if let Some(path) = log {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
            let copy = file.try_clone().expect("duplicating the log file");
            command.stdout(file).stderr(copy);
        }
        command.env_clear();
        for keep in ["PATH", "HOME", "RUST_LOG"] {
            if let Ok(value) = std::env::var(keep) {
                command.env(keep, value);
            }
        }
        for (name, value) in env {
            command.env(name, value);
        }
        let child = command
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {binary}: {e}"));
        ServiceProcess {
            child,
            name: binary.rsplit('/').next().unwrap_or(binary).to_owned(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -{signal} {} failed", self.pid());
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        self.signal("TERM");
    }

    /// Sends SIGKILL and reaps the process.
    pub fn kill(mut self) {
        self.signal("KILL");
        let _ = self.child.wait();
    }

    /// Waits for the process to exit, up to `deadline`.
    pub async fn wait_exit(&mut self, deadline: Duration) -> ExitStatus {
        crate::wait_for(&format!("{} to exit", self.name), deadline, || {
            let status = self.child.try_wait().expect("polling the child");
            async move { status }
        })
        .await
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
