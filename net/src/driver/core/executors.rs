//! The driver core's executors: their ids on the wire, where each one's launches go (the lanes
//! of a remote executor, or the local runner), what was launched on each lane and not heard
//! end (to route launches, send kills to the lane holding the attempt, and tell a lane that
//! does not read its launches), the lane keys, the executors retiring for a known reason and
//! those removed lately. No IO: the core asks, this answers.
//!
//! An executor that heartbeats but does not read its socket holds what it was sent for as
//! long as the kernel's buffers take the launches (the IO layer's write-stuck check never
//! fires), so the core compares each heartbeat's running count with what the executor must
//! know of: the attempts it reported RUNNING and not final, plus those launched more than
//! `heartbeat_timeout` ago and never reported at all (an honest executor reads a launch well
//! within that, and sends the reports of the attempts it no longer counts ahead of the
//! heartbeat). Two heartbeats in a row reporting fewer, with at least one such old unreported
//! launch, and the executor is lost with the reason ("executor does not read its launches: N
//! attempts sent over T s ago, it reports M running"): its attempts are launched elsewhere.
//! An executor that reads its launches but runs them late (a busy pool) counts them in its
//! heartbeats and is never taken for one.
//!
//! Lanes: an executor of several cores registers on its lane 0 with `lanes` (1 to
//! `LANES_MAX`, no more than its cores) and is given a random lane key; its other lanes
//! connect, pass the same handshake and join with `JoinLane` (executor id, lane, key), refused
//! with the reason for an unknown executor, a wrong key, a lane out of range or one joined
//! already, without touching the executor. The scheduler sees one executor; each launch goes to
//! the joined lane holding the fewest attempts (launches start as soon as lane 0 is
//! registered), a kill to the lane holding the attempt, and status updates are taken from any
//! lane of the executor (the scheduler ignores those about attempts it did not send there).
//! Each lane heartbeats on its own connection, is expired on its own deadline and is checked
//! against what it holds (the rule above, per lane). Fate-sharing: any lane lost (closed,
//! expired, not reading) loses the whole executor, the reason naming the lane, and its other
//! lanes are closed. Every lane counts against `connections_max` like any connection.
//!

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use flint_engine::hash::FxHashMap;
use flint_engine::scheduler::{Attempt, ExecutorId, RemovalReason, TaskLaunch};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::functions::Defined;
use super::PeerId;
use crate::driver::{EXECUTOR_CORES_MAX, LANES_MAX};
use crate::wire;

/// Removed executors whose ids the driver keeps for late exit reasons.
const GONE_IDS_MAX: usize = 1024;

/// The local executor's id.
pub const LOCAL_EXECUTOR: ExecutorId = ExecutorId(0);

/// Where an executor's launches go.
pub(super) enum ExecutorLink {
    Remote(Remote),
    Local,
}

/// A remote executor: its lanes (connections) and what the driver launched on each and has
/// not heard end.
pub(super) struct Remote {
    /// Lane `i`'s connection and counts; lane 0 registered, the others are `None` until they
    /// join. At most [`LANES_MAX`].
    pub(super) lanes: Vec<Lane>,
    /// What the other lanes show to join.
    lane_key: [u8; 32],
    /// What was launched and not reported final (see [`Sent`]).
    sent: Sent,
}

/// One lane of a remote executor.
#[derive(Default)]
pub(super) struct Lane {
    /// Its connection, once joined.
    pub(super) peer: Option<PeerId>,
    /// Attempts launched on it and not reported final: launches go to the joined lane with
    /// the fewest.
    held: u32,
    /// Attempts launched on it in all (the driver's view shows them).
    pub(super) launched: u64,
    /// Its last heartbeat reported fewer attempts than it must know of.
    suspect: bool,
    /// The functions its connection has defined, by index.
    pub(super) functions: Defined,
}

impl Remote {
    fn new(lanes: u32, lane_key: [u8; 32], lane0: PeerId) -> Remote {
        assert!(
            (1..=LANES_MAX).contains(&lanes),
            "lanes checked at registration"
        );
        let mut lanes: Vec<Lane> = (0..lanes).map(|_| Lane::default()).collect();
        lanes[0].peer = Some(lane0);
        Remote {
            lanes,
            lane_key,
            sent: Sent::default(),
        }
    }

