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
//!
//! A world may have regions ([`Regions`]): the policy lists them with their weights, each
//! key lives in one (drawn by the regions' parts of the keys, which differ from their
//! weights) and some move to another at the world's midpoint. A key sends what it would in
//! a world of one region times the share its region gives it ([`Regions::sending_share`]:
//! the static weight's, or with the reconcile the near-whole share it gives a key in one
//! region), and bursts one over its region's static share of the bucket (a burst comes
//! before any round), so each limit's truth is the same; each region's requests are decided
//! by a limiter of its own (its own counters, enforcing its static share or the shares the
//! reconcile's rounds give). In a world of
//! [`Regions::lopsided`] keys send the same wherever they are, and the weights are what is
//! wrong.

use std::collections::BTreeMap;
use std::sync::Arc;

use object_store::ObjectStore;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use verdict_limiter::{
    FakeClock, Limiter, LimiterConfig, LimiterMetrics, MemoryStore, PolicyHandle, PolicySnapshot,
    Regional, Request, event_queue, round_in_process,
};
use verdict_reconcile::round_log::{RoundLog, RoundRecord};
use verdict_reconcile::{ReconcileConfig, RoundOutcome};
use verdict_schemas::layout::HourPartition;
use verdict_schemas::{DecisionEvent, KeyId, RegionId, RouteClassId, TierId};

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

/// The regions of a world.
#[derive(Debug, Clone, PartialEq)]
pub struct Regions {
    /// Each region (its id is its place here): name, weight in the policy, and the part of
    /// the keys that live there.
    pub regions: Vec<(&'static str, f64, f64)>,
    /// The part of the keys that move to another region at the world's midpoint.
    pub moving: f64,
    /// Whether a key sends its region's share of what it would in a world of one region
    /// (so each limit's truth stays), or the same wherever it is (so a region whose part
    /// of the keys exceeds its weight needs more of every limit than its weight gives it).
    pub scaled: bool,
    /// Whether every key sends from every region, each request from a region drawn by the
    /// regions' parts (a global client behind a global load balancer), rather than from its
    /// home.
    pub spread: bool,
    /// The regional reconcile running, or the static weights throughout.
    pub reconcile: Option<WorldReconcile>,
}

/// The regional reconcile as a world runs it, with the job's settings ([`ReconcileConfig`])
/// and its arithmetic ([`compute_shares`]), every interval of the world's clock, over the
/// limiters' own near-limit notes and counters, the shares stored into their share handles
/// as the gateways' poll would.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct WorldReconcile {
    /// The job's settings (its defaults unless a test says otherwise).
    pub cfg: ReconcileConfig,
}

impl WorldReconcile {
    fn interval_ms(&self) -> i64 {
        self.cfg.interval.as_millis() as i64
    }

    /// The world's rounds, as the job records them.
    pub fn rounds(&self) -> Vec<RoundRecord> {
        let end = START_MS + HOURS * HOUR_MS;
        (1..)
            .map(|k| START_MS + k * self.interval_ms())
            .take_while(|t| *t < end)
            .map(|time_ms| RoundRecord::of(time_ms, &self.cfg, &RoundOutcome::default()))
            .collect()
    }

    /// One round at `now_ms` over the limiters of every region (their id is their place),
    /// as the demo runs it: [`round_in_process`] on the job's settings.
    fn round(
        &self,
        now_ms: i64,
        policy: &PolicySnapshot,
        stores: &[MemoryStore],
        regional: &[Regional],
    ) {
        round_in_process(
            now_ms,
            policy,
            regional,
            &stores.iter().collect::<Vec<_>>(),
            self.cfg.round_settings(),
        );
    }
}

impl Regions {
    /// Three regions weighted 5 / 3 / 2, home to 65 / 29 / 6 % of the keys.
    pub fn three() -> Self {
        Self {
            regions: vec![
                ("us-east-1", 5.0, 0.65),
                ("eu-central-1", 3.0, 0.29),
                ("ap-southeast-2", 2.0, 0.06),
            ],
            moving: 0.1,
            scaled: true,
            spread: false,
            reconcile: None,
        }
    }

