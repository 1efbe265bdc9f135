//! The simulated network: one TCP-like connection between the driver and each peer, carrying
//! each direction's bytes in order, after a seeded delay, cut into random chunks (so a frame
//! decoder sees every chunking). Sans-IO like the cores it connects: [`Network::send`] and
//! [`Network::close`] are inputs, [`Network::poll_timeout`] the next delivery and
//! [`Network::poll_delivery`] the outputs.
//!
//! What TCP does and this models: bytes arrive in order or not at all; a side that closes has
//! its queued bytes delivered and then a FIN; a broken connection (a reset, a crashed host) loses
//! what is in flight, and each side hears of it after a delay, or never (a host that vanished
//! without a reset: only a heartbeat timeout notices). A *stalled* receiver does not read: bytes
//! for it pile up, up to the network's window (socket buffers, [`WINDOW_BYTES_DEFAULT`] unless
//! [`Network::new`] says), after which a send takes none.

use std::collections::VecDeque;

use bytes::Bytes;
use flint_engine::sim::Rng;

/// Bytes a direction holds undelivered by default (a socket's send and receive buffers
/// together); a send beyond it takes only what fits.
pub const WINDOW_BYTES_DEFAULT: usize = 256 << 10;

/// A connection, by the order it was opened.
pub type ConnId = usize;

/// Which end of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// The driver's end.
    Driver,
    /// The executor's (or hostile peer's) end.
    Peer,
}

impl End {
    fn other(self) -> End {
        match self {
            End::Driver => End::Peer,
            End::Peer => End::Driver,
        }
    }
}

/// What the network hands one end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Bytes arrived.
    Bytes(Bytes),
    /// The other end closed (after everything it sent).
    Fin,
    /// The connection broke.
    Reset,
}

/// One segment on its way.
#[derive(Debug)]
struct Segment {
    at_us: u64,
    what: Delivery,
}

/// One direction of a connection.
#[derive(Debug, Default)]
struct Pipe {
    segments: VecDeque<Segment>,
    /// Data bytes queued (bounded by the window).
    queued_bytes: usize,
    /// When the last segment is due: later ones come after it (in order).
    last_us: u64,
    /// The receiver does not read.
    stalled: bool,
    /// Nothing more is accepted (this direction was closed or broken).
    shut: bool,
}

impl Pipe {
    fn due_us(&self) -> Option<u64> {
        if self.stalled {
            return None;
        }
        self.segments.front().map(|s| s.at_us)
    }

    fn push(&mut self, at_us: u64, what: Delivery) {
        let at_us = at_us.max(self.last_us);
        self.last_us = at_us;
        if let Delivery::Bytes(b) = &what {
            self.queued_bytes += b.len();
        }
        self.segments.push_back(Segment { at_us, what });
    }
}

/// A connection: the pipe toward the driver and the one toward the peer.
#[derive(Debug)]
struct Conn {
    to_driver: Pipe,
    to_peer: Pipe,
    /// Base one-way latency, micros.
    latency_us: u64,
}

impl Conn {
    fn toward(&mut self, end: End) -> &mut Pipe {
        match end {
            End::Driver => &mut self.to_driver,
            End::Peer => &mut self.to_peer,
        }
    }
}

/// Every connection of a run.
#[derive(Debug)]
pub struct Network {
    conns: Vec<Conn>,
    /// Bytes a direction holds undelivered, at most.
    window_bytes_max: usize,
    /// Data bytes delivered, all connections.
    pub delivered_bytes: u64,
    /// Chunks delivered, all connections.
    pub delivered_chunks: u64,
}

impl Network {
    /// A network whose connections hold at most `window_bytes_max` undelivered bytes each way.
    pub fn new(window_bytes_max: usize) -> Network {
        Network {
            conns: Vec::new(),
            window_bytes_max,
            delivered_bytes: 0,
            delivered_chunks: 0,
        }
    }

