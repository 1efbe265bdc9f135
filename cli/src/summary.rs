//! The summary a job run prints (`flint local`, `flint driver`, `flint submit`, `flint-load`):
//! counts, throughput, submit-to-result latency percentiles from an HDR histogram (counted in
//! its buckets as results arrive, [`crate::latency`]), and the checksum anyone can recompute.
//!
//! The checksum is the wrapping `u64` sum over all tasks of the first 8 bytes of each result read
//! as `u64` little-endian (0 for a result shorter than 8 bytes).

use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;

use crate::latency::LatencyCounts;

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Latency {
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest.
    pub max: u64,
}

/// Collects results as they arrive.
#[derive(Debug)]
pub struct Recorder {
    latency_us: LatencyCounts,
    succeeded: u64,
    failed: u64,
    checksum: u64,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

impl Recorder {
    /// An empty recorder (latencies from 1 us to 1 hour, 3 significant digits).
    pub fn new() -> Self {
        Recorder {
            latency_us: LatencyCounts::new(),
            succeeded: 0,
            failed: 0,
            checksum: 0,
        }
    }

    /// One task's result and its submit-to-result latency.
    pub fn record(&mut self, result: Result<&[u8], &str>, latency: Duration) {
        self.record_ns(
            result,
            u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX),
        );
    }

    /// [`Recorder::record`] with the latency in nanoseconds, as a [`flint_engine::clock`]
    /// reading gives it (no `Duration` to make and take apart once per result).
    pub fn record_ns(&mut self, result: Result<&[u8], &str>, latency_ns: u64) {
        self.record_outcome(result);
        self.latency_us.record_us(latency_us_of(latency_ns));
    }

    /// One task's result without its latency, for a caller that counts latencies itself and
    /// hands them over with [`Recorder::add_latencies`] (the load harness counts each result's
    /// latency once, in the current interval's counts).
    #[inline]
    pub fn record_outcome(&mut self, result: Result<&[u8], &str>) {
        match result {
            Ok(bytes) => {
                self.succeeded += 1;
                self.checksum = self.checksum.wrapping_add(checksum_of(bytes));
            }
            Err(_) => self.failed += 1,
        }
    }

    /// Latencies counted elsewhere (in microseconds, [`latency_us_of`]), added to the ones
    /// recorded here.
    pub fn add_latencies(&mut self, counts: &LatencyCounts) {
        self.latency_us.add(counts);
    }

    /// Tasks recorded.
    pub fn tasks(&self) -> u64 {
        self.succeeded + self.failed
    }

    /// Tasks recorded as failed.
    pub fn failed(&self) -> u64 {
        self.failed
    }

    /// The latency histogram (for logs and reports), built from the counts.
    pub fn histogram(&self) -> Histogram<u64> {
        self.latency_us.to_histogram()
    }

    /// The summary of a run that took `elapsed`.
    pub fn summary(
        &self,
        tasks: u64,
        retried: u64,
        executors_lost: u64,
        elapsed: Duration,
    ) -> Summary {
        let h = self.latency_us.to_histogram();
        let latency = if h.is_empty() {
            Latency::default()
        } else {
            Latency {
                p50: h.value_at_quantile(0.50),
                p90: h.value_at_quantile(0.90),
                p99: h.value_at_quantile(0.99),
                p999: h.value_at_quantile(0.999),
                max: h.max(),
            }
        };
        let elapsed_s = elapsed.as_secs_f64();
        Summary {
            tasks,
            succeeded: self.succeeded,
            failed: self.failed,
            retried,
            executors_lost,
            elapsed_s,
            tasks_per_s: if elapsed_s > 0.0 {
                self.tasks() as f64 / elapsed_s
            } else {
                0.0
            },
            latency_us: latency,
            checksum: self.checksum,
        }
    }
}

/// The microseconds a latency of `latency_ns` is counted as: whole microseconds, at least 1
/// (the histogram's lowest value).
#[inline]
pub fn latency_us_of(latency_ns: u64) -> u64 {
    (latency_ns / 1_000).max(1)
}

/// The first 8 bytes of a result as `u64` LE, or 0 if it is shorter.
pub fn checksum_of(result: &[u8]) -> u64 {
    result
        .first_chunk::<8>()
        .map_or(0, |bytes| u64::from_le_bytes(*bytes))
}

/// Task `index`'s payload for `--task hash`: `index` as u64 LE repeated, truncated to `len`.
pub fn indexed_payload(index: u64, len: usize) -> Vec<u8> {
    index
        .to_le_bytes()
        .iter()
        .copied()
        .cycle()
        .take(len)
        .collect()
}

