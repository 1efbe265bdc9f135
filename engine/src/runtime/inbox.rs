//! The bounded lock-free multi-producer inbox that feeds an event loop (and each pool worker),
//! plus the "parked" flag protocol that lets senders skip the wake-up syscall while the
//! receiver is busy.
//!
//! # The queue
//!
//! A Vyukov bounded array queue. The buffer holds `capacity` slots (rounded up to a power of
//! two, at least 2); each slot carries a sequence number next to the value:
//!
//! * initially `slot[i].seq == i`;
//! * a producer that read `tail == pos` may claim slot `pos & mask` when `seq == pos`: it CASes
//!   `tail` from `pos` to `pos + 1`, writes the value, then publishes it by storing
//!   `seq = pos + 1` (Release);
//! * a consumer that read `head == pos` may take the slot when `seq == pos + 1` (Acquire, so the
//!   value written by the producer is visible): it CASes `head` from `pos` to `pos + 1`, moves
//!   the value out (`pop_with` hands it to its caller's function first), then frees the slot for
//!   the next lap by storing `seq = pos + capacity` (Release, so the producer of the next lap
//!   sees the slot empty only after the read).
//! * `seq < pos` (producer) means the slot still holds last lap's value: the queue is full and
//!   `push` hands the value back. `seq < pos + 1` (consumer) means nothing is published there
//!   yet: the queue is empty.
//!
//! Both ends use CAS, so the queue is safe with several consumers too; the pool relies on that
//! to let an idle worker steal from a busy worker's inbox. A value pushed by one thread before
//! it pushes another is popped first (per-sender FIFO), because `tail` only grows.
//!
//! # Parking (the Dekker handshake)
//!
//! The receiver may block (in `mio::Poll::poll` or `thread::park`) when its inbox is empty, and
//! a sender must then wake it; but a syscall per message would cost more than the queue. So:
//!
//! ```text
//! receiver (about to block)              sender
//!   parked.store(true)                     queue.push(v)        // seq store, Release
//!   fence(SeqCst)                          fence(SeqCst)
//!   if !queue.is_empty() { cancel }        if parked.load() { wake() }
//!   block until woken                      
//!   parked.store(false)
//! ```
//!
//! The two SeqCst fences are ordered one way or the other: if the receiver's fence comes first,
//! the sender's load sees `parked == true` and wakes it; if the sender's fence comes first, the
//! receiver's emptiness check sees the value and does not block. A lost wake-up is impossible;
//! a spurious one (the receiver was woken for another reason and has not cleared `parked` yet)
//! costs one extra return from the blocking call. Senders only read `parked` (no
//! read-modify-write on it), so the protocol is plain Dekker that loom models exactly; the price
//! is that every sender arriving between the receiver's announcement and its `park_done` pays
//! for a wake-up (a window of a few microseconds; `mio::Waker` and `Thread::unpark` are cheap
//! when already signalled). While the receiver is busy `parked` is false and a send costs the
//! CAS, the store and the fence, no syscall. The loom tests at the bottom of this file check
//! both the queue and the handshake (with a loom condition variable standing in for the waker).

use crate::loom::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use crate::loom::UnsafeCell;
use crossbeam_utils::CachePadded;
use std::mem::MaybeUninit;

struct Slot<T> {
    seq: AtomicUsize,
    value: UnsafeCell<MaybeUninit<T>>,
}

/// A bounded lock-free multi-producer queue with a park/wake handshake for its receiver.
///
/// See the module documentation for the protocol. `push` never blocks and never allocates;
/// a full inbox hands the value back.
pub struct Inbox<T> {
    head: CachePadded<AtomicUsize>,
    tail: CachePadded<AtomicUsize>,
    parked: CachePadded<AtomicBool>,
    slots: Box<[Slot<T>]>,
    mask: usize,
}

// SAFETY: values of type `T` move between threads through the queue (so `T: Send` is needed),
// and each slot's value is accessed by exactly one thread at a time: the slot's sequence number
// and the CAS on `head`/`tail` hand exclusive ownership of the slot to one producer (to write)
// and then to one consumer (to read), with Release/Acquire on `seq` ordering the accesses.
unsafe impl<T: Send> Send for Inbox<T> {}
// SAFETY: as above; shared access only goes through the atomic protocol.
unsafe impl<T: Send> Sync for Inbox<T> {}

