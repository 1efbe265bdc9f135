//! How long a master takes to replay its journal and to listen (issue 25, item 4).
//!
//! `cargo run --release -p flint-net --example journal_replay -- RECORDS...` builds, for each
//! count, a journal of that many records (applications registered and removed: three records
//! each, as a busy master writes them), then times the replay of its bytes and a
//! `MasterHandle::start` on a state directory holding it (lock, replay, compaction, bind: until
//! it listens), each the median of 3. `--write-legacy DIR APPS` instead writes a journal of
//! the format before `FLJRNL02` (plain wire frames), which the master before issue 25 read too,
//! to time old and new `flint master` binaries on the same file.

use std::time::{Duration, Instant};

use bytes::BytesMut;
use flint_engine::standalone::AppSpec;
use flint_net::standalone::journal::{replay, Journal, Record};
use flint_net::standalone::master::{MasterConfig, MasterHandle};
use flint_net::standalone::with_description;
use flint_net::wire::Message;

fn spec(n: u64) -> AppSpec {
    AppSpec {
        name: format!("job-{n}"),
        driver_addr: "127.0.0.1:40000".into(),
        cores_per_executor: 1,
        max_cores: 4,
        ..AppSpec::default()
    }
}

/// A journal of `records` records (rounded down to whole applications) in `dir`.
fn write(dir: &std::path::Path, records: u64) {
    let _ = std::fs::remove_dir_all(dir);
    let (mut journal, _) = Journal::open(dir).expect("journal");
    for n in 0..records / 3 {
        let id = format!("app-{n}");
        journal.record(&Record::AppRegistered(id.clone(), spec(n)));
        journal.record(&Record::AppRemoved(id));
        if n % 10_000 == 0 {
            journal.flush();
        }
    }
    journal.flush();
}

/// The same history as plain wire frames (the journal format before `FLJRNL02`).
fn write_legacy(path: &std::path::Path, apps: u64) {
    let mut out = BytesMut::new();
    for n in 0..apps {
        let id = format!("app-{n}");
        let encode = |message: &Message<'_>, out: &mut BytesMut| {
            message.encode(out, 1 << 20).expect("encodes");
        };
        encode(&Message::RegisteredApplication { app_id: &id }, &mut out);
        with_description(&spec(n), |app| {
            encode(&Message::RegisterApplication { app }, &mut out)
        });
        encode(
            &Message::ApplicationRemoved {
                app_id: &id,
                reason: "",
            },
            &mut out,
        );
    }
    std::fs::write(path, &out).expect("write");
}

fn median(mut runs: Vec<Duration>) -> Duration {
    runs.sort();
    runs[runs.len() / 2]
}

fn measure(records: u64) {
    let base = std::env::temp_dir().join(format!("flint-journal-replay-{}", std::process::id()));
    let source = base.join("source");
    write(&source, records);
    let bytes = std::fs::read(source.join("master.journal")).expect("read");
    let replays = (0..3)
        .map(|_| {
            let start = Instant::now();
            let recovered = replay(&bytes);
            assert!(recovered.apps.is_empty());
            start.elapsed()
        })
        .collect();
    let state = base.join("state");
    let listens = (0..3)
        .map(|_| {
            let _ = std::fs::remove_dir_all(&state);
            std::fs::create_dir_all(&state).expect("state dir");
            std::fs::write(state.join("master.journal"), &bytes).expect("copy");
            let start = Instant::now();
            let master = MasterHandle::start(MasterConfig {
                listen: "127.0.0.1:0".parse().expect("addr"),
                state_dir: Some(state.clone()),
                ..MasterConfig::default()
            })
            .expect("master");
            let elapsed = start.elapsed();
            assert!(master.local_addr().is_some());
            master.shutdown();
            elapsed
        })
        .collect();
    println!(
        "records {records} bytes {} replay_ms {:.1} listens_ms {:.1}",
        bytes.len(),
        median(replays).as_secs_f64() * 1e3,
        median(listens).as_secs_f64() * 1e3
    );
    let _ = std::fs::remove_dir_all(&base);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--write-legacy") {
        let (Some(dir), Some(apps)) = (args.get(1), args.get(2).and_then(|a| a.parse().ok()))
        else {
            eprintln!("usage: journal_replay --write-legacy DIR APPS");
            std::process::exit(2);
        };
        let dir = std::path::Path::new(dir);
        std::fs::create_dir_all(dir).expect("dir");
        write_legacy(&dir.join("master.journal"), apps);
        return;
    }
    let counts: Vec<u64> = args.iter().filter_map(|a| a.parse().ok()).collect();
    for records in if counts.is_empty() {
        vec![1_000_000]
    } else {
        counts
    } {
        measure(records);
    }
}