    /// Opens a connection whose one-way latency is drawn from `rng`.
    pub fn open(&mut self, rng: &mut Rng) -> ConnId {
        let latency_us = if rng.chance(0.2) {
            rng.range(1_000, 20_000)
        } else {
            rng.range(20, 500)
        };
        self.conns.push(Conn {
            to_driver: Pipe::default(),
            to_peer: Pipe::default(),
            latency_us,
        });
        self.conns.len() - 1
    }

    /// Sends `bytes` from `from` at `now_us`, cut into random chunks; returns how many were
    /// taken (fewer when the receiver's window is full; none on a closed or broken direction,
    /// which the sender is told of separately).
    pub fn send(
        &mut self,
        rng: &mut Rng,
        conn: ConnId,
        from: End,
        now_us: u64,
        bytes: Bytes,
    ) -> usize {
        let window_bytes_max = self.window_bytes_max;
        let Some(c) = self.conns.get_mut(conn) else {
            return 0;
        };
        let latency_us = c.latency_us;
        let pipe = c.toward(from.other());
        if pipe.shut {
            return 0;
        }
        let room = window_bytes_max.saturating_sub(pipe.queued_bytes);
        let mut rest = bytes.slice(..bytes.len().min(room));
        let taken = rest.len();
        while !rest.is_empty() {
            let len = chunk_len(rng, rest.len());
            let chunk = rest.split_to(len);
            let at_us = now_us + latency_us + jitter_us(rng);
            pipe.push(at_us, Delivery::Bytes(chunk));
        }
        taken
    }

    /// `from` closes its end: what it sent still arrives, then a FIN; it receives nothing more.
    pub fn close(&mut self, rng: &mut Rng, conn: ConnId, from: End, now_us: u64) {
        let Some(c) = self.conns.get_mut(conn) else {
            return;
        };
        let latency_us = c.latency_us;
        let out = c.toward(from.other());
        if !out.shut {
            out.shut = true;
            out.push(now_us + latency_us + jitter_us(rng), Delivery::Fin);
        }
        let inbound = c.toward(from);
        inbound.shut = true;
        inbound.segments.clear();
        inbound.queued_bytes = 0;
    }

    /// The connection breaks at `now_us`: what is in flight is lost; each end hears a reset after
    /// its delay, or never (`None`).
    pub fn break_conn(
        &mut self,
        conn: ConnId,
        now_us: u64,
        driver_told_after_us: Option<u64>,
        peer_told_after_us: Option<u64>,
    ) {
        let Some(c) = self.conns.get_mut(conn) else {
            return;
        };
        for (end, after) in [
            (End::Driver, driver_told_after_us),
            (End::Peer, peer_told_after_us),
        ] {
            let pipe = c.toward(end);
            if pipe.shut && pipe.segments.is_empty() {
                continue;
            }
            pipe.segments.clear();
            pipe.queued_bytes = 0;
            pipe.shut = true;
            pipe.stalled = false;
            pipe.last_us = 0;
            if let Some(after_us) = after {
                pipe.push(now_us + after_us, Delivery::Reset);
            }
        }
    }

    /// Whether the peer end reads (a stalled peer's bytes pile up).
    pub fn set_peer_stalled(&mut self, conn: ConnId, stalled: bool) {
        if let Some(c) = self.conns.get_mut(conn) {
            c.to_peer.stalled = stalled;
        }
    }

    /// When the next delivery is due, if any.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.conns
            .iter()
            .flat_map(|c| [c.to_driver.due_us(), c.to_peer.due_us()])
            .flatten()
            .min()
    }

    /// The next delivery due at `now_us`: which connection, to which end, what.
    pub fn poll_delivery(&mut self, now_us: u64) -> Option<(ConnId, End, Delivery)> {
        for (id, c) in self.conns.iter_mut().enumerate() {
            for end in [End::Driver, End::Peer] {
                let pipe = c.toward(end);
                if pipe.due_us().is_some_and(|at| at <= now_us) {
                    let segment = pipe.segments.pop_front()?;
                    if let Delivery::Bytes(b) = &segment.what {
                        pipe.queued_bytes -= b.len();
                        self.delivered_bytes += b.len() as u64;
                        self.delivered_chunks += 1;
                    }
                    return Some((id, end, segment.what));
                }
            }
        }
        None
    }
}