    /// The same regions with the regional reconcile running (its default settings).
    pub fn reconciled(mut self) -> Self {
        self.reconcile = Some(WorldReconcile::default());
        self
    }

    /// Two regions of equal weight, home to 70 / 30 % of the keys.
    pub fn two() -> Self {
        Self {
            regions: vec![("us-east-1", 1.0, 0.7), ("eu-central-1", 1.0, 0.3)],
            moving: 0.1,
            scaled: true,
            spread: false,
            reconcile: None,
        }
    }

    /// Three regions of equal weight, home to 90 / 5 / 5 % of the keys, each key sending
    /// what it would in a world of one region: the weights are what is wrong.
    pub fn lopsided() -> Self {
        Self {
            regions: vec![
                ("us-east-1", 1.0, 0.9),
                ("eu-central-1", 1.0, 0.05),
                ("ap-southeast-2", 1.0, 0.05),
            ],
            moving: 0.0,
            scaled: false,
            spread: false,
            reconcile: None,
        }
    }

    /// Two regions of equal weight, every key sending from both, 70 / 30 % of its requests
    /// from each: the weights are what is wrong (every key's first region runs out of its
    /// share while the other's goes unused).
    pub fn spread() -> Self {
        Self {
            regions: vec![("us-east-1", 1.0, 0.7), ("eu-central-1", 1.0, 0.3)],
            moving: 0.0,
            scaled: false,
            spread: true,
            reconcile: None,
        }
    }

