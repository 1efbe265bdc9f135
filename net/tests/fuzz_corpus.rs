//! Replays the committed fuzz corpus (`fuzz/corpus/TARGET/*`) through the same target bodies the
//! fuzzer runs, so every seed and every crash input ever committed stays fixed.

use std::path::Path;

use flint_net::wire::fuzzing;

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
