//! Adaptive spinning before parking, under a process-wide budget of spinning threads.
//!
//! A thread that runs out of work may spin a little before it parks, to pick up the next piece
//! without a wake-up's cost (about 10 us on an idle VM, twice per round trip). Blind spinning
//! takes the core from the thread it waits for: on 2 cores it cost 2-3x the throughput. So:
//!
//! - [`SpinBudget`]: at most `available_parallelism - 1` threads of the process spin at once,
//!   less the threads known busy, so a spinner never takes the last core. A thread spins only
//!   while it holds a [`SpinPermit`]; without one it parks at once. Threads using
//!   [`AdaptiveSpin`] count as busy between work and their next idle round; other threads (a
//!   service's tokio workers, say) may say so with [`set_thread_busy`].
//! - [`AdaptiveSpin`]: each thread's spin follows its recent idle-to-work gaps. It spins up to
//!   twice the recent gap, capped at the configured maximum, and not at all when the gaps are
//!   longer than that maximum. When [`MISSES_MAX`] spins in a row end in a park anyway, it stops
//!   spinning for a number of idle periods that doubles with each further miss, up to
//!   [`SKIP_MAX`], then tries again.
//! - Preemption: a spinning thread that finds more than [`PREEMPTED_GAP`] between two of its
//!   own idle rounds was taken off its core (another thread, or another process, wanted it):
//!   its spin was taking a core someone else needed. It parks at once and counts the spin as a
//!   miss that starts the skipping at once, so under a competing load spinning turns itself
//!   off within a few idle periods and comes back only when spins pay again.
//!
//! Spinning is on by default on machines with at least [`SPIN_CORES_MIN`] cores (2: a
//! one-core machine never spins). `FLINT_SPIN=0` (or `off`) turns every spin off;
//! `FLINT_SPIN=1` (or `on`) turns it on even on one core (BENCHMARKS.md, "Adaptive spinning").

use std::sync::OnceLock;
use std::time::Duration;

use crate::loom::sync::atomic::{AtomicUsize, Ordering};

/// Cores a machine needs before waiting threads spin by default.
pub const SPIN_CORES_MIN: usize = 2;
/// A gap between two idle rounds of a spinning thread longer than this means the thread was
/// preempted while it spun (a round is a poll or a few dozen pause instructions: about a
/// microsecond).
pub const PREEMPTED_GAP: Duration = Duration::from_micros(30);
/// The environment variable that turns spinning on (`1`, `on`) or off (`0`, `off`).
pub const SPIN_ENV: &str = "FLINT_SPIN";
/// Consecutive spins that did not pay before a thread stops spinning for a while.
pub const MISSES_MAX: u32 = 4;
/// The most idle periods a thread skips spinning after spins that did not pay.
pub const SKIP_MAX: u32 = 1024;
/// The shortest spin worth starting, in nanoseconds (below it, clock reads dominate).
const SPIN_NS_MIN: u64 = 1_000;

/// Whether waiting threads spin: `FLINT_SPIN` if set, else only with [`SPIN_CORES_MIN`] cores.
pub fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| match std::env::var(SPIN_ENV).as_deref().map(str::trim) {
        Ok("0" | "off" | "false") => false,
        Ok("1" | "on" | "true") => true,
        _ => cores() >= SPIN_CORES_MIN,
    })
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A bound on how many threads spin at once.
#[derive(Debug)]
pub struct SpinBudget {
    spinning: AtomicUsize,
    busy: AtomicUsize,
    max: usize,
}

impl SpinBudget {
    /// A budget of `max` spinning threads.
    pub fn new(max: usize) -> Self {
        Self {
            spinning: AtomicUsize::new(0),
            busy: AtomicUsize::new(0),
            max,
        }
    }

    /// The process's budget: one spinner per core but one, or none when spinning is off.
    pub fn global() -> &'static SpinBudget {
        static GLOBAL: OnceLock<SpinBudget> = OnceLock::new();
        GLOBAL.get_or_init(|| {
            let max = if enabled() {
                cores().saturating_sub(1)
            } else {
                0
            };
            SpinBudget::new(max)
        })
    }

    /// The most threads that may spin at once.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Threads spinning now.
    pub fn spinning(&self) -> usize {
        self.spinning.load(Ordering::Relaxed)
    }

    /// Threads known busy now.
    pub fn busy(&self) -> usize {
        self.busy.load(Ordering::Relaxed)
    }

    /// Counts a thread as busy or not; `counted` is its own record, so a thread is counted
    /// once at most however often it says so. Nothing to count when spinning is off.
    pub fn set_busy(&self, counted: &mut bool, busy: bool) {
        if self.max == 0 || *counted == busy {
            return;
        }
        *counted = busy;
        if busy {
            self.busy.fetch_add(1, Ordering::Relaxed);
        } else {
            self.busy.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// A permit to spin, unless `max` threads, less the busy ones, spin already.
    pub fn try_acquire(&self) -> Option<SpinPermit<'_>> {
        let mut current = self.spinning.load(Ordering::Relaxed);
        loop {
            let busy = self.busy.load(Ordering::Relaxed);
            if current.saturating_add(busy) >= self.max {
                return None;
            }
            match self.spinning.compare_exchange(
                current,
                current + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(SpinPermit { budget: self }),
                Err(now) => current = now,
            }
        }
    }
}

