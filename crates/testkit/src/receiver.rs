//! A real HTTP receiver on loopback for webhook deliveries: it records every request and answers
//! as the test tells it (a status, slowly, never, by closing the connection, with a redirect).

use std::collections::VecDeque;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::combinators::UnsyncBoxBody as BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// How the receiver answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Behavior {
    /// Answers this status with a short body.
    Status(u16),
    /// Waits, then answers the status.
    Delay(Duration, u16),
    /// Never answers (until the client gives up).
    Hang,
    /// Reads the request and closes the connection without an answer.
    Close,
    /// Answers 302 to this location.
    Redirect(String),
    /// Answers the status and the start of a body, then never the rest.
    SlowBody(u16),
    /// Answers the status and the start of a body, then (100 ms later) breaks the connection.
    BrokenBody(u16),
    /// Answers the status with a body of this many bytes (`x` repeated).
    Body(u16, usize),
    /// Answers the first request about each incident (the body's `data.id`) with this status,
    /// and every later one 204: a receiver that fails each incident's first request once.
    FirstOfEachIncident(u16),
}

/// A request the receiver got.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub at: Instant,
    /// The status the receiver answered with (`None`: it hung or closed the connection).
    pub answered: Option<u16>,
}

impl Received {
    /// A header's value (case-insensitive name).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("the received body is JSON")
    }
}

#[derive(Default)]
struct State {
    received: Vec<Received>,
    /// Answers for given paths, ahead of the script and the default.
    by_path: std::collections::HashMap<String, Behavior>,
    /// Answers for the next requests, in order; then `default`.
    script: VecDeque<Behavior>,
    default: Option<Behavior>,
    /// The incidents a request was received about (for `FirstOfEachIncident`).
    incidents: std::collections::HashSet<String>,
}

/// A running receiver.
#[derive(Clone)]
pub struct Receiver {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

impl Receiver {
    /// Starts a receiver that answers 200.
    pub async fn start() -> Receiver {
        Self::start_with(Behavior::Status(200)).await
    }

    /// Starts a receiver with a default behaviour.
    pub async fn start_with(default: Behavior) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding a receiver");
        let addr = listener.local_addr().expect("receiver address");
        let state = Arc::new(Mutex::new(State {
            default: Some(default),
            ..State::default()
        }));
        let shared = state.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = shared.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| handle(state.clone(), req));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Receiver { addr, state }
    }

    /// The URL of `path` on this receiver.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Changes how later requests are answered.
    pub fn set_behavior(&self, behavior: Behavior) {
        let mut state = self.state.lock().expect("receiver state");
        state.script.clear();
        state.default = Some(behavior);
    }

    /// Answers every request for `path` this way (ahead of the script and the default).
    pub fn set_path_behavior(&self, path: &str, behavior: Behavior) {
        self.state
            .lock()
            .expect("receiver state")
            .by_path
            .insert(path.to_owned(), behavior);
    }

    /// Answers the next requests in this order, then falls back to the default.
    pub fn script(&self, answers: impl IntoIterator<Item = Behavior>) {
        self.state.lock().expect("receiver state").script = answers.into_iter().collect();
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Received> {
        self.state.lock().expect("receiver state").received.clone()
    }

    pub fn count(&self) -> usize {
        self.state.lock().expect("receiver state").received.len()
    }

    /// Waits until at least `n` requests arrived; panics after `deadline`.
    pub async fn wait_for_requests(&self, n: usize, deadline: Duration) -> Vec<Received> {
        crate::wait_for(
            &format!("{n} requests at {}", self.addr),
            deadline,
            || async {
                let requests = self.requests();
                (requests.len() >= n).then_some(requests)
            },
        )
        .await
    }
}

async fn handle(
    state: Arc<Mutex<State>>,
    req: Request<Incoming>,
) -> Result<Response<BoxBody<Bytes, std::io::Error>>, std::io::Error> {
    let at = Instant::now();
    let method = req.method().to_string();
    let path = req.uri().path().to_owned();
    let headers = req
        .headers()
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes().to_vec())
        .unwrap_or_default();
    let behavior = {
        let mut state = state.lock().expect("receiver state");
        let for_path = state.by_path.get(&path).cloned();
        let mut behavior = for_path
            .or_else(|| state.script.pop_front())
            .or_else(|| state.default.clone())
            .unwrap_or(Behavior::Status(200));
        if let Behavior::FirstOfEachIncident(status) = behavior {
            let incident = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["data"]["id"].as_str().map(str::to_owned))
                .unwrap_or_default();
            let first = state.incidents.insert(incident);
            behavior = Behavior::Status(if first { status } else { 204 });
        }
        let answered = match &behavior {
            Behavior::Status(status)
            | Behavior::Delay(_, status)
            | Behavior::SlowBody(status)
            | Behavior::BrokenBody(status)
            | Behavior::Body(status, _)
            | Behavior::FirstOfEachIncident(status) => Some(*status),
            Behavior::Redirect(_) => Some(302),
            Behavior::Hang | Behavior::Close => None,
        };
        state.received.push(Received {
            method,
            path,
            headers,
            body,
            at,
            answered,
        });
        behavior
    };
    let with_body = |status: u16, body: BoxBody<Bytes, std::io::Error>| {
        let mut response = Response::new(body);
        *response.status_mut() =
            hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::OK);
        response
    };
    let respond = |status: u16| {
        let body = Full::new(Bytes::from(format!("answer {status}")))
            .map_err(|never| match never {})
            .boxed_unsync();
        with_body(status, body)
    };
    // The first part of a body, then `rest` (pending forever, or an error).
    let partial =
        |rest: futures::stream::BoxStream<'static, Result<Frame<Bytes>, std::io::Error>>| {
            use futures::StreamExt;
            let first = futures::stream::once(async { Ok(Frame::data(Bytes::from("partial "))) });
            BodyExt::boxed_unsync(StreamBody::new(first.chain(rest)))
        };
    match behavior {
        Behavior::Status(status) | Behavior::FirstOfEachIncident(status) => Ok(respond(status)),
        Behavior::Delay(delay, status) => {
            tokio::time::sleep(delay).await;
            Ok(respond(status))
        }
        Behavior::Hang => {
            futures::future::pending::<()>().await;
            Ok(respond(200))
        }
        Behavior::Close => Err(std::io::Error::other("closing the connection on purpose")),
        Behavior::Body(status, size) => {
            let body = Full::new(Bytes::from(vec![b'x'; size]))
                .map_err(|never| match never {})
                .boxed_unsync();
            Ok(with_body(status, body))
        }
        Behavior::SlowBody(status) => {
            let rest = futures::stream::pending();
            Ok(with_body(status, partial(Box::pin(rest))))
        }
        Behavior::BrokenBody(status) => {
            // After a moment, so that the head and the first part go out before the break.
            let rest = futures::stream::once(async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                Err(std::io::Error::other("breaking the body on purpose"))
            });
            Ok(with_body(status, partial(Box::pin(rest))))
        }
        Behavior::Redirect(location) => {
            let mut response = respond(302);
            if let Ok(value) = hyper::header::HeaderValue::from_str(&location) {
                response
                    .headers_mut()
                    .insert(hyper::header::LOCATION, value);
            }
            Ok(response)
        }
    }
}
