//! Calls to the API server with back-off: what is worth retrying (409 Conflict, 429, 5xx,
//! timeouts and connection errors) is retried with a log line, from 100 ms doubling to 2 s,
//! for at most the budget; then the call fails with the last error.
//!
//! A watch counts as answered when its response headers arrive, so the budget bounds starting
//! a watch, not the stream.

use std::future::Future;
use std::time::{Duration, Instant};

/// Whether `error` may go away by itself.
pub fn retryable(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(response) => {
            (response.code == 409 && response.reason != "AlreadyExists")
                || response.code == 429
                || response.code >= 500
        }
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => true,
        _ => false,
    }
}

/// The HTTP status of an API error, if it is one.
pub fn status_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(response) => Some(response.code),
        _ => None,
    }
}

/// Runs `call` until it succeeds, fails with an error not worth retrying, or `budget` has
/// passed since the first attempt (then the last error is returned). Each attempt may take at
/// most what is left of the budget (at least 100 ms): one that takes longer counts as a
/// timeout, so a hung API server fails the call in about `budget`. Each retry logs `what`.
pub async fn with_retry<T, F, Fut>(what: &str, budget: Duration, mut call: F) -> kube::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = kube::Result<T>>,
{
    let start = Instant::now();
    let mut delay = Duration::from_millis(100);
    let mut attempt = 1u32;
    loop {
        let left = budget
            .saturating_sub(start.elapsed())
            .max(Duration::from_millis(100));
        let result = match tokio::time::timeout(left, call()).await {
            Ok(result) => result,
            Err(elapsed) => Err(kube::Error::Service(Box::new(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {} ms ({elapsed})", left.as_millis()),
            )))),
        };
        match result {
            Ok(value) => {
                if attempt > 1 {
                    tracing::info!("{what}: succeeded after {attempt} attempts");
                }
                return Ok(value);
            }
            Err(error) if retryable(&error) && start.elapsed() + delay < budget => {
                tracing::warn!(
                    "{what}: {error}; retrying in {} ms (attempt {attempt})",
                    delay.as_millis()
                );
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
                attempt += 1;
            }
            Err(error) => return Err(error),
        }
    }
}
