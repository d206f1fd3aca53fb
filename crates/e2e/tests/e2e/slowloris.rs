//! Slowloris against each service, run as its binary with `TOCSIN_CLIENT_TIMEOUT=2s`: 200
//! connections each send part of a request head and then trickle one more byte a second,
//! never finishing it. Meanwhile the service answers normal requests promptly, and it closes
//! every slow connection once the client timeout has passed (with a 408 where it can).
//!
//! It needs the binaries built (`cargo build --bins`, or `cargo nextest run --workspace`).

use std::time::{Duration, Instant};

use tocsin_testkit::{
    amqp_url, binary, free_port, wait_for, wait_ready, ServiceProcess, TestDb, TestPrefix,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SLOW_CONNECTIONS: usize = 200;
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a normal request may take while the attack runs (debug build, shared machine).
/// Under the whole suite a probe once took 1.006 s, about Linux's initial SYN retransmission
/// timeout (1 s) plus the request; a service that the slow connections blocked would answer
/// only once they are cut off, after `CLIENT_TIMEOUT` (2 s), so this bound still tells the two
/// apart.
const PROMPT: Duration = Duration::from_millis(1500);
/// How long after the client timeout the server may take to close a slow connection.
const CLOSE_SLACK: Duration = Duration::from_secs(5);
const ADMIN_TOKEN: &str = "slowloris-admin-token-0123456789";

/// How one slow connection ended.
#[derive(Debug)]
struct Ended {
    /// From connecting to the server closing the connection.
    after: Duration,
    /// The server answered 408 before closing.
    answered_408: bool,
}

/// One slowloris connection: part of a request head, then a byte a second (the deliberate
/// pacing of the attacker), until the server closes the connection or `give_up` passes.
async fn slow_client(port: u16, give_up: Duration) -> Option<Ended> {
    let started = Instant::now();
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    stream
        .write_all(b"POST /api/v1/webhooks/alerts HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        .await
        .ok()?;
    let mut pacing = tokio::time::interval(Duration::from_secs(1));
    pacing.tick().await;
    let mut answer = Vec::new();
    let mut buffer = [0u8; 256];
    loop {
        tokio::select! {
            read = stream.read(&mut buffer) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buffer[..n]),
            },
            _ = pacing.tick() => {
                if started.elapsed() > give_up {
                    return None;
                }
                if stream.write_all(b"a").await.is_err() {
                    break;
                }
            }
        }
    }
    Some(Ended {
        after: started.elapsed(),
        answered_408: answer.starts_with(b"HTTP/1.1 408"),
    })
}

