//! A receiver on loopback that answers in raw bytes instead of through an HTTP server library,
//! for the hostile-target tests: it reads each request (its head and `Content-Length` body),
//! then writes exactly what the test says, however malformed or slow: NUL bytes, invalid
//! UTF-8, a body far over any cap, a body dripped byte by byte, a reset, a chunked body that
//! never ends, or nothing at all (an `https://` URL's TLS handshake then stalls).
//!
//! One request per connection. Every connection is served for [`CONNECTION_LIMIT`] at most,
//! and the receiver's tasks stop when it is dropped.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// The longest one connection is served, whatever the behaviour: far past any test's timeout.
pub const CONNECTION_LIMIT: Duration = Duration::from_secs(60);

/// The most bytes of a request's head, and of its body, that are read.
const REQUEST_LIMIT: usize = 1024 * 1024;

/// How the raw receiver answers each connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawBehavior {
    /// Reads the request, writes these bytes, then closes the connection.
    Raw(Vec<u8>),
    /// Reads the request, writes `head`, then `body` one byte every `every`, then closes.
    Drip {
        head: Vec<u8>,
        body: Vec<u8>,
        every: Duration,
    },
    /// Reads the request, then resets the connection (an RST, no FIN).
    Reset,
    /// Reads the request, answers `200` with a chunked body, and sends a chunk every 100 ms
    /// until the client goes away.
    NeverEndingChunked,
    /// Writes these bytes as soon as the connection is accepted, reads nothing as HTTP, and
    /// keeps the connection open until the client closes it (for a TLS client: garbage where
    /// its server's handshake should be).
    OnConnect(Vec<u8>),
    /// Accepts the connection and never writes a byte: an HTTP client waits for its answer, a
    /// TLS client's handshake stalls.
    Silent,
}

impl RawBehavior {
    /// Writes [`response`]`(status_line, headers, body)`.
    pub fn answer(status_line: &str, headers: &[String], body: &[u8]) -> RawBehavior {
        RawBehavior::Raw(response(status_line, headers, body))
    }

    /// `200 OK` with `body` as is.
    pub fn ok_with_body(body: &[u8]) -> RawBehavior {
        Self::answer("200 OK", &[], body)
    }
}

/// A whole answer: `status_line` (such as `200 OK`), the `headers` lines given (such as
/// `location: /x`), the body's `Content-Length`, then `body` as is; see [`head`].
pub fn response(status_line: &str, headers: &[String], body: &[u8]) -> Vec<u8> {
    let mut bytes = head(
        status_line,
        headers
            .iter()
            .cloned()
            .chain([format!("content-length: {}", body.len())]),
    );
    bytes.extend_from_slice(body);
    bytes
}

/// The head of an answer: `HTTP/1.1 <status_line>`, the header lines, `Connection: close`
/// (so that the client never reuses the connection), and the blank line.
pub fn head(status_line: &str, headers: impl IntoIterator<Item = String>) -> Vec<u8> {
    let mut text = format!("HTTP/1.1 {status_line}\r\n");
    for line in headers {
        text.push_str(&line);
        text.push_str("\r\n");
    }
    text.push_str("connection: close\r\n\r\n");
    text.into_bytes()
}

/// Response bodies for property tests, up to 4 KiB: arbitrary bytes, bytes rich in NUL and
/// in the starts of multi-byte UTF-8 sequences left unfinished, and arbitrary Unicode text.
pub fn arbitrary_bodies() -> impl Strategy<Value = Vec<u8>> {
    let hostile_byte = prop_oneof![
        Just(0u8),
        Just(0xffu8),
        Just(0xc3u8),
        0x20u8..0x7f,
        any::<u8>()
    ];
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..4096),
        proptest::collection::vec(hostile_byte, 0..4096),
        any::<String>().prop_map(String::into_bytes),
    ]
}

/// A request the raw receiver read.
#[derive(Debug, Clone)]
pub struct RawRequest {
    /// The request line and headers, as text (invalid UTF-8 replaced).
    pub head: String,
    pub body: Vec<u8>,
    pub at: Instant,
}

impl RawRequest {
    /// The request line, such as `POST /hook HTTP/1.1`.
    pub fn request_line(&self) -> &str {
        self.head.lines().next().unwrap_or_default()
    }

    /// A header's value (case-insensitive name).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

struct State {
    behavior: RawBehavior,
    connections: usize,
    requests: Vec<RawRequest>,
}

/// A running raw receiver; its tasks and connections stop when it is dropped.
pub struct RawReceiver {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

impl RawReceiver {
    /// Starts a receiver answering every connection with `behavior`.
    pub async fn start(behavior: RawBehavior) -> RawReceiver {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding a raw receiver");
        let addr = listener.local_addr().expect("raw receiver address");
        let state = Arc::new(Mutex::new(State {
            behavior,
            connections: 0,
            requests: Vec::new(),
        }));
        let shared = state.clone();
        // The connections' tasks live in the accept loop's set: aborting the loop drops the
        // set, which aborts them.
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { break };
                        let state = shared.clone();
                        connections.spawn(async move {
                            let _ = tokio::time::timeout(CONNECTION_LIMIT, serve(stream, state)).await;
                        });
                    }
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        RawReceiver { addr, state, task }
    }

