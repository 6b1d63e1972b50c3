//! The demo's three regions: a gateway and memory counters in each, every limit shared by
//! the regions' static weights (5 / 3 / 2) until the regional reconcile moves the shares
//! towards where each key's traffic is. The reconcile runs in this process on the demo's
//! clock, with the job's own settings (a round every 30 s, growing shares 12 s after their
//! round, shares kept 300 s, a floor of 0.1 of the static weight), over the gateways'
//! near-limit notes and counters ([`verdict_limiter::round_in_process`]); its rounds are
//! recorded in the lake's `reconcile_rounds`, as the job records them, so that the review
//! and the what-if model the shares the gateways enforced.
//!
//! Traffic is unequal: 65 % of the keys live in `us-east-1`, 29 % in `eu-central-1`, 6 % in
//! `ap-southeast-2`, and a tenth of the keys move, each request from a region drawn by the
//! same proportions.

use std::sync::Arc;
use std::time::Duration;

use verdict_limiter::{Clock, MemoryStore, PolicySnapshot, Regional, round_in_process};
use verdict_reconcile::round_log::RoundRecord;
use verdict_reconcile::{ReconcileConfig, RoundOutcome};
use verdict_schemas::{KeyId, RegionId};

/// The regions: name, static weight, share of the keys that live there.
pub const REGIONS: [(&str, f64, f64); 3] = [
    ("us-east-1", 5.0, 0.65),
    ("eu-central-1", 3.0, 0.29),
    ("ap-southeast-2", 2.0, 0.06),
];

/// Of every thousand keys, how many move between regions.
const MOVING_PER_MILLE: u64 = 100;

/// The policy's `[[regions]]`: the regions with their ids (their place in [`REGIONS`]) and
/// static weights.
pub fn regions_toml() -> String {
    REGIONS
        .iter()
        .enumerate()
        .map(|(id, (name, weight, _))| {
            format!("\n[[regions]]\nid = {id}\nname = \"{name}\"\nweight = {weight}\n")
        })
        .collect()
}

/// A number in 0..1000 drawn from `key` and `salt` (the same key and salt, the same number).
fn draw(key: &KeyId, salt: u64) -> u64 {
    let b = key.as_bytes();
    let x = u64::from_le_bytes([b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11]]);
    // A splitmix64 step, so that nearby salts give unrelated draws.
    let mut z = x ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) % 1_000
}

/// The region (its place in [`REGIONS`]) of a draw in 0..1000, by the regions' shares of
/// the keys.
fn region_of_draw(d: u64) -> usize {
    let mut upto = 0.0;
    for (i, (_, _, share)) in REGIONS.iter().enumerate() {
        upto += share * 1_000.0;
        if (d as f64) < upto {
            return i;
        }
    }
    REGIONS.len() - 1
}

/// The region request `i` of `key` is sent from: the key's home region, or for a key that
/// moves, a region drawn for the request.
pub fn region_of(key: &KeyId, i: u64) -> usize {
    if draw(key, 0) < MOVING_PER_MILLE {
        region_of_draw(draw(key, i + 1))
    } else {
        region_of_draw(draw(key, u64::MAX))
    }
}

/// One region's gateway state the reconcile reads and writes.
#[derive(Debug, Clone)]
pub struct RegionState {
    /// The region's counters.
    pub store: Arc<MemoryStore>,
    /// Its shares and near-limit notes.
    pub regional: Regional,
}

/// Runs the reconcile's rounds over `regions` on `clock`, one every `cfg.interval` of the
/// demo's time from `start_ms`, until `stop` fires; returns the rounds as the job records
/// them.
pub async fn reconcile(
    clock: Arc<dyn Clock>,
    speed: u32,
    policy: Arc<PolicySnapshot>,
    regions: Vec<RegionState>,
    cfg: ReconcileConfig,
    start_ms: i64,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) -> Vec<RoundRecord> {
    let interval_ms = (cfg.interval.as_millis() as i64).max(1);
    let settings = cfg.round_settings();
    let regional: Vec<Regional> = regions.iter().map(|r| r.regional.clone()).collect();
    let stores: Vec<&MemoryStore> = regions.iter().map(|r| r.store.as_ref()).collect();
    let mut rounds = Vec::new();
    let mut next = start_ms + interval_ms;
    loop {
        let wait_ms = (next - clock.now_ms()).max(0) as f64 / f64::from(speed.max(1));
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs_f64(wait_ms / 1_000.0)) => {}
            _ = &mut stop => break,
        }
        let now_ms = clock.now_ms();
        let counts = round_in_process(now_ms, &policy, &regional, &stores, settings);
        let outcome = RoundOutcome {
            keys: counts.keys,
            rows: counts.shares,
            reachable: (0..regions.len()).map(|i| RegionId(i as u16)).collect(),
            unreachable: Vec::new(),
        };
        rounds.push(RoundRecord::of(now_ms, &cfg, &outcome));
        while next <= now_ms {
            next += interval_ms;
        }
    }
    rounds
}

#[cfg(test)]
mod tests {
    use super::*;
    use verdict_schemas::synth::synth_key_id;

    #[test]
    fn keys_live_in_the_regions_by_their_shares_and_a_tenth_move() {
        let n = 20_000;
        let mut homes = [0u32; 3];
        let mut moving = 0;
        for index in 0..n {
            let key = synth_key_id(index);
            let first = region_of(&key, 0);
            if (1..50).any(|i| region_of(&key, i) != first) {
                moving += 1;
            } else {
                homes[first] += 1;
            }
        }
        let settled = f64::from(n - moving);
        assert!(
            (0.08..0.12).contains(&(f64::from(moving) / f64::from(n))),
            "{moving}"
        );
        for (i, (_, _, share)) in REGIONS.iter().enumerate() {
            let got = f64::from(homes[i]) / settled;
            assert!((got - share).abs() < 0.015, "{i}: {got} against {share}");
        }
    }

    #[test]
    fn the_regions_are_valid_policy() {
        let world = crate::world::world(&crate::config::DemoConfig::default());
        let text = crate::policy::per_route_policy_toml(&world, 1) + &regions_toml();
        let doc = verdict_limiter::policy::parse_toml(&text).unwrap();
        let snapshot = PolicySnapshot::build(doc).unwrap();
        assert_eq!(snapshot.region_static_ppm(RegionId(0)), 500_000);
        assert_eq!(snapshot.region_static_ppm(RegionId(2)), 200_000);
    }
}
