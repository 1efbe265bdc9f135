//! Batches over frames: a run of task launches or status updates goes out in as few frames as
//! fit under the maximum frame size, and every item that fits in a frame alone is sent.
//!
//! One item's variable part (a payload, a result, a failure's text) may be at most
//! [`item_bytes_max`]; callers bound what they put in a batch by it (a result larger than that
//! fails its task, a reason is truncated), so encoding a batch never fails and never drops an
//! item.

use bytes::{Bytes, BytesMut};

use super::{List, Message, StatusUpdate, TaskLaunch, WireError};

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
    let size = |i: usize| tasks.get(i).map_or(0, |t| t.payload.len());
    let mut start = 0;
    while start < tasks.len() {
        let (end, items) = run_end(start, tasks.len(), frame_size_max, size);
        reserve(out, items);
        let run = tasks.get(start..end).unwrap_or_default();
        Message::LaunchTasks {
            tasks: List::from_items(run),
        }
        .encode(out, frame_size_max)?;
        start = end;
    }
    Ok(())
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
