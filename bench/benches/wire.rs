//! Wire encode and decode of `LaunchTasks` and `StatusUpdates` batches, beside serde+bincode
//! encoding the same data in the same group.
//!
//! `cargo bench -p flint-bench --bench wire`. Each benchmark's id is `IMPL/TASKSxPAYLOAD`; the
//! time is for the whole batch (divide by TASKS for ns per task) and the throughput is the
//! Flint frame's size in bytes. Decoding includes visiting every task's id and payload, as an
//! executor would.

use std::hint::black_box;
use std::time::Duration;

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use flint_net::wire::{
    Kind, List, Message, StatusUpdate, TaskLaunch, TaskState, FRAME_SIZE_MAX_DEFAULT, HEADER_LEN,
};
use serde::{Deserialize, Serialize};

const BATCH_SIZES: [usize; 3] = [1, 64, 1024];
const PAYLOAD_LENS: [usize; 3] = [0, 64, 1024];

/// The same task as `TaskLaunch`, for serde.
#[derive(Serialize, Deserialize)]
struct SerdeTask<'a> {
    task_id: u64,
    attempt: u32,
    cores: u32,
    function: &'a str,
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

fn launch_tasks<'a>(count: usize, payload: &'a [u8]) -> Vec<TaskLaunch<'a>> {
    (0..count as u64)
        .map(|task_id| TaskLaunch {
            task_id,
            attempt: 0,
            cores: 1,
            function: "echo",
            payload,
        })
        .collect()
}

fn status_updates<'a>(count: usize, data: &'a [u8]) -> Vec<StatusUpdate<'a>> {
    (0..count as u64)
        .map(|task_id| StatusUpdate {
            task_id,
            attempt: 0,
            state: TaskState::Finished,
            data,
        })
        .collect()
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1000))
        .sample_size(20)
}

fn launch(c: &mut Criterion) {
    for (group_name, decode) in [
        ("launch_tasks/encode", false),
        ("launch_tasks/decode", true),
    ] {
        let mut group = c.benchmark_group(group_name);
        for count in BATCH_SIZES {
            for payload_len in PAYLOAD_LENS {
                let payload = vec![7u8; payload_len];
                let tasks = launch_tasks(count, &payload);
                let serde_tasks: Vec<SerdeTask> = tasks
                    .iter()
                    .map(|t| SerdeTask {
                        task_id: t.task_id,
                        attempt: t.attempt,
                        cores: t.cores,
                        function: t.function,
                        payload: t.payload,
                    })
                    .collect();
                let message = Message::LaunchTasks {
                    tasks: List::from_items(&tasks),
                };
                let mut frame = BytesMut::new();
                message
                    .encode(&mut frame, FRAME_SIZE_MAX_DEFAULT)
                    .expect("fits");
                let serde_bytes = bincode::serialize(&serde_tasks).expect("serializes");
                group.throughput(Throughput::Bytes(frame.len() as u64));
                let id = format!("{count}x{payload_len}");

                if decode {
                    let body = frame.split_off(HEADER_LEN).freeze();
                    group.bench_with_input(BenchmarkId::new("flint", &id), &body, |b, body| {
                        b.iter(|| {
                            let Ok(Message::LaunchTasks { tasks }) =
                                Message::decode(Kind::LaunchTasks as u16, body)
                            else {
                                panic!("decodes");
                            };
                            tasks
                                .iter()
                                .fold(0u64, |acc, t| acc ^ t.task_id ^ t.payload.len() as u64)
                        })
                    });
                    group.bench_with_input(
                        BenchmarkId::new("bincode", &id),
                        &serde_bytes,
                        |b, bytes| {
                            b.iter(|| {
                                let tasks: Vec<SerdeTask> =
                                    bincode::deserialize(bytes).expect("decodes");
                                tasks
                                    .iter()
                                    .fold(0u64, |acc, t| acc ^ t.task_id ^ t.payload.len() as u64)
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
                            bincode::serialize_into(&mut out, black_box(&serde_tasks))
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

fn status(c: &mut Criterion) {
    for (group_name, decode) in [
        ("status_updates/encode", false),
        ("status_updates/decode", true),
    ] {
        let mut group = c.benchmark_group(group_name);
        for count in BATCH_SIZES {
            for result_len in PAYLOAD_LENS {
                let data = vec![3u8; result_len];
                let updates = status_updates(count, &data);
                let serde_updates: Vec<SerdeUpdate> = updates
                    .iter()
                    .map(|u| SerdeUpdate {
                        task_id: u.task_id,
                        attempt: u.attempt,
                        state: u.state as u8,
                        data: u.data,
                    })
                    .collect();
                let message = Message::StatusUpdates {
                    updates: List::from_items(&updates),
                };
                let mut frame = BytesMut::new();
                message
                    .encode(&mut frame, FRAME_SIZE_MAX_DEFAULT)
                    .expect("fits");
                let serde_bytes = bincode::serialize(&serde_updates).expect("serializes");
                group.throughput(Throughput::Bytes(frame.len() as u64));
                let id = format!("{count}x{result_len}");

                if decode {
                    let body = frame.split_off(HEADER_LEN).freeze();
                    group.bench_with_input(BenchmarkId::new("flint", &id), &body, |b, body| {
                        b.iter(|| {
                            let Ok(Message::StatusUpdates { updates }) =
                                Message::decode(Kind::StatusUpdates as u16, body)
                            else {
                                panic!("decodes");
                            };
                            updates
                                .iter()
                                .fold(0u64, |acc, u| acc ^ u.task_id ^ u.data.len() as u64)
                        })
                    });
                    group.bench_with_input(
                        BenchmarkId::new("bincode", &id),
                        &serde_bytes,
                        |b, bytes| {
                            b.iter(|| {
                                let updates: Vec<SerdeUpdate> =
                                    bincode::deserialize(bytes).expect("decodes");
                                updates
                                    .iter()
                                    .fold(0u64, |acc, u| acc ^ u.task_id ^ u.data.len() as u64)
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
                            bincode::serialize_into(&mut out, black_box(&serde_updates))
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

criterion_group! {
    name = benches;
    config = config();
    targets = launch, status
}
criterion_main!(benches);
