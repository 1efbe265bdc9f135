//! Batches over frames: a run of task launches or status updates goes out in as few frames as
//! fit under the maximum frame size, and every item that fits in a frame alone is sent.
//!
//! One item's variable part (a payload, a result, a failure's text) may be at most
//! [`item_bytes_max`]; callers bound what they put in a batch by it (a result larger than that
//! fails its task, a reason is truncated), so encoding a batch never fails and never drops an
//! item.

use bytes::{BufMut, Bytes, BytesMut};

use super::codec::Field;
use super::frame::{self, HEADER_LEN};
use super::{Kind, List, Message, StatusUpdate, TaskLaunch, WireError};

/// Bytes a batch item takes besides its variable part (ids, attempt, state, length prefixes;
/// rounded up).
pub const ITEM_OVERHEAD_BYTES: usize = 32;

/// Bytes a batch frame's body takes besides its items (the item count; rounded up).
pub const FRAME_OVERHEAD_BYTES: usize = 64;

/// The largest variable part one item may have and still fit in a frame of `frame_size_max`.
pub fn item_bytes_max(frame_size_max: usize) -> usize {
    frame_size_max.saturating_sub(FRAME_OVERHEAD_BYTES + ITEM_OVERHEAD_BYTES)
}

/// Longest failure text an item carries; longer ones are cut (see [`bound_reason`]).
pub const REASON_BYTES_MAX: usize = 4096;

/// `text` cut to at most [`REASON_BYTES_MAX`] bytes (at a character boundary where it is
/// UTF-8), ending with a marker that says how much was cut; shorter texts come back as they are.
pub fn bound_reason(text: Bytes) -> Bytes {
    if text.len() <= REASON_BYTES_MAX {
        return text;
    }
    let marker = format!(" [... {} bytes cut]", text.len());
    let mut keep = REASON_BYTES_MAX - marker.len();
    while keep > 0 && !is_char_start(text.get(keep).copied()) {
        keep -= 1;
    }
    let mut bounded = Vec::with_capacity(keep + marker.len());
    bounded.extend_from_slice(text.get(..keep).unwrap_or_default());
    bounded.extend_from_slice(marker.as_bytes());
    Bytes::from(bounded)
}

/// Whether a byte starts a UTF-8 character (is not a continuation byte).
fn is_char_start(byte: Option<u8>) -> bool {
    byte.is_none_or(|b| b & 0xC0 != 0x80)
}

/// The end of the run that starts at item `start` and fits in one frame (at least one item),
/// and the bytes its items take: `size(i)` is item `i`'s variable part, `len` the items in all.
fn run_end(
    start: usize,
    len: usize,
    frame_size_max: usize,
    size: impl Fn(usize) -> usize,
) -> (usize, usize) {
    let budget = frame_size_max.saturating_sub(FRAME_OVERHEAD_BYTES);
    let mut used = 0usize;
    let mut end = start;
    while end < len {
        let cost = size(end).saturating_add(ITEM_OVERHEAD_BYTES);
        if end > start && used.saturating_add(cost) > budget {
            break;
        }
        used = used.saturating_add(cost);
        end += 1;
    }
    (end, used)
}

/// Reserves room in `out` for a frame whose items take `items` bytes, so it grows its buffer
/// at most once a frame.
fn reserve(out: &mut BytesMut, items: usize) {
    out.reserve(items.saturating_add(FRAME_OVERHEAD_BYTES + super::HEADER_LEN));
}

/// `v` emptied, as a vector of `U`, keeping its allocation when `T` and `U` have one layout
/// (the standard library collects an empty `IntoIter` into the same buffer then): how a
/// vector of borrowing items (a batch to encode) outlives the borrows, kept from call to call.
pub fn emptied<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter().map(|_| unreachable!("emptied")).collect()
}

