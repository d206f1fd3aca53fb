//! Waiting on a condition with a deadline, never a bare sleep.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `probe` every 20 ms until it returns `Some`, and returns that value; `None` when
/// `deadline` passes first (for a caller that says itself what was still missing).
pub async fn within<T, F, Fut>(deadline: Duration, mut probe: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = probe().await {
            return Some(value);
        }
        if start.elapsed() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `probe` every 20 ms until it returns `Some`, and returns that value. Panics naming
/// `what` when `deadline` passes first.
pub async fn wait_for<T, F, Fut>(what: &str, deadline: Duration, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    match within(deadline, probe).await {
        Some(value) => value,
        None => panic!("timed out after {deadline:?} waiting for {what}"),
    }
}

/// Polls `probe` until it returns `true`; panics naming `what` when `deadline` passes first.
pub async fn wait_until<F, Fut>(what: &str, deadline: Duration, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_for(what, deadline, || {
        let fut = probe();
        async move { fut.await.then_some(()) }
    })
    .await
}
