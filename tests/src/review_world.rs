//! Worlds with known answers for the limit review: seeded demand that the limiter itself
//! (memory counters on a fake clock) decides under a known policy, written as raw files. Each tier's limit is wrong, or right, in a way the world is built to show:
//!
//! - `low`: every key needs 1.5 to 3 times the hourly quota: **too low**.
//! - `fine`: keys use 25 % to 80 % of the quota; 15 % of them send one burst a few requests
//!   over the bucket (intended burst control, a handful of refusals each), and two scrapers
//!   send five times the quota (most of the refusals): **fine**.
//! - `high`: nobody uses more than 5 % of a generous quota: **too high**.
//! - `shadow`: as `low`, in shadow mode (would-deny): **too low**.
//! - `sparse`: four keys: **not enough data**.
//! - `changed`: under policy version 1 (the first half) the quota is four times what version
//!   2 gives it; the keys' demand stays, so from the change on it is **too low**.
//! - one key of `fine` has an override whose quota is half of what it sends: **too low** (its
//!   own row).
//!
//! Demand is generated once, independently of the decisions (no retries), so the world's
//! truth (each key's busiest clock hour) is known exactly.

use std::collections::BTreeMap;
use std::sync::Arc;

use object_store::ObjectStore;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use verdict_limiter::{
    FakeClock, Limiter, LimiterConfig, LimiterMetrics, MemoryStore, PolicyHandle, PolicySnapshot,
    Request, event_queue,
};
use verdict_schemas::layout::HourPartition;
use verdict_schemas::{DecisionEvent, KeyId, RouteClassId, TierId};

use crate::rollup_check::write_raw_hour;

/// 2026-11-29T00:00:00Z: the world's first hour.
pub const START_MS: i64 = 1_795_910_400_000;
/// Hours of traffic; policy version 1 holds for the first half, version 2 for the rest.
pub const HOURS: i64 = 4;
const HOUR_MS: i64 = 3_600_000;

/// The tiers, by id.
pub const TIERS: [&str; 6] = ["low", "fine", "high", "shadow", "sparse", "changed"];

/// The key of the `fine` tier with an override.
pub fn override_key() -> KeyId {
    key(1, 250)
}

/// One limit row: tier, capacity, refill per second, hourly quota, mode.
pub type LimitRow = (&'static str, u32, f64, u32, &'static str);

/// The world's limits under policy `version` (1 before the change, 2 from it on).
pub fn limits(version: u64) -> [LimitRow; 6] {
    let changed_quota = if version == 1 { 400 } else { 100 };
    [
        ("low", 20, 0.2, 100, "enforce"),
        ("fine", 20, 0.2, 400, "enforce"),
        ("high", 200, 2.0, 5000, "enforce"),
        ("shadow", 20, 0.2, 100, "shadow"),
        ("sparse", 20, 0.2, 100, "enforce"),
        ("changed", 20, 0.2, changed_quota, "enforce"),
    ]
}

/// The world's policy of `version` as TOML (version 2 is the one in force, which the query
/// service reads).
pub fn policy_toml(version: u64) -> String {
    policy_text(version, &limits(version))
}

/// A policy of the world's tiers and route class with `limits` (and the world's override).
pub fn policy_text(version: u64, limits: &[LimitRow]) -> String {
    let mut t = format!("version = {version}\n");
    for (id, name) in TIERS.iter().enumerate() {
        t += &format!("[[tiers]]\nid = {id}\nname = \"{name}\"\n");
    }
    t += "[[route_classes]]\nid = 0\nname = \"read\"\nprefixes = [\"/v1\"]\n";
    for (tier, capacity, refill, quota, mode) in limits {
        t += &format!(
            "[[limits]]\ntier = \"{tier}\"\nroute_class = \"*\"\ncapacity = {capacity}\n\
             refill_per_s = {refill}\nhourly_quota = {quota}\nmode = \"{mode}\"\n"
        );
    }
    t += &format!(
        "[[overrides]]\nkey_id = \"{}\"\nroute_class = \"read\"\ncapacity = 20\n\
         refill_per_s = 0.2\nhourly_quota = 150\n",
        override_key()
    );
    t
}

