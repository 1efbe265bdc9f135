//! A small, fast, non-cryptographic hasher for tables keyed by ids (the scheduler's, the
//! runtime's, the roles'): FxHash, as in rustc.
//!
//! Keys are ids the process issues or validates itself, or that come from an authenticated peer,
//! so hash flooding is not a concern. The
//! hasher has no random state, so iteration orders (and thus outputs) are deterministic, which the
//! simulator relies on.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// FxHash (as in rustc): one multiply and rotate per word.
#[derive(Default, Clone, Copy)]
pub struct FxHasher {
    hash: u64,
}

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        // The tail in at most three words (4, 2 and 1 bytes), as rustc's FxHasher does: a
        // short name (a host's, a pool's) is mostly tail.
        let mut rest = chunks.remainder();
        if let [a, b, c, d, tail @ ..] = rest {
            self.add(u64::from(u32::from_le_bytes([*a, *b, *c, *d])));
            rest = tail;
        }
        if let [a, b, tail @ ..] = rest {
            self.add(u64::from(u16::from_le_bytes([*a, *b])));
            rest = tail;
        }
        if let [a] = rest {
            self.add(u64::from(*a));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

/// A `HashMap` with [`FxHasher`].
pub type FxHashMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;
/// A `HashSet` with [`FxHasher`].
pub type FxHashSet<K> = HashSet<K, BuildHasherDefault<FxHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    fn hash(bytes: &[u8]) -> u64 {
        let mut h = FxHasher::default();
        h.write(bytes);
        h.finish()
    }

    /// Every byte of a name feeds its hash, its tail (past the last whole word) too: names of
    /// every length to 17 that differ in one byte, or only in length, hash apart.
    #[test]
    fn every_byte_and_the_length_of_a_name_change_its_hash() {
        let base: Vec<u8> = (1..=17).collect();
        let mut seen = HashSet::new();
        for len in 0..=base.len() {
            let name = &base[..len];
            assert!(
                seen.insert(hash(name)),
                "length {len} hashes like a shorter name"
            );
            for i in 0..len {
                let mut other = name.to_vec();
                other[i] ^= 0x80;
                assert_ne!(hash(name), hash(&other), "byte {i} of {len} ignored");
            }
        }
        // As a table's hasher: a string key goes through `write` (and its terminator).
        let build = BuildHasherDefault::<FxHasher>::default();
        assert_ne!(build.hash_one("host-1"), build.hash_one("host-2"));
    }
}
