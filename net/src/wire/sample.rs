//! Random valid encodings for the property tests (test builds only).

/// splitmix64: a seeded generator for sample encodings (proptest picks the seeds).
#[allow(missing_docs)]
pub struct Rng(u64);

#[allow(missing_docs)]
impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, bound: usize) -> usize {
        (self.next_u64() % bound as u64) as usize
    }

    /// Short text with one-, two-, three- and four-byte characters.
    pub fn text(&mut self) -> String {
        const CHARS: [char; 8] = ['a', 'Z', '0', ' ', ':', 'é', '漢', '🦀'];
        (0..self.below(12))
            .map(|_| CHARS[self.below(CHARS.len())])
            .collect()
    }

    pub fn blob(&mut self) -> Vec<u8> {
        (0..self.below(40)).map(|_| self.next_u64() as u8).collect()
    }
}