    /// The `http://` URL of `path` on this receiver.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// The `https://` URL of `path` on this receiver (which speaks no TLS itself).
    pub fn https_url(&self, path: &str) -> String {
        format!("https://{}{}", self.addr, path)
    }

    /// Changes how later connections are answered.
    pub fn set_behavior(&self, behavior: RawBehavior) {
        self.state.lock().expect("raw receiver state").behavior = behavior;
    }

    /// How many connections were accepted.
    pub fn connections(&self) -> usize {
        self.state.lock().expect("raw receiver state").connections
    }

    /// Every request read so far.
    pub fn requests(&self) -> Vec<RawRequest> {
        self.state
            .lock()
            .expect("raw receiver state")
            .requests
            .clone()
    }

    pub fn count(&self) -> usize {
        self.state
            .lock()
            .expect("raw receiver state")
            .requests
            .len()
    }

    /// Waits until at least `n` requests were read; panics after `deadline`.
    pub async fn wait_for_requests(&self, n: usize, deadline: Duration) -> Vec<RawRequest> {
        crate::wait_for(
            &format!("{n} requests at the raw receiver {}", self.addr),
            deadline,
            || async {
                let requests = self.requests();
                (requests.len() >= n).then_some(requests)
            },
        )
        .await
    }
}

impl Drop for RawReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves one connection as the behaviour of the moment says. Write errors end it: the client
/// went away.
async fn serve(mut stream: TcpStream, state: Arc<Mutex<State>>) -> std::io::Result<()> {
    let behavior = {
        let mut state = state.lock().expect("raw receiver state");
        state.connections += 1;
        state.behavior.clone()
    };
    match behavior {
        RawBehavior::OnConnect(bytes) => {
            stream.write_all(&bytes).await?;
            return drain(&mut stream).await;
        }
        RawBehavior::Silent => return drain(&mut stream).await,
        _ => {}
    }
    let Some(request) = read_request(&mut stream).await? else {
        return Ok(());
    };
    state
        .lock()
        .expect("raw receiver state")
        .requests
        .push(request);
    match behavior {
        RawBehavior::Raw(bytes) => {
            stream.write_all(&bytes).await?;
            stream.shutdown().await
        }
        RawBehavior::Drip { head, body, every } => {
            stream.write_all(&head).await?;
            for byte in body {
                tokio::time::sleep(every).await;
                stream.write_all(&[byte]).await?;
            }
            stream.shutdown().await
        }
        RawBehavior::Reset => {
            // Closing with a zero linger sends an RST instead of a FIN.
            stream.set_zero_linger()?;
            drop(stream);
            Ok(())
        }
        RawBehavior::NeverEndingChunked => {
            stream
                .write_all(&head("200 OK", ["transfer-encoding: chunked".to_owned()]))
                .await?;
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tick.tick().await;
                stream.write_all(b"6\r\nchunk \r\n").await?;
            }
        }
        RawBehavior::OnConnect(_) | RawBehavior::Silent => Ok(()),
    }
}

/// Reads and discards until the client closes the connection.
async fn drain(stream: &mut TcpStream) -> std::io::Result<()> {
    let mut buffer = [0u8; 4096];
    while stream.read(&mut buffer).await? > 0 {}
    Ok(())
}

/// Reads a request's head and its `Content-Length` body; `None` when the client closed the
/// connection first or sent a head over [`REQUEST_LIMIT`].
async fn read_request(stream: &mut TcpStream) -> std::io::Result<Option<RawRequest>> {
    let mut read = Vec::new();
    let mut buffer = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = read.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        if read.len() > REQUEST_LIMIT {
            return Ok(None);
        }
        let n = stream.read(&mut buffer).await?;
        if n == 0 {
            return Ok(None);
        }
        read.extend_from_slice(&buffer[..n]);
    };
    let at = Instant::now();
    let mut body = read.split_off(head_end);
    let request = RawRequest {
        head: String::from_utf8_lossy(&read).into_owned(),
        body: Vec::new(),
        at,
    };
    let length = request
        .header("content-length")
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(0)
        .min(REQUEST_LIMIT);
    while body.len() < length {
        let n = stream.read(&mut buffer).await?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&buffer[..n]);
    }
    body.truncate(length);
    Ok(Some(RawRequest { body, ..request }))
}
