//! The decision, as a pure function of (stored state, now, limits): a token bucket for
//! bursts and a sliding window counter for the hourly quota, both of which must pass. A
//! denied request consumes nothing and writes nothing.
//!
//! The arithmetic is integer-only and every intermediate stays below 2^53, so the Lua
//! script in `redis.lua`, where numbers are doubles, computes exactly the same values; a
//! property test feeds both the same requests and compares every answer.
//!
//! Units: a token is [`TOKEN_UNITS`] units, so a refill of 0.05 tokens/s is 50 units per
//! millisecond; times are Unix milliseconds of the store's clock.

/// Units per token (the bucket's fixed-point scale).
pub const TOKEN_UNITS: i64 = 1_000_000;
/// The sliding window of the hourly quota.
pub const HOUR_MS: i64 = 3_600_000;
/// Largest capacity or quota the arithmetic accepts (keeps products below 2^53).
pub const MAX_LIMIT: u32 = 1_000_000_000;

/// Parts per million: the unit of a region's share of a limit.
pub const PPM: u32 = 1_000_000;

/// The limits of one limit key, in the core's units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    /// Bucket capacity, tokens.
    pub capacity: u32,
    /// Refill, units per millisecond (tokens per second × 1000).
    pub refill_units_per_ms: i64,
    /// Requests allowed per window.
    pub quota: u32,
    /// Window length, ms (an hour in production; shorter in tests).
    pub window_ms: i64,
}

impl Limits {
    /// Limits from a capacity, a refill in tokens per second and an hourly quota.
    pub fn per_hour(capacity: u32, refill_per_s: f64, quota: u32) -> Self {
        Self {
            capacity: capacity.min(MAX_LIMIT),
            refill_units_per_ms: refill_units_per_ms(refill_per_s),
            quota: quota.min(MAX_LIMIT),
            window_ms: HOUR_MS,
        }
    }

    fn capacity_units(&self) -> i64 {
        i64::from(self.capacity) * TOKEN_UNITS
    }

    /// These limits divided among `n` sub-keys (hot-key split) or instances (fallback),
    /// rounding so that no share is zero where the whole was not.
    pub fn divided(&self, n: u32) -> Self {
        let n = n.max(1);
        let share = |v: u32| if v == 0 { 0 } else { v.div_ceil(n).max(1) };
        Self {
            capacity: share(self.capacity),
            refill_units_per_ms: if self.refill_units_per_ms == 0 {
                0
            } else {
                (self.refill_units_per_ms / i64::from(n)).max(1)
            },
            quota: share(self.quota),
            window_ms: self.window_ms,
        }
    }
}

impl Limits {
    /// A region's part of these limits: capacity and refill × `bucket_ppm`, quota ×
    /// `window_ppm` (parts per million), rounded down so that the parts of all regions never
    /// add up to more than the whole. A refill is never rounded to nothing (it stays at
    /// least 0.001 tokens/s), so a small share still recovers.
    pub fn scaled(&self, bucket_ppm: u32, window_ppm: u32) -> Self {
        let part =
            |v: u32, ppm: u32| (u64::from(v) * u64::from(ppm.min(PPM)) / u64::from(PPM)) as u32;
        let refill = if self.refill_units_per_ms == 0 || bucket_ppm == 0 {
            0
        } else {
            (self.refill_units_per_ms * i64::from(bucket_ppm.min(PPM)) / i64::from(PPM)).max(1)
        };
        Self {
            capacity: part(self.capacity, bucket_ppm),
            refill_units_per_ms: refill,
            quota: part(self.quota, window_ppm),
            window_ms: self.window_ms,
        }
    }
}

/// Tokens per second as units per millisecond (0.001 tokens/s is the smallest non-zero).
pub fn refill_units_per_ms(tokens_per_s: f64) -> i64 {
    if tokens_per_s.is_finite() && tokens_per_s > 0.0 {
        ((tokens_per_s * 1000.0).round() as i64).clamp(1, i64::from(MAX_LIMIT) * 1000)
    } else {
        0
    }
}

/// What is stored per limit key: the bucket and the window together. The window index of
/// `cur` is that of `last_ms` (state is only written when a request is allowed, which
/// updates both).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CounterState {
    /// Tokens in the bucket at `last_ms`, in units.
    pub tokens: i64,
    /// Time of the last allowed request.
    pub last_ms: i64,
    /// Requests counted in the window holding `last_ms`.
    pub cur: u32,
    /// Requests counted in the window before it.
    pub prev: u32,
}