    /// The joined lane with the fewest attempts held (lane 0 is always joined).
    fn route(&self) -> u32 {
        let joined = self
            .lanes
            .iter()
            .enumerate()
            .filter(|(_, l)| l.peer.is_some());
        let lane = joined.min_by_key(|(_, l)| l.held).map_or(0, |(i, _)| i);
        debug_assert!(
            self.lanes[lane].peer.is_some(),
            "routed to a lane not joined"
        );
        lane as u32
    }

    /// Routes `tasks` launched at `now_us`, each to the joined lane holding the fewest:
    /// `lanes` gets each task's lane, in order (emptied first). False, with `lanes` emptied,
    /// when the executor has one lane: every task goes to lane 0.
    pub(super) fn route_all(
        &mut self,
        tasks: &[TaskLaunch],
        now_us: u64,
        lanes: &mut Vec<u32>,
    ) -> bool {
        lanes.clear();
        if !self.is_laned() {
            // One lane: every task goes to it, with no record per attempt (see `launched`).
            self.lanes[0].launched += tasks.len() as u64;
            return false;
        }
        for task in tasks {
            let lane = self.route();
            self.launched(Attempt::new(task.task, task.attempt), lane, now_us);
            lanes.push(lane);
        }
        debug_assert_eq!(lanes.len(), tasks.len());
        true
    }

    /// Attempt `key` goes to `lane` at `now_us`. An executor of one lane keeps no record per
    /// attempt here: the scheduler's book holds what its heartbeats are checked against.
    fn launched(&mut self, key: Attempt, lane: u32, now_us: u64) {
        if !self.is_laned() {
            self.lanes[0].launched += 1;
            return;
        }
        if let Some(old) = self.sent.attempts.insert(key, (now_us, false, lane)) {
            // Relaunched while held (the scheduler does not): count it once.
            self.lane_mut(old.2).held -= 1;
        }
        let lane = self.lane_mut(lane);
        lane.held += 1;
        lane.launched += 1;
    }

    /// An executor's report on one of its attempts, from any of its lanes.
    pub(super) fn reported(&mut self, key: Attempt, state: wire::TaskState) {
        if !self.is_laned() {
            return;
        }
        if let Some(lane) = self.sent.reported(key, state) {
            let lane = self.lane_mut(lane);
            assert!(
                lane.held > 0,
                "a lane held an attempt it was not counted for"
            );
            lane.held -= 1;
        }
    }

    /// The connection holding attempt `key` (lane 0's if the attempt is not known).
    pub(super) fn peer_of(&self, key: Attempt) -> Option<PeerId> {
        let lane = if self.is_laned() {
            self.sent.attempts.get(&key).map_or(0, |a| a.2)
        } else {
            0
        };
        self.lanes.get(lane as usize).and_then(|l| l.peer)
    }

    /// Lane `lane`'s heartbeat saying it runs `running` attempts at `now_us`: why it does not
    /// read its launches, when this is the second heartbeat in a row to show it (see the
    /// module docs of [`super`]).
    /// `book`: for an executor of one lane, what the scheduler's book says it holds (reported
    /// RUNNING, and never reported though launched at least `timeout_us` ago); a laned one's
    /// lanes are counted here.
    pub(super) fn heartbeat(
        &mut self,
        lane: u32,
        running: u32,
        (now_us, timeout_us): (u64, u64),
        book: Option<(u64, u64)>,
    ) -> Option<String> {
        let laned = self.is_laned();
        let Remote { lanes, sent, .. } = self;
        let suspect = &mut lanes.get_mut(lane as usize)?.suspect;
        let (reported, unread) = match book {
            Some(counts) if !laned => counts,
            _ => sent.counts(lane, now_us, timeout_us),
        };
        unread_verdict(suspect, running, (reported, unread), timeout_us)
    }

    /// Lets `peer` in as lane `lane` if it shows the key and the lane is free; why not
    /// otherwise.
    fn admit(&mut self, peer: PeerId, lane: u32, lane_key: &[u8; 32]) -> Result<(), String> {
        // An executor of one lane has the zero key and no lane to join.
        if !self.is_laned() || !eq_const_time(&self.lane_key, lane_key) {
            return Err("wrong lane key".into());
        }
        let lanes = self.lanes.len();
        match self.lanes.get_mut(lane as usize) {
            Some(slot) if lane > 0 && slot.peer.is_none() => {
                slot.peer = Some(peer);
                Ok(())
            }
            Some(_) if lane > 0 => Err(format!("lane {lane} has joined already")),
            _ => Err(format!(
                "lane {lane} out of range: the executor registered {lanes} lanes (lane 0 \
                 registers, 1 to {} join)",
                lanes - 1
            )),
        }
    }