/// How long the next chunk of `left` bytes is: usually all of it, sometimes a random cut, now
/// and then a single byte.
fn chunk_len(rng: &mut Rng, left: usize) -> usize {
    match rng.range(0, 9) {
        0..=5 => left,
        6..=8 => rng.range(1, left as u64) as usize,
        _ => 1,
    }
}

/// Extra delay on top of a connection's latency (delivery order is kept regardless).
fn jitter_us(rng: &mut Rng) -> u64 {
    if rng.chance(0.05) {
        rng.range(1_000, 10_000)
    } else {
        rng.range(0, 100)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drains every delivery toward `end` of `conn` up to `until_us`.
    fn drain(net: &mut Network, until_us: u64) -> Vec<(ConnId, End, Delivery)> {
        let mut out = Vec::new();
        while let Some(t) = net.poll_timeout() {
            if t > until_us {
                break;
            }
            while let Some(d) = net.poll_delivery(t) {
                out.push(d);
            }
        }
        out
    }

    #[test]
    fn bytes_arrive_in_order_in_chunks_then_fin() {
        let mut rng = Rng::new(1);
        let mut net = Network::new(WINDOW_BYTES_DEFAULT);
        let c = net.open(&mut rng);
        let data: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
        let mut sent = 0;
        for (i, part) in data.chunks(700).enumerate() {
            sent += net.send(
                &mut rng,
                c,
                End::Peer,
                i as u64 * 10,
                Bytes::copy_from_slice(part),
            );
        }
        assert_eq!(sent, data.len());
        net.close(&mut rng, c, End::Peer, 100);
        let got = drain(&mut net, u64::MAX);
        let mut bytes = Vec::new();
        for (conn, end, d) in &got[..got.len() - 1] {
            assert_eq!((*conn, *end), (c, End::Driver));
            let Delivery::Bytes(b) = d else {
                panic!("{d:?} before the end");
            };
            bytes.extend_from_slice(b);
        }
        assert_eq!(bytes, data);
        assert!(
            got.len() > data.len() / 700 + 2,
            "cut into more chunks than sends"
        );
        assert_eq!(got.last().map(|d| &d.2), Some(&Delivery::Fin));
        assert_eq!(
            net.send(&mut rng, c, End::Peer, 200, Bytes::from_static(b"x")),
            0
        );
    }

    #[test]
    fn a_stalled_peer_fills_its_window_and_a_break_loses_what_is_in_flight() {
        let mut rng = Rng::new(2);
        let mut net = Network::new(WINDOW_BYTES_DEFAULT);
        let c = net.open(&mut rng);
        net.set_peer_stalled(c, true);
        let big = Bytes::from(vec![1u8; WINDOW_BYTES_DEFAULT + 10]);
        assert_eq!(
            net.send(&mut rng, c, End::Driver, 0, big),
            WINDOW_BYTES_DEFAULT
        );
        assert_eq!(
            net.send(&mut rng, c, End::Driver, 0, Bytes::from_static(b"y")),
            0
        );
        assert_eq!(net.poll_timeout(), None, "a stalled peer reads nothing");
        net.break_conn(c, 50, Some(1_000), None);
        let got = drain(&mut net, u64::MAX);
        assert_eq!(got, vec![(c, End::Driver, Delivery::Reset)]);
        assert_eq!(
            net.send(&mut rng, c, End::Peer, 60, Bytes::from_static(b"z")),
            0
        );
    }
}
