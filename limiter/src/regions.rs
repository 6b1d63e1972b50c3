//! Regions. Counters are regional: a globally exact count would cost a cross-region round
//! trip (~80 ms) per request. The policy states a key's *global* limits and each region
//! enforces its share of them: its static weight (policy `[[regions]]`), or what the
//! reconcile job (`verdict_reconcile`) last computed from every region's usage.
//!
//! - [`Share`], [`ShareEntry`], [`ShareHandle`]: the shares in force in one region, swapped
//!   atomically like the policy. A share that grows takes effect only at its
//!   `effective_ms`, after every region has had time to apply the shares that shrank, so
//!   the sum in force never exceeds the whole limit.
//! - [`NearLimit`]: how the job finds the keys that need
//!   attention without scanning every key. A gateway notes each request of a key that is
//!   near its regional limit (refused, or less than half of the bucket or of the quota
//!   left) and, every report interval (a second), adds the counts to a hash of
//!   quarter-second buckets in its region's Redis (`rl:near:<bucket>`, field `<key id hex>.<route class>.<tier>`). The job reads
//!   the last interval's buckets: only those keys, and the requests each region saw of
//!   them (its demand). The report itself is `verdict_counters_redis::spawn_near_limit_reporter`.
//! - [`ShareRow`]: a row of the shares in the policy store, read by the gateways of one
//!   region (`verdict_policy_store::spawn_share_refresher`) and written by the job.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use verdict_schemas::{KeyId, RegionId, RouteClassId, TierId};

use crate::algo::PPM;

/// One limit key's identity across regions: who, on what, at which tier (sub-keys of a
/// split key share one share).
pub type ShareKey = (KeyId, RouteClassId, TierId);

/// A region's part of one key's global limits, in parts per million.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Share {
    /// Of the bucket's capacity and refill.
    pub bucket_ppm: u32,
    /// Of the hourly quota.
    pub window_ppm: u32,
}

impl Share {
    /// The whole limit.
    pub const WHOLE: Share = Share::uniform(PPM);

    /// The same part of both.
    pub const fn uniform(ppm: u32) -> Self {
        Self {
            bucket_ppm: ppm,
            window_ppm: ppm,
        }
    }

    /// The smaller part of each.
    pub fn min(self, other: Share) -> Self {
        Self {
            bucket_ppm: self.bucket_ppm.min(other.bucket_ppm),
            window_ppm: self.window_ppm.min(other.window_ppm),
        }
    }
}

/// One key's share in one region, as the reconcile job wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareEntry {
    /// The share in force before this round.
    pub before: Share,
    /// The share this round computed.
    pub after: Share,
    /// From when `after` applies in full; until then the smaller of the two.
    pub effective_ms: i64,
    /// When the round read the counters.
    pub computed_ms: i64,
}

impl ShareEntry {
    /// The share in force at `now_ms`: `after` once effective, before that the smaller of
    /// `before` and `after` (a shrinking share applies at once, a growing one waits).
    pub fn in_force(&self, now_ms: i64) -> Share {
        if now_ms >= self.effective_ms {
            self.after
        } else {
            self.before.min(self.after)
        }
    }

    /// Whether the entry is still in force at `now_ms` for a share life of `ttl_ms`
    /// (younger than it); an older one gives way to the static weight.
    pub fn is_fresh(&self, now_ms: i64, ttl_ms: i64) -> bool {
        now_ms - self.computed_ms < ttl_ms
    }

    /// The share in force at `now_ms` ([`Self::in_force`]), or `None` once the entry is older
    /// than `ttl_ms` (the static weight applies).
    pub fn in_force_within(&self, now_ms: i64, ttl_ms: i64) -> Option<Share> {
        self.is_fresh(now_ms, ttl_ms).then(|| self.in_force(now_ms))
    }
}

/// The shares in force in one region.
#[derive(Debug, Clone, Default)]
pub struct ShareSnapshot {
    /// Rises with every round that wrote this region's shares (0: none yet).
    pub version: u64,
    /// One entry per key the job found near its limit.
    pub entries: HashMap<ShareKey, ShareEntry>,
}