impl CounterState {
    /// Requests in view of the sliding window at `now_ms` (the count the quota is checked
    /// against): the current window's count plus the previous window's in proportion to how
    /// much of it is still in view.
    pub fn window_used(&self, now_ms: i64, window_ms: i64) -> f64 {
        let w = window_ms.max(1);
        let (p, c, e) = self.rolled(now_ms.max(self.last_ms), w);
        (p as f64) * (w - e) as f64 / w as f64 + c as f64
    }

    /// The state of one instance's part of a key, from what the shared store said was left
    /// after its last decision (`told`), at `now_ms`: `1/instances` of the remaining tokens
    /// and of the remaining window quota, within `share` (the whole limits divided among
    /// the instances). `None` when that part is a full share, the state of a key never seen.
    ///
    /// The window's count goes into the current window whole (none into the previous), so
    /// the part never admits more than the store's answer left it; it may admit less for up
    /// to a window, while that count decays as the previous window's.
    pub fn from_store_answer(
        told: &CounterCheck,
        share: &Limits,
        instances: u32,
        now_ms: i64,
    ) -> Option<Self> {
        let n = instances.max(1);
        let cap = share.capacity_units();
        let tokens = (i64::from(told.remaining_tokens) * TOKEN_UNITS / i64::from(n)).min(cap);
        let window_left = (told.remaining_window / n).min(share.quota);
        (tokens < cap || window_left < share.quota).then_some(Self {
            tokens,
            last_ms: now_ms,
            cur: share.quota - window_left,
            prev: 0,
        })
    }

    /// The more spent of two states of one key at `now_ms` (each refilled and rolled to
    /// it): the fewer tokens, the larger counts. The local fallback keeps what it admitted
    /// itself when a store answer that does not count it yet comes in.
    pub fn lower(&self, other: &Self, now_ms: i64, limits: &Limits) -> Self {
        let now = now_ms.max(self.last_ms).max(other.last_ms);
        let (cap, rate, w) = (
            limits.capacity_units(),
            limits.refill_units_per_ms,
            limits.window_ms.max(1),
        );
        let (pa, ca, _) = self.rolled(now, w);
        let (pb, cb, _) = other.rolled(now, w);
        Self {
            tokens: self
                .refilled(now, cap, rate)
                .min(other.refilled(now, cap, rate)),
            last_ms: now,
            cur: ca.max(cb) as u32,
            prev: pa.max(pb) as u32,
        }
    }

    /// A key's stored state (a full bucket for a key never seen), the instant to decide at
    /// (`now_ms`, or the state's last write if the store's clock stepped back: a failover to
    /// a replica does not undo refill), and the bucket's tokens then.
    fn at(state: Option<Self>, now_ms: i64, limits: &Limits) -> (Self, i64, i64) {
        let cap = limits.capacity_units();
        let s = state.unwrap_or(Self {
            tokens: cap,
            last_ms: now_ms,
            cur: 0,
            prev: 0,
        });
        let now = now_ms.max(s.last_ms);
        (s, now, s.refilled(now, cap, limits.refill_units_per_ms))
    }

    /// Tokens in the bucket at `now` (not before `last_ms`): arithmetic on read, capped at
    /// `cap` units, refilling `rate` units per ms.
    fn refilled(&self, now: i64, cap: i64, rate: i64) -> i64 {
        let deficit = cap - self.tokens;
        if deficit <= 0 {
            cap
        } else if rate == 0 {
            self.tokens
        } else if now - self.last_ms > deficit / rate {
            cap
        } else {
            self.tokens + (now - self.last_ms) * rate
        }
    }

    /// The window rolled to `now` (not before `last_ms`): the previous window's count, the
    /// current window's count, and how far `now` is into the current window, ms.
    fn rolled(&self, now: i64, w: i64) -> (i64, i64, i64) {
        let (i_last, i_now) = (self.last_ms.div_euclid(w), now.div_euclid(w));
        let (p, c) = if i_now == i_last {
            (i64::from(self.prev), i64::from(self.cur))
        } else if i_now == i_last + 1 {
            (i64::from(self.cur), 0)
        } else {
            (0, 0)
        };
        (p, c, now - i_now * w)
    }
}