/// Starts `binary` with the client timeout shortened, waits until it is ready, and runs the
/// attack against it; `normal` is a request it must keep answering, with its expected status.
async fn attack(service: &str, extra_env: Vec<(&'static str, String)>, normal: (&str, u16)) {
    let db = TestDb::new().await;
    let prefix = TestPrefix::new();
    let port = free_port();
    let mut env = vec![
        ("DATABASE_URL", db.url.clone()),
        ("AMQP_URL", amqp_url()),
        ("TOCSIN_AMQP_PREFIX", prefix.prefix.clone()),
        (
            "TOCSIN_CLIENT_TIMEOUT",
            format!("{}s", CLIENT_TIMEOUT.as_secs()),
        ),
        ("TOCSIN_SHUTDOWN_TIMEOUT", "2s".to_owned()),
    ];
    env.extend(
        extra_env
            .into_iter()
            .map(|(name, value)| (name, value.replace("{port}", &port.to_string()))),
    );
    let log = std::env::temp_dir().join(format!("tocsin-slowloris-{}.log", prefix.prefix));
    let _process =
        ServiceProcess::spawn_logged(&binary(&format!("tocsin-{service}")), &env, Some(&log));
    wait_ready(port, Duration::from_secs(60)).await;

    let attack_started = Instant::now();
    let give_up = CLIENT_TIMEOUT + CLOSE_SLACK + Duration::from_secs(5);
    let slow: Vec<_> = (0..SLOW_CONNECTIONS)
        .map(|_| tokio::spawn(slow_client(port, give_up)))
        .collect();

    // (a) Normal requests are answered promptly while the slow connections are open.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let (path, expected) = normal;
    let mut slowest = Duration::ZERO;
    let mut answered = 0;
    while attack_started.elapsed() < CLIENT_TIMEOUT + Duration::from_millis(500) {
        for probe in ["/healthz", path] {
            let sent = Instant::now();
            let response = tokio::time::timeout(
                PROMPT * 5,
                client
                    .get(format!("http://127.0.0.1:{port}{probe}"))
                    .bearer_auth(ADMIN_TOKEN)
                    .send(),
            )
            .await
            .unwrap_or_else(|_| panic!("{service}: GET {probe} unanswered during the attack"))
            .unwrap_or_else(|e| panic!("{service}: GET {probe} failed during the attack: {e}"));
            let took = sent.elapsed();
            let want = if probe == "/healthz" { 200 } else { expected };
            assert_eq!(response.status().as_u16(), want, "{service}: GET {probe}");
            slowest = slowest.max(took);
            answered += 1;
        }
    }
    assert!(
        slowest < PROMPT,
        "{service}: the slowest normal request took {slowest:?} during the attack"
    );

    // (b) Every slow connection is closed by the server after the client timeout.
    let mut ended = Vec::new();
    for task in slow {
        let result = task.await.expect("the slow client task");
        ended.push(result.unwrap_or_else(|| {
            panic!("{service}: a slow connection was still open after {give_up:?}")
        }));
    }
    let earliest = ended.iter().map(|e| e.after).min().unwrap();
    let latest = ended.iter().map(|e| e.after).max().unwrap();
    let with_408 = ended.iter().filter(|e| e.answered_408).count();
    // actix-web reads the time from a clock it updates every 500 ms, so a deadline may come
    // up to half a second early.
    assert!(
        earliest >= CLIENT_TIMEOUT - Duration::from_millis(600),
        "{service}: a slow connection was closed after {earliest:?}, before the client timeout"
    );
    assert!(
        latest <= CLIENT_TIMEOUT + CLOSE_SLACK,
        "{service}: a slow connection was closed only after {latest:?}"
    );
    eprintln!(
        "{service}: {SLOW_CONNECTIONS} slow connections closed after {earliest:.2?} to {latest:.2?} \
         ({with_408} with a 408); {answered} normal requests meanwhile, the slowest {slowest:.2?}"
    );

    // And afterwards the service still serves.
    wait_for(
        &format!("{service} to answer after the attack"),
        Duration::from_secs(10),
        || {
            let client = client.clone();
            async move {
                let response = client
                    .get(format!("http://127.0.0.1:{port}/healthz"))
                    .send()
                    .await
                    .ok()?;
                response.status().is_success().then_some(())
            }
        },
    )
    .await;
    let _ = std::fs::remove_file(&log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_closes_slow_clients_and_keeps_serving() {
    attack(
        "ingest",
        vec![("TOCSIN_INGEST_ADDR", "127.0.0.1:{port}".to_owned())],
        ("/metrics", 200),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispatcher_closes_slow_clients_and_keeps_serving() {
    attack(
        "dispatcher",
        vec![("TOCSIN_DISPATCHER_ADDR", "127.0.0.1:{port}".to_owned())],
        ("/readyz", 200),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_closes_slow_clients_and_keeps_serving() {
    attack(
        "admin",
        vec![
            ("TOCSIN_ADMIN_ADDR", "127.0.0.1:{port}".to_owned()),
            ("TOCSIN_ADMIN_TOKEN", ADMIN_TOKEN.to_owned()),
        ],
        ("/api/v1/webhooks", 200),
    )
    .await;
}