/// `text` validated as the limiter validates a policy.
pub fn snapshot_of(text: &str) -> PolicySnapshot {
    let doc = verdict_limiter::policy::parse_toml(text).expect("the policy");
    PolicySnapshot::build(doc).expect("a valid policy")
}

/// The world's policy of `version` (1 before the change, 2 after), validated.
pub fn snapshot(version: u64) -> PolicySnapshot {
    snapshot_of(&policy_toml(version))
}

/// Key `n` of tier `tier`.
pub fn key(tier: u8, n: u16) -> KeyId {
    let mut k = [0u8; 16];
    k[0] = 0xb0;
    k[13] = tier;
    k[14..].copy_from_slice(&n.to_be_bytes());
    KeyId(k)
}

/// What the world was built to show for one limit.
#[derive(Debug, Clone, PartialEq)]
pub struct Truth {
    /// Tier name.
    pub tier: &'static str,
    /// The key of an override row.
    pub override_key: Option<KeyId>,
    /// The verdict the review must give.
    pub verdict: &'static str,
    /// The nearest-rank p99, over the limit's keys, of each key's busiest clock hour
    /// (requests); `None` for `not enough data`.
    pub p99_peak_hour: Option<u64>,
}

/// One world: its demand and its truth.
#[derive(Debug, Clone)]
pub struct World {
    /// The truth, in the review's row order (tier, then the override rows).
    pub truth: Vec<Truth>,
    /// Each key's request times (ms), as generated.
    pub demand: BTreeMap<(u8, KeyId), Vec<i64>>,
}

/// Uniform times in hour `h` of the world, `n` of them.
fn spread(rng: &mut SmallRng, h: i64, n: u32) -> Vec<i64> {
    let start = START_MS + h * HOUR_MS;
    (0..n)
        .map(|_| start + rng.random_range(0..HOUR_MS))
        .collect()
}

/// The requests of one key: `per_hour` (a range, each hour drawn anew within ±10 %).
fn steady(rng: &mut SmallRng, per_hour: (u32, u32)) -> Vec<i64> {
    let base = rng.random_range(per_hour.0..=per_hour.1);
    let mut times = Vec::new();
    for h in 0..HOURS {
        let n = (f64::from(base) * rng.random_range(0.9..1.1)).round() as u32;
        times.extend(spread(rng, h, n));
    }
    times
}

/// Builds the world of `seed` with `scale` × 30 keys in each tier (`sparse` keeps 4).
pub fn world(seed: u64, scale: u32) -> World {
    let mut rng = SmallRng::seed_from_u64(seed);
    let per_tier = 30 * scale as u16;
    let mut demand: BTreeMap<(u8, KeyId), Vec<i64>> = BTreeMap::new();
    for (tier, keys, per_hour) in [
        (0u8, per_tier, (150, 300)),
        (1, per_tier, (100, 320)),
        (2, per_tier, (20, 200)),
        (3, per_tier, (150, 300)),
        (4, 4, (100, 320)),
        (5, per_tier, (150, 300)),
    ] {
        for n in 0..keys {
            let mut times = steady(&mut rng, per_hour);
            // 15 % of the fine keys: one burst two requests over the bucket, 50 ms apart.
            if tier == 1 && rng.random_bool(0.15) {
                let at = START_MS + rng.random_range(0..HOURS * HOUR_MS - 10_000);
                times.extend((0..22).map(|i| at + i * 50));
            }
            demand.insert((tier, key(tier, n)), times);
        }
    }
    // Two scrapers in `fine`, five times its quota every hour.
    for n in [200, 201] {
        let times = (0..HOURS).flat_map(|h| spread(&mut rng, h, 2000)).collect();
        demand.insert((1, key(1, n)), times);
    }
    // The override key sends twice its own quota.
    let times = (0..HOURS).flat_map(|h| spread(&mut rng, h, 300)).collect();
    demand.insert((1, override_key()), times);
    for times in demand.values_mut() {
        times.sort_unstable();
    }

    let truth = truth(&demand);
    World { truth, demand }
}

impl World {
    /// The world's decisions under its own policies (version 1, then 2).
    pub async fn events(&self) -> Vec<DecisionEvent> {
        decide_all(&self.demand, [snapshot(1), snapshot(2)]).await
    }
}

