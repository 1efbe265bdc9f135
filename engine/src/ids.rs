//! `IdMap`: a map keyed by ids a process hands out in increasing order (job ids), for the
//! tables the driver keeps per active job (the scheduler's job slots, the telemetry's tracks;
//! the callers' handles find theirs by the job's token instead).
//!
//! Such ids arrive nearly in order and mostly end nearly in order, so the live ones are a
//! window of recent ids with a few older ones: the window is a ring indexed by the id's low
//! bits (an insert is a push at the back, a lookup an index, a removal at the front moves
//! `base` on), and an id below the window, or one the window had to let go of to stay within
//! [`WINDOW_MAX`] slots, lives in a hash map beside it. Whatever the order of inserts and
//! removals, each id is in exactly one of the two, memory is bounded by the entries plus
//! `WINDOW_MAX` slots (the ring keeps the largest size it grew to: up to `WINDOW_MAX` times
//! `size_of::<Option<V>>()`), and every operation is O(1) amortized (an entry moves from the
//! window to the hash map at most once); walking every entry (`iter`, `values`) visits the
//! ring's slots too, so it is for views and rare checks, not for every event.

use crate::hash::FxHashMap;

/// Slots the window spans at most (a power of two): an insert further past its front than this
/// moves the front's entries to the hash map (a long-lived id among many short-lived ones).
pub const WINDOW_MAX: usize = 4096;

/// A map from `u64` ids to `V`, fastest when ids come in increasing order (see the module docs).
///
/// The common cases are a few instructions inlined at the caller: an insert one past the
/// window's end, a lookup inside the window, a removal at either end of it. Anything else
/// (a straggler, a gap, a ring to grow) goes out of line.
#[derive(Debug, Clone)]
pub struct IdMap<V> {
    /// The id of the window's first slot; it only grows, and every key of `older` is below it.
    base: u64,
    /// The window: a ring of `slots.len()` slots (0 or a power of two) in which id `id` has
    /// slot `id & (slots.len() - 1)` (no separate head to add: the window's front is `base`'s
    /// slot). The window spans ids `base..base + len`; when `len > 0` the first and last of
    /// them are `Some`. Every slot outside it is `None`, so the window moves on past an empty
    /// slot without moving anything, and an append finds its slot empty.
    slots: Vec<Option<V>>,
    /// `slots.len() - 1` (wrapping), kept beside the ring: an id's slot is `id & mask`, one
    /// `and` where the ring's length was loaded and decremented at every use.
    mask: usize,
    len: usize,
    /// `Some` slots in the window.
    in_window: usize,
    /// The entries of ids below `base`.
    older: FxHashMap<u64, V>,
}

impl<V> Default for IdMap<V> {
    fn default() -> Self {
        IdMap {
            base: 0,
            slots: Vec::new(),
            mask: usize::MAX,
            len: 0,
            in_window: 0,
            older: FxHashMap::default(),
        }
    }
}

impl<V> IdMap<V> {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// The entries.
    pub fn len(&self) -> usize {
        self.in_window + self.older.len()
    }

    /// Whether it has no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ring slot of `id` (`slots` is not empty; meaningful only for an id the window
    /// spans, or the one just past it when the ring has room).
    #[inline]
    fn slot(&self, id: u64) -> usize {
        // Truncating on a 32-bit target keeps the low bits, which are all the mask keeps.
        debug_assert_eq!(self.mask, self.slots.len().wrapping_sub(1));
        (id as usize) & self.mask
    }

    /// The ring slot of `id`, which the window spans (or the one just past it when the ring has
    /// room), without a bounds check: the common operations index the ring once or twice each,
    /// and the check was a compare and a branch every time, in every table keyed by job.
    #[inline]
    fn at(&self, id: u64) -> &Option<V> {
        debug_assert!(!self.slots.is_empty());
        let at = self.slot(id);
        // SAFETY: the window spans an id (or has room past its end), so the ring is not empty
        // (`len <= slots.len()`, checked by `check`), and its length is a power of two (see
        // `slots`): `id & (slots.len() - 1)` is below it.
        unsafe { self.slots.get_unchecked(at) }
    }

    /// [`IdMap::at`], to change.
    #[inline]
    fn at_mut(&mut self, id: u64) -> &mut Option<V> {
        debug_assert!(!self.slots.is_empty());
        let at = self.slot(id);
        // SAFETY: as for `at`.
        unsafe { self.slots.get_unchecked_mut(at) }
    }