    /// Lane 0's connection (the one that registered).
    pub(super) fn lane0(&self) -> Option<PeerId> {
        self.lanes[0].peer
    }

    /// Whether the executor has more than one lane (its loss reasons name the lane).
    pub(super) fn is_laned(&self) -> bool {
        self.lanes.len() > 1
    }

    /// Its lanes joined so far (lane 0 included).
    pub(super) fn lanes_joined(&self) -> u32 {
        self.lanes.iter().filter(|l| l.peer.is_some()).count() as u32
    }

    fn lane_mut(&mut self, lane: u32) -> &mut Lane {
        &mut self.lanes[lane as usize]
    }
}

/// What the driver launched on a laned executor's lanes and has not heard end: to route
/// launches, send kills to the lane holding the attempt, and tell a lane that does not read
/// its launches (see the module docs of [`super`]). An executor of one lane needs none of it:
/// the scheduler's book holds its attempts.
#[derive(Default)]
struct Sent {
    /// Attempts launched and not reported final: when each was launched, whether the
    /// executor reported it RUNNING, and the lane it went to. At most the executor's slots
    /// (the scheduler launches no more than it frees with final reports).
    attempts: FxHashMap<Attempt, (u64, bool, u32)>,
}

impl Sent {
    /// What lane `lane` must know of at `now_us`: the attempts it reported RUNNING, and those
    /// never reported that were launched at least `timeout_us` ago.
    fn counts(&self, lane: u32, now_us: u64, timeout_us: u64) -> (u64, u64) {
        let (mut reported, mut unread) = (0u64, 0u64);
        for &(launched_us, running_reported, on) in self.attempts.values() {
            if on != lane {
                continue;
            }
            if running_reported {
                reported += 1;
            } else if launched_us.saturating_add(timeout_us) <= now_us {
                unread += 1;
            }
        }
        (reported, unread)
    }

    /// A report on one attempt: the lane that held it, when it is final and was held.
    fn reported(&mut self, key: Attempt, state: wire::TaskState) -> Option<u32> {
        if state == wire::TaskState::Running {
            if let Some((_, running_reported, _)) = self.attempts.get_mut(&key) {
                *running_reported = true;
            }
            None
        } else {
            self.attempts.remove(&key).map(|(_, _, lane)| lane)
        }
    }
}

/// A lane's heartbeat saying it runs `running` attempts, against the `(reported, unread)`
/// attempts it must know of (`suspect`: its last heartbeat showed too few): why it does not
/// read its launches, when this is the second heartbeat in a row to show it.
fn unread_verdict(
    suspect: &mut bool,
    running: u32,
    (reported, unread): (u64, u64),
    timeout_us: u64,
) -> Option<String> {
    let known = reported + unread;
    let now_suspect = unread > 0 && u64::from(running) < known;
    if !std::mem::replace(suspect, now_suspect) || !now_suspect {
        return None;
    }
    let timeout_s = Duration::from_micros(timeout_us).as_secs_f64();
    Some(format!(
        "executor does not read its launches: {unread} attempts sent over {timeout_s} s ago, \
         it reports {running} running (it must hold at least {known})"
    ))
}

/// Lane keys: HMAC-SHA256 of a counter under a seed the IO layer drew from the operating
/// system, so the core draws no entropy of its own (a simulation gives a fixed seed) and
/// keys never repeat within a driver.
struct KeyStream {
    seed: [u8; 32],
    counter: u64,
}

impl KeyStream {
    fn next_key(&mut self) -> [u8; 32] {
        self.counter += 1;
        // HMAC takes keys of any length; `new_from_slice` fails for none.
        let mut mac =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.seed).unwrap_or_else(|_| unreachable!());
        mac.update(b"flint-lane-key-v1");
        mac.update(&self.counter.to_le_bytes());
        mac.finalize().into_bytes().into()
    }
}

/// What an executor registers with.
pub(super) struct Registration<'a> {
    pub(super) executor_id: &'a str,
    pub(super) host: &'a str,
    pub(super) cores: u32,
    pub(super) lanes: u32,
}

/// An executor that left, as the core reports it: its id on the wire, the reason the
/// scheduler gets, how it left, and whether it counts as lost.
pub(super) struct Departure {
    pub(super) executor_id: String,
    pub(super) reason: RemovalReason,
    pub(super) how: How,
    pub(super) lost: bool,
}

