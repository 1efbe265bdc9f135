//! The HTTP server's connection table, sans IO: slots for at most `max` connections, at most
//! `per_key_max` from one client ([`AddrKey`]), and the order in which connections may be
//! evicted. A connection is evictable while it has shown nothing worth keeping (reading its
//! head, or held for a paced refusal); once a request is accepted it is not. A newcomer over a
//! cap evicts the oldest evictable connection (of its client, then of all) that has been in
//! the table at least `evict_age_us`, so a client that holds connections open cannot keep a
//! newer one out; when none is that old the newcomer is refused (cheaper: it was never
//! registered, and a client reconnecting in a loop churns through refusals, not evictions).

use std::collections::{BTreeSet, VecDeque};

use flint_engine::hash::FxHashMap;

use super::pace::AddrKey;

/// One connection's place in the table.
#[derive(Debug)]
pub struct Entry<C> {
    /// What the server keeps for it.
    pub conn: C,
    /// Its client.
    pub key: AddrKey,
    /// Its sequence number: unique in the table's life, increasing with arrival.
    pub seq: u64,
    /// When it came in.
    since_us: u64,
    evictable: bool,
}

#[derive(Debug, Default)]
struct KeyConns {
    count: usize,
    /// Its evictable connections, oldest first: `(seq, slot)`.
    evictable: VecDeque<(u64, usize)>,
}

/// What [`Table::insert`] did.
#[derive(Debug)]
pub enum Inserted<C> {
    /// In this slot, with this sequence number; these connections were evicted for it.
    At {
        /// Its slot.
        slot: usize,
        /// Its sequence number.
        seq: u64,
        /// Connections evicted to make room.
        evicted: Vec<C>,
    },
    /// No room: the connection is handed back.
    Refused(C),
}

/// The table (see the module docs).
#[derive(Debug)]
pub struct Table<C> {
    slots: Vec<Option<Entry<C>>>,
    free: Vec<usize>,
    len: usize,
    keys: FxHashMap<AddrKey, KeyConns>,
    /// Every evictable connection: `(seq, slot)`, oldest first.
    evictable: BTreeSet<(u64, usize)>,
    next_seq: u64,
    max: usize,
    per_key_max: usize,
    evict_age_us: u64,
}

impl<C> Table<C> {
    /// An empty table with these caps (each at least 1) and the age a connection must have to
    /// be evicted for a newcomer.
    pub fn new(max: usize, per_key_max: usize, evict_age_us: u64) -> Table<C> {
        assert!(max > 0 && per_key_max > 0);
        Table {
            slots: Vec::new(),
            free: Vec::new(),
            len: 0,
            keys: FxHashMap::default(),
            evictable: BTreeSet::new(),
            next_seq: 0,
            max,
            per_key_max,
            evict_age_us,
        }
    }

    /// Connections in the table.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Takes `conn` from client `key` in at `now_us`, evicting for it if a cap is reached.
    pub fn insert(&mut self, key: AddrKey, conn: C, now_us: u64) -> Inserted<C> {
        let mut evicted = Vec::new();
        let at_key_cap = self
            .keys
            .get(&key)
            .is_some_and(|k| k.count >= self.per_key_max);
        if at_key_cap {
            let oldest = self
                .keys
                .get(&key)
                .and_then(|k| k.evictable.front().copied());
            match oldest.and_then(|(_, slot)| self.remove_if_old(slot, now_us)) {
                Some(old) => evicted.push(old),
                None => return Inserted::Refused(conn),
            }
        }
        if self.len >= self.max {
            let oldest = self.evictable.first().copied();
            match oldest.and_then(|(_, slot)| self.remove_if_old(slot, now_us)) {
                Some(old) => evicted.push(old),
                None => return Inserted::Refused(conn),
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let slot = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.slots.len() - 1
        });
        self.slots[slot] = Some(Entry {
            conn,
            key,
            seq,
            since_us: now_us,
            evictable: true,
        });
        self.len += 1;
        let conns = self.keys.entry(key).or_default();
        conns.count += 1;
        conns.evictable.push_back((seq, slot));
        self.evictable.insert((seq, slot));
        Inserted::At { slot, seq, evicted }
    }

