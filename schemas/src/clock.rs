//! Time: a `Clock` gives Unix milliseconds, and every part of verdict that reads the time
//! reads it from the one it was given. The limiter's memory store, breaker and policy age
//! use it (its Redis store ignores it: Redis's own `TIME` decides, so gateways with skewed
//! clocks agree); the ingest worker stamps its commits and judges event times with it; the
//! rollup and the jobs date their files and commits with it; the lake's tables stamp their
//! commits with it. Tests move a [`FakeClock`] instead of sleeping, and the demo runs a
//! [`ScaledClock`].

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

/// A source of the current time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Now, Unix milliseconds (UTC).
    fn now_ms(&self) -> i64;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or_default()
    }
}

/// A clock that moves only when told; clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct FakeClock(Arc<AtomicI64>);

impl FakeClock {
    /// A clock standing at `ms`.
    pub fn at(ms: i64) -> Self {
        Self(Arc::new(AtomicI64::new(ms)))
    }

    /// Moves the clock forward by `ms`.
    pub fn advance(&self, ms: i64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the clock to `ms`.
    pub fn set(&self, ms: i64) {
        self.0.store(ms, Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A clock that starts at `start_ms` and runs `speed` times faster than real time: the
/// demo compresses an hour of traffic into a minute with `speed` 60, so the hourly quota
/// and the hourly rollup have whole hours to work on.
#[derive(Debug, Clone, Copy)]
pub struct ScaledClock {
    start_ms: i64,
    real_start: std::time::Instant,
    speed: f64,
}

impl ScaledClock {
    /// A clock reading `start_ms` now and advancing `speed` ms per real ms.
    pub fn starting_at(start_ms: i64, speed: f64) -> Self {
        Self {
            start_ms,
            real_start: std::time::Instant::now(),
            speed: speed.max(0.0),
        }
    }
}

impl Clock for ScaledClock {
    fn now_ms(&self) -> i64 {
        self.start_ms + (self.real_start.elapsed().as_secs_f64() * 1000.0 * self.speed) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scaled_clock_runs_speed_times_faster_from_its_start() {
        let c = ScaledClock::starting_at(1_000_000, 60.0);
        let first = c.now_ms();
        assert!(first >= 1_000_000, "{first}");
        std::thread::sleep(std::time::Duration::from_millis(50));
        // 50 real ms are at least 3 s on the clock.
        assert!(c.now_ms() - first >= 3_000, "{}", c.now_ms() - first);
    }
}
