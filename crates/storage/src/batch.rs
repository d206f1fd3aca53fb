//! Gathers requests made concurrently into batches, so that concurrent work shares one database
//! transaction (one commit, one WAL flush) instead of paying for one each.
//!
//! A [`Batcher`] runs a few worker tasks. Each takes the first waiting request, every other one
//! already waiting (up to a maximum), hands them to the handler together and sends each caller
//! its own answer. Nothing waits for a batch to fill: under light load a batch holds one request
//! and adds no latency; under heavy load the requests that arrive while a batch is being written
//! form the next one.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Mutex};

struct Job<Req, Resp> {
    request: Req,
    reply: oneshot::Sender<Resp>,
}

/// The batcher's workers are gone (the handler panicked, or the runtime is stopping).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the batch worker stopped")]
pub struct BatcherStopped;

/// A handle to submit requests; cheap to clone. The workers stop when every handle is dropped.
pub struct Batcher<Req, Resp> {
    queue: mpsc::Sender<Job<Req, Resp>>,
}

impl<Req, Resp> Clone for Batcher<Req, Resp> {
    fn clone(&self) -> Self {
        Batcher {
            queue: self.queue.clone(),
        }
    }
}

impl<Req: Send + 'static, Resp: Send + 'static> Batcher<Req, Resp> {
    /// Starts `workers` tasks that call `handler` with up to `max_batch` requests at a time. The
    /// handler must answer with one response per request, in order.
    pub fn start<H, Fut>(max_batch: usize, workers: usize, handler: H) -> Self
    where
        H: Fn(Vec<Req>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Resp>> + Send + 'static,
    {
        let max_batch = max_batch.max(1);
        let (queue, receiver) = mpsc::channel(max_batch * workers.max(1) * 2);
        let receiver = Arc::new(Mutex::new(receiver));
        let handler = Arc::new(handler);
        for _ in 0..workers.max(1) {
            tokio::spawn(work(receiver.clone(), handler.clone(), max_batch));
        }
        Batcher { queue }
    }

    /// Submits one request and waits for its answer.
    pub async fn call(&self, request: Req) -> Result<Resp, BatcherStopped> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Job { request, reply })
            .await
            .map_err(|_| BatcherStopped)?;
        answer.await.map_err(|_| BatcherStopped)
    }
}

async fn work<Req, Resp, H, Fut>(
    receiver: Arc<Mutex<mpsc::Receiver<Job<Req, Resp>>>>,
    handler: Arc<H>,
    max_batch: usize,
) where
    H: Fn(Vec<Req>) -> Fut,
    Fut: Future<Output = Vec<Resp>>,
{
    loop {
        let jobs = {
            let mut receiver = receiver.lock().await;
            let Some(first) = receiver.recv().await else {
                return;
            };
            let mut jobs = vec![first];
            while jobs.len() < max_batch {
                match receiver.try_recv() {
                    Ok(job) => jobs.push(job),
                    Err(_) => break,
                }
            }
            jobs
        };
        let (requests, replies): (Vec<Req>, Vec<oneshot::Sender<Resp>>) =
            jobs.into_iter().map(|job| (job.request, job.reply)).unzip();
        let responses = handler(requests).await;
        debug_assert_eq!(responses.len(), replies.len());
        for (reply, response) in replies.into_iter().zip(responses) {
            // The caller may have given up (its task was cancelled): its answer is dropped.
            let _ = reply.send(response);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn each_caller_gets_its_own_answer_and_concurrent_calls_share_batches() {
        let batches = Arc::new(AtomicUsize::new(0));
        let counted = batches.clone();
        let batcher = Batcher::start(16, 1, move |requests: Vec<u32>| {
            counted.fetch_add(1, Ordering::SeqCst);
            async move {
                // Long enough for the other callers to queue up behind the first batch.
                tokio::task::yield_now().await;
                requests.into_iter().map(|n| n * 10).collect()
            }
        });
        let calls = (0..64u32).map(|n| {
            let batcher = batcher.clone();
            tokio::spawn(async move { (n, batcher.call(n).await.unwrap()) })
        });
        for call in futures::future::join_all(calls).await {
            let (n, answer) = call.unwrap();
            assert_eq!(answer, n * 10);
        }
        let batches = batches.load(Ordering::SeqCst);
        assert!(
            (4..64).contains(&batches),
            "64 concurrent calls in batches of at most 16 took {batches} batches"
        );
    }

    #[tokio::test]
    async fn a_panicking_handler_fails_the_call_instead_of_hanging_it() {
        let batcher = Batcher::start(4, 1, |requests: Vec<u32>| async move {
            assert!(requests.is_empty(), "the handler fails");
            requests
        });
        let answer = batcher.call(1).await;
        assert!(answer.is_err());
    }
}