/// What a job run prints.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Tasks submitted.
    pub tasks: u64,
    /// Tasks that succeeded.
    pub succeeded: u64,
    /// Tasks that failed (after their retries).
    pub failed: u64,
    /// Task attempts that were retried.
    pub retried: u64,
    /// Executors lost during the run.
    pub executors_lost: u64,
    /// Wall time from submit to the last result.
    pub elapsed_s: f64,
    /// Results per second.
    pub tasks_per_s: f64,
    /// Submit-to-result latency.
    pub latency_us: Latency,
    /// See the module docs.
    pub checksum: u64,
}

impl Summary {
    /// One JSON object; `extra` adds fields (already JSON values) at the end.
    pub fn to_json(&self, extra: &[(&str, String)]) -> String {
        let l = &self.latency_us;
        let mut json = format!(
            "{{\"tasks\":{},\"succeeded\":{},\"failed\":{},\"retried\":{},\"executors_lost\":{},\
             \"elapsed_s\":{:.6},\"tasks_per_s\":{:.1},\"latency_us\":{{\"p50\":{},\"p90\":{},\
             \"p99\":{},\"p999\":{},\"max\":{}}},\"checksum\":{}",
            self.tasks,
            self.succeeded,
            self.failed,
            self.retried,
            self.executors_lost,
            self.elapsed_s,
            self.tasks_per_s,
            l.p50,
            l.p90,
            l.p99,
            l.p999,
            l.max,
            self.checksum
        );
        for (key, value) in extra {
            let _ = write!(json, ",{}:{value}", json_string(key));
        }
        json.push('}');
        json
    }

    /// A table for people.
    pub fn to_table(&self) -> String {
        let l = &self.latency_us;
        format!(
            "tasks           {}\nsucceeded       {}\nfailed          {}\nretried         {}\n\
             executors lost  {}\nelapsed         {:.3} s\nthroughput      {:.0} tasks/s\n\
             latency (us)    p50 {}  p90 {}  p99 {}  p99.9 {}  max {}\nchecksum        {}\n",
            self.tasks,
            self.succeeded,
            self.failed,
            self.retried,
            self.executors_lost,
            self.elapsed_s,
            self.tasks_per_s,
            l.p50,
            l.p90,
            l.p99,
            l.p999,
            l.max,
            self.checksum
        )
    }
}

/// `text` as a JSON string literal.
pub fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_reads_the_first_eight_bytes_and_ignores_short_results() {
        assert_eq!(checksum_of(&[1, 0, 0, 0, 0, 0, 0, 0, 99]), 1);
        assert_eq!(checksum_of(&[1, 2, 3]), 0);
        let mut recorder = Recorder::new();
        recorder.record(Ok(&u64::MAX.to_le_bytes()), Duration::from_micros(5));
        recorder.record(Ok(&2u64.to_le_bytes()), Duration::from_micros(7));
        recorder.record(Err("boom"), Duration::from_micros(9));
        let summary = recorder.summary(3, 1, 0, Duration::from_secs(1));
        assert_eq!(summary.checksum, 1, "wrapping sum of u64::MAX and 2");
        assert_eq!(
            (summary.succeeded, summary.failed, summary.tasks),
            (2, 1, 3)
        );
        assert_eq!(summary.latency_us.max, 9);
    }

    #[test]
    fn outcomes_with_latencies_added_summarise_as_results_recorded_whole() {
        let mut whole = Recorder::new();
        let mut split = Recorder::new();
        let mut counts = LatencyCounts::new();
        for i in 0..3_000u64 {
            let bytes = (i * 7_919).to_le_bytes();
            let result = if i % 5 == 0 { Err("x") } else { Ok(&bytes[..]) };
            let latency_ns = i * i * 1_013;
            whole.record_ns(result, latency_ns);
            split.record_outcome(result);
            counts.record_us(latency_us_of(latency_ns));
            if i % 1_000 == 999 {
                split.add_latencies(&counts);
                counts.clear();
            }
        }
        let elapsed = Duration::from_millis(1_500);
        assert_eq!(
            split.summary(3_000, 0, 0, elapsed),
            whole.summary(3_000, 0, 0, elapsed)
        );
        assert_eq!(split.histogram(), whole.histogram());
        assert_eq!(latency_us_of(999), 1, "under 1 us counts as 1 us");
    }

    #[test]
    fn indexed_payload_repeats_the_index_and_truncates() {
        assert_eq!(
            indexed_payload(0x0102, 10),
            vec![2, 1, 0, 0, 0, 0, 0, 0, 2, 1]
        );
    }

    #[test]
    fn json_has_the_promised_fields() {
        let summary = Recorder::new().summary(0, 0, 0, Duration::from_secs(1));
        let json = summary.to_json(&[("mode", json_string("closed \"loop\""))]);
        for field in [
            "\"tasks\":0",
            "\"tasks_per_s\":",
            "\"latency_us\":{\"p50\":0",
            "\"checksum\":0",
            "\"mode\":\"closed \\\"loop\\\"\"",
        ] {
            assert!(json.contains(field), "{field} missing from {json}");
        }
    }
}
