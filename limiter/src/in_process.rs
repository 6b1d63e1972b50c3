//! The regional reconcile run in one process: a round over regional limiters that live
//! side by side (the demo's three regions, the known-answer worlds), reading each one's
//! near-limit notes and counters and storing the new shares in each one's handle. In
//! production the job does the same over every region's Redis and the policy store.

use std::collections::HashMap;

use verdict_schemas::RegionId;

use crate::regions::{Reading, RegionInput, ShareEntry, ShareKey, ShareSnapshot, compute_shares};

/// The reconcile's settings a round applies (the job's `ReconcileConfig`, on the gateways'
/// clock).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoundSettings {
    /// How long after a round a share that grows takes effect, ms.
    pub increase_delay_ms: i64,
    /// How long a share not rewritten stays in force, ms.
    pub share_ttl_ms: i64,
    /// Part of the static weight every region keeps in the demand weights (0 to 1).
    pub floor: f64,
}

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoundCounts {
    /// Keys noted near their limit in some region since the last round.
    pub keys: usize,
    /// Shares written (one per key and region).
    pub shares: usize,
}

/// One round of the reconcile at `now_ms` over regional limiters that live in one process
/// (the demo's three regions, the known-answer worlds; in production the job does this
/// over every region's Redis and the policy store): the keys each region noted near their
/// limit since the last round, each region's usage of them (read from its counters,
/// `stores[i]`), the shares in force (`regional[i]` is the limiter of the region with id `i`). The new
/// shares are stored in every region's handle; the ones not rewritten are kept while they
/// are fresh.
pub fn round_in_process(
    now_ms: i64,
    policy: &crate::policy::PolicySnapshot,
    regional: &[crate::limiter::Regional],
    stores: &[&crate::memory::MemoryStore],
    settings: RoundSettings,
) -> RoundCounts {
    let notes: Vec<HashMap<ShareKey, u64>> = regional
        .iter()
        .map(|r| r.near.drain().into_iter().collect())
        .collect();
    let mut keys: Vec<ShareKey> = notes.iter().flat_map(|n| n.keys().copied()).collect();
    keys.sort_unstable();
    keys.dedup();
    let static_ppm: Vec<u32> = (0..regional.len())
        .map(|i| policy.region_static_ppm(RegionId(i as u16)))
        .collect();
    let mut written: Vec<HashMap<ShareKey, ShareEntry>> = regional
        .iter()
        .map(|r| {
            r.shares
                .load()
                .entries
                .iter()
                .filter(|(_, e)| e.is_fresh(now_ms, settings.share_ttl_ms))
                .map(|(k, e)| (*k, *e))
                .collect()
        })
        .collect();
    let mut counts = RoundCounts::default();
    for key in keys {
        let crate::policy::LimitLookup::Check {
            limits, sub_keys, ..
        } = policy.resolve(&key.0, key.1, key.2)
        else {
            continue;
        };
        let inputs: Vec<RegionInput> = (0..regional.len())
            .map(|i| RegionInput {
                static_ppm: static_ppm[i],
                reading: Some(Reading {
                    used: stores[i]
                        .get(&crate::key::LimitKey::new(key.0, key.1, key.2))
                        .map_or(0.0, |c| c.window_used(now_ms, limits.window_ms)),
                    demand: notes[i].get(&key).copied().unwrap_or(0),
                }),
                last: regional[i].shares.share(&key, now_ms, static_ppm[i]),
            })
            .collect();
        let quota = limits.quota.saturating_mul(u32::from(sub_keys));
        let shares = compute_shares(quota, &inputs, settings.floor);
        counts.keys += 1;
        for (i, (input, share)) in inputs.iter().zip(shares).enumerate() {
            written[i].insert(
                key,
                ShareEntry {
                    before: input.last,
                    after: share,
                    effective_ms: now_ms + settings.increase_delay_ms,
                    computed_ms: now_ms,
                },
            );
            counts.shares += 1;
        }
    }
    for (r, entries) in regional.iter().zip(written) {
        let version = r.shares.load().version + 1;
        r.shares.store(ShareSnapshot { version, entries });
    }
    counts
}
