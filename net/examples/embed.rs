//! Embedding Flint in a service: start a driver, let executors connect (here: one local
//! in-process executor, plus any `flint executor --driver ADDR` you start), register a
//! function, submit a job, wait for the results.
//!
//! `cargo run --release -p flint-net --example embed`

use std::time::Duration;

use bytes::Bytes;
use flint_net::driver::Driver;
use flint_net::functions::Registry;
use flint_net::job::{Job, JobOutcome};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut registry = Registry::with_builtins();
    registry.register("word_count", |_, payload| {
        let text = std::str::from_utf8(&payload)
            .map_err(|e| flint_net::functions::TaskError::new(e.to_string()))?;
        Ok(Bytes::from(
            (text.split_whitespace().count() as u64)
                .to_le_bytes()
                .to_vec(),
        ))
    });
    let driver = Driver::builder().local(2, registry).start()?;
    if let Some(addr) = driver.local_addr() {
        println!(
            "driver listening on {addr} (executors may join with `flint executor --driver {addr}`)"
        );
    }
    let lines = ["the quick brown fox", "jumps over", "the lazy dog", ""];
    let job = Job::new(
        "word_count",
        lines
            .iter()
            .map(|line| Bytes::from_static(line.as_bytes()))
            .collect(),
    );
    let handle = driver.submit(job)?;
    match handle.wait_timeout(Duration::from_secs(30)) {
        Ok(JobOutcome::Succeeded(results)) => {
            for (line, result) in lines.iter().zip(results) {
                let count = result
                    .first_chunk::<8>()
                    .map_or(0, |b| u64::from_le_bytes(*b));
                println!("{count:>2} words: {line:?}");
            }
            Ok(())
        }
        Ok(other) => Err(format!("job ended: {other:?}").into()),
        Err(_) => Err("job timed out".into()),
    }
}