/// What the two counters say about one request, before the mode is applied (the limiter
/// turns it into a [`crate::Decision`]): passed or which check refused, what is left, and
/// when a request would pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CounterCheck {
    /// Passed both checks.
    pub allowed: bool,
    /// The bucket refused.
    pub denied_by_bucket: bool,
    /// The window refused.
    pub denied_by_window: bool,
    /// Whole tokens left after this request.
    pub remaining_tokens: u32,
    /// Requests left in the window after this request.
    pub remaining_window: u32,
    /// When denied: ms until a request would pass (the later of the two checks), assuming
    /// no other request; 0 when allowed.
    pub retry_after_ms: u32,
    /// The time the decision was made at (the store's clock).
    pub now_ms: i64,
}

/// Decides one request of cost 1. Returns the outcome and, if allowed, the state to store
/// (a denial writes nothing).
pub fn decide(
    state: Option<CounterState>,
    now_ms: i64,
    limits: &Limits,
) -> (CounterCheck, Option<CounterState>) {
    decide_hits(state, now_ms, limits, 1)
}

/// Decides one request that counts as `hits` requests: it passes
/// if the bucket holds `hits` tokens and the window has room for `hits` more, and then
/// takes them all. Zero hits checks without counting: it passes unless the key is already
/// past a limit (a bucket in debt from charges, a window over its quota), and writes
/// nothing. A request of more hits than the capacity or the quota (or [`MAX_LIMIT`]) never
/// passes; it is told to ask again in a window. Returns the outcome and, if allowed and counting, the state
/// to store.
pub fn decide_hits(
    state: Option<CounterState>,
    now_ms: i64,
    limits: &Limits,
    hits: u32,
) -> (CounterCheck, Option<CounterState>) {
    let rate = limits.refill_units_per_ms;
    let w = limits.window_ms.max(1);
    let q = i64::from(limits.quota);
    let h = i64::from(hits.min(MAX_LIMIT + 1));
    let cost = h * TOKEN_UNITS;

    let (s, now, tokens) = CounterState::at(state, now_ms, limits);

    // Roll the window.
    let (p, c, e) = s.rolled(now, w);
    // In window units × w: used = p × (w − e) + c × w; the request fits if used + h × w ≤
    // q × w.
    let used = p * (w - e) + c * w;

    let bucket_ok = tokens >= cost;
    let window_ok = used + h * w <= q * w;
    if bucket_ok && window_ok {
        let tokens = tokens - cost;
        let outcome = CounterCheck {
            allowed: true,
            denied_by_bucket: false,
            denied_by_window: false,
            remaining_tokens: (tokens / TOKEN_UNITS) as u32,
            remaining_window: ((q * w - used - h * w).max(0) / w) as u32,
            retry_after_ms: 0,
            now_ms: now,
        };
        let next = (h > 0).then_some(CounterState {
            tokens,
            last_ms: now,
            cur: (c + h) as u32,
            prev: p as u32,
        });
        return (outcome, next);
    }

    let bucket_wait = if bucket_ok {
        0
    } else if rate == 0 || cost > limits.capacity_units() {
        w
    } else {
        (cost - tokens + rate - 1) / rate
    };
    let window_wait = if window_ok {
        0
    } else {
        window_wait(p, c, e, q, w, h)
    };
    let outcome = CounterCheck {
        allowed: false,
        denied_by_bucket: !bucket_ok,
        denied_by_window: !window_ok,
        remaining_tokens: (tokens.max(0) / TOKEN_UNITS) as u32,
        remaining_window: ((q * w - used).max(0) / w) as u32,
        retry_after_ms: bucket_wait.max(window_wait).clamp(0, i64::from(u32::MAX)) as u32,
        now_ms: now,
    };
    (outcome, None)
}

/// Counts `count` requests of a key that were admitted elsewhere (the local fallback, while
/// the store was failing or this process overloaded) at `now_ms`: they take tokens from the
/// bucket and count whole in the current window, so the hourly quota sees every request
/// admitted. The bucket may go into debt, down to minus its capacity: while the fallback
/// admits, the store's bucket refills too, and a charge that stopped at empty would let
/// both admit the refill. The debt is repaid by refill before the next request passes;
/// past one bucket it is forgiven (the window still counts every request). The new state is
/// always written; nothing is refused.
pub fn charge(
    state: Option<CounterState>,
    now_ms: i64,
    limits: &Limits,
    count: u32,
) -> CounterState {
    let cap = limits.capacity_units();
    let (s, now, tokens) = CounterState::at(state, now_ms, limits);
    let (p, c, _) = s.rolled(now, limits.window_ms.max(1));
    let count = i64::from(count.min(MAX_LIMIT));
    CounterState {
        tokens: (tokens - count * TOKEN_UNITS).max(-cap),
        last_ms: now,
        cur: (c + count).min(i64::from(MAX_LIMIT)) as u32,
        prev: p as u32,
    }
}

