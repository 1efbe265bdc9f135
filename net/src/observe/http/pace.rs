//! Refusals at a pace, sans IO: a client without the token gets its answer (the login page, a
//! `401`) at once for its first [`PaceLimits::burst`] requests, then at most
//! [`PaceLimits::per_second`]; all such clients together at most [`PaceLimits::global_per_second`].
//! A refusal that would wait longer than [`PaceLimits::hold_max_us`] is not answered: the
//! connection is held that long and closed. So a client that loops on refused requests spends
//! its time waiting, not the machine's cores, and a refusal costs the server a timer.
//!
//! Clients are told apart by [`AddrKey`]: an IPv4 address, or an IPv6 address's /64 (one
//! host's usual allocation). The buckets are GCRA (a "theoretical arrival time" per key), at
//! most [`KEYS_MAX`] keys; beyond that, keys that are back to a full burst are forgotten, and if
//! none is, new keys share one bucket.

use std::net::IpAddr;

use flint_engine::hash::FxHashMap;

/// Keys (client addresses) remembered at once.
pub const KEYS_MAX: usize = 4096;

/// A client address as the caps and the pace see it: IPv4 (or IPv4-mapped) addresses whole,
/// IPv6 addresses by their /64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AddrKey(u128);

impl AddrKey {
    /// The key of `ip`.
    pub fn of(ip: IpAddr) -> AddrKey {
        match ip.to_canonical() {
            IpAddr::V4(v4) => AddrKey(u128::from(u32::from(v4))),
            IpAddr::V6(v6) => AddrKey((u128::from(v6) & !u128::from(u64::MAX)) | 1 << 32),
        }
    }

    /// The key every client shares once [`KEYS_MAX`] are remembered.
    const OVERFLOW: AddrKey = AddrKey(u128::MAX);
}

/// The pace's numbers.
#[derive(Debug, Clone)]
pub struct PaceLimits {
    /// Refusals a client gets at once.
    pub burst: u32,
    /// Refusals a client gets per second after its burst.
    pub per_second: u32,
    /// Refusals all clients get per second together (and at once).
    pub global_per_second: u32,
    /// The longest a refusal waits for its turn (microseconds); past that it is dropped.
    pub hold_max_us: u64,
}

impl Default for PaceLimits {
    fn default() -> PaceLimits {
        PaceLimits {
            burst: 10,
            per_second: 5,
            global_per_second: 200,
            hold_max_us: 2_000_000,
        }
    }
}

/// One GCRA bucket: the theoretical arrival time of the next refusal.
#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    tat_us: u64,
}

impl Bucket {
    /// When a refusal arriving at `now_us` may be answered, with this spacing and tolerance.
    fn when(self, now_us: u64, tolerance_us: u64) -> u64 {
        self.tat_us
            .max(now_us)
            .saturating_sub(tolerance_us)
            .max(now_us)
    }

    fn take(&mut self, now_us: u64, interval_us: u64) {
        self.tat_us = self.tat_us.max(now_us) + interval_us;
    }

    fn full(self, now_us: u64) -> bool {
        self.tat_us <= now_us
    }
}

/// What to do with a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Answer it at this time (now or later).
    AnswerAt(u64),
    /// Do not answer: hold the connection until this time, then close it.
    DropAt(u64),
}

/// The refusals' pace per client and for all (see the module docs).
#[derive(Debug)]
pub struct Pace {
    limits: PaceLimits,
    keys: FxHashMap<AddrKey, Bucket>,
    global: Bucket,
}

impl Pace {
    /// Nobody refused yet.
    pub fn new(limits: PaceLimits) -> Pace {
        assert!(limits.per_second > 0 && limits.global_per_second > 0);
        Pace {
            limits,
            keys: FxHashMap::default(),
            global: Bucket::default(),
        }
    }