    /// `id`'s offset into the window, if the window spans it. One comparison: an id below
    /// `base` wraps to an offset far past any window.
    #[inline]
    fn offset(&self, id: u64) -> Option<u64> {
        let offset = id.wrapping_sub(self.base);
        (offset < self.len as u64).then_some(offset)
    }

    /// The entry of `id`.
    #[inline]
    pub fn get(&self, id: u64) -> Option<&V> {
        if self.offset(id).is_some() {
            return self.at(id).as_ref();
        }
        if id < self.base {
            return self.older_get(id);
        }
        None
    }

    /// The entry of `id`, to change.
    #[inline]
    pub fn get_mut(&mut self, id: u64) -> Option<&mut V> {
        if self.offset(id).is_some() {
            return self.at_mut(id).as_mut();
        }
        if id < self.base {
            return self.older.get_mut(&id);
        }
        None
    }

    /// The entry of an id below the window (out of line: rare, and a hash lookup).
    #[inline(never)]
    fn older_get(&self, id: u64) -> Option<&V> {
        self.older.get(&id)
    }

    /// Whether `id` has an entry.
    #[inline]
    pub fn contains_key(&self, id: u64) -> bool {
        self.get(id).is_some()
    }

    /// Sets `id`'s entry to `value`; the one it replaces, if any.
    #[inline]
    pub fn insert(&mut self, id: u64, value: V) -> Option<V> {
        // The common case: the id just past the window's end, with room in the ring (its slot
        // is outside the window, so empty).
        if id.wrapping_sub(self.base) == self.len as u64 && self.len < self.slots.len() {
            let slot = self.at_mut(id);
            debug_assert!(slot.is_none());
            *slot = Some(value);
            self.len += 1;
            self.in_window += 1;
            self.check();
            return None;
        }
        self.insert_elsewhere(id, value)
    }

    /// [`IdMap::insert`] of an id below the window, inside it, or past its end with a gap or
    /// with no room left in the ring.
    #[inline(never)]
    fn insert_elsewhere(&mut self, id: u64, value: V) -> Option<V> {
        if id < self.base {
            return self.older.insert(id, value);
        }
        if self.offset(id).is_some() {
            let at = self.slot(id);
            let before = self.slots[at].replace(value);
            self.in_window += usize::from(before.is_none());
            return before;
        }
        // Past the window's end: make room within WINDOW_MAX slots, then extend.
        while self.len > 0 && id - self.base >= WINDOW_MAX as u64 {
            self.retire_front();
        }
        if self.len == 0 {
            self.base = id;
        }
        let offset = (id - self.base) as usize;
        debug_assert!(offset >= self.len && offset < WINDOW_MAX);
        if offset >= self.slots.len() {
            self.grow(offset + 1);
        }
        let at = self.slot(id);
        self.slots[at] = Some(value);
        self.len = offset + 1;
        self.in_window += 1;
        self.check();
        None
    }

    /// Removes `id`'s entry and returns it.
    #[inline]
    pub fn remove(&mut self, id: u64) -> Option<V> {
        let Some(offset) = self.offset(id) else {
            return self.remove_older(id);
        };
        let value = self.at_mut(id).take()?;
        self.in_window -= 1;
        // Only a removal at an end narrows the window; one inside leaves a hole.
        if offset == 0 {
            self.trim_front();
        } else if offset == self.len as u64 - 1 {
            self.trim_back();
        }
        self.check();
        Some(value)
    }

    /// [`IdMap::remove`] of an id the window does not span (out of line: rare).
    #[inline(never)]
    fn remove_older(&mut self, id: u64) -> Option<V> {
        if id < self.base {
            return self.older.remove(&id);
        }
        None
    }

    /// A ring of at least `slots` slots (a power of two), each of the window's entries moved
    /// to its id's slot in it.
    #[cold]
    fn grow(&mut self, slots: usize) {
        let size = slots.next_power_of_two().max(16);
        let mut ring: Vec<Option<V>> = Vec::with_capacity(size);
        ring.resize_with(size, || None);
        for offset in 0..self.len {
            let id = self.base.wrapping_add(offset as u64);
            let from = self.slot(id);
            ring[(id as usize) & (size - 1)] = self.slots[from].take();
        }
        self.slots = ring;
        self.mask = size - 1;
    }

    /// Moves the window's first entry to the hash map (the window moves on past it).
    fn retire_front(&mut self) {
        let at = self.slot(self.base);
        if let Some(value) = self.slots[at].take() {
            self.older.insert(self.base, value);
            self.in_window -= 1;
        }
        self.base += 1;
        self.len -= 1;
        self.trim();
    }

