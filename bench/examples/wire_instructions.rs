//! Encodes or decodes a 1024-task `LaunchTasks` batch 1000 times, for counting instructions per
//! task with callgrind, a figure that does not depend on what else the machine is doing:
//!
//! ```sh
//! cargo build --release -p flint-bench --example wire_instructions
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg ./target/release/examples/wire_instructions decode
//! ```
//!
//! Divide callgrind's "Collected" total by 1,024,000 (setup is under 0.1% of it).

use std::hint::black_box;

use bytes::BytesMut;
use flint_net::wire::{Kind, List, Message, TaskLaunch, FRAME_SIZE_MAX_DEFAULT, HEADER_LEN};

const TASKS: u64 = 1024;
const ROUNDS: usize = 1000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let decode = match std::env::args().nth(1).as_deref() {
        Some("decode") => true,
        Some("encode") => false,
        _ => return Err("usage: wire_instructions encode|decode".into()),
    };
    let tasks: Vec<TaskLaunch> = (0..TASKS)
        .map(|task_id| TaskLaunch {
            task_id,
            attempt: 0,
            cores: 1,
            function: 0,
            payload: &[],
        })
        .collect();
    let mut frame = BytesMut::new();
    Message::LaunchTasks {
        tasks: List::from_items(&tasks),
    }
    .encode(&mut frame, FRAME_SIZE_MAX_DEFAULT)?;
    let body = frame.split_off(HEADER_LEN).freeze();
    let mut out = BytesMut::with_capacity(frame.len() + body.len());
    let mut check = 0u64;
    for _ in 0..ROUNDS {
        if decode {
            let Message::LaunchTasks { tasks } =
                Message::decode(Kind::LaunchTasks as u16, black_box(&body))?
            else {
                return Err("not a LaunchTasks".into());
            };
            check = tasks.iter().fold(check, |acc, task| {
                acc ^ task.task_id ^ task.payload.len() as u64
            });
        } else {
            out.clear();
            Message::LaunchTasks {
                tasks: List::from_items(black_box(&tasks)),
            }
            .encode(&mut out, FRAME_SIZE_MAX_DEFAULT)?;
            check ^= out.len() as u64;
        }
    }
    println!(
        "{} {} tasks ({check})",
        if decode { "decoded" } else { "encoded" },
        TASKS as usize * ROUNDS
    );
    Ok(())
}
