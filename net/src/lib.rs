//! Flint: a task scheduling engine for latency-sensitive services, after the scheduling core of
//! Apache Spark.
//!
//! A *job* is a function name and one payload per task. A [`Driver`] inside your service
//! schedules the tasks on *executors* (processes holding a [`Registry`] of functions by name)
//! and hands back each job's [`JobOutcome`]: the results in task order, or why it failed.
//! Executors that die or stall have their tasks re-run elsewhere; slow tasks are speculated;
//! jobs share the executors FIFO or FAIR ([`pools`]).
//!
//! # Embedding
//!
//! - **The driver** lives in your service: [`Driver::builder`], then [`Driver::submit`] (blocks
//!   only when the driver's inbox is full), [`Driver::try_submit`] (never blocks) or
//!   [`Driver::submit_async`]. Each returns a [`JobHandle`]: wait on it
//!   ([`JobHandle::wait_timeout`]), `.await` it (it is a `Future`), or read results as they
//!   come ([`Job::stream_results`], [`JobHandle::results`], [`JobHandle::results_stream`]).
//!   Dropping a handle cancels its job unless it is [detached](JobHandle::detach).
//! - **Local mode** ([`DriverBuilder::local`]) runs the tasks on a pool inside the driver's
//!   process: the same jobs and functions with no sockets, for tests and small deployments.
//! - **Executors** are processes that connect to the driver's address. The stock
//!   `flint executor` knows the built-in functions; to run your own, your binary calls
//!   [`executor::run`] with your [`Registry`] (see `examples/embed.rs`). A task function gets a
//!   [`TaskContext`] and its payload, and returns bytes or a [`TaskError`].
//! - **Security**: a driver listening beyond loopback needs a shared [`Secret`] (from a file,
//!   [`SECRET_ENV`], or [`Secret::generate`]); every peer proves it holds the secret in the
//!   handshake and is otherwise untrusted.
//!
//! # Starting each role
//!
//! A role that returns a handle to a running loop is *started*; a role that occupies its thread
//! until it ends is *run*. Each has one error type.
//!
//! | role | how it starts | error |
//! | --- | --- | --- |
//! | driver | [`Driver::builder`]`().…start()` | [`DriverError`] |
//! | executor | [`executor::run`]`(config, registry)` | [`ExecutorError`] |
//! | master | [`MasterHandle::start`]`(config)` | [`MasterError`] |
//! | worker | [`standalone::worker::run`]`(config)` | [`WorkerError`] |
//! | application client | [`AppClient::start`]`(config)` | [`AppClientError`] |
//!
//! # Where executors come from
//!
//! - Started by hand, or by your own deployment, pointed at the driver's address.
//! - [`lifecycle::local::LocalExecutors`]: `flint executor` child processes kept at a target count,
//!   with dynamic allocation (the executor lifecycle).
//! - [`lifecycle::LifecycleThread`] over your own [`lifecycle::ExecutorBackend`]: executors a
//!   cluster manager creates, deletes, lists and watches, kept at a target or followed so the
//!   driver drops the ones that are gone.
//! - The standalone cluster (Spark's): a [`standalone::master`] and [`standalone::worker`]s on the hosts; the driver's
//!   [`AppClient`] registers the application and asks for executors, which the workers start;
//!   [`lifecycle::master::MasterExecutors`] follows them and scales them with the backlog.
//! - Kubernetes: the `flint-k8s` crate runs executors as pods.
//!
//! # Watching it
//!
//! [`Driver::observer`] answers what the driver's loop holds ([`observe`]); [`observe::metrics`] renders
//! it for Prometheus and [`observe::ui`] as web pages.
//!
//! The `flint` command line (`flint local`, `driver`, `executor`, `master`, `worker`, `submit`,
//! `status`) is the `flint-cli` crate, so this one builds no argument parser.
//!
//! # Example: a job in local mode
//!
//! ```
//! use std::time::Duration;
//!
//! use flint_net::{Bytes, Driver, Job, JobOutcome, Registry, TaskError};
//!
//! let mut registry = Registry::new();
//! registry.register("word_count", |_ctx, payload: Bytes| {
//!     let text = std::str::from_utf8(&payload).map_err(|e| TaskError::new(e.to_string()))?;
//!     let words = text.split_whitespace().count() as u64;
//!     Ok(Bytes::copy_from_slice(&words.to_le_bytes()))
//! });
//! let driver = Driver::builder().local(2, registry).start()?;
//!
//! let lines = ["the quick brown fox", "jumps over", "the lazy dog"];
//! let job = Job::new("word_count", lines.iter().map(|l| Bytes::from(*l)).collect());
//! let handle = driver.submit(job)?;
//! let Ok(JobOutcome::Succeeded(results)) = handle.wait_timeout(Duration::from_secs(30)) else {
//!     panic!("the job did not succeed");
//! };
//! let counts: Vec<u64> = results
//!     .iter()
//!     .map(|r| u64::from_le_bytes(r[..].try_into().expect("8 bytes")))
//!     .collect();
//! assert_eq!(counts, [4, 2, 3]);
//! driver.shutdown();
//! # Ok::<(), flint_net::DriverError>(())
//! ```
//!
//! # Example: async submission, results as they come
//!
//! ```no_run
//! use std::pin::Pin;
//!
//! use flint_net::{Bytes, Driver, Job, JobOutcome, Secret};
//! use futures_core::Stream;
//!
//! async fn serve(driver: &Driver, payloads: Vec<Bytes>) -> Result<(), flint_net::DriverError> {
//!     // Results are streamed and not kept: the outcome carries none.
//!     let job = Job::new("hash", payloads).stream_results().keep_results(false);
//!     let mut handle = driver.submit_async(job).await?;
//!     let mut stream = handle.results_stream();
//!     while let Some((task, result)) =
//!         std::future::poll_fn(|cx| Pin::new(&mut stream).poll_next(cx)).await
//!     {
//!         match result {
//!             Ok(bytes) => println!("task {task}: {} bytes", bytes.len()),
//!             Err(reason) => println!("task {task} failed: {reason}"),
//!         }
//!     }
//!     assert!(matches!(handle.await, JobOutcome::Succeeded(_)));
//!     Ok(())
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Executors connect from other hosts, so the driver listens beyond loopback with a secret.
//! let driver = Driver::builder()
//!     .listen("0.0.0.0:7078".parse()?)
//!     .secret(Secret::from_env(flint_net::SECRET_ENV)?)
//!     .start()?;
//! driver.wait_for_executors(2, std::time::Duration::from_secs(30))?;
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