/// How an executor left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum How {
    /// Stopped or removed for a reason known beforehand.
    Retired,
    /// The driver was stopping every executor.
    Stopped,
    /// Lost: its connection closed, expired or misbehaved.
    Lost,
}

/// The driver's executors (see the module docs).
pub(super) struct Executors {
    /// Executor ids on the wire, for refusing duplicates (peer-chosen strings: SipHash).
    ids: HashMap<String, ExecutorId>,
    /// Where each executor's launches go: its lanes, or the local runner.
    links: FxHashMap<ExecutorId, ExecutorLink>,
    next: u64,
    /// Executors being stopped or removed for a known reason: the reason their removal gets,
    /// and whether it counts as a loss (a cluster manager's report does, a stop does not).
    retiring: FxHashMap<ExecutorId, (RemovalReason, bool)>,
    /// Executors removed lately (newest last, at most [`GONE_IDS_MAX`]) by their id on the
    /// wire, so a cluster manager's later exit reason still reaches the scheduler.
    gone: VecDeque<(String, ExecutorId)>,
    keys: KeyStream,
    /// Registered in all, and lost in all.
    registered_total: u64,
    lost_total: u64,
}

impl Executors {
    /// No executors; lane keys drawn from `seed`.
    pub(super) fn new(seed: [u8; 32]) -> Executors {
        Executors {
            ids: HashMap::new(),
            links: FxHashMap::default(),
            next: 1,
            retiring: FxHashMap::default(),
            gone: VecDeque::new(),
            keys: KeyStream { seed, counter: 0 },
            registered_total: 0,
            lost_total: 0,
        }
    }

    /// Why a registration is refused, if it is: too many cores or lanes, or a duplicate id.
    pub(super) fn refusal(&self, r: &Registration<'_>) -> Option<String> {
        let Registration { cores, lanes, .. } = *r;
        if cores > EXECUTOR_CORES_MAX {
            return Some(format!(
                "executor claims {cores} cores; at most {EXECUTOR_CORES_MAX} are accepted"
            ));
        }
        if lanes == 0 || lanes > LANES_MAX || lanes > cores.max(1) {
            return Some(format!(
                "executor claims {lanes} lanes; from 1 to {LANES_MAX} are accepted, and no more \
                 than its {cores} cores"
            ));
        }
        if self.ids.contains_key(r.executor_id) {
            return Some(format!("duplicate executor id {:?}", r.executor_id));
        }
        None
    }

    /// The id the next registered executor gets.
    pub(super) fn next_id(&self) -> ExecutorId {
        ExecutorId(self.next)
    }

    /// Adds a remote executor the scheduler took (its registration passed [`Self::refusal`]),
    /// with lane 0 on `peer`; the key its other lanes join with (zeros for one lane, which
    /// has none to join).
    pub(super) fn add_remote(&mut self, r: &Registration<'_>, peer: PeerId) -> [u8; 32] {
        debug_assert!(self.refusal(r).is_none(), "a refused registration added");
        let id = self.next_id();
        let lane_key = if r.lanes > 1 {
            self.keys.next_key()
        } else {
            [0; 32]
        };
        self.next += 1;
        self.ids.insert(r.executor_id.to_owned(), id);
        let remote = Remote::new(r.lanes, lane_key, peer);
        assert!(self
            .links
            .insert(id, ExecutorLink::Remote(remote))
            .is_none());
        self.registered_total += 1;
        lane_key
    }

    /// Adds the in-process executor (local mode).
    pub(super) fn add_local(&mut self) {
        assert!(self
            .links
            .insert(LOCAL_EXECUTOR, ExecutorLink::Local)
            .is_none());
    }

    /// Lets `peer` join as lane `lane` of `executor_id` with `lane_key`: the executor, or why
    /// not.
    pub(super) fn join_lane(
        &mut self,
        peer: PeerId,
        executor_id: &str,
        lane: u32,
        lane_key: &[u8; 32],
    ) -> Result<ExecutorId, String> {
        let Some(&id) = self.ids.get(executor_id) else {
            return Err(format!("no executor {executor_id:?} is registered"));
        };
        match self.links.get_mut(&id) {
            Some(ExecutorLink::Remote(remote)) => remote.admit(peer, lane, lane_key).map(|()| id),
            _ => Err(format!("no executor {executor_id:?} is registered")),
        }
    }

    pub(super) fn link(&self, id: ExecutorId) -> Option<&ExecutorLink> {
        self.links.get(&id)
    }