/// Ms from offset `e` in the current window until `h` more requests fit, with `p` and `c`
/// counted in the previous and current windows and no other requests meanwhile.
fn window_wait(p: i64, c: i64, e: i64, q: i64, w: i64, h: i64) -> i64 {
    if q == 0 || h > q {
        // A quota of zero, or below the request's hits, never admits it: ask again in a
        // window.
        return w;
    }
    // Within this window: p × (w − e') ≤ (q − c − h) × w, i.e. e' ≥ w − ⌊(q − c − h) × w / p⌋.
    // The numerator is capped at p × w so the quotient stays ≤ w (exact in doubles too).
    if c + h <= q && p > 0 {
        let span = ((q - c - h) * w).min(p * w) / p;
        let at = w - span;
        if at < w {
            return at - e;
        }
    }
    // In the next window the previous count is c: c × (w − e'') ≤ (q − h) × w.
    let at_next = if c == 0 {
        0
    } else {
        w - ((q - h) * w).min(c * w) / c
    };
    (w - e) + at_next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_part_of_a_store_answer_admits_no_more_than_was_left() {
        let whole = Limits::per_hour(10, 1.0, 100);
        let part = whole.divided(2);
        let told = |tokens, window| CounterCheck {
            allowed: true,
            denied_by_bucket: false,
            denied_by_window: false,
            remaining_tokens: tokens,
            remaining_window: window,
            retry_after_ms: 0,
            now_ms: 0,
        };
        // Nothing used: a full part, the state of a key never seen.
        assert_eq!(
            CounterState::from_store_answer(&told(10, 100), &part, 2, 5),
            None
        );
        // 7 tokens and 50 of the window left: 3.5 tokens and 25 requests are this part.
        let s = CounterState::from_store_answer(&told(7, 50), &part, 2, 5).unwrap();
        assert_eq!(
            s,
            CounterState {
                tokens: 3_500_000,
                last_ms: 5,
                cur: 25,
                prev: 0
            }
        );
        let mut state = Some(s);
        let mut allowed = 0;
        for _ in 0..10 {
            let (o, next) = decide(state, 5, &part);
            allowed += u32::from(o.allowed);
            state = next.or(state);
        }
        assert_eq!(allowed, 3, "the whole tokens of 3.5");
        // The window's part binds when it is the smaller.
        let s = CounterState::from_store_answer(&told(10, 4), &part, 2, 5).unwrap();
        assert_eq!((s.tokens, s.cur), (5_000_000, 48));
    }

    #[test]
    fn a_share_scales_the_limits_down_never_to_more_than_the_whole() {
        let l = Limits::per_hour(40, 40.0, 300);
        let third = l.scaled(PPM / 3, PPM / 3);
        assert_eq!((third.capacity, third.quota), (13, 99));
        assert_eq!(third.refill_units_per_ms, 13_333);
        assert_eq!(l.scaled(PPM, PPM), l);
        // Three thirds never add up to more than the whole.
        assert!(3 * third.capacity <= l.capacity && 3 * third.quota <= l.quota);
        // A tiny share keeps a refill, so the region recovers.
        let tiny = l.scaled(1, 0);
        assert_eq!(
            (tiny.capacity, tiny.quota, tiny.refill_units_per_ms),
            (0, 0, 1)
        );
    }

    #[test]
    fn the_count_in_view_weighs_the_previous_window_by_what_is_left_of_it() {
        let s = CounterState {
            tokens: 2_500_000,
            last_ms: 9_000_000,
            cur: 30,
            prev: 100,
        };
        // Half-way through the window: all of this one, half of the one before.
        assert_eq!(s.window_used(9_000_000, HOUR_MS), 30.0 + 50.0);
        // A quarter into the next: three quarters of what is now the previous one.
        assert_eq!(s.window_used(11_700_000, HOUR_MS), 22.5);
        // Two windows on: nothing in view.
        assert_eq!(s.window_used(15_000_000, HOUR_MS), 0.0);
        // The same count the decision uses: with q = 80, the window is exactly full.
        let (o, _) = decide(
            Some(s),
            9_000_000,
            &Limits {
                quota: 80,
                ..Limits::per_hour(10, 1.0, 80)
            },
        );
        assert!(o.denied_by_window);
        let (o, _) = decide(Some(s), 9_000_000, &Limits::per_hour(10, 1.0, 81));
        assert!(o.allowed);
    }

    const T0: i64 = 1_796_047_200_000; // the start of an hour

    fn limits(capacity: u32, refill_per_s: f64, quota: u32) -> Limits {
        Limits::per_hour(capacity, refill_per_s, quota)
    }

    /// Runs requests at the given times, threading the state; returns the outcomes.
    fn run(l: &Limits, times: &[i64]) -> Vec<CounterCheck> {
        let mut state = None;
        times
            .iter()
            .map(|&t| {
                let (o, next) = decide(state, t, l);
                if next.is_some() {
                    state = next;
                }
                o
            })
            .collect()
    }

    #[test]
    fn a_full_bucket_allows_a_burst_of_its_capacity_then_denies() {
        let l = limits(5, 1.0, 1000);
        let out = run(&l, &[T0; 6]);
        assert!(out[..5].iter().all(|o| o.allowed));
        assert_eq!(out[4].remaining_tokens, 0);
        let d = out[5];
        assert!(!d.allowed && d.denied_by_bucket && !d.denied_by_window);
        // One token refills in 1 s.
        assert_eq!(d.retry_after_ms, 1000);
        assert_eq!(d.remaining_window, 995);
    }

    #[test]
    fn refill_is_arithmetic_on_read_and_capped_at_capacity() {
        let l = limits(2, 0.5, 1000);
        let out = run(
            &l,
            &[
                T0,
                T0,
                T0 + 1_000,
                T0 + 2_000,
                T0 + 60_000,
                T0 + 60_000,
                T0 + 60_000,
            ],
        );
        let allowed: Vec<bool> = out.iter().map(|o| o.allowed).collect();
        // After 1 s half a token: denied; after 2 s one token: allowed; after a minute the
        // bucket is full again (2, not 29).
        assert_eq!(allowed, [true, true, false, true, true, true, false]);
        assert_eq!(out[2].retry_after_ms, 1_000);
    }

    #[test]
    fn a_denied_request_consumes_nothing() {
        let l = limits(1, 1.0, 1000);
        let (first, s1) = decide(None, T0, &l);
        assert!(first.allowed);
        let (denied, s2) = decide(s1, T0 + 10, &l);
        assert!(!denied.allowed);
        assert_eq!(s2, None, "a denial writes nothing");
        // At exactly one second the token is back, as if the denial never happened.
        let (again, _) = decide(s1, T0 + 1_000, &l);
        assert!(again.allowed);
    }

    #[test]
    fn the_quota_holds_within_a_window() {
        let l = limits(1000, 1000.0, 10);
        let times: Vec<i64> = (0..11).map(|i| T0 + i * 1000).collect();
        let out = run(&l, &times);
        assert!(out[..10].iter().all(|o| o.allowed));
        assert_eq!(out[9].remaining_window, 0);
        let d = out[10];
        assert!(!d.allowed && d.denied_by_window && !d.denied_by_bucket);
        // Nothing in the previous window: the next request fits when the window turns, and
        // then only after the old ten have faded below nine in the weighted sum.
        assert_eq!(
            d.retry_after_ms as i64,
            (HOUR_MS - 10_000) + (HOUR_MS - 9 * HOUR_MS / 10)
        );
    }

    #[test]
    fn the_previous_window_fades_with_the_share_still_in_view() {
        let l = limits(1000, 1000.0, 100);
        // 100 requests in the first window, spread over its last minute.
        let mut times: Vec<i64> = (0..100).map(|i| T0 + HOUR_MS - 60_000 + i * 100).collect();
        // A quarter into the next window 75 % of the previous still counts: 75 used, so 25 fit.
        times.extend((0..26).map(|i| T0 + HOUR_MS + HOUR_MS / 4 + i));
        let out = run(&l, &times);
        assert!(out[..100].iter().all(|o| o.allowed));
        let next: Vec<bool> = out[100..].iter().map(|o| o.allowed).collect();
        assert_eq!(next.iter().filter(|a| **a).count(), 25);
        assert!(!next[25]);
        assert_eq!(out[124].remaining_window, 0);
        // Denied at e = w/4 with p = 100, c = 25: needs 100 × (w − e') ≤ 74 w → e' = 0.26 w.
        assert_eq!(
            out[125].retry_after_ms as i64,
            26 * HOUR_MS / 100 - (HOUR_MS / 4 + 25)
        );
    }

    #[test]
    fn no_boundary_burst_of_twice_the_quota() {
        // The fixed-window flaw: the full quota at 11:59:59 and again at 12:00:00.
        let l = limits(1000, 1000.0, 50);
        let mut times = vec![T0 + HOUR_MS - 1_000; 50];
        times.extend(vec![T0 + HOUR_MS; 50]);
        let out = run(&l, &times);
        let allowed = out.iter().filter(|o| o.allowed).count();
        assert_eq!(
            allowed, 50,
            "the second 50 must wait for the first 50 to fade"
        );
    }

    #[test]
    fn retry_after_is_the_later_of_the_two_waits() {
        // Bucket empty (1 token, refill 1 per 10 s) and quota spent (1 per hour).
        let l = limits(1, 0.1, 1);
        let out = run(&l, &[T0, T0 + 1]);
        let d = out[1];
        assert!(d.denied_by_bucket && d.denied_by_window);
        let bucket_wait = 10_000 - 1;
        // Window: c = 1 = q, so the next window; there the previous 1 must fade to 0: w more.
        let window_wait = (HOUR_MS - 1) + HOUR_MS;
        assert_eq!(d.retry_after_ms as i64, bucket_wait.max(window_wait));
    }

    #[test]
    fn a_request_of_n_hits_is_n_requests_at_one_instant_or_none() {
        for (cap, refill, quota) in [(3, 0.5, 10), (10, 20.0, 7), (6, 0.001, 1000), (50, 5.0, 30)] {
            let l = Limits {
                window_ms: 60_000,
                ..limits(cap, refill, quota)
            };
            let mut state = None;
            let mut t = T0 + 1_234_567;
            for step in 0..400u32 {
                let h = step * 7 % 9;
                let (o, next) = decide_hits(state, t, &l, h);
                // The same instant, one hit at a time.
                let mut singles = (state, Vec::new());
                for _ in 0..h {
                    let (one, after) = decide(singles.0, t, &l);
                    singles.1.push(one);
                    singles.0 = after.or(singles.0);
                }
                let all = singles.1.iter().all(|o| o.allowed);
                assert_eq!(o.allowed, all, "{h} hits at step {step} under {l:?}");
                if o.allowed && h > 0 {
                    assert_eq!(next, singles.0, "{h} hits at step {step} under {l:?}");
                    let last = singles.1.last().unwrap();
                    assert_eq!(
                        (o.remaining_tokens, o.remaining_window),
                        (last.remaining_tokens, last.remaining_window)
                    );
                } else {
                    assert_eq!(next, None, "{h} hits wrote at step {step}");
                }
                if next.is_some() {
                    state = next;
                }
                t += i64::from(step % 13) * 97;
            }
        }
    }

    #[test]
    fn waiting_the_retry_after_is_enough_and_one_ms_less_is_not() {
        // Hourly and a 20 s window; requests of one hit, and of several (up to the smaller
        // limit, so that each can pass).
        let cases = [(3, 0.5, 10), (10, 20.0, 7), (1, 0.001, 1000), (50, 5.0, 3)]
            .into_iter()
            .map(|(cap, refill, quota)| (limits(cap, refill, quota), false))
            .chain(
                [(3, 0.5, 10), (10, 20.0, 7), (5, 0.001, 1000), (50, 5.0, 12)]
                    .into_iter()
                    .map(|(cap, refill, quota)| {
                        let l = limits(cap, refill, quota);
                        (
                            Limits {
                                window_ms: 20_000,
                                ..l
                            },
                            true,
                        )
                    }),
            );
        for (l, several) in cases {
            let mut state = None;
            let mut t = T0 + 1_234_567;
            for step in 0..300u32 {
                let h = if several {
                    1 + step * 5 % l.capacity.min(l.quota)
                } else {
                    1
                };
                let (o, next) = decide_hits(state, t, &l, h);
                if let Some(n) = next {
                    state = Some(n);
                    t += 7;
                    continue;
                }
                let wait = i64::from(o.retry_after_ms);
                assert!(wait > 0);
                assert!(
                    !decide_hits(state, t + wait - 1, &l, h).0.allowed,
                    "{h} hits allowed before retry-after under {l:?}"
                );
                assert!(
                    decide_hits(state, t + wait, &l, h).0.allowed,
                    "{h} hits still denied at retry-after under {l:?}"
                );
                t += wait;
            }
        }
    }

    #[test]
    fn a_charge_counts_in_the_window_and_leaves_the_bucket_in_debt_of_at_most_a_bucket() {
        let l = Limits {
            window_ms: 10_000,
            ..limits(10, 1.0, 20)
        };
        // Three admitted here (t = 0, 1, 2 ms), then eight admitted by a fallback are
        // charged at 3 ms: 10 − 3 − 8 tokens, plus 3 ms of refill.
        let mut state = None;
        for t in [0, 1, 2] {
            state = decide(state, t, &l).1;
        }
        let charged = charge(state, 3, &l, 8);
        assert_eq!(
            charged,
            CounterState {
                tokens: -TOKEN_UNITS + 3_000,
                last_ms: 3,
                cur: 11,
                prev: 0
            }
        );
        // The debt is repaid before a request passes: a token is back at 1.997 s, not 1 s.
        let (o, _) = decide(Some(charged), 1_003, &l);
        assert_eq!(
            (o.allowed, o.denied_by_bucket, o.remaining_tokens),
            (false, true, 0)
        );
        assert_eq!(o.retry_after_ms, 997);
        let (o, _) = decide(Some(charged), 2_000, &l);
        assert!(o.allowed, "{o:?}");
        assert_eq!(
            o.remaining_window, 8,
            "11 charged and counted, then this one"
        );
        // A charge in the next window counts there; the past one rolls into `prev`.
        let next = charge(Some(charged), 15_000, &l, 2);
        assert_eq!((next.prev, next.cur), (11, 2));
        // A key the store never saw starts full; a debt stops at one bucket.
        assert_eq!(charge(None, 7, &l, 4).tokens, 6 * TOKEN_UNITS);
        assert_eq!(charge(None, 7, &l, 50).tokens, -10 * TOKEN_UNITS);
    }

    #[test]
    fn the_lower_of_two_states_is_the_more_spent_at_one_instant() {
        let l = Limits {
            window_ms: 10_000,
            ..limits(10, 1.0, 20)
        };
        // Spent locally at 0: 4 tokens, 6 counted. Told at 500 by the store: 7 tokens, 3.
        let local = CounterState {
            tokens: 4 * TOKEN_UNITS,
            last_ms: 0,
            cur: 6,
            prev: 1,
        };
        let told = CounterState {
            tokens: 7 * TOKEN_UNITS,
            last_ms: 500,
            cur: 3,
            prev: 2,
        };
        // The local state refilled to 500 ms has 4.5 tokens: fewer, and it counted more.
        assert_eq!(
            local.lower(&told, 500, &l),
            CounterState {
                tokens: 4 * TOKEN_UNITS + 500_000,
                last_ms: 500,
                cur: 6,
                prev: 2
            }
        );
        assert_eq!(told.lower(&local, 500, &l), local.lower(&told, 500, &l));
    }

    #[test]
    fn a_quota_of_zero_admits_nothing() {
        let (o, s) = decide(None, T0, &limits(10, 1.0, 0));
        assert!(!o.allowed && o.denied_by_window && s.is_none());
        assert_eq!(i64::from(o.retry_after_ms), HOUR_MS);
    }

    #[test]
    fn a_clock_that_steps_back_does_not_refill_or_unroll() {
        let l = limits(2, 1.0, 100);
        let (_, s) = decide(None, T0 + 10_000, &l);
        let (o, s2) = decide(s, T0, &l);
        assert!(o.allowed);
        assert_eq!(o.now_ms, T0 + 10_000);
        assert_eq!(s2.unwrap().cur, 2);
    }

    #[test]
    fn division_among_sub_keys_never_rounds_a_limit_to_zero() {
        let l = limits(10, 0.01, 15).divided(16);
        assert_eq!((l.capacity, l.refill_units_per_ms, l.quota), (1, 1, 1));
        let l = limits(1600, 16.0, 16_000).divided(16);
        assert_eq!(
            (l.capacity, l.refill_units_per_ms, l.quota),
            (100, 1000, 1000)
        );
    }
}
