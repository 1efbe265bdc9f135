//! Which CPUs threads are pinned to.
//!
//! Flint pins only to CPUs in the process's affinity mask (what `taskset`, a cgroup or a launcher
//! allowed), and only to CPUs the caller names: a process cannot know which CPUs its neighbours
//! on the machine use, and the old rule (thread *i* on CPU *i*) put the first thread of every
//! process on CPU 0. A launcher that starts several processes on one machine (`flint local`,
//! `flint-load`) hands each its own CPUs ([`Pinning::spread`]) and leaves the processes beyond
//! what the CPUs hold unpinned.

use std::fmt;

/// The most CPUs a list may name (Linux's `CPU_SETSIZE`).
pub const CPUS_MAX: usize = 1024;

/// Where a set of threads runs: thread *i* on the *i*-th listed CPU (wrapping around), or
/// wherever the operating system puts it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Pinning {
    /// Not pinned (the default): the operating system places the threads.
    #[default]
    None,
    /// Pinned to these CPU ids, in order; every one is in the process's affinity mask.
    Cores(Vec<usize>),
}

/// Why a CPU list was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PinError {
    /// The text is not `none` or a list like `0,2-3`.
    #[error("{0:?} is not a CPU list (like 0,2-3) or none")]
    Syntax(String),
    /// A CPU outside the process's affinity mask.
    #[error("CPU {cpu} is not in this process's affinity mask (allowed: {allowed})")]
    NotAllowed {
        /// The CPU asked for.
        cpu: usize,
        /// The allowed CPUs, as a list.
        allowed: String,
    },
}

impl Pinning {
    /// Parses `none` or a comma-separated list of CPU ids and ranges (`0,2-3`), checking each
    /// CPU against the affinity mask.
    pub fn parse(text: &str) -> Result<Pinning, PinError> {
        let text = text.trim();
        if text == "none" {
            return Ok(Pinning::None);
        }
        let syntax = || PinError::Syntax(text.chars().take(64).collect());
        let mut cpus = Vec::new();
        for part in text.split(',') {
            let (first, last) = match part.split_once('-') {
                Some((a, b)) => (a.trim().parse(), b.trim().parse()),
                None => (part.trim().parse(), part.trim().parse()),
            };
            let (first, last): (usize, usize) =
                (first.map_err(|_| syntax())?, last.map_err(|_| syntax())?);
            if first > last || last >= CPUS_MAX || cpus.len() + (last - first) >= CPUS_MAX {
                return Err(syntax());
            }
            cpus.extend(first..=last);
        }
        let allowed = allowed_cpus();
        if let Some(&cpu) = cpus.iter().find(|cpu| !allowed.contains(cpu)) {
            return Err(PinError::NotAllowed {
                cpu,
                allowed: Pinning::Cores(allowed).to_string(),
            });
        }
        Ok(Pinning::Cores(cpus))
    }

    /// Every CPU in the affinity mask, for a process that has the machine to itself.
    pub fn all() -> Pinning {
        Pinning::Cores(allowed_cpus())
    }

    /// The CPUs for process `index` of several that each run `threads` pinned threads: the
    /// allowed CPUs handed out in turn. A process beyond what the CPUs hold is not pinned, so
    /// the operating system can move it to whichever CPU is idle.
    pub fn spread(index: usize, threads: usize) -> Pinning {
        let allowed = allowed_cpus();
        let threads = threads.clamp(1, CPUS_MAX);
        match allowed
            .get(index.saturating_mul(threads)..index.saturating_add(1).saturating_mul(threads))
        {
            Some(cpus) => Pinning::Cores(cpus.to_vec()),
            None => Pinning::None,
        }
    }

    /// The same CPUs for threads numbered from `first`: thread `i` of the result runs where
    /// thread `first + i` of `self` would (a driver's loop is its thread 0, its local pool's
    /// workers follow).
    pub fn from_thread(&self, first: usize) -> Pinning {
        match self {
            Pinning::Cores(cpus) if !cpus.is_empty() => {
                let n = cpus.len();
                Pinning::Cores(
                    (0..n)
                        .filter_map(|i| cpus.get((first + i) % n).copied())
                        .collect(),
                )
            }
            _ => Pinning::None,
        }
    }

    /// The CPU for thread `index`, if pinned.
    pub fn cpu_for(&self, index: usize) -> Option<usize> {
        match self {
            Pinning::None => None,
            Pinning::Cores(cpus) if cpus.is_empty() => None,
            Pinning::Cores(cpus) => cpus.get(index % cpus.len()).copied(),
        }
    }

    /// Pins the calling thread as thread `index`; a failure is logged, not fatal.
    pub fn pin_current(&self, index: usize, what: &str) {
        if let Some(cpu) = self.cpu_for(index) {
            if !core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) {
                tracing::warn!(cpu, index, "could not pin {what}");
            }
        }
    }
}

impl fmt::Display for Pinning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pinning::None => f.write_str("none"),
            Pinning::Cores(cpus) => {
                let text: Vec<String> = cpus.iter().map(usize::to_string).collect();
                f.write_str(&text.join(","))
            }
        }
    }
}

/// The CPUs in the calling thread's affinity mask, ascending (empty if they cannot be read).
pub fn allowed_cpus() -> Vec<usize> {
    let mut cpus: Vec<usize> = core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .map(|core| core.id)
        .collect();
    cpus.sort_unstable();
    cpus
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_ranges_and_none_parse_and_garbage_does_not() {
        let first = allowed_cpus()[0];
        assert_eq!(Pinning::parse("none"), Ok(Pinning::None));
        assert_eq!(
            Pinning::parse(&format!("{first}")),
            Ok(Pinning::Cores(vec![first]))
        );
        for bad in [
            "",
            "a",
            "1-0",
            "0,,1",
            "-1",
            "99999999999999999999",
            "0-5000",
        ] {
            assert!(
                matches!(Pinning::parse(bad), Err(PinError::Syntax(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            Pinning::parse("1023"),
            Err(PinError::NotAllowed { cpu: 1023, .. })
        ));
    }

    #[test]
    fn spread_hands_out_distinct_cpus_then_leaves_the_rest_unpinned() {
        let n = allowed_cpus().len();
        let taken: Vec<usize> = (0..n)
            .filter_map(|i| Pinning::spread(i, 1).cpu_for(0))
            .collect();
        let mut distinct = taken.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), n, "{taken:?}");
        assert_eq!(Pinning::spread(n, 1), Pinning::None);
        assert_eq!(Pinning::spread(0, n + 1), Pinning::None);
    }
}