/// The shares in force, swapped atomically when the refresher reads a new round. An entry
/// older than `ttl` is ignored (the static weight applies): if the job stops, no region is
/// held at a stale small share for good.
#[derive(Debug, Clone)]
pub struct ShareHandle {
    current: Arc<arc_swap::ArcSwap<ShareSnapshot>>,
    ttl_ms: i64,
}

/// Default life of a share the job no longer rewrites: ten 30-second rounds.
pub const DEFAULT_SHARE_TTL: Duration = Duration::from_secs(300);

impl ShareHandle {
    /// No shares yet (static weights), entries living `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self {
            current: Arc::new(arc_swap::ArcSwap::from_pointee(ShareSnapshot::default())),
            ttl_ms: ttl.as_millis() as i64,
        }
    }

    /// The shares in force.
    pub fn load(&self) -> Arc<ShareSnapshot> {
        self.current.load_full()
    }

    /// Puts new shares in force.
    pub fn store(&self, snapshot: ShareSnapshot) {
        self.current.store(Arc::new(snapshot));
    }

    /// This region's share of `key` at `now_ms`, or `static_ppm` when the job has none (or
    /// only an expired one).
    pub fn share(&self, key: &ShareKey, now_ms: i64, static_ppm: u32) -> Share {
        self.current
            .load()
            .entries
            .get(key)
            .and_then(|e| e.in_force_within(now_ms, self.ttl_ms))
            .unwrap_or(Share::uniform(static_ppm))
    }
}

/// Width of one near-limit bucket in Redis.
pub const NEAR_BUCKET_MS: i64 = 250;
/// How long a near-limit bucket lives in Redis.
pub const NEAR_BUCKET_TTL_MS: i64 = 300_000;
/// Most distinct keys one gateway notes between two reports (the rest are counted as
/// dropped).
pub const NEAR_MAX_KEYS: usize = 100_000;

/// The Redis hash of near-limit counts for the bucket holding `ms`.
pub fn near_bucket_key(ms: i64) -> String {
    format!("rl:near:{}", ms.div_euclid(NEAR_BUCKET_MS))
}

/// The field of a key in a near-limit hash: `<key id hex>.<route class>.<tier>`.
pub fn near_field(key: &ShareKey) -> String {
    format!("{}.{}.{}", key.0, key.1.0, key.2.0)
}

/// Reads a near-limit field back (None if it is not one).
pub fn parse_near_field(field: &str) -> Option<ShareKey> {
    let mut parts = field.split('.');
    let key: KeyId = parts.next()?.parse().ok()?;
    let route: u8 = parts.next()?.parse().ok()?;
    let tier: u8 = parts.next()?.parse().ok()?;
    parts
        .next()
        .is_none()
        .then_some((key, RouteClassId(route), TierId(tier)))
}

/// The gateway's notes of near-limit requests since the last report.
#[derive(Debug)]
pub struct NearLimit {
    shards: Vec<Mutex<HashMap<ShareKey, u64>>>,
    max_keys_per_shard: usize,
}

impl Default for NearLimit {
    fn default() -> Self {
        Self::new(NEAR_MAX_KEYS)
    }
}

impl NearLimit {
    /// Notes at most `max_keys` distinct keys between reports.
    pub fn new(max_keys: usize) -> Self {
        const SHARDS: usize = 16;
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            max_keys_per_shard: max_keys.div_ceil(SHARDS).max(1),
        }
    }

    /// Notes one request of `key`; false if the notes are full.
    pub fn record(&self, key: ShareKey) -> bool {
        let shard = &self.shards[usize::from(key.0.0[0]) % self.shards.len()];
        let mut map = shard.lock().unwrap_or_else(|p| p.into_inner());
        let full = map.len() >= self.max_keys_per_shard;
        match map.get_mut(&key) {
            Some(n) => *n += 1,
            None if full => return false,
            None => {
                map.insert(key, 1);
            }
        }
        true
    }

    /// Takes every note.
    pub fn drain(&self) -> Vec<(ShareKey, u64)> {
        let mut out = Vec::new();
        for shard in &self.shards {
            let mut map = shard.lock().unwrap_or_else(|p| p.into_inner());
            out.extend(map.drain());
        }
        out
    }
}

