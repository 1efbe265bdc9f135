//! The `flint` command line as a library: the job flags and running one job from them
//! ([`run`]), its stop on SIGTERM or SIGINT ([`stop`]), and the summary a run prints
//! ([`summary`], its latencies counted by [`latency`]). Kept out of `flint-net` so embedding
//! the engine does not pull clap, tracing-subscriber and hdrhistogram; `flint-k8s` and
//! `flint-load` run and summarize jobs through it the same way the `flint` binary does.
#![deny(missing_docs)]

pub mod latency;
pub mod run;
pub mod stop;
pub mod summary;