    /// The region a request of `key` at `t` comes from in a spread world: drawn by the
    /// parts, the same draw every time.
    pub fn spread_region(&self, key: KeyId, t: i64) -> u16 {
        let mut x = u64::from_le_bytes(key.0[8..].try_into().unwrap_or_default())
            ^ (t as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
        let mut u =
            (x >> 11) as f64 / (1u64 << 53) as f64 * self.regions.iter().map(|r| r.2).sum::<f64>();
        for (i, r) in self.regions.iter().enumerate() {
            if u < r.2 {
                return i as u16;
            }
            u -= r.2;
        }
        (self.regions.len() - 1) as u16
    }

    /// The share of every limit that a key living in region `r` alone is given: its static
    /// share, or with the reconcile running, the share a round gives a key all of whose
    /// demand is in one region (the whole, but for the other regions' floor: `1 - floor ×
    /// (1 - share)`). A key of a scaled world sends this share of its one-region demand.
    pub fn sending_share(&self, r: u16) -> f64 {
        let share = self.share(r);
        match self.reconcile {
            Some(w) => 1.0 - w.cfg.floor * (1.0 - share),
            None => share,
        }
    }

    /// Region `r`'s static share of every limit, as the limiter computes it.
    pub fn share(&self, r: u16) -> f64 {
        let snapshot = snapshot_of(&format!("{}{}", policy_toml(2), self.toml()));
        f64::from(snapshot.region_static_ppm(RegionId(r))) / f64::from(verdict_limiter::algo::PPM)
    }

    /// The policy's `[[regions]]`.
    pub fn toml(&self) -> String {
        self.regions
            .iter()
            .enumerate()
            .map(|(id, (name, weight, _))| {
                format!("[[regions]]\nid = {id}\nname = \"{name}\"\nweight = {weight}\n")
            })
            .collect()
    }

    /// A region drawn by the parts of the keys, other than `not`.
    fn draw(&self, rng: &mut SmallRng, not: Option<u16>) -> u16 {
        let parts: Vec<f64> = (0..self.regions.len())
            .map(|r| {
                if Some(r as u16) == not {
                    0.0
                } else {
                    self.regions[r].2
                }
            })
            .collect();
        let mut x = rng.random_range(0.0..parts.iter().sum::<f64>());
        for (r, p) in parts.iter().enumerate() {
            if x < *p {
                return r as u16;
            }
            x -= p;
        }
        (parts.len() - 1) as u16
    }
}

/// Where a key sends from: its region before the world's midpoint, and from it on.
pub type Place = (u16, u16);

/// The region of a request at `t` from a key at `place`.
pub fn region_at(place: Place, t: i64) -> u16 {
    if t < START_MS + HOURS / 2 * HOUR_MS {
        place.0
    } else {
        place.1
    }
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
    /// The truth, in the review's row order (tier, then the override rows); none in a world
    /// of unscaled regions.
    pub truth: Vec<Truth>,
    /// Each key's request times (ms), as generated.
    pub demand: BTreeMap<(u8, KeyId), Vec<i64>>,
    /// Its regions, if more than one.
    pub regions: Option<Regions>,
    /// Where each key sends from (region 0 throughout without regions).
    pub places: BTreeMap<(u8, KeyId), Place>,
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
    world_in(seed, scale, None)
}

/// The world of `seed` and `scale` in `regions` (see the module's documentation).
pub fn world_in(seed: u64, scale: u32, regions: Option<Regions>) -> World {
    let mut rng = SmallRng::seed_from_u64(seed);
    // Places and the thinning to each region's share come from a generator of their own,
    // so a world without regions is the same world with or without them.
    let mut placing = SmallRng::seed_from_u64(seed ^ 0x5eed_0f9e_610e);
    let per_tier = 30 * scale as u16;
    let mut demand: BTreeMap<(u8, KeyId), Vec<i64>> = BTreeMap::new();
    let mut places: BTreeMap<(u8, KeyId), Place> = BTreeMap::new();
    let place = |rng: &mut SmallRng| -> Place {
        let Some(r) = &regions else {
            return (0, 0);
        };
        let home = r.draw(rng, None);
        if rng.random_bool(r.moving) {
            (home, r.draw(rng, Some(home)))
        } else {
            (home, home)
        }
    };
    let shares: Vec<f64> = regions.as_ref().map_or(vec![1.0], |r| {
        (0..r.regions.len() as u16).map(|i| r.share(i)).collect()
    });
    let sending: Vec<f64> = regions.as_ref().map_or(vec![1.0], |r| {
        (0..r.regions.len() as u16)
            .map(|i| r.sending_share(i))
            .collect()
    });
    let share_at = |p: Place, t: i64| shares[usize::from(region_at(p, t))];
    let sending_at = |p: Place, t: i64| sending[usize::from(region_at(p, t))];
    let scaled = regions.as_ref().is_some_and(|r| r.scaled);
    // Each request kept with its region's share of probability.
    let thin = |times: Vec<i64>, p: Place, rng: &mut SmallRng| -> Vec<i64> {
        if !scaled {
            return times;
        }
        times
            .into_iter()
            .filter(|t| rng.random_bool(sending_at(p, *t)))
            .collect()
    };
    for (tier, keys, per_hour) in [
        (0u8, per_tier, (150, 300)),
        (1, per_tier, (100, 320)),
        (2, per_tier, (20, 200)),
        (3, per_tier, (150, 300)),
        (4, 4, (100, 320)),
        (5, per_tier, (150, 300)),
    ] {
        for n in 0..keys {
            let p = place(&mut placing);
            let mut times = thin(steady(&mut rng, per_hour), p, &mut placing);
            // 15 % of the fine keys: one burst two requests over the bucket, 50 ms apart (in
            // a region, one over its share of the bucket: a key there sends fewer requests,
            // and a refusal is a larger part of them).
            if tier == 1 && rng.random_bool(0.15) {
                let at = START_MS + rng.random_range(0..HOURS * HOUR_MS - 10_000);
                let burst = if scaled {
                    (20.0 * share_at(p, at)).floor() as i64 + 1
                } else {
                    22
                };
                times.extend((0..burst).map(|i| at + i * 50));
            }
            demand.insert((tier, key(tier, n)), times);
            places.insert((tier, key(tier, n)), p);
        }
    }
    // Two scrapers in `fine`, five times its quota every hour.
    for n in [200, 201] {
        let p = place(&mut placing);
        let times = (0..HOURS).flat_map(|h| spread(&mut rng, h, 2000)).collect();
        demand.insert((1, key(1, n)), thin(times, p, &mut placing));
        places.insert((1, key(1, n)), p);
    }
    // The override key sends twice its own quota.
    let p = place(&mut placing);
    let times = (0..HOURS).flat_map(|h| spread(&mut rng, h, 300)).collect();
    demand.insert((1, override_key()), thin(times, p, &mut placing));
    places.insert((1, override_key()), p);
    for times in demand.values_mut() {
        times.sort_unstable();
    }

    // A world whose keys send the same wherever they are has no truth of its limits
    // written down: its point is the weights.
    let truth = if regions.as_ref().is_none_or(|r| r.scaled) {
        truth(&demand, &places, &sending)
    } else {
        Vec::new()
    };
    World {
        truth,
        demand,
        regions,
        places,
    }
}

impl World {
    /// The world's decisions under its own policies (version 1, then 2).
    pub async fn events(&self) -> Vec<DecisionEvent> {
        self.decide([self.snapshot(1), self.snapshot(2)]).await
    }