impl<T> Inbox<T> {
    /// Creates an inbox holding at most `capacity` values, rounded up to a power of two (at
    /// least 2).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(2).next_power_of_two();
        let slots = (0..capacity)
            .map(|i| Slot {
                seq: AtomicUsize::new(i),
                value: UnsafeCell::new(MaybeUninit::uninit()),
            })
            .collect::<Vec<_>>()
            .into_boxed_slice();
        Self {
            head: CachePadded::new(AtomicUsize::new(0)),
            tail: CachePadded::new(AtomicUsize::new(0)),
            parked: CachePadded::new(AtomicBool::new(false)),
            slots,
            mask: capacity - 1,
        }
    }

    /// The number of values the inbox can hold.
    pub fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// The number of queued values; a snapshot that may be stale by the time it is used.
    pub fn len(&self) -> usize {
        let tail = self.tail.load(Ordering::Relaxed);
        let head = self.head.load(Ordering::Relaxed);
        tail.wrapping_sub(head).min(self.capacity())
    }

    /// Whether no value is published at the head of the queue right now.
    pub fn is_empty(&self) -> bool {
        let mut pos = self.head.load(Ordering::Relaxed);
        loop {
            let seq = self.slots[pos & self.mask].seq.load(Ordering::Acquire);
            let diff = seq.wrapping_sub(pos.wrapping_add(1)) as isize;
            if diff == 0 {
                return false;
            }
            if diff < 0 {
                return true;
            }
            // Another consumer moved `head` on: look again at the new head.
            pos = self.head.load(Ordering::Relaxed);
        }
    }

    /// Pushes `value` without any wake-up bookkeeping; `Err(value)` when full.
    fn enqueue(&self, value: T) -> Result<(), T> {
        let mut pos = self.tail.load(Ordering::Relaxed);
        loop {
            let slot = &self.slots[pos & self.mask];
            let seq = slot.seq.load(Ordering::Acquire);
            let diff = seq.wrapping_sub(pos) as isize;
            if diff == 0 {
                match self.tail.compare_exchange(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        // SAFETY: the successful CAS on `tail` with `seq == pos` gives this
                        // thread exclusive ownership of the (empty) slot until it publishes
                        // `seq = pos + 1` below; no consumer reads it before that.
                        slot.value.with_mut(|p| unsafe { (*p).write(value) });
                        slot.seq.store(pos.wrapping_add(1), Ordering::Release);
                        return Ok(());
                    }
                    Err(current) => pos = current,
                }
            } else if diff < 0 {
                return Err(value);
            } else {
                pos = self.tail.load(Ordering::Relaxed);
            }
        }
    }

    /// Pushes `value`. On success, returns whether the caller must wake the receiver (it is
    /// parked or about to park). `Err(value)` when
    /// the inbox is full.
    #[inline]
    pub fn push(&self, value: T) -> Result<bool, T> {
        self.enqueue(value)?;
        // Pairs with the fence in `park_prepare` (see the module docs).
        fence(Ordering::SeqCst);
        Ok(self.parked.load(Ordering::Relaxed))
    }

    /// Pops the oldest value, if any. Safe to call from several threads.
    #[inline]
    pub fn pop(&self) -> Option<T> {
        self.pop_with(|value| value)
    }

    /// Pops the oldest value, if any, into `f`, and returns what `f` made of it. The slot is
    /// given back to the producers when `f` returns (or unwinds), not before: a consumer that
    /// takes the value apart reads its parts where the producer wrote them, instead of moving
    /// the whole value out first (a large value's copies were most of a pop). Safe to call from
    /// several threads.
    #[inline]
    pub fn pop_with<R>(&self, f: impl FnOnce(T) -> R) -> Option<R> {
        let mut pos = self.head.load(Ordering::Relaxed);
        loop {
            let slot = &self.slots[pos & self.mask];
            let seq = slot.seq.load(Ordering::Acquire);
            let diff = seq.wrapping_sub(pos.wrapping_add(1)) as isize;
            if diff == 0 {
                match self.head.compare_exchange(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        // Frees the slot for the next lap once `f` is done with the value
                        // (on unwinding too).
                        let _free = FreeSlot {
                            seq: &slot.seq,
                            next: pos.wrapping_add(self.mask + 1),
                        };
                        // SAFETY: `seq == pos + 1` (Acquire) means a producer wrote the value
                        // and published it; the successful CAS on `head` makes this thread
                        // the only one to read it, and the slot is not reused by a producer
                        // until `seq = pos + capacity` is stored, when `_free` drops.
                        let value = slot.value.with_mut(|p| unsafe { (*p).assume_init_read() });
                        return Some(f(value));
                    }
                    Err(current) => pos = current,
                }
            } else if diff < 0 {
                return None;
            } else {
                pos = self.head.load(Ordering::Relaxed);
            }
        }
    }

    /// Receiver side: announces that the receiver is about to block. Returns `true` when it
    /// may block (the inbox is empty after the handshake); `false` means a value is queued,
    /// the announcement was withdrawn, and the receiver should keep going.
    #[inline]
    pub fn park_prepare(&self) -> bool {
        self.parked.store(true, Ordering::Relaxed);
        // Pairs with the fence in `push` (see the module docs).
        fence(Ordering::SeqCst);
        if self.is_empty() {
            true
        } else {
            self.parked.store(false, Ordering::Relaxed);
            false
        }
    }

    /// Receiver side: called after the blocking call returned, for whatever reason.
    #[inline]
    pub fn park_done(&self) {
        self.parked.store(false, Ordering::Relaxed);
    }

    /// Best-effort wake-up of a receiver that is not owed one: returns `true` (and clears the
    /// flag) if the receiver is parked, so the caller should wake it. Used to call idle pool
    /// workers over to steal; correctness never depends on it.
    pub fn take_parked(&self) -> bool {
        self.parked.load(Ordering::Relaxed) && self.parked.swap(false, Ordering::Relaxed)
    }

    /// Whether the receiver announced it is parked (for diagnostics and wake decisions).
    pub fn is_parked(&self) -> bool {
        self.parked.load(Ordering::Relaxed)
    }
}