    /// After the window's first slot was emptied: moves `base` on past the empty slots.
    #[inline]
    fn trim_front(&mut self) {
        if self.in_window == 0 {
            self.empty_window();
            return;
        }
        // The last slot is `Some`, so the loop stops at it at the latest (and `base` stays
        // below it: no overflow).
        loop {
            self.base += 1;
            self.len -= 1;
            if self.at(self.base).is_some() {
                return;
            }
        }
    }

    /// After the window's last slot was emptied (the first is `Some`): shortens the window
    /// past the empty slots at its end.
    #[inline]
    fn trim_back(&mut self) {
        loop {
            self.len -= 1;
            let last = self.base + (self.len as u64 - 1);
            if self.slots[self.slot(last)].is_some() {
                return;
            }
        }
    }

    /// A window with no entry left spans nothing, starting just past where it ended.
    fn empty_window(&mut self) {
        // Saturating: past an entry of id u64::MAX, nothing is left to span.
        self.base = self.base.saturating_add(self.len as u64);
        self.len = 0;
    }

    /// Leaves out the empty slots at both ends of the window (the front's move `base` on).
    fn trim(&mut self) {
        if self.in_window == 0 {
            self.empty_window();
            return;
        }
        while self.slots[self.slot(self.base)].is_none() {
            self.base += 1;
            self.len -= 1;
        }
        while self.slots[self.slot(self.base + (self.len as u64 - 1))].is_none() {
            self.len -= 1;
        }
    }

