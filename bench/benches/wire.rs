//! Wire encode and decode of `LaunchTasks` and `StatusUpdates` batches, beside serde+bincode
//! encoding the same data in the same group.
//!
//! `cargo bench -p flint-bench --bench wire`. Each benchmark's id is `IMPL/TASKSxPAYLOAD`; the
//! time is for the whole batch (divide by TASKS for ns per task) and the throughput is the
//! Flint frame's size in bytes. Decoding includes visiting every task's id and payload, as an
//! executor (or the driver, for status updates) would.

use std::hint::black_box;
use std::time::Duration;

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use flint_net::wire::{
    Field, List, Message, StatusUpdate, TaskLaunch, TaskState, FRAME_SIZE_MAX_DEFAULT, HEADER_LEN,
};
use serde::{Deserialize, Serialize};

const BATCH_SIZES: [usize; 3] = [1, 64, 1024];
const PAYLOAD_LENS: [usize; 3] = [0, 64, 1024];

/// A kind of batch: its Flint item, the same data for serde, and how a consumer visits it.
trait Batch {
    /// The criterion group prefix.
    const GROUP: &'static str;
    /// Flint's item.
    type Item<'a>: Field<'a> + Copy + 'a;
    /// The same item for serde.
    type Serde<'a>: Serialize + Deserialize<'a> + From<Self::Item<'a>>;
    /// Item `id` carrying `data` (the payload or the result).
    fn item(id: u64, data: &[u8]) -> Self::Item<'_>;
    /// The message carrying a batch.
    fn message<'a>(items: List<'a, Self::Item<'a>>) -> Message<'a>;
    /// The batch inside a decoded message.
    fn items(message: Message<'_>) -> Option<List<'_, Self::Item<'_>>>;
    /// What a consumer reads of an item: its id and its data's length.
    fn visit(item: &Self::Item<'_>) -> u64;
    /// The same for the serde twin.
    fn visit_serde(item: &Self::Serde<'_>) -> u64;
}

/// The same task as `TaskLaunch`, for serde.
#[derive(Serialize, Deserialize)]
struct SerdeTask<'a> {
    task_id: u64,
    attempt: u32,
    cores: u32,
    function: u32,
    payload: &'a [u8],
}

/// The same update as `StatusUpdate`, for serde.
#[derive(Serialize, Deserialize)]
struct SerdeUpdate<'a> {
    task_id: u64,
    attempt: u32,
    state: u8,
    data: &'a [u8],
}

impl<'a> From<TaskLaunch<'a>> for SerdeTask<'a> {
    fn from(t: TaskLaunch<'a>) -> Self {
        SerdeTask {
            task_id: t.task_id,
            attempt: t.attempt,
            cores: t.cores,
            function: t.function,
            payload: t.payload,
        }
    }
}

impl<'a> From<StatusUpdate<'a>> for SerdeUpdate<'a> {
    fn from(u: StatusUpdate<'a>) -> Self {
        SerdeUpdate {
            task_id: u.task_id,
            attempt: u.attempt,
            state: u.state as u8,
            data: u.data,
        }
    }
}

struct Launch;

impl Batch for Launch {
    const GROUP: &'static str = "launch_tasks";
    type Item<'a> = TaskLaunch<'a>;
    type Serde<'a> = SerdeTask<'a>;
    fn item(task_id: u64, payload: &[u8]) -> TaskLaunch<'_> {
        TaskLaunch {
            task_id,
            attempt: 0,
            cores: 1,
            function: 0,
            payload,
        }
    }
    fn message<'a>(tasks: List<'a, TaskLaunch<'a>>) -> Message<'a> {
        Message::LaunchTasks { tasks }
    }
    fn items(message: Message<'_>) -> Option<List<'_, TaskLaunch<'_>>> {
        match message {
            Message::LaunchTasks { tasks } => Some(tasks),
            _ => None,
        }
    }
    fn visit(t: &TaskLaunch<'_>) -> u64 {
        t.task_id ^ t.payload.len() as u64
    }
    fn visit_serde(t: &SerdeTask<'_>) -> u64 {
        t.task_id ^ t.payload.len() as u64
    }
}

struct Status;

