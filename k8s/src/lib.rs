//! Flint on Kubernetes: executors as pods in the application's namespace, created, watched,
//! polled and deleted through the API server with kube-rs, after Spark on Kubernetes.
//!
//! - [`pods`]: the executor pod (labels, command, the shared secret by `secretKeyRef`, the
//!   owner reference) and what a pod's phase means as an executor state;
//! - [`api`]: retries with back-off for API errors worth retrying;
//! - [`executors`]: [`executors::K8sExecutors`], the watch and polling sources feeding the
//!   engine's snapshot store, the allocator's creates and deletes as pod creates and deletes,
//!   the lifecycle handler removing gone executors from the driver's scheduler;
//! - `double` (feature `double`, for tests; not in a default build): a test double of the API
//!   server's pods and secrets over real HTTP, with a "kubelet" that runs each pod's command
//!   as a local process (what the tests run against).
//!
//! The `flint-k8s` binary (`flint-k8s submit`, also reached as `flint submit --master
//! k8s://...`) runs a driver here (client mode) with its executors as pods.
#![deny(missing_docs)]

pub mod api;
#[cfg(feature = "double")]
pub mod double;
pub mod executors;
pub mod pods;