/// Decides every request of `demand` in time order through the limiter itself (memory
/// counters on a fake clock), under `policies[0]` for the first half of the world and
/// `policies[1]` from then on; returns the decisions' events.
pub async fn decide_all(
    demand: &BTreeMap<(u8, KeyId), Vec<i64>>,
    policies: [PolicySnapshot; 2],
) -> Vec<DecisionEvent> {
    let change_ms = START_MS + HOURS / 2 * HOUR_MS;
    let mut requests: Vec<(i64, u8, KeyId)> = demand
        .iter()
        .flat_map(|((tier, key), times)| times.iter().map(move |t| (*t, *tier, *key)))
        .collect();
    requests.sort_unstable();
    let clock = FakeClock::at(START_MS);
    let metrics = Arc::new(LimiterMetrics::new());
    // The events are taken from each decision; the queue only has to exist.
    let (queue, _receiver) = event_queue(1, Arc::clone(&metrics));
    let [before, after] = policies;
    let limiter = Limiter::with_clock(
        MemoryStore::with_clock(1_000_000, Arc::new(clock.clone())),
        PolicyHandle::new(before, START_MS),
        queue,
        metrics,
        LimiterConfig::default(),
        Arc::new(clock.clone()),
    );
    let mut after = Some(after);
    let mut events = Vec::with_capacity(requests.len());
    for (t, tier, key_id) in requests {
        if t >= change_ms
            && let Some(next) = after.take()
        {
            limiter.policy().store(next, t);
        }
        clock.set(t);
        let decision = limiter
            .check(&Request {
                key_id,
                route_class: RouteClassId(0),
                tier: TierId(tier),
                caller: &[],
            })
            .await;
        events.push(decision.event);
    }
    events
}

/// Each key's busiest clock hour, requests.
pub fn peak_hour(times: &[i64]) -> u64 {
    let mut per_hour: BTreeMap<i64, u64> = BTreeMap::new();
    for t in times {
        *per_hour.entry(t.div_euclid(HOUR_MS)).or_default() += 1;
    }
    per_hour.values().copied().max().unwrap_or(0)
}

/// The nearest-rank percentile `q` of `values`.
pub fn nearest_rank(values: &mut [u64], q: f64) -> u64 {
    values.sort_unstable();
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

fn truth(demand: &BTreeMap<(u8, KeyId), Vec<i64>>) -> Vec<Truth> {
    let verdicts = [
        "too low",
        "fine",
        "too high",
        "too low",
        "not enough data",
        "too low",
    ];
    let mut out = Vec::new();
    for (tier, verdict) in verdicts.iter().enumerate() {
        let mut peaks: Vec<u64> = demand
            .iter()
            .filter(|((t, k), _)| usize::from(*t) == tier && *k != override_key())
            .map(|(_, times)| peak_hour(times))
            .collect();
        out.push(Truth {
            tier: TIERS[tier],
            override_key: None,
            verdict,
            p99_peak_hour: (*verdict != "not enough data").then(|| nearest_rank(&mut peaks, 0.99)),
        });
        if tier == 1 {
            out.push(Truth {
                tier: TIERS[tier],
                override_key: Some(override_key()),
                verdict: "too low",
                p99_peak_hour: Some(peak_hour(&demand[&(1, override_key())])),
            });
        }
    }
    out
}

/// Writes decisions as raw files in `store` (2 partitions) and its policy
/// (version 2) to `dir`; returns the policy file's path.
pub async fn write_world(
    store: &Arc<dyn ObjectStore>,
    dir: &std::path::Path,
    events: &[DecisionEvent],
) -> std::path::PathBuf {
    let mut by_hour: BTreeMap<i64, Vec<DecisionEvent>> = BTreeMap::new();
    for e in events {
        by_hour
            .entry(e.event_time_ms.div_euclid(HOUR_MS) * HOUR_MS)
            .or_default()
            .push(*e);
    }
    for (start, events) in &by_hour {
        let hour = HourPartition::from_event_time_ms(*start).expect("a valid hour");
        write_raw_hour(store, "verdict.decisions.v1", hour, events, 2, 1_000_000).await;
    }
    let path = dir.join("policy.toml");
    std::fs::write(&path, policy_toml(2)).expect("writing the policy file");
    path
}