/// Stores a popped slot's sequence number for the next lap when dropped: the consumer's last
/// step ([`Inbox::pop_with`]), after it is done with the slot's value.
struct FreeSlot<'a> {
    seq: &'a AtomicUsize,
    next: usize,
}

impl Drop for FreeSlot<'_> {
    #[inline]
    fn drop(&mut self) {
        self.seq.store(self.next, Ordering::Release);
    }
}

impl<T> Drop for Inbox<T> {
    fn drop(&mut self) {
        while self.pop().is_some() {}
    }
}

impl<T> std::fmt::Debug for Inbox<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("capacity", &self.capacity())
            .field("len", &self.len())
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn capacity_rounds_up_and_full_returns_value() {
        let inbox = Inbox::new(3);
        assert_eq!(inbox.capacity(), 4);
        for i in 0..4 {
            assert!(inbox.push(i).is_ok());
        }
        assert_eq!(inbox.push(99), Err(99));
        assert_eq!(inbox.len(), 4);
        assert_eq!(inbox.pop(), Some(0));
        assert!(inbox.push(4).is_ok());
        let rest: Vec<_> = std::iter::from_fn(|| inbox.pop()).collect();
        assert_eq!(rest, vec![1, 2, 3, 4]);
        assert!(inbox.is_empty());
    }

    #[test]
    fn wake_requested_only_when_parked() {
        let inbox = Inbox::new(8);
        assert_eq!(inbox.push(1), Ok(false));
        assert!(!inbox.park_prepare(), "non-empty inbox must not park");
        assert_eq!(inbox.pop(), Some(1));
        assert!(inbox.park_prepare());
        assert_eq!(inbox.push(2), Ok(true), "first push after park wakes");
        inbox.park_done();
        assert_eq!(
            inbox.push(3),
            Ok(false),
            "no wake once the receiver is running"
        );
    }

    /// `pop_with` hands the value to its function and frees the slot only when the function
    /// returns or unwinds: a producer that comes round to the slot meanwhile finds the inbox
    /// full.
    #[test]
    fn pop_with_frees_the_slot_after_its_function() {
        let inbox = Inbox::new(2);
        assert_eq!(inbox.push(1), Ok(false));
        assert_eq!(inbox.push(2), Ok(false));
        assert_eq!(inbox.push(3), Err(3));
        let popped = inbox.pop_with(|v| {
            assert!(
                inbox.push(30).is_err(),
                "the slot is held while the value is used"
            );
            v * 10
        });
        assert_eq!(popped, Some(10));
        assert!(inbox.push(30).is_ok(), "and given back after");
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            inbox.pop_with(|_| panic!("the consumer's function fails"))
        }));
        assert!(unwound.is_err());
        assert!(
            inbox.push(40).is_ok(),
            "an unwinding consumer gives the slot back too"
        );
        let rest: Vec<_> = std::iter::from_fn(|| inbox.pop()).collect();
        assert_eq!(rest, vec![30, 40]);
    }

    #[test]
    fn drop_releases_queued_values() {
        let value = std::sync::Arc::new(());
        let inbox = Inbox::new(4);
        inbox.push(value.clone()).unwrap();
        inbox.push(value.clone()).unwrap();
        drop(inbox);
        assert_eq!(std::sync::Arc::strong_count(&value), 1);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::loom::sync::{Arc, Condvar, Mutex};
    use crate::loom::thread;

    /// Explores every interleaving with up to `LOOM_MAX_PREEMPTIONS` (default 3) preemptions,
    /// as tokio does, to keep the state space tractable.
    fn bounded_model(f: impl Fn() + Sync + Send + 'static) {
        let mut builder = loom::model::Builder::new();
        if builder.preemption_bound.is_none() {
            builder.preemption_bound = Some(3);
        }
        builder.check(f);
    }

    /// Two producers race two values each into the inbox while the consumer pops once
    /// concurrently, then drains. With capacity 4 every push fits; with capacity 2 some pushes
    /// find the inbox full. Either way: every accepted value is popped exactly once, nothing
    /// rejected appears, and each producer's values come out in the order it pushed them.
    fn mpsc_model(capacity: usize) {
        bounded_model(move || {
            let inbox = Arc::new(Inbox::new(capacity));
            let producers: Vec<_> = (0..2usize)
                .map(|p| {
                    let inbox = inbox.clone();
                    thread::spawn(move || {
                        (0..2usize)
                            .filter(|i| inbox.enqueue(p * 10 + i).is_ok())
                            .map(|i| p * 10 + i)
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            let mut got: Vec<usize> = inbox.pop().into_iter().collect();
            let mut accepted = Vec::new();
            for p in producers {
                accepted.extend(p.join().unwrap());
            }
            while let Some(v) = inbox.pop() {
                got.push(v);
            }
            for p in 0..2 {
                let mine: Vec<_> = got.iter().filter(|v| **v / 10 == p).copied().collect();
                let mut sorted = mine.clone();
                sorted.sort_unstable();
                assert_eq!(mine, sorted, "per-producer FIFO");
            }
            let mut got_sorted = got.clone();
            got_sorted.sort_unstable();
            accepted.sort_unstable();
            assert_eq!(
                got_sorted, accepted,
                "exactly the accepted values, once each"
            );
            assert!(accepted.len() >= capacity.min(4));
        });
    }

    #[test]
    fn loom_inbox_mpsc_fifo() {
        mpsc_model(4);
    }

    #[test]
    fn loom_inbox_mpsc_full() {
        mpsc_model(2);
    }

    /// The park handshake never loses a wake-up: the consumer blocks on a condition variable
    /// (standing in for `mio::Waker`) only after `park_prepare` said so, and producers notify
    /// only when `push` says so. If a wake-up could be lost, loom reports a deadlock.
    #[test]
    fn loom_inbox_park_no_lost_wakeup() {
        bounded_model(|| {
            let inbox = Arc::new(Inbox::new(4));
            let signal = Arc::new((Mutex::new(false), Condvar::new()));
            let producers: Vec<_> = (0..2usize)
                .map(|p| {
                    let inbox = inbox.clone();
                    let signal = signal.clone();
                    thread::spawn(move || {
                        if inbox.push(p).expect("capacity 4 holds 2 values") {
                            let (lock, cvar) = &*signal;
                            *lock.lock().unwrap() = true;
                            cvar.notify_one();
                        }
                    })
                })
                .collect();
            let mut received = 0;
            while received < 2 {
                if inbox.pop().is_some() {
                    received += 1;
                    continue;
                }
                if inbox.park_prepare() {
                    let (lock, cvar) = &*signal;
                    let mut woken = lock.lock().unwrap();
                    while !*woken {
                        woken = cvar.wait(woken).unwrap();
                    }
                    *woken = false;
                    drop(woken);
                    inbox.park_done();
                }
            }
            for p in producers {
                p.join().unwrap();
            }
        });
    }
}
