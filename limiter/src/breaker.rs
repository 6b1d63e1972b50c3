//! The circuit breaker in front of the shared counter store. Closed: every decision goes to
//! the store. After `failure_threshold` consecutive failures or timeouts that span at least
//! `failing_for` it opens: decisions go to the local fallback for `open_for`, without
//! touching the store. Then it lets one probe through (half-open): success closes it,
//! failure opens it again. Lock-free: the decision path reads two atomics.

use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU32, Ordering};
use std::time::Duration;

/// When to open and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures (errors or timeouts) that open the breaker.
    pub failure_threshold: u32,
    /// How long the failures must have gone on: the requests in flight during one stall
    /// (a pause of this process, a lost packet) all time out together, and that alone
    /// should not send a second of decisions to the fallback. A store that is down or slow
    /// keeps failing, and opens the breaker this long after its first failure.
    pub failing_for: Duration,
    /// How long it stays open before a probe.
    pub open_for: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failure_threshold: 5,
            failing_for: Duration::from_millis(25),
            open_for: Duration::from_secs(1),
        }
    }
}

/// The breaker's state, as exported (`verdict_breaker_state`: 0, 1, 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum BreakerState {
    /// The store is used.
    Closed = 0,
    /// One probe is in flight.
    HalfOpen = 1,
    /// The fallback decides.
    Open = 2,
}

/// Where one decision should go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Ask the store.
    Store,
    /// Ask the store as the half-open probe.
    Probe,
    /// Do not ask the store: fall back.
    Fallback,
}

/// A circuit breaker.
#[derive(Debug)]
pub struct Breaker {
    cfg: BreakerConfig,
    state: AtomicU8,
    failures: AtomicU32,
    first_failure_ms: AtomicI64,
    open_until_ms: AtomicI64,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(cfg: BreakerConfig) -> Self {
        Self {
            cfg,
            state: AtomicU8::new(BreakerState::Closed as u8),
            failures: AtomicU32::new(0),
            first_failure_ms: AtomicI64::new(0),
            open_until_ms: AtomicI64::new(0),
        }
    }

    /// The current state.
    pub fn state(&self) -> BreakerState {
        match self.state.load(Ordering::Acquire) {
            0 => BreakerState::Closed,
            1 => BreakerState::HalfOpen,
            _ => BreakerState::Open,
        }
    }

    /// Where a decision at `now_ms` should go.
    pub fn admit(&self, now_ms: i64) -> Admit {
        match self.state() {
            BreakerState::Closed => Admit::Store,
            BreakerState::HalfOpen => Admit::Fallback,
            BreakerState::Open => {
                if now_ms < self.open_until_ms.load(Ordering::Acquire) {
                    return Admit::Fallback;
                }
                // Exactly one caller wins the probe.
                match self.state.compare_exchange(
                    BreakerState::Open as u8,
                    BreakerState::HalfOpen as u8,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => Admit::Probe,
                    Err(_) => Admit::Fallback,
                }
            }
        }
    }

    /// Records the store's answer to a decision admitted as `admit`.
    pub fn record(&self, admit: Admit, ok: bool, now_ms: i64) {
        match (admit, ok) {
            (Admit::Fallback, _) => {}
            (_, true) => {
                self.failures.store(0, Ordering::Release);
                if admit == Admit::Probe {
                    self.state
                        .store(BreakerState::Closed as u8, Ordering::Release);
                }
            }
            (Admit::Probe, false) => self.open(now_ms),
            (Admit::Store, false) => {
                let n = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
                if n == 1 {
                    self.first_failure_ms.store(now_ms, Ordering::Release);
                }
                let since = now_ms - self.first_failure_ms.load(Ordering::Acquire);
                if n >= self.cfg.failure_threshold
                    && since >= self.cfg.failing_for.as_millis() as i64
                {
                    self.open(now_ms);
                }
            }
        }
    }

    /// Gives back a probe that could not be made (overload kept the request in this
    /// process past its deadline: it says nothing of the store): the breaker stays open and
    /// the next decision probes.
    pub fn release_probe(&self, now_ms: i64) {
        self.open_until_ms.store(now_ms, Ordering::Release);
        let _ = self.state.compare_exchange(
            BreakerState::HalfOpen as u8,
            BreakerState::Open as u8,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    fn open(&self, now_ms: i64) {
        let until = now_ms + self.cfg.open_for.as_millis() as i64;
        self.open_until_ms.store(until, Ordering::Release);
        self.failures.store(0, Ordering::Release);
        self.state
            .store(BreakerState::Open as u8, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_consecutive_failures_probes_then_closes() {
        let b = Breaker::new(BreakerConfig {
            failure_threshold: 3,
            failing_for: Duration::from_millis(10),
            open_for: Duration::from_millis(100),
        });
        for _ in 0..2 {
            b.record(Admit::Store, false, 0);
        }
        b.record(Admit::Store, true, 0); // a success resets the count
        for _ in 0..2 {
            b.record(Admit::Store, false, 0);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        b.record(Admit::Store, false, 10);
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.admit(50), Admit::Fallback);
        assert_eq!(b.admit(110), Admit::Probe);
        assert_eq!(b.admit(111), Admit::Fallback, "one probe at a time");
        b.record(Admit::Probe, false, 120);
        assert_eq!(
            (b.state(), b.admit(150)),
            (BreakerState::Open, Admit::Fallback)
        );
        assert_eq!(b.admit(220), Admit::Probe);
        b.record(Admit::Probe, true, 221);
        assert_eq!(
            (b.state(), b.admit(222)),
            (BreakerState::Closed, Admit::Store)
        );
    }

    #[test]
    fn a_probe_given_back_leaves_it_open_for_the_next_decision_to_probe() {
        let b = Breaker::new(BreakerConfig {
            failure_threshold: 1,
            failing_for: Duration::ZERO,
            open_for: Duration::from_millis(100),
        });
        b.record(Admit::Store, false, 0);
        assert_eq!(b.admit(100), Admit::Probe);
        b.release_probe(101);
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(
            b.admit(101),
            Admit::Probe,
            "the next decision probes at once"
        );
        b.record(Admit::Probe, true, 102);
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn failures_of_one_instant_do_not_open_it_failures_that_go_on_do() {
        let b = Breaker::new(BreakerConfig::default());
        // A stall: 40 requests in flight time out within the same few milliseconds.
        for i in 0..40 {
            b.record(Admit::Store, false, 1_000 + i / 10);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        b.record(Admit::Store, true, 1_006);
        // An outage: failures keep coming; the breaker opens 25 ms after the first.
        for t in (2_000..2_024).step_by(2) {
            b.record(Admit::Store, false, t);
            assert_eq!(b.state(), BreakerState::Closed, "at {t}");
        }
        b.record(Admit::Store, false, 2_025);
        assert_eq!(b.state(), BreakerState::Open);
    }
}
