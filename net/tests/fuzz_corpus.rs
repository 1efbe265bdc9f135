//! Replays the committed fuzz corpus (`fuzz/corpus/TARGET/*`) through the same target bodies the
//! fuzzer runs, so every seed and every crash input ever committed stays fixed.

use std::path::Path;

use flint_net::wire::{fuzzing, Kind, Message};

fn replay(target: &str, run: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut replayed = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("corpus entry").path();
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let outcome = std::panic::catch_unwind(|| run(&data));
        assert!(
            outcome.is_ok(),
            "fuzz target {target} fails on {}",
            path.display()
        );
        replayed += 1;
    }
    assert!(replayed > 0, "the {target} corpus is empty");
}

#[test]
fn stream_corpus() {
    replay("stream", fuzzing::stream);
}

#[test]
fn message_corpus() {
    replay("message", fuzzing::message);
}

#[test]
fn handshake_corpus() {
    replay("handshake", fuzzing::handshake);
}

/// The message table's own seeds (`KIND-N`, written by `write_seed_corpus`) decode as their
/// kind: a table change that leaves them stale fails here, not silently as one more bad input.
#[test]
fn message_seeds_match_the_table() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/message");
    let mut checked = 0;
    for (index, kind) in Kind::ALL.iter().enumerate() {
        for seed in 0..2 {
            let path = dir.join(format!("{}-{seed}", kind.name()));
            let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(data.first(), Some(&(index as u8)), "{}", path.display());
            let decoded = Message::decode(*kind as u16, &data[1..]);
            assert!(
                decoded.is_ok(),
                "{} no longer decodes ({decoded:?}): rerun write_seed_corpus",
                path.display()
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 2 * Kind::ALL.len());
}