mod admission;
mod conn;
#[doc(hidden)]
pub mod files;

// Internals being reworked (the one transport): hidden rather than private until they settle,
// so their test-only accessors do not warn as dead code.
#[doc(hidden)]
pub mod transport;

// The embedding API.
pub mod driver;
pub mod executor;
pub mod job;
pub mod pools;

// The standalone cluster: master, workers, the application client.
pub mod standalone;

// A daemon's stop on SIGTERM or SIGINT (the master and worker roles).
pub mod signals;

// The executor lifecycle: executors something else creates, kept at a target.
pub mod lifecycle;

// What a process shows about itself: views, metrics, the web UI.
pub mod observe;

// For the fuzzers, benches, tests and the CLI's own tools, not for embedders: the handshake and
// the wire protocol, and (feature `sim`, not in a default build) the cluster simulator over
// the real driver and executor cores.
#[doc(hidden)]
pub mod handshake;
#[doc(hidden)]
pub mod seal;
#[cfg(feature = "sim")]
#[doc(hidden)]
pub mod sim;
#[doc(hidden)]
pub mod wire;

pub use bytes::Bytes;

pub use driver::{Driver, DriverBuilder, DriverConfig, DriverError, DriverObserver, Rejected};
pub use executor::{ExecutorConfig, ExecutorError, ExecutorSummary};
pub use flint_engine::functions::{Registry, TaskContext, TaskError};
pub use handshake::{Secret, SecretError, SECRET_ENV};
pub use job::{Job, JobHandle, JobOutcome, ResultStream, TaskResult};

pub use standalone::app_client::{AppClient, AppClientConfig, AppClientError};
pub use standalone::master::{MasterConfig, MasterError, MasterHandle};
pub use standalone::worker::{WorkerConfig, WorkerError};
pub use standalone::{ClientError, JournalError};
