//! The decision core's invariants, over any limits and any request times (proptest):
//!
//! - a denial changes nothing: no state is written;
//! - the bucket: over any span of T ms, a key is allowed at most capacity + refill × T;
//! - the window: after each allowed request, the requests allowed in its fixed window plus
//!   the previous window's, weighted by how much of it is still in view, are at most the
//!   quota (counted from the history of allowed requests, not from the stored state);
//! - Retry-After is exact to the millisecond: a request that waits it is allowed, one that
//!   waits a millisecond less is not.

use proptest::prelude::*;
use verdict_limiter::algo::TOKEN_UNITS;
use verdict_limiter::{CounterCheck, CounterState, Limits, decide};

/// The start of an hour, so windows of every length here start at a round offset.
const T0: i64 = 1_796_047_200_000;

/// Limits with a refill and a quota (a refill or quota of zero never recovers, so its
/// Retry-After is a window, not an instant).
fn limits() -> impl Strategy<Value = Limits> {
    (1u32..=40, 1i64..=40_000, 1u32..=120, 1_000i64..=120_000).prop_map(
        |(capacity, refill_units_per_ms, quota, window_ms)| Limits {
            capacity,
            refill_units_per_ms,
            quota,
            window_ms,
        },
    )
}

/// Request times: mostly bursts and short gaps, some gaps of windows.
fn times(window_ms: i64) -> impl Strategy<Value = Vec<i64>> {
    let gap = prop_oneof![
        4 => 0i64..=5,
        3 => 0i64..=window_ms / 20,
        1 => 0i64..=3 * window_ms,
    ];
    prop::collection::vec(gap, 1..250).prop_map(|gaps| {
        gaps.iter()
            .scan(T0 + 17, |t, g| {
                *t += g;
                Some(*t)
            })
            .collect()
    })
}

fn case() -> impl Strategy<Value = (Limits, Vec<i64>)> {
    limits().prop_flat_map(|l| (Just(l), times(l.window_ms)))
}

/// One decision per time, threading the state as a store would.
struct Run {
    /// Each request's outcome and the state it was decided on.
    steps: Vec<(
        i64,
        Option<CounterState>,
        CounterCheck,
        Option<CounterState>,
    )>,
}

fn run(l: &Limits, times: &[i64]) -> Run {
    let mut state = None;
    let steps = times
        .iter()
        .map(|&t| {
            let before = state;
            let (o, next) = decide(before, t, l);
            if next.is_some() {
                state = next;
            }
            (t, before, o, next)
        })
        .collect();
    Run { steps }
}

impl Run {
    fn allowed_times(&self) -> Vec<i64> {
        self.steps
            .iter()
            .filter(|s| s.2.allowed)
            .map(|s| s.0)
            .collect()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn a_denial_writes_nothing((l, times) in case()) {
        for (t, _, o, next) in run(&l, &times).steps {
            prop_assert_eq!(o.allowed, next.is_some(), "at {}: {:?}", t, o);
        }
    }

    #[test]
    fn the_bucket_allows_at_most_capacity_plus_refill_over_any_span((l, times) in case()) {
        let allowed = run(&l, &times).allowed_times();
        for (i, &from) in allowed.iter().enumerate() {
            for (j, &to) in allowed.iter().enumerate().skip(i) {
                let n = (j - i + 1) as i64;
                let bound = i64::from(l.capacity) * TOKEN_UNITS + l.refill_units_per_ms * (to - from);
                prop_assert!(
                    n * TOKEN_UNITS <= bound,
                    "{} allowed in [{}, {}] ({} ms) with {:?}", n, from, to, to - from, l
                );
            }
        }
    }

    #[test]
    fn the_window_allows_at_most_the_quota_with_the_previous_window_weighted((l, times) in case()) {
        let w = l.window_ms;
        let allowed = run(&l, &times).allowed_times();
        for (i, &t) in allowed.iter().enumerate() {
            let window = t.div_euclid(w);
            let so_far = &allowed[..=i];
            let cur = so_far.iter().filter(|&&a| a.div_euclid(w) == window).count() as i64;
            let prev = so_far.iter().filter(|&&a| a.div_euclid(w) == window - 1).count() as i64;
            let into = t - window * w;
            // cur + prev × (w − into) / w ≤ quota, in integers.
            prop_assert!(
                cur * w + prev * (w - into) <= i64::from(l.quota) * w,
                "at {} ({} ms into its window): {} in this window, {} in the one before, quota {}",
                t, into, cur, prev, l.quota
            );
        }
    }

    #[test]
    fn retry_after_is_exact_to_the_millisecond((l, times) in case()) {
        for (t, before, o, _) in run(&l, &times).steps {
            if o.allowed {
                prop_assert_eq!(o.retry_after_ms, 0);
                continue;
            }
            let wait = i64::from(o.retry_after_ms);
            prop_assert!(wait > 0, "denied at {} with no wait: {:?}", t, o);
            let early = decide(before, t + wait - 1, &l).0;
            prop_assert!(!early.allowed, "allowed {} ms after a Retry-After of {} at {}", wait - 1, wait, t);
            let on_time = decide(before, t + wait, &l).0;
            prop_assert!(on_time.allowed, "still denied after waiting the Retry-After of {} at {}: {:?}", wait, t, on_time);
        }
    }
}
