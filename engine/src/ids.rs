//! `IdMap`: a map keyed by ids a process hands out in increasing order (job ids), for the
//! tables the driver keeps per active job (the scheduler's job slots, the core's active jobs,
//! the callers' handles, the telemetry's tracks).
//!
//! Such ids arrive nearly in order and mostly end nearly in order, so the live ones are a
//! window of recent ids with a few older ones: the window is a ring indexed by `id - base`
//! (an insert is a push at the back, a lookup an index, a removal at the front moves `base`
//! on), and an id below the window, or one the window had to let go of to stay within
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
#[derive(Debug, Clone)]
pub struct IdMap<V> {
    /// The id of the window's first slot; it only grows, and every key of `older` is below it.
    base: u64,
    /// The window: a ring of `slots.len()` slots (0 or a power of two), of which the `len` from
    /// `head` on hold ids `base..base + len`; when `len > 0` the first and last of them are
    /// `Some`. Every slot outside them is `None`, so the window moves on past an empty slot
    /// without moving anything.
    slots: Vec<Option<V>>,
    head: usize,
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
            head: 0,
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

    /// The ring position of the window's `offset`-th slot (`slots` is not empty).
    #[inline]
    fn at(&self, offset: usize) -> usize {
        (self.head + offset) & (self.slots.len() - 1)
    }

    /// The ring position of `id`, if the window spans it.
    #[inline]
    fn position(&self, id: u64) -> Option<usize> {
        let offset = id.checked_sub(self.base)?;
        (offset < self.len as u64).then(|| self.at(offset as usize))
    }

    /// The entry of `id`.
    #[inline]
    pub fn get(&self, id: u64) -> Option<&V> {
        if id < self.base {
            return self.older.get(&id);
        }
        self.slots[self.position(id)?].as_ref()
    }

    /// The entry of `id`, to change.
    #[inline]
    pub fn get_mut(&mut self, id: u64) -> Option<&mut V> {
        if id < self.base {
            return self.older.get_mut(&id);
        }
        let at = self.position(id)?;
        self.slots[at].as_mut()
    }

    /// Whether `id` has an entry.
    #[inline]
    pub fn contains_key(&self, id: u64) -> bool {
        self.get(id).is_some()
    }

    /// Sets `id`'s entry to `value`; the one it replaces, if any.
    #[inline]
    pub fn insert(&mut self, id: u64, value: V) -> Option<V> {
        if id < self.base {
            return self.older.insert(id, value);
        }
        if let Some(at) = self.position(id) {
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
        let at = self.at(offset);
        self.slots[at] = Some(value);
        self.len = offset + 1;
        self.in_window += 1;
        self.check();
        None
    }

    /// Removes `id`'s entry and returns it.
    #[inline]
    pub fn remove(&mut self, id: u64) -> Option<V> {
        if id < self.base {
            return self.older.remove(&id);
        }
        let at = self.position(id)?;
        let value = self.slots[at].take()?;
        self.in_window -= 1;
        self.trim();
        self.check();
        Some(value)
    }

    /// A ring of at least `slots` slots (a power of two), the window's slots first.
    #[cold]
    fn grow(&mut self, slots: usize) {
        let size = slots.next_power_of_two().max(16);
        let mut ring: Vec<Option<V>> = Vec::with_capacity(size);
        for offset in 0..self.len {
            let at = self.at(offset);
            ring.push(self.slots[at].take());
        }
        ring.resize_with(size, || None);
        self.slots = ring;
        self.head = 0;
    }

    /// Moves the window's first entry to the hash map (the window moves on past it).
    fn retire_front(&mut self) {
        if let Some(value) = self.slots[self.head].take() {
            self.older.insert(self.base, value);
            self.in_window -= 1;
        }
        self.head = self.at(1);
        self.base += 1;
        self.len -= 1;
        self.trim();
    }

    /// Leaves out the empty slots at both ends of the window (the front's move `base` on).
    #[inline]
    fn trim(&mut self) {
        if self.in_window == 0 {
            // Saturating: past an entry of id u64::MAX, nothing is left to span.
            self.base = self.base.saturating_add(self.len as u64);
            self.len = 0;
            return;
        }
        while self.slots[self.head].is_none() {
            self.head = self.at(1);
            self.base += 1;
            self.len -= 1;
        }
        while self.slots[self.at(self.len - 1)].is_none() {
            self.len -= 1;
        }
    }

    /// The window's entries with their ids, in id order.
    fn window(&self) -> impl Iterator<Item = (u64, &V)> + '_ {
        (0..self.len).filter_map(move |offset| {
            let value = self.slots[self.at(offset)].as_ref()?;
            Some((self.base + offset as u64, value))
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
            let at = self.at(offset);
            let id = self.base + offset as u64;
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
            let at = self.at(offset);
            if let Some(value) = self.slots[at].take() {
                all.push((self.base + offset as u64, value));
            }
        }
        self.base = self.base.saturating_add(self.len as u64);
        self.len = 0;
        self.in_window = 0;
        all.extend(self.older.drain());
        self.check();
        all
    }

    /// Debug builds check the layout's invariants after each change.
    fn check(&self) {
        if cfg!(debug_assertions) {
            debug_assert!(self.len <= self.slots.len() && self.slots.len() <= WINDOW_MAX);
            debug_assert!(self.slots.is_empty() || self.slots.len().is_power_of_two());
            debug_assert!(self.in_window <= self.len);
            if self.len > 0 {
                debug_assert!(self.slots[self.head].is_some());
                debug_assert!(self.slots[self.at(self.len - 1)].is_some());
            }
            // Every slot outside the window is empty (checked in full only for small rings).
            if self.slots.len() <= 64 {
                let outside = (self.len..self.slots.len()).map(|offset| self.at(offset));
                debug_assert!(outside.clone().all(|at| self.slots[at].is_none()));
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
}