    /// The window's entries with their ids, in id order.
    fn window(&self) -> impl Iterator<Item = (u64, &V)> + '_ {
        (0..self.len).filter_map(move |offset| {
            let id = self.base + offset as u64;
            let value = self.slots[self.slot(id)].as_ref()?;
            Some((id, value))
        })
    }

    /// Every entry with its id: the window's in id order, then the older ones in no order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &V)> + '_ {
        (self.window()).chain(self.older.iter().map(|(&id, v)| (id, v)))
    }

    /// Every id with an entry (in [`IdMap::iter`]'s order).
    pub fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.iter().map(|(id, _)| id)
    }

    /// Every entry (in no particular order).
    pub fn values(&self) -> impl Iterator<Item = &V> + '_ {
        (self.slots.iter().flatten()).chain(self.older.values())
    }

    /// Every entry, to change (in no particular order).
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> + '_ {
        (self.slots.iter_mut().flatten()).chain(self.older.values_mut())
    }

    /// Keeps only the entries `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(u64, &mut V) -> bool) {
        for offset in 0..self.len {
            let id = self.base + offset as u64;
            let at = self.slot(id);
            if self.slots[at].as_mut().is_some_and(|v| !keep(id, v)) {
                self.slots[at] = None;
                self.in_window -= 1;
            }
        }
        self.trim();
        self.older.retain(|&id, v| keep(id, v));
        self.check();
    }

    /// Removes every entry and returns them with their ids (the map keeps its memory).
    pub fn drain(&mut self) -> Vec<(u64, V)> {
        let mut all = Vec::with_capacity(self.len());
        for offset in 0..self.len {
            let id = self.base + offset as u64;
            let at = self.slot(id);
            if let Some(value) = self.slots[at].take() {
                all.push((id, value));
            }
        }
        self.in_window = 0;
        self.empty_window();
        all.extend(self.older.drain());
        self.check();
        all
    }

    /// Debug builds check the layout's invariants after each change.
    #[inline]
    fn check(&self) {
        if cfg!(debug_assertions) {
            debug_assert!(self.len <= self.slots.len() && self.slots.len() <= WINDOW_MAX);
            debug_assert!(self.slots.is_empty() || self.slots.len().is_power_of_two());
            debug_assert!(self.in_window <= self.len);
            debug_assert!(self.len == 0 || self.base.checked_add(self.len as u64 - 1).is_some());
            if self.len > 0 {
                debug_assert!(self.slots[self.slot(self.base)].is_some());
                let last = self.base + (self.len as u64 - 1);
                debug_assert!(self.slots[self.slot(last)].is_some());
            }
            // Every slot outside the window is empty and the window holds `in_window`
            // entries (checked in full only for small rings).
            if self.slots.len() <= 64 {
                let inside = (0..self.len).map(|offset| self.base + offset as u64);
                let filled = inside.filter(|&id| self.slots[self.slot(id)].is_some());
                debug_assert_eq!(filled.count(), self.in_window);
                debug_assert_eq!(self.slots.iter().flatten().count(), self.in_window);
            }
            if self.older.len() <= 64 {
                debug_assert!(self.older.keys().all(|&id| id < self.base));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn ids_in_order_stay_in_the_window() {
        let mut map = IdMap::new();
        for id in 10..20 {
            assert_eq!(map.insert(id, id * 2), None);
        }
        assert_eq!((map.len(), map.older.len(), map.base), (10, 0, 10));
        assert_eq!(map.keys().collect::<Vec<_>>(), (10..20).collect::<Vec<_>>());
        assert_eq!(map.get(15), Some(&30));
        assert_eq!(map.remove(10), Some(20));
        assert_eq!(map.base, 11, "a removal at the front moves the window on");
        assert_eq!(map.remove(15), Some(30));
        assert_eq!(map.get(15), None);
        assert_eq!(map.remove(15), None);
        assert_eq!(map.base, 11, "a removal inside leaves a hole");
        for id in 11..20 {
            map.remove(id);
        }
        assert!(map.is_empty() && map.len == 0);
        assert_eq!(map.insert(25, 1), None);
        assert_eq!(map.base, 25, "an empty window starts at the next id");
    }

    #[test]
    fn a_long_lived_id_moves_to_the_hash_map_and_stays_found() {
        let mut map = IdMap::new();
        map.insert(1, "old");
        for id in 2..(2 + 3 * WINDOW_MAX as u64) {
            map.insert(id, "new");
            map.remove(id);
        }
        assert_eq!(map.older.len(), 1, "the old id left the window");
        assert!(map.len <= 1);
        assert_eq!(map.get(1), Some(&"old"));
        assert_eq!(map.len(), 1);
        assert_eq!(map.remove(1), Some("old"));
        assert!(map.is_empty());
    }

    #[test]
    fn an_id_below_the_window_and_one_far_past_it() {
        let mut map = IdMap::new();
        map.insert(100, 'a');
        map.insert(7, 'b');
        assert_eq!((map.base, map.older.len()), (100, 1));
        map.insert(u64::MAX, 'c');
        assert_eq!(map.base, u64::MAX, "a far id moves the whole window out");
        assert_eq!(map.get(100), Some(&'a'));
        assert_eq!(map.get(7), Some(&'b'));
        assert_eq!(map.get(u64::MAX), Some(&'c'));
        let mut all = map.drain();
        all.sort();
        assert_eq!(all, [(7, 'b'), (100, 'a'), (u64::MAX, 'c')]);
        assert!(map.is_empty());
        assert_eq!(map.get(7), None);
    }

    #[test]
    fn a_removal_at_either_end_narrows_the_window_past_its_holes() {
        let mut map = IdMap::new();
        for id in 10..20 {
            map.insert(id, id);
        }
        for id in [11, 12, 15, 16, 17] {
            assert_eq!(map.remove(id), Some(id));
        }
        assert_eq!((map.base, map.len), (10, 10), "holes inside change no end");
        assert_eq!(map.remove(19), Some(19));
        assert_eq!((map.base, map.len), (10, 9), "18 still ends it");
        assert_eq!(map.remove(18), Some(18));
        assert_eq!((map.base, map.len), (10, 5), "the back moved past 17..=15");
        assert_eq!(map.remove(10), Some(10));
        assert_eq!(
            (map.base, map.len),
            (13, 2),
            "the front moved past 11 and 12"
        );
        // The id just past the end is an append again, into a slot left empty.
        assert_eq!(map.insert(15, 150), None);
        assert_eq!((map.base, map.len, map.in_window), (13, 3, 3));
        assert_eq!(map.keys().collect::<Vec<_>>(), [13, 14, 15]);
        assert_eq!(map.get(15), Some(&150));
        assert_eq!(map.get(16), None);
        assert_eq!(map.remove(16), None);
        for id in [14, 13, 15] {
            assert_eq!(map.remove(id), Some(if id == 15 { 150 } else { id }));
        }
        assert!(map.is_empty());
        assert_eq!(
            (map.base, map.len),
            (16, 0),
            "an emptied window starts past its end"
        );
    }

    /// A window that goes round its ring many times, and a ring that grows while the window
    /// wraps round its end: each entry stays in its id's slot and is found.
    #[test]
    fn a_window_wrapping_round_its_ring_and_growing_keeps_every_entry() {
        let mut map = IdMap::new();
        let mut front = 0u64;
        for id in 0..1_000u64 {
            map.insert(id, id * 3);
            if id >= 10 {
                assert_eq!(map.remove(front), Some(front * 3));
                front += 1;
            }
        }
        assert_eq!(
            map.slots.len(),
            16,
            "a steady window of 10 stays in the first ring"
        );
        assert_eq!(map.base, 990);
        // 990..1000 wraps round the ring's end (990 & 15 = 14); growing moves it.
        for id in 1_000..1_100u64 {
            map.insert(id, id * 3);
        }
        assert_eq!(map.slots.len(), 128);
        assert_eq!(map.len(), 110);
        for id in 990..1_100u64 {
            assert_eq!(map.get(id), Some(&(id * 3)), "id {id}");
        }
        assert_eq!(map.get(989), None);
        assert_eq!(map.get(1_100), None);
        assert!(map.older.is_empty(), "nothing left the window");
    }

    #[test]
    fn appends_up_to_the_last_id_and_removals_past_it() {
        let mut map = IdMap::new();
        let top = u64::MAX;
        for id in top - 20..=top {
            assert_eq!(map.insert(id, id), None);
        }
        assert_eq!((map.base, map.len), (top - 20, 21));
        assert_eq!(map.get(top), Some(&top));
        assert_eq!(map.remove(top), Some(top));
        assert_eq!(map.len, 20, "the back moved in from the last id");
        for id in top - 20..top {
            assert_eq!(map.remove(id), Some(id));
        }
        assert!(map.is_empty());
        assert_eq!(
            (map.base, map.len),
            (top, 0),
            "saturated: top's slot is next"
        );
        assert_eq!(map.insert(top, 1), None);
        assert_eq!(map.remove(top), Some(1));
        assert_eq!(map.insert(top - 1, 2), None);
        assert_eq!(map.older.len(), 1, "below the window: the hash map");
        assert_eq!(map.get(top - 1), Some(&2));
    }

    /// Random inserts, lookups and removals, ids mostly in increasing order with stragglers,
    /// against a `HashMap`.
    #[test]
    fn agrees_with_a_hash_map() {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..20 {
            let mut map = IdMap::new();
            let mut model = HashMap::new();
            let mut top = round * 1_000;
            for _ in 0..20_000 {
                let r = next();
                let id = match r % 8 {
                    0 => next() % (top + 1),
                    1 => top + next() % (2 * WINDOW_MAX as u64),
                    _ => top.saturating_sub(next() % 300),
                };
                if r % 997 == 0 {
                    let odd = |id: u64| id % 2 == 1;
                    map.retain(|id, _| odd(id));
                    model.retain(|id, _| odd(*id));
                }
                match (r >> 8) % 4 {
                    0 | 1 => {
                        top = top.max(id + 1);
                        assert_eq!(map.insert(id, r), model.insert(id, r));
                    }
                    2 => assert_eq!(map.remove(id), model.remove(&id)),
                    _ => assert_eq!(map.get(id), model.get(&id)),
                }
                assert_eq!(map.len(), model.len());
            }
            let mut all: Vec<_> = map.iter().map(|(id, v)| (id, *v)).collect();
            all.sort();
            let mut want: Vec<_> = model.into_iter().collect();
            want.sort();
            assert_eq!(all, want);
        }
    }

    proptest::proptest! {
        /// Any order of inserts, lookups and removals, near id 0 or near `u64::MAX`, agrees
        /// with a `HashMap`, and the window keeps its layout (the debug checks).
        #[test]
        fn any_order_agrees_with_a_hash_map(
            near_top: bool,
            ops in proptest::collection::vec((0u8..4, 0u64..(2 * WINDOW_MAX as u64 + 64)), 1..400),
        ) {
            let start = if near_top { u64::MAX - 3 * WINDOW_MAX as u64 } else { 0 };
            let mut map = IdMap::new();
            let mut model = HashMap::new();
            for (i, (op, spread)) in ops.into_iter().enumerate() {
                // Mostly around a front that creeps up with the step, sometimes far.
                let id = start.saturating_add(i as u64 * 8).saturating_add(spread % 96)
                    .saturating_add(if spread > 2 * WINDOW_MAX as u64 { spread } else { 0 });
                match op {
                    0 | 1 => proptest::prop_assert_eq!(map.insert(id, i), model.insert(id, i)),
                    2 => proptest::prop_assert_eq!(map.remove(id), model.remove(&id)),
                    _ => proptest::prop_assert_eq!(map.get(id), model.get(&id)),
                }
                proptest::prop_assert_eq!(map.len(), model.len());
            }
            let mut all: Vec<_> = map.iter().map(|(id, v)| (id, *v)).collect();
            all.sort();
            let mut want: Vec<_> = model.into_iter().collect();
            want.sort();
            proptest::prop_assert_eq!(all, want);
        }
    }
}
