//! Shared pieces of the benches and the load harness.