/// True when a decision shows its key near the regional limit, so that the next round
/// gives it (or renews) a share: refused, less than half of the bucket or of the quota it
/// enforces (`limits`) left, or more than half of its static share of either (`static_limits`)
/// used. The last keeps a key noted while it relies on a share the reconcile gave it above its
/// static one: a share not rewritten expires (`share_ttl`), and a key whose traffic still
/// needs it would be refused until the next round noticed.
pub fn is_near_limit(
    allowed: bool,
    remaining_tokens: u32,
    remaining_window: u32,
    limits: &crate::algo::Limits,
    static_limits: &crate::algo::Limits,
) -> bool {
    let used_tokens = limits.capacity.saturating_sub(remaining_tokens);
    let used_window = limits.quota.saturating_sub(remaining_window);
    !allowed
        || u64::from(remaining_tokens) * 2 < u64::from(limits.capacity)
        || u64::from(remaining_window) * 2 < u64::from(limits.quota)
        || u64::from(used_tokens) * 2 > u64::from(static_limits.capacity)
        || u64::from(used_window) * 2 > u64::from(static_limits.quota)
}

/// What one region contributes to one key's round.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RegionInput {
    /// The region's static share, ppm.
    pub static_ppm: u32,
    /// Its usage and demand, or None when it could not be read this round.
    pub reading: Option<Reading>,
    /// The share it enforces now (the last round's, decayed if stale, or its static weight).
    pub last: Share,
}

/// One region's reading of one key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    /// Requests in view of the key's sliding window in the region.
    pub used: f64,
    /// Near-limit requests the region saw in the last interval.
    pub demand: u64,
}

/// The new shares of one key, one per input, for a global quota of `quota`. Regions that
/// could not be read keep `last`; the others share the rest. The bucket shares, and the
/// window shares, each sum to at most the whole ([`PPM`]).
pub fn compute_shares(quota: u32, inputs: &[RegionInput], floor: f64) -> Vec<Share> {
    let floor = floor.clamp(0.0, 1.0);
    let fixed = |f: fn(&Share) -> u32| {
        inputs
            .iter()
            .filter(|i| i.reading.is_none())
            .map(|i| f(&i.last))
            .sum::<u32>()
            .min(PPM)
    };
    let avail_bucket = f64::from(PPM - fixed(|s| s.bucket_ppm));
    let avail_window = f64::from(PPM - fixed(|s| s.window_ppm));
    let readings: Vec<(usize, Reading, u32)> = inputs
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.reading.map(|x| (i, x, r.static_ppm)))
        .collect();
    let demand: f64 = readings.iter().map(|(_, r, _)| r.demand as f64).sum();
    let statics: f64 = readings.iter().map(|(_, _, s)| f64::from(*s)).sum();
    let weight = |r: &Reading, s: u32| {
        let s = if statics > 0.0 {
            f64::from(s) / statics
        } else {
            1.0 / readings.len() as f64
        };
        if demand > 0.0 {
            (1.0 - floor) * r.demand as f64 / demand + floor * s
        } else {
            s
        }
    };
    let q = f64::from(quota);
    let q_avail = q * avail_window / f64::from(PPM);
    let used: f64 = readings.iter().map(|(_, r, _)| r.used.max(0.0)).sum();

    let mut out: Vec<Share> = inputs.iter().map(|i| i.last).collect();
    for (i, r, s) in &readings {
        let w = weight(r, *s);
        let window = if quota == 0 {
            avail_window * w
        } else if used >= q_avail {
            // Over the global quota already: everyone keeps what it used, nothing more.
            avail_window * r.used.max(0.0) / used.max(f64::MIN_POSITIVE)
        } else {
            (r.used.max(0.0) + w * (q_avail - used)) / q * f64::from(PPM)
        };
        out[*i] = Share {
            bucket_ppm: (avail_bucket * w).floor() as u32,
            window_ppm: window.floor().max(0.0) as u32,
        };
    }
    out
}

