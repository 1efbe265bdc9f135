//! Sends `LaunchTasks` batches over a real TCP connection on 127.0.0.1 and decodes them on the
//! other side, checking every task arrived: a demonstration of the wire protocol until the
//! driver exists.
//!
//! `cargo run --release -p flint-net --example wire_loopback [TASKS] [BATCH] [PAYLOAD_BYTES]`

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

use bytes::BytesMut;
use flint_net::wire::{
    AuthMethod, FrameDecoder, List, Message, Role, TaskLaunch, FRAME_SIZE_MAX_DEFAULT,
};

fn arg(index: usize, default: usize) -> Result<usize, String> {
    match std::env::args().nth(index) {
        None => Ok(default),
        Some(text) => text
            .parse()
            .map_err(|e| format!("argument {index} ({text:?}): {e}")),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tasks_total = arg(1, 1_000_000)?;
    let batch_size = arg(2, 1024)?.max(1);
    let payload_len = arg(3, 16)?;

    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let receiver = std::thread::spawn(move || receive(listener));

    let mut socket = TcpStream::connect(addr)?;
    socket.set_nodelay(true)?;
    let start = Instant::now();
    send(&mut socket, tasks_total, batch_size, payload_len)?;
    let (received, id_sum) = receiver.join().map_err(|_| "receiver panicked")??;
    let elapsed = start.elapsed().as_secs_f64();

    let expected_sum = (0..tasks_total as u64).fold(0u64, |acc, id| acc.wrapping_add(id));
    println!(
        "sent {tasks_total} tasks in batches of {batch_size} with {payload_len}-byte payloads over 127.0.0.1"
    );
    println!(
        "received {received} tasks, id checksum {}",
        if id_sum == expected_sum {
            "ok"
        } else {
            "WRONG"
        }
    );
    println!(
        "{:.0} tasks/s ({:.3} s)",
        received as f64 / elapsed,
        elapsed
    );
    if received != tasks_total as u64 || id_sum != expected_sum {
        return Err("tasks were lost or corrupted".into());
    }
    Ok(())
}

/// The receiving side: decodes frames until `Shutdown`; the tasks received and their ids' sum.
fn receive(listener: TcpListener) -> Result<(u64, u64), String> {
    let (mut socket, _) = listener.accept().map_err(|e| e.to_string())?;
    let mut decoder = FrameDecoder::new(FRAME_SIZE_MAX_DEFAULT);
    let (mut tasks, mut id_sum) = (0u64, 0u64);
    loop {
        while let Some(frame) = decoder.next_frame().map_err(|e| e.to_string())? {
            match frame.message().map_err(|e| e.to_string())? {
                Message::Hello { role, .. } => println!("receiver: handshake from {role}"),
                Message::LaunchTasks { tasks: batch } => {
                    for task in batch {
                        tasks += 1;
                        id_sum = id_sum.wrapping_add(task.task_id);
                    }
                }
                Message::Shutdown {} => return Ok((tasks, id_sum)),
                other => return Err(format!("unexpected {:?}", other.kind())),
            }
        }
        if decoder.read_from(&mut socket).map_err(|e| e.to_string())? == 0 {
            return Err("connection closed before Shutdown".into());
        }
    }
}

/// The sending side: a `Hello`, the tasks in `LaunchTasks` batches (written in 1 MiB chunks),
/// then `Shutdown`.
fn send(
    socket: &mut TcpStream,
    tasks_total: usize,
    batch_size: usize,
    payload_len: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut out = BytesMut::with_capacity(1 << 20);
    Message::hello(Role::Driver, AuthMethod::None, [0; 32])
        .encode(&mut out, FRAME_SIZE_MAX_DEFAULT)?;
    let payload = vec![0xab; payload_len];
    let mut batch = Vec::with_capacity(batch_size);
    let mut next_id = 0u64;
    while (next_id as usize) < tasks_total {
        batch.clear();
        let end = (next_id as usize + batch_size).min(tasks_total) as u64;
        batch.extend((next_id..end).map(|task_id| TaskLaunch {
            task_id,
            attempt: 0,
            cores: 1,
            function: 0,
            payload: &payload,
        }));
        next_id = end;
        Message::LaunchTasks {
            tasks: List::from_items(&batch),
        }
        .encode(&mut out, FRAME_SIZE_MAX_DEFAULT)?;
        if out.len() >= 1 << 20 {
            socket.write_all(&out)?;
            out.clear();
        }
    }
    Message::Shutdown {}.encode(&mut out, FRAME_SIZE_MAX_DEFAULT)?;
    socket.write_all(&out)?;
    Ok(())
}
