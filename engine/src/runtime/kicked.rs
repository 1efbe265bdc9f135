//! A bounded lock-free queue from other threads to one loop, with the "kick" protocol that
//! wakes the loop once per batch instead of once per value: the task runner's completions
//! (`crate::runner`) and the driver's submissions use it.
//!
//! A producer pushes its value, then sets `kick_pending`; only the producer that flips it from
//! false to true must kick the loop (send it one wake-up). The loop clears the flag *before* it
//! drains, so a value pushed during a drain is either taken by it or flips the flag and kicks
//! again: none is stranded. While the loop is busy, values pile up and leave in one batch. A
//! drain takes at most a queue's worth (a flood cannot starve the loop) and says when the loop
//! must come back for the rest.

use std::sync::atomic::{AtomicBool, Ordering};

use super::Inbox;

/// The queue and its kick flag (see the module docs).
pub struct Kicked<T> {
    queue: Inbox<T>,
    kick_pending: AtomicBool,
}

impl<T> Kicked<T> {
    /// A queue of `capacity` values (rounded up to a power of two, at least 2).
    pub fn new(capacity: usize) -> Self {
        Kicked {
            queue: Inbox::new(capacity),
            kick_pending: AtomicBool::new(false),
        }
    }

    /// A producer's side: queues `value`. `Ok(true)` when the caller must kick the loop (no
    /// kick was pending); `Err` hands the value back when the queue is full.
    pub fn push(&self, value: T) -> Result<bool, T> {
        self.queue.push(value)?;
        Ok(!self.kick_pending.swap(true, Ordering::SeqCst))
    }

    /// The loop's side: hands queued values to `each`, at most a queue's worth. Returns
    /// whether the loop must come back for more (some are left and no kick is pending; the
    /// flag is set, so producers do not kick meanwhile).
    pub fn drain(&self, mut each: impl FnMut(T)) -> bool {
        self.kick_pending.store(false, Ordering::SeqCst);
        for _ in 0..self.queue.capacity() {
            // The value goes to `each` straight from its slot.
            if self.queue.pop_with(&mut each).is_none() {
                return false;
            }
        }
        !self.queue.is_empty() && !self.kick_pending.swap(true, Ordering::SeqCst)
    }

    /// Every queued value, taken by anyone once no loop will drain (it stopped).
    pub fn take_all(&self, mut each: impl FnMut(T)) {
        while let Some(value) = self.queue.pop() {
            each(value);
        }
    }

    /// Whether nothing is queued (a snapshot).
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Condvar, Mutex};
    use std::time::{Duration, Instant};

    /// Producers on four threads push while a loop thread drains only when kicked: every value
    /// is taken, and each producer's in the order it pushed them. (Without the flag cleared
    /// before the drain, values are stranded and this fails at its deadline.)
    #[test]
    fn kicked_drains_take_every_value_in_each_producers_order() {
        const PRODUCERS: u64 = 4;
        const EACH: u64 = 20_000;
        let queue = Arc::new(Kicked::new(64));
        let kicks = Arc::new((Mutex::new(0usize), Condvar::new()));
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let (queue, kicks) = (queue.clone(), kicks.clone());
                std::thread::spawn(move || {
                    let mut next = 0;
                    while next < EACH {
                        match queue.push(p << 32 | next) {
                            Ok(kick) => {
                                next += 1;
                                if kick {
                                    *kicks.0.lock().unwrap() += 1;
                                    kicks.1.notify_one();
                                }
                            }
                            Err(_) => std::thread::yield_now(),
                        }
                    }
                })
            })
            .collect();
        let mut taken = 0u64;
        let mut last = [None::<u64>; PRODUCERS as usize];
        let deadline = Instant::now() + Duration::from_secs(60);
        while taken < PRODUCERS * EACH {
            assert!(Instant::now() < deadline, "stranded: {taken} taken");
            let mut pending = kicks.0.lock().unwrap();
            if *pending == 0 {
                pending = kicks
                    .1
                    .wait_timeout(pending, Duration::from_millis(100))
                    .unwrap()
                    .0;
                if *pending == 0 {
                    continue;
                }
            }
            *pending -= 1;
            drop(pending);
            let again = queue.drain(|v| {
                let (p, index) = ((v >> 32) as usize, v & 0xffff_ffff);
                assert!(
                    last[p].is_none_or(|l| l < index),
                    "producer {p} out of order"
                );
                last[p] = Some(index);
                taken += 1;
            });
            if again {
                *kicks.0.lock().unwrap() += 1;
            }
        }
        producers.into_iter().for_each(|p| p.join().unwrap());
        assert!(queue.is_empty());
        assert_eq!(last, [Some(EACH - 1); PRODUCERS as usize]);
    }

    #[test]
    fn a_full_queue_hands_the_value_back_and_take_all_empties_it() {
        let queue = Kicked::new(2);
        assert!(matches!(queue.push(1), Ok(true)), "the first push kicks");
        assert!(matches!(queue.push(2), Ok(false)), "a kick is pending");
        assert!(matches!(queue.push(3), Err(3)), "full");
        let mut all = Vec::new();
        queue.take_all(|v| all.push(v));
        assert_eq!(all, [1, 2]);
        assert!(queue.is_empty());
    }
}