/// One row of `verdict_policy.shares`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareRow {
    /// The region.
    pub region: RegionId,
    /// The limit key.
    pub key: ShareKey,
    /// The share.
    pub entry: ShareEntry,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::Limits;

    fn key(b: u8) -> ShareKey {
        (KeyId([b; 16]), RouteClassId(2), TierId(1))
    }

    #[test]
    fn a_growing_share_waits_for_its_effective_time_and_a_shrinking_one_does_not() {
        let e = ShareEntry {
            before: Share {
                bucket_ppm: 300_000,
                window_ppm: 600_000,
            },
            after: Share {
                bucket_ppm: 900_000,
                window_ppm: 100_000,
            },
            effective_ms: 1_000,
            computed_ms: 500,
        };
        assert_eq!(
            e.in_force(999),
            Share {
                bucket_ppm: 300_000,
                window_ppm: 100_000
            }
        );
        assert_eq!(e.in_force(1_000), e.after);
    }

    #[test]
    fn the_handle_falls_back_to_the_static_weight_without_a_fresh_entry() {
        let h = ShareHandle::new(Duration::from_millis(1_000));
        assert_eq!(h.share(&key(1), 0, 333_333), Share::uniform(333_333));
        let entry = ShareEntry {
            before: Share::uniform(500_000),
            after: Share::uniform(500_000),
            effective_ms: 0,
            computed_ms: 10_000,
        };
        h.store(ShareSnapshot {
            version: 3,
            entries: [(key(1), entry)].into_iter().collect(),
        });
        assert_eq!(h.share(&key(1), 10_500, 333_333), Share::uniform(500_000));
        assert_eq!(h.share(&key(2), 10_500, 333_333), Share::uniform(333_333));
        // Not rewritten for longer than the TTL: the static weight again.
        assert_eq!(h.share(&key(1), 11_000, 333_333), Share::uniform(333_333));
    }

    #[test]
    fn near_fields_round_trip_and_nonsense_is_ignored() {
        let k = key(0xab);
        assert_eq!(
            near_field(&k),
            "abababababababababababababababab.2.1".to_string()
        );
        assert_eq!(parse_near_field(&near_field(&k)), Some(k));
        for bad in [
            "",
            "ab.1.1",
            "abababababababababababababababab.1",
            "abababababababababababababababab.1.1.1",
            "abababababababababababababababab.300.1",
        ] {
            assert_eq!(parse_near_field(bad), None, "{bad}");
        }
    }

    #[test]
    fn notes_count_per_key_and_stop_at_the_bound() {
        let near = NearLimit::new(16);
        for _ in 0..3 {
            assert!(near.record(key(1)));
        }
        assert!(near.record(key(2)));
        let mut notes = near.drain();
        notes.sort();
        assert_eq!(notes, vec![(key(1), 3), (key(2), 1)]);
        assert!(near.drain().is_empty());
        // One key per shard at most: a second key in shard 1 is refused, the first still counts.
        let near = NearLimit::new(16);
        assert!(near.record(key(1)));
        assert!(!near.record(key(17)));
        assert!(near.record(key(1)));
    }

    #[test]
    fn near_means_refused_or_under_half_left() {
        let l = Limits::per_hour(10, 1.0, 100);
        assert!(is_near_limit(false, 9, 99, &l, &l));
        assert!(is_near_limit(true, 4, 99, &l, &l));
        assert!(is_near_limit(true, 9, 49, &l, &l));
        assert!(!is_near_limit(true, 5, 50, &l, &l));
    }

    #[test]
    fn a_key_using_more_than_half_its_static_share_stays_near() {
        // Given 90 % of the limit where the static weight is 20 %: 30 of the quota used is
        // far from the region's 90, but more than half of the static 20.
        let global = Limits::per_hour(100, 1.0, 100);
        let given = global.scaled(900_000, 900_000);
        let static_limits = global.scaled(200_000, 200_000);
        assert!(is_near_limit(true, 89, 60, &given, &static_limits));
        assert!(is_near_limit(true, 78, 85, &given, &static_limits));
        assert!(!is_near_limit(true, 89, 85, &given, &static_limits));
    }
}