    /// Removes the connection in `slot` if it came in at least `evict_age_us` before `now_us`.
    fn remove_if_old(&mut self, slot: usize, now_us: u64) -> Option<C> {
        let entry = self.slots.get(slot)?.as_ref()?;
        if entry.since_us.saturating_add(self.evict_age_us) > now_us {
            return None;
        }
        self.remove(slot)
    }

    /// Removes the oldest evictable connection, if any, whatever its age (to free a descriptor).
    pub fn evict_oldest(&mut self) -> Option<C> {
        let (_, slot) = self.evictable.first().copied()?;
        self.remove(slot)
    }

    /// One past the highest slot ever used.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// The entry in `slot`.
    pub fn get_mut(&mut self, slot: usize) -> Option<&mut Entry<C>> {
        self.slots.get_mut(slot)?.as_mut()
    }

    /// Every occupied slot.
    pub fn slots(&self) -> impl Iterator<Item = usize> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.as_ref().map(|_| i))
    }

    /// Marks the connection in `slot` as one that may not be evicted (its request is taken).
    pub fn keep(&mut self, slot: usize) {
        let Some(entry) = self.slots.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        if !entry.evictable {
            return;
        }
        entry.evictable = false;
        let (seq, key) = (entry.seq, entry.key);
        self.unlist(key, seq, slot);
    }

    /// Takes the connection in `slot` out of the table.
    pub fn remove(&mut self, slot: usize) -> Option<C> {
        let entry = self.slots.get_mut(slot)?.take()?;
        self.free.push(slot);
        self.len -= 1;
        if entry.evictable {
            self.unlist(entry.key, entry.seq, slot);
        }
        if let Some(conns) = self.keys.get_mut(&entry.key) {
            conns.count -= 1;
            if conns.count == 0 {
                self.keys.remove(&entry.key);
            }
        }
        Some(entry.conn)
    }

    fn unlist(&mut self, key: AddrKey, seq: u64, slot: usize) {
        self.evictable.remove(&(seq, slot));
        if let Some(conns) = self.keys.get_mut(&key) {
            if let Some(i) = conns.evictable.iter().position(|&(s, _)| s == seq) {
                conns.evictable.remove(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(last: u8) -> AddrKey {
        AddrKey::of(std::net::IpAddr::from([10, 0, 0, last]))
    }

    fn slot_of(inserted: Inserted<u32>) -> (usize, Vec<u32>) {
        match inserted {
            Inserted::At { slot, evicted, .. } => (slot, evicted),
            Inserted::Refused(c) => panic!("{c} refused"),
        }
    }

    #[test]
    fn a_client_at_its_cap_evicts_its_own_oldest() {
        let mut table = Table::new(100, 3, 50);
        slot_of(table.insert(key(1), 0, 0));
        slot_of(table.insert(key(1), 1, 10));
        slot_of(table.insert(key(2), 100, 10));
        slot_of(table.insert(key(1), 2, 20));
        // Its oldest is too young to be evicted: the newcomer is refused.
        assert!(matches!(table.insert(key(1), 9, 49), Inserted::Refused(9)));
        assert_eq!(slot_of(table.insert(key(1), 3, 50)).1, vec![0]);
        // Kept connections are never evicted: with all three kept, a fourth is refused.
        let slots: Vec<usize> = table.slots().collect();
        for slot in slots {
            if table.get_mut(slot).unwrap().key == key(1) {
                table.keep(slot);
            }
        }
        assert!(matches!(
            table.insert(key(1), 4, 1_000),
            Inserted::Refused(4)
        ));
        assert_eq!(table.len(), 4);
    }

    #[test]
    fn a_full_table_evicts_the_oldest_of_all() {
        let mut table = Table::new(3, 3, 0);
        let (a, _) = slot_of(table.insert(key(1), 1, 0));
        slot_of(table.insert(key(2), 2, 0));
        slot_of(table.insert(key(3), 3, 0));
        table.keep(a);
        assert_eq!(slot_of(table.insert(key(4), 4, 0)).1, vec![2]);
        assert_eq!(table.remove(a), Some(1));
        assert_eq!(table.len(), 2);
        assert_eq!(table.evict_oldest(), Some(3));
        assert_eq!(table.evict_oldest(), Some(4));
        assert!(table.is_empty());
        assert_eq!(table.evict_oldest(), None);
        assert!(table.keys.is_empty() && table.evictable.is_empty());
    }
}
