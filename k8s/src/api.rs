//! Calls to the API server with back-off: what is worth retrying (409 Conflict, 429, 5xx,
//! timeouts and connection errors) is retried with a log line, from 100 ms doubling to 2 s,
//! for at most the budget; then the call fails with the last error.
//!
//! A watch counts as answered when its response headers arrive, so the budget bounds starting
//! a watch, not the stream.

use std::future::Future;

/// The Kubernetes version flint-k8s is built for: k8s-openapi's feature `v1_30`.
pub const BUILT_FOR: (u32, u32) = (1, 30);
/// The API server versions flint-k8s supports: kube 2's window around [`BUILT_FOR`]. It uses
/// only core v1 pods and secrets, whose fields it reads have not changed in that window.
pub const SUPPORTED_MINORS: std::ops::RangeInclusive<u32> = 26..=34;

/// What to say about an API server of version `major.minor` (from `/version`), if anything:
/// outside [`SUPPORTED_MINORS`] it may send another shape, and a missing field then fails the
/// call that meets it with the field's name.
pub fn version_warning(major: &str, minor: &str) -> Option<String> {
    // Minor versions of some distributions carry a '+' ("30+").
    let digits: String = minor.chars().take_while(char::is_ascii_digit).collect();
    let supported = major == "1" && digits.parse().is_ok_and(|m| SUPPORTED_MINORS.contains(&m));
    (!supported).then(|| {
        format!(
            "the API server is Kubernetes {major}.{minor}; flint-k8s is built for {}.{} and supports 1.{}-1.{}: a field it needs that this server lacks fails with its name",
            BUILT_FOR.0,
            BUILT_FOR.1,
            SUPPORTED_MINORS.start(),
            SUPPORTED_MINORS.end()
        )
    })
}
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_outside_the_window_are_named() {
        assert_eq!(version_warning("1", "30"), None);
        assert_eq!(version_warning("1", "34+"), None);
        let old = version_warning("1", "19").expect("a warning");
        assert!(
            old.contains("Kubernetes 1.19") && old.contains("1.26-1.34"),
            "{old}"
        );
        assert!(version_warning("1", "35").is_some());
        assert!(version_warning("2", "0").is_some());
        assert!(
            version_warning("1", "").is_some(),
            "unreadable is not supported"
        );
    }
}
