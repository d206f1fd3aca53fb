//! Several addresses, from outside: a dispatcher process whose `AMQP_URL` lists an unreachable
//! broker before the real one, or whose `DATABASE_URL` (libpq multi-host form) lists an
//! unreachable PostgreSQL host first, becomes ready; the passwords of the URLs never show in
//! its output. Needs the binaries built (`cargo build --bins`, or `cargo nextest run
//! --workspace`).

use std::path::PathBuf;
use std::time::Duration;

use tocsin_testkit::{amqp_url, binary, free_port, wait_ready, ServiceProcess, TestDb, TestPrefix};

const DEADLINE: Duration = Duration::from_secs(60);
/// Put in the unreachable addresses' URLs: it must never be printed.
const PASSWORD: &str = "pw-never-printed-7f3a";

struct Dispatcher {
    port: u16,
    log: PathBuf,
    process: ServiceProcess,
}

fn start_dispatcher(database_url: String, amqp: String, prefix: &TestPrefix) -> Dispatcher {
    let port = free_port();
    let log = std::env::temp_dir().join(format!("tocsin-addresses-{}.log", prefix.prefix));
    let process = ServiceProcess::spawn_logged(
        &binary("tocsin-dispatcher"),
        &[
            ("DATABASE_URL", database_url),
            ("AMQP_URL", amqp),
            ("TOCSIN_AMQP_PREFIX", prefix.prefix.clone()),
            ("TOCSIN_DISPATCHER_ADDR", format!("127.0.0.1:{port}")),
            ("TOCSIN_SHUTDOWN_TIMEOUT", "3s".into()),
            ("RUST_LOG", "debug".into()),
        ],
        Some(&log),
    );
    Dispatcher { port, log, process }
}

impl Dispatcher {
    async fn stop_and_check_log(mut self) {
        self.process.terminate();
        let status = self.process.wait_exit(Duration::from_secs(20)).await;
        assert_eq!(status.code(), Some(0), "{status}");
        let log = std::fs::read_to_string(&self.log).unwrap();
        assert!(!log.contains(PASSWORD), "a password was printed:\n{log}");
        let _ = std::fs::remove_file(&self.log);
    }
}

#[tokio::test]
async fn a_dispatcher_whose_amqp_url_lists_an_unreachable_broker_first_becomes_ready() {
    let db = TestDb::new().await;
    let prefix = TestPrefix::new();
    let amqp = format!("amqp://guest:{PASSWORD}@127.0.0.1:1/%2f,{}", amqp_url());
    let dispatcher = start_dispatcher(db.url.clone(), amqp, &prefix);
    wait_ready(dispatcher.port, DEADLINE).await;
    let log = std::fs::read_to_string(&dispatcher.log).unwrap();
    assert!(
        log.contains("trying the next address"),
        "the unreachable broker was tried first:\n{log}"
    );
    dispatcher.stop_and_check_log().await;
}

#[tokio::test]
async fn a_dispatcher_whose_database_url_lists_an_unreachable_host_first_becomes_ready() {
    let db = TestDb::new().await;
    let prefix = TestPrefix::new();
    let url = db.multi_host_url("127.0.0.1:1");
    let (scheme, rest) = url.split_once("://").unwrap();
    let with_password = match rest.split_once('@') {
        Some((user, hosts)) if !user.contains(':') => {
            format!("{scheme}://{user}:{PASSWORD}@{hosts}")
        }
        _ => url.clone(),
    };
    let dispatcher = start_dispatcher(with_password, amqp_url(), &prefix);
    wait_ready(dispatcher.port, DEADLINE).await;
    dispatcher.stop_and_check_log().await;
}