thread_local! {
    /// Whether this thread is counted busy in the process's budget by [`set_thread_busy`].
    static THREAD_BUSY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Counts the calling thread as busy (or not) in the process's budget, so spinners leave its
/// core alone: for threads that do not spin themselves, e.g. from a tokio runtime's
/// `on_thread_unpark` (busy) and `on_thread_park` (not).
pub fn set_thread_busy(busy: bool) {
    THREAD_BUSY.with(|cell| {
        let mut counted = cell.get();
        SpinBudget::global().set_busy(&mut counted, busy);
        cell.set(counted);
    });
}

/// One thread's leave to spin; dropping it gives the place back.
#[derive(Debug)]
pub struct SpinPermit<'a> {
    budget: &'a SpinBudget,
}

impl Drop for SpinPermit<'_> {
    fn drop(&mut self) {
        self.budget.spinning.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One thread's spin-before-park, adapted to its recent idle-to-work gaps (sans-IO: every
/// input carries `now_ns`, nanoseconds on [`crate::clock::now_ns`]'s clock). Call [`idle`](Self::idle) on each idle round until it says park,
/// [`work`](Self::work) when work arrives, and [`parking`](Self::parking) before parking.
#[derive(Debug)]
pub struct AdaptiveSpin {
    budget: &'static SpinBudget,
    spin_max_ns: u64,
    /// Recent idle-to-work gaps, a moving average.
    gap_ns: u64,
    idle_since_ns: Option<u64>,
    /// This idle period's spin: until when, under which permit.
    spin: Option<(u64, SpinPermit<'static>)>,
    /// The latest idle round of this period (to notice a preemption).
    last_round_ns: Option<u64>,
    /// Whether this idle period began with a spin (to judge it when it ends).
    spun: bool,
    misses: u32,
    skip: u32,
    /// Whether this thread is counted busy in the budget (between work and its next idle).
    counted_busy: bool,
}

impl AdaptiveSpin {
    /// Spins of at most `spin_max` under the process's budget (none if `spin_max` is zero).
    pub fn new(spin_max: Duration) -> Self {
        Self::with_budget(spin_max, SpinBudget::global())
    }

    /// The same under another budget.
    pub fn with_budget(spin_max: Duration, budget: &'static SpinBudget) -> Self {
        let spin_max_ns = u64::try_from(spin_max.as_nanos()).unwrap_or(u64::MAX);
        Self {
            budget,
            spin_max_ns,
            gap_ns: spin_max_ns / 2,
            idle_since_ns: None,
            spin: None,
            last_round_ns: None,
            spun: false,
            misses: 0,
            skip: 0,
            counted_busy: false,
        }
    }

    /// An idle round at `now_ns`: true to go on spinning, false to park.
    pub fn idle(&mut self, now_ns: u64) -> bool {
        if self.idle_since_ns.is_none() {
            self.budget.set_busy(&mut self.counted_busy, false);
            self.idle_since_ns = Some(now_ns);
            self.spin = self.plan(now_ns);
            self.spun = self.spin.is_some();
        }
        let last_round = self.last_round_ns.replace(now_ns);
        if self.spin.is_some() && last_round.is_some_and(|at| preempted(at, now_ns)) {
            self.preempted();
            return false;
        }
        match &self.spin {
            Some((until_ns, _)) if now_ns < *until_ns => true,
            _ => {
                self.spin = None;
                false
            }
        }
    }

    /// The thread was taken off its core while it spun: the spin ends and counts as enough
    /// misses to start skipping (see the module docs).
    fn preempted(&mut self) {
        self.spin = None;
        self.misses = self.misses.max(MISSES_MAX - 1);
        self.missed();
        // `work` must not count this period's spin a second time.
        self.spun = false;
    }

    /// Whether this idle period spins, and until when.
    fn plan(&mut self, now_ns: u64) -> Option<(u64, SpinPermit<'static>)> {
        if self.skip > 0 {
            self.skip -= 1;
            return None;
        }
        let spin_ns = self.spin_ns();
        if spin_ns < SPIN_NS_MIN {
            return None;
        }
        let permit = self.budget.try_acquire()?;
        Some((now_ns.saturating_add(spin_ns), permit))
    }

    /// How long the next idle period would spin: twice the recent gap, capped, or zero when
    /// the gaps are longer than the cap.
    pub fn spin_ns(&self) -> u64 {
        if self.gap_ns > self.spin_max_ns {
            0
        } else {
            self.gap_ns.saturating_mul(2).min(self.spin_max_ns)
        }
    }

    /// Work arrived at `now_ns` (while spinning or after a park).
    pub fn work(&mut self, now_ns: u64) {
        self.budget.set_busy(&mut self.counted_busy, true);
        self.last_round_ns = None;
        let Some(since_ns) = self.idle_since_ns.take() else {
            return;
        };
        let gap_ns = now_ns.saturating_sub(since_ns);
        self.gap_ns = (self.gap_ns / 4).saturating_mul(3) + gap_ns / 4;
        if self.spin.take().is_some() {
            self.misses = 0;
        } else if self.spun {
            self.missed();
        }
        self.spun = false;
    }

    /// The thread parks now: a spin in this idle period did not pay.
    pub fn parking(&mut self) {
        self.spin = None;
        self.last_round_ns = None;
    }

    fn missed(&mut self) {
        self.misses = self.misses.saturating_add(1);
        if self.misses >= MISSES_MAX {
            let doublings = (self.misses - MISSES_MAX).min(10);
            self.skip = (1u32 << doublings).min(SKIP_MAX);
        }
    }

    /// Whether an idle period is open (work since then has not been reported).
    pub fn is_idle(&self) -> bool {
        self.idle_since_ns.is_some()
    }

    /// Whether this thread holds a spin permit now.
    pub fn is_spinning(&self) -> bool {
        self.spin.is_some()
    }
}

impl Drop for AdaptiveSpin {
    fn drop(&mut self) {
        self.budget.set_busy(&mut self.counted_busy, false);
    }
}

/// Spins until `done` or `spin_max` passes, under the process's budget; returns whether `done`
/// held. For a caller about to block on something nearly finished.
pub fn spin_until(spin_max: Duration, done: impl FnMut() -> bool) -> bool {
    spin_until_in(SpinBudget::global(), spin_max, PREEMPTED_GAP, done)
}

/// [`spin_until`] under `budget`, giving up after a gap over `preempted_gap` between two looks
/// (the process's spins use [`PREEMPTED_GAP`]): without a permit, only one look at `done`.
fn spin_until_in(
    budget: &SpinBudget,
    spin_max: Duration,
    preempted_gap: Duration,
    mut done: impl FnMut() -> bool,
) -> bool {
    if spin_max.is_zero() {
        return done();
    }
    let Some(_permit) = budget.try_acquire() else {
        return done();
    };
    let (spin_max_ns, gap_ns) = (nanos(spin_max), nanos(preempted_gap));
    let started = crate::clock::now_ns();
    let mut last_round = started;
    let backoff = crossbeam_utils::Backoff::new();
    loop {
        if done() {
            return true;
        }
        let now = crate::clock::now_ns();
        let preempted = now.saturating_sub(last_round) > gap_ns;
        if now.saturating_sub(started) >= spin_max_ns || preempted {
            return false;
        }
        last_round = now;
        backoff.spin();
    }
}

/// Whether a spinning thread whose previous round was at `last_round_ns` was preempted since.
fn preempted(last_round_ns: u64, now_ns: u64) -> bool {
    now_ns.saturating_sub(last_round_ns) > nanos(PREEMPTED_GAP)
}

/// Nanoseconds in `d`, saturating.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A gap no spin sees: for tests that time a whole spin on a machine that may preempt it.
#[cfg(test)]
const NEVER_PREEMPTED: Duration = Duration::MAX;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize as StdAtomicUsize;
    use std::sync::Arc;
    use std::time::Instant;

    /// A moment to start from (the spin's times are plain nanoseconds, any origin).
    const T0: u64 = 1_000_000_000;
    const US: u64 = 1_000;
    const MS: u64 = 1_000_000;
    const GAP_NS: u64 = PREEMPTED_GAP.as_nanos() as u64;

    fn leaked(max: usize) -> &'static SpinBudget {
        Box::leak(Box::new(SpinBudget::new(max)))
    }

    #[test]
    fn the_budget_hands_out_at_most_max_permits_and_takes_them_back() {
        let budget = SpinBudget::new(2);
        let a = budget.try_acquire().expect("first");
        let b = budget.try_acquire().expect("second");
        assert!(budget.try_acquire().is_none());
        assert_eq!(budget.spinning(), 2);
        drop(a);
        let c = budget.try_acquire().expect("a freed place");
        assert!(budget.try_acquire().is_none());
        drop((b, c));
        assert_eq!(budget.spinning(), 0);
        assert!(SpinBudget::new(0).try_acquire().is_none());
    }

    /// Eight threads race for two places, many times: never more than two hold one.
    #[test]
    fn the_budget_is_never_exceeded_under_contention() {
        let budget = Arc::new(SpinBudget::new(2));
        let holders = Arc::new(StdAtomicUsize::new(0));
        let most = Arc::new(StdAtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (budget, holders, most) = (budget.clone(), holders.clone(), most.clone());
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        if let Some(permit) = budget.try_acquire() {
                            let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                            std::hint::spin_loop();
                            holders.fetch_sub(1, Ordering::SeqCst);
                            drop(permit);
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("no panic");
        }
        assert!(most.load(Ordering::SeqCst) <= 2);
        assert!(most.load(Ordering::SeqCst) >= 1);
        assert_eq!(budget.spinning(), 0);
    }

    /// An idle period that spins, then parks, then gets work after the spin ran out.
    fn idle_period_that_misses(spin: &mut AdaptiveSpin, start: u64, gap_ns: u64) -> bool {
        let spun = spin.idle(start);
        // Rounds a microsecond apart until the spin runs out and the idle round says park.
        let mut round = start;
        while spin.idle(round) {
            round += US;
            assert!(round < start + MS, "a spin ends");
        }
        spin.parking();
        spin.work(start + gap_ns);
        spun
    }

    #[test]
    fn a_thread_whose_spins_never_pay_stops_spinning() {
        let mut spin = AdaptiveSpin::with_budget(Duration::from_micros(50), leaked(1));
        let mut now = T0;
        let mut spun = Vec::new();
        for _ in 0..40 {
            // Work always comes 20 us after the thread went idle, but only once the thread
            // has parked (it comes to the parked thread's inbox): each spin is wasted.
            spun.push(idle_period_that_misses(&mut spin, now, 20 * US));
            now += 20 * MS;
        }
        assert!(spun[..MISSES_MAX as usize].iter().all(|&s| s));
        let late = spun[20..].iter().filter(|&&s| s).count();
        assert!(late <= 2, "spun in {late} of the last 20 idle periods");
    }

    #[test]
    fn spins_that_pay_go_on_and_follow_the_gap() {
        let budget = leaked(1);
        let mut spin = AdaptiveSpin::with_budget(Duration::from_micros(50), budget);
        let mut now = T0;
        for _ in 0..40 {
            assert!(spin.idle(now), "a spin that pays is never given up");
            assert_eq!(budget.spinning(), 1);
            now += 5 * US;
            spin.work(now);
            assert_eq!(budget.spinning(), 0, "work gives the permit back");
            now += 100 * US;
        }
        // The recent gap is 5 us: spin about twice that, not the 50 us cap.
        let spin_ns = spin.spin_ns();
        assert!((9_000..=12_000).contains(&spin_ns), "spin {spin_ns} ns");
    }

    #[test]
    fn busy_threads_take_places_from_spinners() {
        let budget = leaked(2);
        let mut worker = AdaptiveSpin::with_budget(Duration::from_micros(50), budget);
        let now = T0;
        worker.work(now);
        worker.work(now);
        assert_eq!(budget.busy(), 1, "counted once");
        let spinner = budget.try_acquire().expect("one place left");
        assert!(
            budget.try_acquire().is_none(),
            "one spinner and one busy thread fill 2"
        );
        drop(spinner);
        assert!(worker.idle(now), "idle, it is no longer busy and may spin");
        assert_eq!(budget.busy(), 0);
        worker.work(now + 3 * US);
        assert_eq!((budget.busy(), budget.spinning()), (1, 0));
        drop(worker);
        assert_eq!(budget.busy(), 0, "a dropped spinner is not busy");
        let mut counted = false;
        let off = SpinBudget::new(0);
        off.set_busy(&mut counted, true);
        assert_eq!(
            (off.busy(), counted),
            (0, false),
            "nothing to count when off"
        );
    }

    #[test]
    fn spin_until_stops_when_done_or_out_of_time_or_budget() {
        let budget = SpinBudget::new(1);
        let mut looks = 0;
        assert!(spin_until_in(
            &budget,
            Duration::from_secs(5),
            NEVER_PREEMPTED,
            || {
                looks += 1;
                looks == 3
            }
        ));
        let started = Instant::now();
        assert!(!spin_until_in(
            &budget,
            Duration::from_micros(200),
            NEVER_PREEMPTED,
            || { false }
        ));
        assert!(started.elapsed() >= Duration::from_micros(200));
        assert_eq!(budget.spinning(), 0, "the permit is given back");
        let _held = budget.try_acquire().expect("the only place");
        let mut looks = 0;
        assert!(!spin_until_in(
            &budget,
            Duration::from_secs(5),
            NEVER_PREEMPTED,
            || {
                looks += 1;
                false
            }
        ));
        assert_eq!(looks, 1, "no permit: one look, no spin");
    }

    /// A spin whose rounds are far apart was preempted: it ends at once, gives its permit
    /// back and the next idle periods skip spinning; spins that pay afterwards bring it back.
    #[test]
    fn a_preempted_spin_parks_at_once_and_skips_the_next_spins() {
        let budget = leaked(1);
        let mut spin = AdaptiveSpin::with_budget(Duration::from_micros(50), budget);
        let now = T0;
        assert!(spin.idle(now), "the first spin starts");
        assert!(spin.idle(now + US), "rounds close together go on");
        let late = now + US + GAP_NS + US;
        assert!(!spin.idle(late), "a round long after the last means park");
        assert_eq!(budget.spinning(), 0, "the permit is given back");
        spin.parking();
        spin.work(late + 5 * US);
        let mut at = late + MS;
        assert!(
            !spin.idle(at),
            "the period after a preemption does not spin"
        );
        spin.parking();
        // Once the skips run out, spins that pay (work 5 us into the idle period) go on.
        let mut spun = 0;
        for _ in 0..8 {
            spin.work(at + 5 * US);
            at += MS;
            if spin.idle(at) {
                spun += 1;
            } else {
                spin.parking();
            }
        }
        assert!(spun >= 6, "spinning came back: {spun} of 8");
    }

    #[test]
    fn spin_until_gives_up_when_preempted() {
        let budget = SpinBudget::new(1);
        let started = Instant::now();
        let mut looks = 0;
        assert!(!spin_until_in(
            &budget,
            Duration::from_secs(5),
            PREEMPTED_GAP,
            || {
                looks += 1;
                // The second look comes long after the first, as after a preemption.
                if looks == 2 {
                    std::thread::sleep(PREEMPTED_GAP * 4);
                }
                false
            }
        ));
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "not the whole 5 s"
        );
        assert_eq!(budget.spinning(), 0);
    }

    #[test]
    fn long_gaps_and_an_empty_budget_mean_no_spin() {
        let mut spin = AdaptiveSpin::with_budget(Duration::from_micros(50), leaked(1));
        let mut now = T0;
        for _ in 0..20 {
            spin.idle(now);
            spin.parking();
            now += 5 * MS;
            spin.work(now);
        }
        assert_eq!(spin.spin_ns(), 0);
        assert!(!spin.idle(now));

        let budget = leaked(1);
        let _held = budget.try_acquire().expect("the only place");
        let mut spin = AdaptiveSpin::with_budget(Duration::from_micros(50), budget);
        assert!(!spin.idle(T0), "no permit, no spin");
        assert!(!spin.is_spinning());
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::SpinBudget;
    use crate::loom::sync::atomic::{AtomicUsize, Ordering};
    use crate::loom::sync::Arc;
    use crate::loom::thread;

    /// Three threads take and give back places in a budget of two, in every interleaving:
    /// never more than two hold a permit, and every place comes back. Up to `LOOM_MAX_PREEMPTIONS`
    /// (default 3) preemptions, as the other models.
    #[test]
    fn loom_spin_budget_never_exceeded() {
        let mut builder = loom::model::Builder::new();
        if builder.preemption_bound.is_none() {
            builder.preemption_bound = Some(3);
        }
        builder.check(|| {
            let budget = Arc::new(SpinBudget::new(2));
            let holders = Arc::new(AtomicUsize::new(0));
            let threads: Vec<_> = (0..3)
                .map(|_| {
                    let (budget, holders) = (budget.clone(), holders.clone());
                    thread::spawn(move || {
                        if let Some(permit) = budget.try_acquire() {
                            let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                            assert!(now <= 2);
                            holders.fetch_sub(1, Ordering::SeqCst);
                            drop(permit);
                        }
                    })
                })
                .collect();
            for thread in threads {
                thread.join().unwrap();
            }
            assert_eq!(budget.spinning(), 0);
        });
    }
}