    pub(super) fn link_mut(&mut self, id: ExecutorId) -> Option<&mut ExecutorLink> {
        self.links.get_mut(&id)
    }

    /// A remote executor, if `id` is one.
    pub(super) fn remote_mut(&mut self, id: ExecutorId) -> Option<&mut Remote> {
        match self.links.get_mut(&id) {
            Some(ExecutorLink::Remote(remote)) => Some(remote),
            _ => None,
        }
    }

    /// Takes a remote executor's link out (it is leaving); `None` if it left already.
    pub(super) fn take_remote(&mut self, id: ExecutorId) -> Option<Remote> {
        match self.links.remove(&id) {
            Some(ExecutorLink::Remote(remote)) => Some(remote),
            Some(ExecutorLink::Local) => {
                self.links.insert(id, ExecutorLink::Local);
                None
            }
            None => None,
        }
    }

    /// Executor `id` is to leave for `reason` (a stop: `lost` false; a cluster manager's
    /// report: true) when its connection closes.
    pub(super) fn retire(&mut self, id: ExecutorId, reason: RemovalReason, lost: bool) {
        self.retiring.insert(id, (reason, lost));
    }

    /// Executor `id` leaves (its lanes are closed already, `why` they closed; `stopping`:
    /// the driver told every executor to stop): its id on the wire goes to the recently gone,
    /// and the reason the scheduler gets follows what was known.
    pub(super) fn depart(&mut self, id: ExecutorId, why: &str, stopping: bool) -> Departure {
        self.links.remove(&id);
        let executor_id = self.name_of(id);
        if self.ids.remove(&executor_id).is_some() {
            if self.gone.len() >= GONE_IDS_MAX {
                self.gone.pop_front();
            }
            self.gone.push_back((executor_id.clone(), id));
        }
        let (reason, how, lost) = match self.retiring.remove(&id) {
            Some((reason, lost)) => (reason, How::Retired, lost),
            None if stopping => (RemovalReason::Killed, How::Stopped, false),
            None => (RemovalReason::Lost(why.to_owned()), How::Lost, true),
        };
        self.lost_total += u64::from(lost);
        debug_assert!(!self.links.contains_key(&id) && !self.retiring.contains_key(&id));
        Departure {
            executor_id,
            reason,
            how,
            lost,
        }
    }

    /// An executor removed lately, by its id on the wire.
    pub(super) fn gone(&self, executor_id: &str) -> Option<ExecutorId> {
        let gone = self.gone.iter().rev().find(|(n, _)| n == executor_id);
        gone.map(|&(_, id)| id)
    }

    /// A registered remote executor by its id on the wire, with its lane 0 connection.
    pub(super) fn remote_by_name(&self, executor_id: &str) -> Option<(ExecutorId, PeerId)> {
        let id = *self.ids.get(executor_id)?;
        match self.links.get(&id)? {
            ExecutorLink::Remote(remote) => Some((id, remote.lane0()?)),
            ExecutorLink::Local => None,
        }
    }

    /// The remote executors' lane 0 connections (a `StopExecutor` there stops every lane).
    pub(super) fn lane0s(&self) -> impl Iterator<Item = PeerId> + '_ {
        self.links.values().filter_map(|link| match link {
            ExecutorLink::Remote(remote) => remote.lane0(),
            ExecutorLink::Local => None,
        })
    }

    /// The registered remote executors: their ids on the wire and in the scheduler.
    pub(super) fn remotes(&self) -> impl Iterator<Item = (&str, ExecutorId)> + '_ {
        self.ids.iter().map(|(name, id)| (name.as_str(), *id))
    }

    /// A remote executor's id in the scheduler, by its id on the wire.
    pub(super) fn id_of(&self, executor_id: &str) -> Option<ExecutorId> {
        self.ids.get(executor_id).copied()
    }

    /// An executor's id on the wire (`local` for the in-process one). O(executors).
    pub(super) fn name_of(&self, id: ExecutorId) -> String {
        self.ids
            .iter()
            .find(|(_, named)| **named == id)
            .map_or_else(
                || "local".to_owned(),
                |(executor_id, _)| executor_id.clone(),
            )
    }

    /// Executors registered now (the local one included).
    pub(super) fn live(&self) -> usize {
        self.links.len()
    }

    /// Remote executors registered in all, and executors lost in all.
    pub(super) fn totals(&self) -> (u64, u64) {
        (self.registered_total, self.lost_total)
    }
}

/// Whether two keys are equal, in time independent of where they differ.
fn eq_const_time(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}
