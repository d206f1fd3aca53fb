//! The bench's own webhook receiver: a hyper 1 HTTP/1 server on 127.0.0.1 that records, for
//! every delivery of the current run, its `webhook-id`, the alert id it carries (`data.title`)
//! and when it arrived.
//!
//! Paths decide the answer: `/ok/...` answers 200 at once, `/fail/...` answers 500 (the
//! delivery goes to the retry queue), `/hang/...` answers nothing until the dispatcher gives up.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long `/hang/...` holds a request at most (longer than any webhook timeout, 30 s).
const HANG_FOR: Duration = Duration::from_secs(40);

/// One delivery that arrived.
#[derive(Debug, Clone)]
pub struct Arrival {
    /// The request path, which names the webhook (`/ok/3`).
    pub path: String,
    /// `ok`, `fail` or `hang`: the first path segment.
    pub class: String,
    pub webhook_id: String,
    /// `data.title` of the body: the alert id the bench sent.
    pub title: String,
    pub at: Instant,
}

#[derive(Default)]
struct State {
    /// Only titles starting with this prefix belong to the current run.
    prefix: String,
    /// First arrival of each delivery of the current run.
    arrivals: Vec<Arrival>,
    seen: HashSet<String>,
    unique_by_class: HashMap<String, usize>,
    /// Arrivals of a `webhook-id` already seen, on `ok` paths (a retry of a failing path is not
    /// a duplicate).
    duplicates: usize,
    /// Later attempts of a delivery on `fail` paths.
    retries: usize,
    /// Deliveries that are not the current run's (other traffic, an earlier phase).
    foreign: usize,
}

/// A running receiver; stops when dropped.
pub struct BenchReceiver {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    changed: watch::Receiver<u64>,
    stop: CancellationToken,
}

impl Drop for BenchReceiver {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// What the receiver saw for the current run.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    pub arrivals: Vec<Arrival>,
    pub duplicates: usize,
    pub retries: usize,
    pub foreign: usize,
}

impl BenchReceiver {
    /// Binds 127.0.0.1 on a free port and serves until dropped.
    pub async fn start() -> anyhow::Result<BenchReceiver> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let (tx, changed) = watch::channel(0u64);
        let tx = Arc::new(tx);
        let stop = CancellationToken::new();
        let (shared, stopping) = (state.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let stream = tokio::select! {
                    _ = stopping.cancelled() => break,
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) => stream,
                        Err(_) => continue,
                    },
                };
                let _ = stream.set_nodelay(true);
                let (state, tx, stop) = (shared.clone(), tx.clone(), stopping.clone());
                tokio::spawn(async move {
                    let for_requests = stop.clone();
                    let service = service_fn(move |req| {
                        handle(state.clone(), tx.clone(), for_requests.clone(), req)
                    });
                    let connection =
                        http1::Builder::new().serve_connection(TokioIo::new(stream), service);
                    tokio::select! {
                        _ = connection => {}
                        _ = stop.cancelled() => {}
                    }
                });
            }
        });
        Ok(BenchReceiver {
            addr,
            state,
            changed,
            stop,
        })
    }

    /// The URL of `path` on this receiver.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Forgets everything and records only deliveries whose title starts with `prefix`.
    pub fn begin(&self, prefix: &str) {
        let mut state = self.state.lock().expect("receiver state");
        *state = State {
            prefix: prefix.to_owned(),
            ..State::default()
        };
    }

    /// Distinct deliveries of the current run on paths of this class.
    pub fn unique(&self, class: &str) -> usize {
        let state = self.state.lock().expect("receiver state");
        state.unique_by_class.get(class).copied().unwrap_or(0)
    }

    /// Waits until `n` distinct deliveries of the class arrived or the deadline passes; says
    /// whether they all arrived.
    pub async fn wait_for(&self, class: &str, n: usize, deadline: Instant) -> bool {
        let mut changed = self.changed.clone();
        loop {
            if self.unique(class) >= n {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            match tokio::time::timeout(left, changed.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return self.unique(class) >= n,
                Err(_) => return self.unique(class) >= n,
            }
        }
    }

    /// What arrived in the current run so far.
    pub fn seen(&self) -> Seen {
        let state = self.state.lock().expect("receiver state");
        Seen {
            arrivals: state.arrivals.clone(),
            duplicates: state.duplicates,
            retries: state.retries,
            foreign: state.foreign,
        }
    }
}

fn class_of(path: &str) -> String {
    path.trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or("")
        .to_owned()
}

async fn handle(
    state: Arc<Mutex<State>>,
    changed: Arc<watch::Sender<u64>>,
    stop: CancellationToken,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::io::Error> {
    let at = Instant::now();
    let path = req.uri().path().to_owned();
    let webhook_id = req
        .headers()
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let title = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["data"]["title"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let class = class_of(&path);
    {
        let mut state = state.lock().expect("receiver state");
        if state.prefix.is_empty() || !title.starts_with(&state.prefix) {
            state.foreign += 1;
        } else if !state.seen.insert(webhook_id.clone()) {
            if class == "fail" {
                state.retries += 1;
            } else {
                state.duplicates += 1;
            }
        } else {
            *state.unique_by_class.entry(class.clone()).or_default() += 1;
            state.arrivals.push(Arrival {
                path,
                class: class.clone(),
                webhook_id,
                title,
                at,
            });
        }
    }
    changed.send_modify(|n| *n += 1);
    let status = match class.as_str() {
        "fail" => StatusCode::INTERNAL_SERVER_ERROR,
        "hang" => {
            tokio::select! {
                _ = tokio::time::sleep(HANG_FOR) => {}
                _ = stop.cancelled() => {}
            }
            StatusCode::OK
        }
        _ => StatusCode::OK,
    };
    let mut response = Response::new(Full::new(Bytes::from_static(b"ok")));
    *response.status_mut() = status;
    Ok(response)
}