impl Batch for Status {
    const GROUP: &'static str = "status_updates";
    type Item<'a> = StatusUpdate<'a>;
    type Serde<'a> = SerdeUpdate<'a>;
    fn item(task_id: u64, data: &[u8]) -> StatusUpdate<'_> {
        StatusUpdate {
            task_id,
            attempt: 0,
            state: TaskState::Finished,
            data,
        }
    }
    fn message<'a>(updates: List<'a, StatusUpdate<'a>>) -> Message<'a> {
        Message::StatusUpdates { updates }
    }
    fn items(message: Message<'_>) -> Option<List<'_, StatusUpdate<'_>>> {
        match message {
            Message::StatusUpdates { updates } => Some(updates),
            _ => None,
        }
    }
    fn visit(u: &StatusUpdate<'_>) -> u64 {
        u.task_id ^ u.data.len() as u64
    }
    fn visit_serde(u: &SerdeUpdate<'_>) -> u64 {
        u.task_id ^ u.data.len() as u64
    }
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1000))
        .sample_size(20)
}

/// The encode and decode groups of one kind of batch, Flint beside bincode.
fn bench_batch<B: Batch + 'static>(c: &mut Criterion) {
    for decode in [false, true] {
        let direction = if decode { "decode" } else { "encode" };
        let mut group = c.benchmark_group(format!("{}/{direction}", B::GROUP));
        for count in BATCH_SIZES {
            for data_len in PAYLOAD_LENS {
                // Leaked so that items, messages and their serde twins can all borrow for
                // `'static` (a few MB for the whole run; the bench exits right after).
                let data: &'static [u8] = Vec::leak(vec![7u8; data_len]);
                let items: &'static [B::Item<'static>] =
                    Vec::leak((0..count as u64).map(|id| B::item(id, data)).collect());
                let serde_items: Vec<B::Serde<'static>> =
                    items.iter().map(|item| B::Serde::from(*item)).collect();
                let message = B::message(List::from_items(items));
                let kind = message.kind() as u16;
                let mut frame = BytesMut::new();
                message
                    .encode(&mut frame, FRAME_SIZE_MAX_DEFAULT)
                    .expect("fits");
                let serde_bytes = bincode::serialize(&serde_items).expect("serializes");
                group.throughput(Throughput::Bytes(frame.len() as u64));
                let id = format!("{count}x{data_len}");
                if decode {
                    let body = frame.split_off(HEADER_LEN).freeze();
                    group.bench_with_input(BenchmarkId::new("flint", &id), &body, |b, body| {
                        b.iter(|| {
                            let message = Message::decode(kind, body).expect("decodes");
                            let items = B::items(message).expect("the right kind");
                            items.iter().fold(0u64, |acc, item| acc ^ B::visit(&item))
                        })
                    });
                    group.bench_with_input(
                        BenchmarkId::new("bincode", &id),
                        &serde_bytes,
                        |b, bytes| {
                            b.iter(|| {
                                let items: Vec<B::Serde<'_>> =
                                    bincode::deserialize(bytes).expect("decodes");
                                items
                                    .iter()
                                    .fold(0u64, |acc, item| acc ^ B::visit_serde(item))
                            })
                        },
                    );
                } else {
                    let mut out = BytesMut::with_capacity(frame.len());
                    group.bench_function(BenchmarkId::new("flint", &id), |b| {
                        b.iter(|| {
                            out.clear();
                            black_box(&message)
                                .encode(&mut out, FRAME_SIZE_MAX_DEFAULT)
                                .expect("fits");
                            out.len()
                        })
                    });
                    let mut out = Vec::with_capacity(serde_bytes.len());
                    group.bench_function(BenchmarkId::new("bincode", &id), |b| {
                        b.iter(|| {
                            out.clear();
                            bincode::serialize_into(&mut out, black_box(&serde_items))
                                .expect("serializes");
                            out.len()
                        })
                    });
                }
            }
        }
        group.finish();
    }
}

fn launch(c: &mut Criterion) {
    bench_batch::<Launch>(c);
}

fn status(c: &mut Criterion) {
    bench_batch::<Status>(c);
}

criterion_group! {
    name = benches;
    config = config();
    targets = launch, status
}
criterion_main!(benches);
