//! FAIR pools from a file, Spark's `fairscheduler.xml` in TOML:
//!
//! ```toml
//! [pool.production]
//! mode = "fair"      # how its jobs share it: "fair" (default) or "fifo"
//! weight = 3         # its share against other pools (default 1, 1 to 1000)
//! min_share = 8      # cores it gets before pools that have theirs (default 0)
//!
//! [pool.batch]
//! mode = "fifo"
//! ```
//!
//! A job picks its pool with [`crate::job::Job::pool`] (`flint ... --pool NAME`); a name the
//! file does not list gets a pool with the defaults. Unlike Spark, which logs and falls back to
//! the defaults for an invalid value (SPARK-17663), a bad file is refused with the reason: a
//! typo in a weight should not pass silently. The engine gets typed [`PoolConfig`]s; it does
//! not parse anything.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use flint_engine::scheduler::{PoolConfig, Sharing};
use serde::Deserialize;

/// The most pools a file may define.
pub const POOLS_MAX: usize = 1024;
/// The largest pool file read, in bytes.
pub const POOL_FILE_BYTES_MAX: u64 = 1 << 20;
/// The largest weight a pool may have.
pub const POOL_WEIGHT_MAX: u32 = 1000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    pool: BTreeMap<String, Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    mode: Option<String>,
    weight: Option<u32>,
    min_share: Option<u32>,
}

/// Why a pool file was refused.
#[derive(Debug, thiserror::Error)]
pub enum PoolsError {
    /// The text is not TOML of the expected shape (an unknown field, a wrong type).
    #[error("pool file: {0}")]
    Syntax(#[from] toml::de::Error),
    /// More than [`POOLS_MAX`] pools.
    #[error("pool file: {count} pools, at most {POOLS_MAX}")]
    TooManyPools {
        /// How many the file defines.
        count: usize,
    },
    /// A pool with an empty name.
    #[error("pool file: a pool needs a name")]
    Unnamed,
    /// A mode other than `fair` or `fifo`.
    #[error("pool {pool}: mode {mode:?}, expected \"fair\" or \"fifo\"")]
    Mode {
        /// The pool.
        pool: String,
        /// The mode it gave.
        mode: String,
    },
    /// A weight outside 1 to [`POOL_WEIGHT_MAX`].
    #[error("pool {pool}: weight {weight}, expected 1 to {POOL_WEIGHT_MAX}")]
    Weight {
        /// The pool.
        pool: String,
        /// The weight it gave.
        weight: u32,
    },
    /// The file could not be read: missing, not a regular file (a FIFO, a device, a
    /// directory), larger than [`POOL_FILE_BYTES_MAX`], not UTF-8.
    #[error("pool file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the operating system (or the size and type check) said.
        source: std::io::Error,
    },
    /// The file's text was refused.
    #[error("{}: {source}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Why.
        source: Box<PoolsError>,
    },
}

/// Parses a pool file's text into pool configurations (in name order).
pub fn parse(text: &str) -> Result<Vec<PoolConfig>, PoolsError> {
    let file: File = toml::from_str(text)?;
    if file.pool.len() > POOLS_MAX {
        return Err(PoolsError::TooManyPools {
            count: file.pool.len(),
        });
    }
    file.pool
        .into_iter()
        .map(|(name, e)| {
            if name.is_empty() {
                return Err(PoolsError::Unnamed);
            }
            let mode = match e.mode.as_deref() {
                None | Some("fair") => Sharing::Fair,
                Some("fifo") => Sharing::Fifo,
                Some(other) => {
                    return Err(PoolsError::Mode {
                        mode: other.to_string(),
                        pool: name,
                    })
                }
            };
            let weight = e.weight.unwrap_or(1);
            if !(1..=POOL_WEIGHT_MAX).contains(&weight) {
                return Err(PoolsError::Weight { pool: name, weight });
            }
            Ok(PoolConfig {
                name,
                mode,
                weight,
                min_share: e.min_share.unwrap_or(0),
            })
        })
        .collect()
}

/// Reads and parses a pool file: a regular file of at most [`POOL_FILE_BYTES_MAX`] bytes (not a
/// FIFO, a device or a directory).
pub fn load(path: &Path) -> Result<Vec<PoolConfig>, PoolsError> {
    let read = |source| PoolsError::Read {
        path: path.to_owned(),
        source,
    };
    let (bytes, _) = crate::files::read_small(path, POOL_FILE_BYTES_MAX).map_err(read)?;
    let text = String::from_utf8(bytes).map_err(|_| {
        read(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not UTF-8 text",
        ))
    })?;
    parse(&text).map_err(|source| PoolsError::Invalid {
        path: path.to_owned(),
        source: Box::new(source),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spark's PoolSuite "Fair Scheduler Test" reads pools "1", "2", "3" with their min shares,
    /// weights and modes from fairscheduler.xml; here the same from TOML (issue 14 item 8).
    #[test]
    fn pools_are_read_with_their_modes_weights_and_min_shares() {
        let pools = parse(
            r#"
            [pool.1]
            min_share = 2
            mode = "fifo"
            [pool.2]
            min_share = 3
            weight = 1
            [pool.3]
            weight = 4
            "#,
        )
        .unwrap();
        assert_eq!(
            pools,
            vec![
                PoolConfig {
                    name: "1".into(),
                    mode: Sharing::Fifo,
                    weight: 1,
                    min_share: 2
                },
                PoolConfig {
                    name: "2".into(),
                    mode: Sharing::Fair,
                    weight: 1,
                    min_share: 3
                },
                PoolConfig {
                    name: "3".into(),
                    mode: Sharing::Fair,
                    weight: 4,
                    min_share: 0
                },
            ]
        );
        assert!(parse("").unwrap().is_empty());
    }

    /// Spark's "SPARK-17663: FairSchedulableBuilder sets default values for blank or invalid
    /// datas" falls back to defaults; Flint refuses the file and says why.
    #[test]
    fn a_bad_pool_file_is_refused_with_the_reason() {
        for (text, why) in [
            ("[pool.a]\nweight = 0", "weight 0"),
            ("[pool.a]\nmode = \"lifo\"", "mode"),
            ("[pool.a]\nminshare = 1", "unknown field"),
            ("[pool.a]\nweight = -1", "pool file"),
            ("[pools.a]", "unknown field"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }
}