/// Appends `tasks` as `LaunchTasks` frames. Fails (leaving what it appended so far) only when
/// one task's payload exceeds [`item_bytes_max`].
pub fn encode_launches(
    tasks: &[TaskLaunch<'_>],
    out: &mut BytesMut,
    frame_size_max: usize,
) -> Result<(), WireError> {
    let mut launches = Launches::new(frame_size_max);
    for task in tasks {
        launches.push(out, task);
    }
    launches.finish(out)
}

/// Writes task launches as `LaunchTasks` frames one at a time, straight into a connection's
/// output: no slice of them is built first (the driver's launch path makes each launch from
/// the scheduler's own, so a slice would be a copy of every launch). The frames are those
/// [`encode_launches`] makes of the same launches in one call: a frame takes launches while
/// they fit under the maximum frame size by [`run_end`]'s rule, so the bytes do not depend on
/// which of the two wrote them.
///
/// Between launches the caller may append other frames to the output only after
/// [`Launches::finish`], which closes the open frame.
#[derive(Debug)]
pub struct Launches {
    frame_size_max: usize,
    /// The bytes a frame's launches may count for, by [`run_end`]'s rule.
    budget: usize,
    /// Where the open frame starts in the output (while `count` is not 0).
    start: usize,
    /// Launches in the open frame; 0 when none is open.
    count: u32,
    /// Bytes its launches count for against `budget`, as [`run_end`] counts them.
    used: usize,
    /// A launch that did not fit in a frame alone: it and the launches after it up to
    /// [`Launches::finish`] are not written, as [`encode_launches`] stops at it.
    failed: Option<WireError>,
}

impl Launches {
    /// No launch written yet, in frames of at most `frame_size_max` bytes of body.
    pub fn new(frame_size_max: usize) -> Self {
        Launches {
            frame_size_max,
            budget: frame_size_max.saturating_sub(FRAME_OVERHEAD_BYTES),
            start: 0,
            count: 0,
            used: 0,
            failed: None,
        }
    }

    /// Reserves room in `out` for a frame of `launches` launches as `encode_launches` did
    /// (what they count for against a frame's budget besides their payloads, and the frame's
    /// overhead), so the buffer grows at most once for a batch rather than as launches are
    /// appended (a connection's output is often a buffer just sent, with little room). At most
    /// one frame's worth is reserved.
    pub fn reserve(&self, out: &mut BytesMut, launches: usize) {
        let items = launches
            .saturating_mul(ITEM_OVERHEAD_BYTES)
            .min(self.budget);
        reserve(out, items);
    }

    /// Appends `task` to the open frame, or to a new one when none is open or it does not fit.
    #[inline]
    pub fn push(&mut self, out: &mut BytesMut, task: &TaskLaunch<'_>) {
        let cost = task.payload.len().saturating_add(ITEM_OVERHEAD_BYTES);
        if (self.count == 0 || self.used.saturating_add(cost) > self.budget)
            && !self.open(out, task)
        {
            return;
        }
        task.write(out);
        self.count += 1;
        self.used = self.used.saturating_add(cost);
    }

    /// Closes the open frame and opens one for `task`; false, opening none, once a launch did
    /// not fit in a frame alone (`task`, or one before it since [`Launches::finish`]).
    #[inline(never)]
    fn open(&mut self, out: &mut BytesMut, task: &TaskLaunch<'_>) -> bool {
        self.close(out);
        if self.failed.is_some() {
            return false;
        }
        // Only a launch alone in its frame can make the frame too large (a frame takes a second
        // one only within its budget): the frame it would be is refused here, as the frame
        // encoder refuses it in `encode_launches`.
        let len = (4 + TaskLaunch::ENCODED_LEN_MIN).saturating_add(task.payload.len());
        let max = self.frame_size_max.min(u32::MAX as usize);
        if len > max {
            self.failed = Some(WireError::FrameTooLarge { len, max });
            return false;
        }
        self.start = frame::begin_frame(out);
        // The list's count, set when the frame closes.
        out.put_u32_le(0);
        true
    }

    /// Closes the open frame (other frames may follow it in the output); the error of a launch
    /// that did not fit in a frame alone, if one did not since the last call.
    pub fn finish(&mut self, out: &mut BytesMut) -> Result<(), WireError> {
        self.close(out);
        match self.failed.take() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Sets the open frame's count and header, if one is open.
    fn close(&mut self, out: &mut BytesMut) {
        if self.count == 0 {
            return;
        }
        let at = self.start + HEADER_LEN;
        if let Some(slot) = out.get_mut(at..at + 4) {
            slot.copy_from_slice(&self.count.to_le_bytes());
        }
        if let Err(error) =
            frame::end_frame(out, self.start, Kind::LaunchTasks, self.frame_size_max)
        {
            self.failed = Some(error);
        }
        self.count = 0;
        self.used = 0;
    }
}

/// Appends `updates` as `StatusUpdates` frames. Fails (leaving what it appended so far) only
/// when one update's data exceeds [`item_bytes_max`].
pub fn encode_status_updates(
    updates: &[StatusUpdate<'_>],
    out: &mut BytesMut,
    frame_size_max: usize,
) -> Result<(), WireError> {
    let size = |i: usize| updates.get(i).map_or(0, |u| u.data.len());
    let mut start = 0;
    while start < updates.len() {
        let (end, items) = run_end(start, updates.len(), frame_size_max, size);
        reserve(out, items);
        let run = updates.get(start..end).unwrap_or_default();
        Message::StatusUpdates {
            updates: List::from_items(run),
        }
        .encode(out, frame_size_max)?;
        start = end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{FrameDecoder, TaskState};

    /// The ends of the runs items of these sizes are split into.
    fn frame_ends(sizes: &[usize], frame_size_max: usize) -> Vec<usize> {
        let mut ends = Vec::new();
        let mut start = 0;
        while start < sizes.len() {
            start = run_end(start, sizes.len(), frame_size_max, |i| sizes[i]).0;
            ends.push(start);
        }
        ends
    }

    #[test]
    fn an_emptied_vector_keeps_its_allocation_across_element_types() {
        let text = String::from("borrowed");
        let mut borrowing: Vec<&str> = Vec::with_capacity(10);
        borrowing.push(&text);
        let kept: Vec<&'static str> = emptied(borrowing);
        assert!(kept.is_empty());
        assert_eq!(kept.capacity(), 10, "the same buffer, not a new one");
    }

    #[test]
    fn runs_fit_their_frames_and_cover_every_item() {
        assert!(frame_ends(&[], 1000).is_empty());
        assert_eq!(frame_ends(&[10, 10, 10], 1000), vec![3]);
        // Each item alone nearly fills the frame: one frame each.
        let big = item_bytes_max(1000);
        assert_eq!(frame_ends(&[big, big, 1], 1000), vec![1, 2, 3]);
    }

    /// `tasks` as frames the way [`encode_launches`] made them before [`Launches`]: split into
    /// runs by [`run_end`], each encoded whole as one message.
    fn launches_by_runs(
        tasks: &[TaskLaunch<'_>],
        out: &mut BytesMut,
        frame_size_max: usize,
    ) -> Result<(), WireError> {
        let mut start = 0;
        while start < tasks.len() {
            let (end, _) = run_end(start, tasks.len(), frame_size_max, |i| {
                tasks[i].payload.len()
            });
            Message::LaunchTasks {
                tasks: List::from_items(&tasks[start..end]),
            }
            .encode(out, frame_size_max)?;
            start = end;
        }
        Ok(())
    }

    #[test]
    fn launches_written_one_at_a_time_make_the_frames_of_whole_runs() {
        let max = 1000;
        let big = vec![1u8; item_bytes_max(max)];
        let too_big = vec![2u8; max];
        let cases: Vec<Vec<&[u8]>> = vec![
            vec![],
            vec![b""],
            vec![b"a", b"", b"bc"],
            vec![&big, b"x", &big, &big, b""],
            vec![&big[..400], &big[..400], &big[..400], b"y"],
            // A launch too large for a frame: the launches before it are sent, it and the
            // ones after it are not, and the error says so.
            vec![b"a", b"b", &too_big, b"c"],
            vec![&too_big],
        ];
        for payloads in cases {
            let tasks: Vec<TaskLaunch> = (payloads.iter().enumerate())
                .map(|(i, payload)| TaskLaunch {
                    task_id: i as u64,
                    attempt: 1,
                    cores: 2,
                    function: 3,
                    payload,
                })
                .collect();
            let (mut expected, mut got) = (BytesMut::new(), BytesMut::new());
            let by_runs = launches_by_runs(&tasks, &mut expected, max);
            let one_by_one = encode_launches(&tasks, &mut got, max);
            assert_eq!(one_by_one, by_runs, "{:?}", payloads.len());
            assert_eq!(got, expected, "{:?}", payloads.len());
        }
        // Other frames may follow a finished one; the next launches open a frame of their own.
        let task = |payload| TaskLaunch {
            task_id: 9,
            attempt: 0,
            cores: 1,
            function: 0,
            payload,
        };
        let (mut expected, mut got) = (BytesMut::new(), BytesMut::new());
        let mut launches = Launches::new(max);
        launches.push(&mut got, &task(b"a"));
        launches.finish(&mut got).expect("fits");
        Message::Shutdown {}.encode(&mut got, max).expect("fits");
        launches.push(&mut got, &task(b"b"));
        launches.finish(&mut got).expect("fits");
        encode_launches(&[task(b"a")], &mut expected, max).expect("fits");
        Message::Shutdown {}
            .encode(&mut expected, max)
            .expect("fits");
        encode_launches(&[task(b"b")], &mut expected, max).expect("fits");
        assert_eq!(got, expected);
    }

    #[test]
    fn reasons_are_cut_at_a_character_boundary_with_a_marker() {
        let short = Bytes::from_static(b"short");
        assert_eq!(bound_reason(short.clone()), short);
        let long = Bytes::from("é".repeat(REASON_BYTES_MAX));
        let cut = bound_reason(long);
        assert!(cut.len() <= REASON_BYTES_MAX);
        let text = std::str::from_utf8(&cut).expect("still UTF-8");
        assert!(text.ends_with(&format!(" [... {} bytes cut]", 2 * REASON_BYTES_MAX)));
    }

    #[test]
    fn an_update_of_item_bytes_max_is_sent_whole_beside_small_ones() {
        let max = 4096;
        let big = vec![7u8; item_bytes_max(max)];
        let updates: Vec<StatusUpdate> = [&b"a"[..], &big, b"b", &big]
            .iter()
            .enumerate()
            .map(|(i, data)| StatusUpdate {
                task_id: i as u64,
                attempt: 0,
                state: TaskState::Finished,
                data,
            })
            .collect();
        let mut out = BytesMut::new();
        encode_status_updates(&updates, &mut out, max).expect("every update fits");
        let mut decoder = FrameDecoder::new(max);
        decoder.extend_from_slice(&out);
        let mut seen = Vec::new();
        while let Some(frame) = decoder.next_frame().expect("valid") {
            let Message::StatusUpdates { updates } = frame.message().expect("decodes") else {
                panic!("not a status batch");
            };
            seen.extend(updates.iter().map(|u| (u.task_id, u.data.len())));
        }
        assert_eq!(seen, vec![(0, 1), (1, big.len()), (2, 1), (3, big.len())]);
    }
}