    /// A refusal for `key` arrives at `now_us`.
    pub fn refuse(&mut self, key: AddrKey, now_us: u64) -> Verdict {
        let interval = 1_000_000 / u64::from(self.limits.per_second);
        let global_interval = 1_000_000 / u64::from(self.limits.global_per_second);
        // A tolerance of n - 1 intervals lets n through at once.
        let tolerance = interval * u64::from(self.limits.burst.saturating_sub(1));
        let global_tolerance =
            global_interval * u64::from(self.limits.global_per_second.saturating_sub(1));
        let key = self.key_for(key, now_us);
        let bucket = self.keys.entry(key).or_default();
        let at = bucket
            .when(now_us, tolerance)
            .max(self.global.when(now_us, global_tolerance));
        let hold_until = now_us + self.limits.hold_max_us;
        if at > hold_until {
            return Verdict::DropAt(hold_until);
        }
        bucket.take(now_us, interval);
        self.global.take(now_us, global_interval);
        Verdict::AnswerAt(at)
    }

    /// `key`, or the shared key when [`KEYS_MAX`] others are remembered and none can go.
    fn key_for(&mut self, key: AddrKey, now_us: u64) -> AddrKey {
        if self.keys.len() < KEYS_MAX || self.keys.contains_key(&key) {
            return key;
        }
        self.keys.retain(|_, bucket| !bucket.full(now_us));
        if self.keys.len() < KEYS_MAX {
            key
        } else {
            AddrKey::OVERFLOW
        }
    }

    /// Keys remembered now.
    pub fn keys(&self) -> usize {
        self.keys.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(last: u8) -> AddrKey {
        AddrKey::of(IpAddr::from([10, 0, 0, last]))
    }

    #[test]
    fn a_burst_then_the_rate_then_drops() {
        let mut pace = Pace::new(PaceLimits::default());
        for _ in 0..10 {
            assert_eq!(pace.refuse(key(1), 0), Verdict::AnswerAt(0));
        }
        // Then one every 200 ms, reserved in order, up to the 2 s hold.
        for i in 1..=10u64 {
            assert_eq!(pace.refuse(key(1), 0), Verdict::AnswerAt(i * 200_000));
        }
        assert_eq!(pace.refuse(key(1), 0), Verdict::DropAt(2_000_000));
        // Another client is not held up by the first.
        assert_eq!(pace.refuse(key(2), 0), Verdict::AnswerAt(0));
        // After a quiet while the burst is back.
        assert_eq!(
            pace.refuse(key(1), 10_000_000),
            Verdict::AnswerAt(10_000_000)
        );
    }

    #[test]
    fn all_clients_together_are_paced() {
        let limits = PaceLimits {
            global_per_second: 20,
            ..PaceLimits::default()
        };
        let mut pace = Pace::new(limits);
        let answered_now = (0..=255u8)
            .filter(|&i| pace.refuse(key(i), 0) == Verdict::AnswerAt(0))
            .count();
        assert_eq!(answered_now, 20);
    }

    #[test]
    fn ipv6_hosts_are_their_64_and_keys_are_bounded() {
        let a: IpAddr = "2001:db8::1".parse().unwrap();
        let b: IpAddr = "2001:db8::ffff:1".parse().unwrap();
        let c: IpAddr = "2001:db8:0:1::1".parse().unwrap();
        assert_eq!(AddrKey::of(a), AddrKey::of(b));
        assert_ne!(AddrKey::of(a), AddrKey::of(c));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(AddrKey::of(mapped), key(1));
        assert_ne!(AddrKey::of("::a00:1".parse().unwrap()), key(1));

        let limits = PaceLimits {
            global_per_second: 1_000_000,
            ..PaceLimits::default()
        };
        let mut pace = Pace::new(limits);
        for i in 0..(KEYS_MAX as u32 + 100) {
            let ip = IpAddr::from(std::net::Ipv4Addr::from(i));
            pace.refuse(AddrKey::of(ip), 0);
        }
        assert!(pace.keys() <= KEYS_MAX + 1, "{}", pace.keys());
        // Once their buckets are full again they are forgotten for new ones.
        pace.refuse(key(200), 60_000_000);
        assert!(pace.keys() < 10, "{}", pace.keys());
    }
}