    /// The world's policy of `version` as TOML, with its regions.
    pub fn policy_toml(&self, version: u64) -> String {
        self.with_regions(policy_toml(version))
    }

    /// `policy` (TOML) with the world's regions.
    pub fn with_regions(&self, policy: String) -> String {
        match &self.regions {
            Some(r) => policy + &r.toml(),
            None => policy,
        }
    }

    /// The world's policy of `version`, validated.
    pub fn snapshot(&self, version: u64) -> PolicySnapshot {
        snapshot_of(&self.policy_toml(version))
    }

    /// The world's demand decided under `policies` (see [`decide_in`]).
    pub async fn decide(&self, policies: [PolicySnapshot; 2]) -> Vec<DecisionEvent> {
        let spread = self.regions.as_ref().filter(|r| r.spread);
        let reconcile = self.regions.as_ref().and_then(|r| r.reconcile);
        decide_in(&self.demand, &self.places, spread, reconcile, policies).await
    }
}

/// Decides every request of `demand` in time order through the limiter itself (memory
/// counters on a fake clock), under `policies[0]` for the first half of the world and
/// `policies[1]` from then on; returns the decisions' events.
pub async fn decide_all(
    demand: &BTreeMap<(u8, KeyId), Vec<i64>>,
    policies: [PolicySnapshot; 2],
) -> Vec<DecisionEvent> {
    decide_in(demand, &BTreeMap::new(), None, None, policies).await
}

/// As [`decide_all`], each request in its key's region at its time (`places`, region 0 for
/// a key not there; or drawn by `spread`'s parts), by that region's limiter: counters of its
/// own, enforcing the region's share of the policy's limits: its static weight's, or with
/// `reconcile` the shares its rounds compute.
pub async fn decide_in(
    demand: &BTreeMap<(u8, KeyId), Vec<i64>>,
    places: &BTreeMap<(u8, KeyId), Place>,
    spread: Option<&Regions>,
    reconcile: Option<WorldReconcile>,
    policies: [PolicySnapshot; 2],
) -> Vec<DecisionEvent> {
    let change_ms = START_MS + HOURS / 2 * HOUR_MS;
    let mut requests: Vec<(i64, u8, KeyId, u16)> = demand
        .iter()
        .flat_map(|((tier, key), times)| {
            let place = places.get(&(*tier, *key)).copied().unwrap_or((0, 0));
            times.iter().map(move |t| {
                let region = match spread {
                    Some(r) => r.spread_region(*key, *t),
                    None => region_at(place, *t),
                };
                (*t, *tier, *key, region)
            })
        })
        .collect();
    requests.sort_unstable();
    let regions = requests
        .iter()
        .map(|r| r.3 + 1)
        .chain([policies[0].document().regions.len() as u16])
        .max()
        .unwrap_or(1);
    let clock = FakeClock::at(START_MS);
    let metrics = Arc::new(LimiterMetrics::new());
    // The events are taken from each decision; the queue only has to exist.
    let (queue, _receiver) = event_queue(1, Arc::clone(&metrics));
    let [before, after] = policies;
    let stores: Vec<MemoryStore> = (0..regions)
        .map(|_| MemoryStore::with_clock(1_000_000, Arc::new(clock.clone())))
        .collect();
    let regional: Vec<Regional> = reconcile
        .map(|r| {
            (0..regions)
                .map(|_| Regional::new(r.cfg.share_ttl))
                .collect()
        })
        .unwrap_or_default();
    let limiters: Vec<_> = (0..regions)
        .map(|region| {
            let limiter = Limiter::with_clock(
                stores[usize::from(region)].clone(),
                PolicyHandle::new(before.clone(), START_MS),
                queue.clone(),
                Arc::clone(&metrics),
                LimiterConfig {
                    region: RegionId(region),
                    ..LimiterConfig::default()
                },
                Arc::new(clock.clone()),
            );
            match regional.get(usize::from(region)) {
                Some(r) => limiter.with_regional(r.clone()),
                None => limiter,
            }
        })
        .collect();
    let mut current = before;
    let mut after = Some(after);
    let mut next_round = reconcile.map(|r| START_MS + r.interval_ms());
    let mut events = Vec::with_capacity(requests.len());
    for (t, tier, key_id, region) in requests {
        if let Some(r) = reconcile {
            while let Some(round) = next_round.filter(|round| *round <= t) {
                // The policy in force when the round ran.
                let policy = match &after {
                    Some(next) if round >= change_ms => next,
                    _ => &current,
                };
                clock.set(round);
                r.round(round, policy, &stores, &regional);
                next_round = Some(round + r.interval_ms());
            }
        }
        if t >= change_ms
            && let Some(next) = after.take()
        {
            for limiter in &limiters {
                limiter.policy().store(next.clone(), t);
            }
            current = next;
        }
        clock.set(t);
        let decision = limiters[usize::from(region)]
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

/// A key's need of the global quota: its busiest clock hour in one region over that
/// region's share (its busiest hour, with one region).
pub fn need(times: &[i64], place: Place, shares: &[f64]) -> u64 {
    let mut per_hour: BTreeMap<(i64, u16), u64> = BTreeMap::new();
    for t in times {
        *per_hour
            .entry((t.div_euclid(HOUR_MS), region_at(place, *t)))
            .or_default() += 1;
    }
    per_hour
        .iter()
        .map(|((_, r), n)| (*n as f64 / shares[usize::from(*r)]).round() as u64)
        .max()
        .unwrap_or(0)
}

fn truth(
    demand: &BTreeMap<(u8, KeyId), Vec<i64>>,
    places: &BTreeMap<(u8, KeyId), Place>,
    shares: &[f64],
) -> Vec<Truth> {
    let verdicts = [
        "too low",
        "fine",
        "too high",
        "too low",
        "not enough data",
        "too low",
    ];
    let need_of = |k: &(u8, KeyId)| need(&demand[k], places[k], shares);
    let mut out = Vec::new();
    for (tier, verdict) in verdicts.iter().enumerate() {
        let mut peaks: Vec<u64> = demand
            .keys()
            .filter(|(t, k)| usize::from(*t) == tier && *k != override_key())
            .map(need_of)
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
                p99_peak_hour: Some(need_of(&(1, override_key()))),
            });
        }
    }
    out
}

/// Records `rounds` in the lake's `reconcile_rounds`, as the reconcile job does.
pub async fn write_rounds(store: &Arc<dyn ObjectStore>, rounds: &[RoundRecord]) {
    let mut log = RoundLog::new(Arc::clone(store), verdict_reconcile::round_log::MAX_PENDING);
    for chunk in rounds.chunks(verdict_reconcile::round_log::MAX_PENDING) {
        for r in chunk {
            log.push(*r);
        }
        log.append(START_MS).await.expect("recording the rounds");
    }
}

/// Writes decisions as raw files in `store` (2 partitions) and `policy` (the one in
/// force) to `dir`; returns the policy file's path.
pub async fn write_world(
    store: &Arc<dyn ObjectStore>,
    dir: &std::path::Path,
    events: &[DecisionEvent],
    policy: &str,
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
    std::fs::write(&path, policy).expect("writing the policy file");
    path
}
