//! Decoding a `LaunchTasks` batch and iterating its tasks allocates nothing per task, and the
//! payloads handed out are views of the receive buffer.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::BytesMut;
use flint_net::wire::{FrameDecoder, List, Message, TaskLaunch, FRAME_SIZE_MAX_DEFAULT};

/// Counts the allocations made by threads that ask for it (the test harness's own threads may
/// allocate at any time and must not count).
struct CountingAllocator;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: forwards every call unchanged to the system allocator; only counts.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract for `alloc` is passed through as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout, via `alloc` above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

#[test]
fn iterating_a_batch_of_1000_tasks_allocates_nothing_per_task() {
    const TASKS: usize = 1000;
    let payloads: Vec<[u8; 64]> = (0..TASKS).map(|i| [i as u8; 64]).collect();
    let tasks: Vec<TaskLaunch> = payloads
        .iter()
        .enumerate()
        .map(|(i, payload)| TaskLaunch {
            task_id: i as u64,
            attempt: 0,
            cores: 1,
            function: 0,
            payload,
        })
        .collect();
    let mut wire = BytesMut::new();
    Message::LaunchTasks {
        tasks: List::from_items(&tasks),
    }
    .encode(&mut wire, FRAME_SIZE_MAX_DEFAULT)
    .expect("fits");
    let mut decoder = FrameDecoder::new(FRAME_SIZE_MAX_DEFAULT);
    decoder.extend_from_slice(&wire);

    COUNTING.with(|counting| counting.set(true));
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let frame = decoder.next_frame().expect("valid").expect("complete");
    let Ok(Message::LaunchTasks { tasks: batch }) = frame.message() else {
        panic!("expected LaunchTasks");
    };
    let mut payload_bytes = 0;
    let mut id_sum = 0;
    for task in batch.iter() {
        let shared = frame.share(task.payload);
        payload_bytes += shared.len();
        id_sum += task.task_id;
    }
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - before;
    COUNTING.with(|counting| counting.set(false));

    assert_eq!(payload_bytes, TASKS * 64);
    assert_eq!(id_sum, (0..TASKS as u64).sum::<u64>());
    // Splitting the frame off the buffer and sharing it may allocate a reference count once;
    // nothing is allocated per task.
    assert!(
        allocations <= 2,
        "{allocations} allocations for {TASKS} tasks"
    );
}
