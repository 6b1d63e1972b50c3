//! What-if replay: shadow mode run offline on history. Every recorded request of a range
//! goes, per key in time order, through the limiter's own pure decision core
//! ([`verdict_limiter::decide`]) under a candidate policy, and the answer says per tier ×
//! route class what the candidate would have refused, beside what was refused.
//!
//! The caveat, said in every answer: recorded demand includes the retries of requests that
//! were refused, so a candidate looser than the policy in force sees demand that would not
//! all have been sent, and a stricter one sees too little of it.
//!
//! The replay reads the raw table one hour at a time, sorts the hour's requests by key and
//! time, and carries each counter's state from hour to hour: memory grows with the keys, not
//! with the range. Decisions of the kill switch and of mode off are not demand the limits
//! saw and are left out, as in the review. A hot key's sub-key is the recorded one (modulo
//! the candidate's split). With several regions, each enforces its share of the candidate's
//! limits: its static weight's, or the share the regional reconcile gave it where the lake
//! records the reconcile's rounds ([`crate::shares`]).
//!
//! Past [`SAMPLE_KEYS`] keys in the range, the replay takes a sample of them, chosen by key
//! (`verdict_key_hash(key_id)` below a threshold, as the review's sample): each key in it is
//! replayed whole, so its counters are exact, and the counts of every tier × route class
//! and region are estimated from the sample's (each sampled key standing for 1 / rate keys),
//! each with its bound: three standard errors of the estimate, from the sampled keys' own
//! counts (`Σ y² × (1 − rate) / rate²`); where the sample saw no refusal in a limit, the
//! keys a sample of that rate misses (`ln 0.003 / ln(1 − rate)`), each refused all the
//! requests of the limit's busiest sampled key. A limit none of whose keys is in the
//! sample is not in the answer. Memory and replay time then grow with the sample,
//! not with the keys; the answer states the sample ([`WhatIfSample`]).

use std::collections::BTreeMap;

use arrow::array::{
    AsArray, BooleanArray, FixedSizeBinaryArray, TimestampMillisecondArray, UInt8Array, UInt16Array,
};
use arrow::record_batch::RecordBatch;
use chrono::{DateTime, Duration, Timelike, Utc};
use rustc_hash::FxHashMap;
use serde::Serialize;
use verdict_limiter::regions::{Share, is_near_limit};
use verdict_limiter::{CounterState, LimitLookup, Mode, PolicySnapshot, decide};
use verdict_schemas::{KeyId, RegionId, RouteClassId, TierId};

use crate::engine::{Engine, RunOptions};
use crate::error::{QueryError, memory_refusal};
use crate::memory::QueryMemory;
use crate::range::Range;
use crate::shares::{Reconcile, STATIC_SHARES, ShareModel};

/// What every answer says about recorded demand.
pub const CAVEAT: &str = "recorded demand includes the retries of refused requests: a \
    candidate looser than the policy in force replays retries that would not have been sent, \
    a stricter one misses the retries it would have caused";

/// One recorded request, as the replay needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Recorded {
    /// The key id.
    pub key_id: KeyId,
    /// Route class id.
    pub route_class: u8,
    /// Decision time, ms.
    pub time_ms: i64,
    /// Tier id.
    pub tier: u8,
    /// Region id.
    pub region: u16,
    /// The hot-key sub-key it was counted on.
    pub sub_key: u8,
    /// Refused when recorded (denied or would-deny).
    pub refused: bool,
    /// Refused by the bucket when recorded.
    pub by_bucket: bool,
    /// Refused by the window when recorded.
    pub by_window: bool,
}

/// Counts of one tier × route class.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Requests replayed.
    pub requests: u64,
    /// Refused (denied, or would-deny in shadow mode).
    pub refused: u64,
    /// Of those, would-deny (the limit in shadow mode).
    pub would_deny: u64,
    /// Refusals in which the bucket refused.
    pub refused_by_bucket: u64,
    /// Refusals in which the window refused.
    pub refused_by_window: u64,
    /// Keys (key × route class) that sent requests.
    pub keys: u64,
    /// Keys with at least one refusal.
    pub keys_refused: u64,
}

impl Counts {
    /// Refusals over requests (0 without requests).
    pub fn share_of_requests_refused(&self) -> f64 {
        ratio(self.refused, self.requests)
    }

    /// Keys refused at least once over keys (0 without keys).
    pub fn share_of_keys_refused(&self) -> f64 {
        ratio(self.keys_refused, self.keys)
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// One key's counts, recorded and replayed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct KeyTally {
    tier: u8,
    requests: u64,
    recorded: u64,
    replayed: u64,
}

/// The replay's state: the candidate, each counter's state and the tallies.
#[derive(Debug)]
pub struct Replay {
    policy: PolicySnapshot,
    counters: FxHashMap<(KeyId, u8, u16, u8), CounterState>,
    /// Per tier × route class: what was recorded, and what the candidate does.
    limits: FxHashMap<(u8, u8), (Counts, Counts)>,
    keys: FxHashMap<(KeyId, u8), KeyTally>,
    /// Per region: requests and what the candidate refused of them.
    regions: BTreeMap<u16, (u64, u64)>,
    /// The resolution of the last (key, route class, tier): requests come sorted by key, so
    /// one lookup in the policy serves a run of them.
    last: Option<((KeyId, u8, u8), LimitLookup)>,
    /// The reconcile's rounds run again, when the model has them (and regions); without
    /// them each region enforces its static weight's share.
    reconcile: Option<Reconcile>,
    /// The keys replayed: those whose `verdict_key_hash` is below this (2³²: every key).
    threshold: i64,
    /// The keys the range holds, estimated, when sampled.
    keys_in_range: u64,
}

/// Keys (key ids) a what-if replays whole, by default: past it, a sample of them.
pub const SAMPLE_KEYS: u64 = 131_072;

/// Every key's hash is below this: [`crate::ranks::key_hash`] takes the upper 32 bits.
pub(crate) const ALL_KEYS: i64 = 1 << 32;

impl Replay {
    /// A replay under `policy`, each region (if it has several) enforcing its static
    /// weight's share.
    pub fn new(policy: PolicySnapshot) -> Self {
        Self::with_shares(policy, ShareModel::Static)
    }

    /// A replay under `policy` with the regions' shares modelled by `model`.
    pub fn with_shares(policy: PolicySnapshot, model: ShareModel) -> Self {
        let reconcile = match &model {
            ShareModel::Reconciled(rounds) if policy.is_multi_region() => {
                Some(Reconcile::new(std::sync::Arc::clone(rounds), &policy))
            }
            _ => None,
        };
        Self {
            policy,
            counters: FxHashMap::default(),
            limits: FxHashMap::default(),
            keys: FxHashMap::default(),
            regions: BTreeMap::new(),
            last: None,
            reconcile,
            threshold: ALL_KEYS,
            keys_in_range: 0,
        }
    }

    /// The replay of a sample of the keys: about `rate` of them, those whose
    /// `verdict_key_hash` is below `rate × 2³²` ([`feed_range`] reads theirs only).
    /// `keys_in_range` is what the answer says the range holds.
    pub fn sampled(mut self, rate: f64, keys_in_range: u64) -> Self {
        self.threshold = ((rate.clamp(0.0, 1.0) * ALL_KEYS as f64) as i64).clamp(1, ALL_KEYS);
        self.keys_in_range = keys_in_range;
        self
    }

    /// The replay of every key when the range holds at most `sample_keys` keys
    /// (`keys_in_range`, as the what-if estimates them), else of a sample of about
    /// `sample_keys`.
    pub fn sampled_past(self, sample_keys: u64, keys_in_range: u64) -> Self {
        if keys_in_range > sample_keys {
            self.sampled(sample_keys as f64 / keys_in_range as f64, keys_in_range)
        } else {
            self
        }
    }

    /// The part of the keys replayed (1: every key).
    pub fn rate(&self) -> f64 {
        self.threshold as f64 / ALL_KEYS as f64
    }

    /// The condition on `decisions` that keeps the sample's keys (`TRUE` without one).
    fn sample_condition(&self) -> String {
        if self.threshold >= ALL_KEYS {
            "TRUE".into()
        } else {
            format!("verdict_key_hash(key_id) < {}", self.threshold)
        }
    }

    fn resolve(&mut self, r: &Recorded) -> LimitLookup {
        let id = (r.key_id, r.route_class, r.tier);
        match self.last {
            Some((last, resolution)) if last == id => resolution,
            _ => {
                let resolution =
                    self.policy
                        .resolve(&r.key_id, RouteClassId(r.route_class), TierId(r.tier));
                self.last = Some((id, resolution));
                resolution
            }
        }
    }

    /// Decides `r` under the candidate. Requests must come in time order per key (any order
    /// across keys). A tier or route class the candidate does not know is an error naming
    /// it.
    pub fn feed(&mut self, r: &Recorded) -> Result<(), QueryError> {
        let (refused, by_bucket, by_window, shadow) = match self.resolve(r) {
            LimitLookup::KillSwitch | LimitLookup::Off => (false, false, false, false),
            LimitLookup::Unknown => {
                return Err(QueryError::Invalid(format!(
                    "the candidate policy has no limit for tier id {} on route class id {}, \
                     which the recorded decisions have",
                    r.tier, r.route_class
                )));
            }
            LimitLookup::Check {
                mut limits,
                mode,
                sub_keys,
                ..
            } => {
                let limit_key = (r.key_id, r.route_class, r.tier);
                let mut static_limits = limits;
                if self.policy.is_multi_region() {
                    let static_ppm = self.policy.region_static_ppm(RegionId(r.region));
                    let counters = &self.counters;
                    let share = self
                        .reconcile
                        .as_mut()
                        .and_then(|reconcile| {
                            reconcile.share(
                                limit_key,
                                r.region,
                                r.time_ms,
                                &limits,
                                sub_keys,
                                |region, sub| {
                                    counters
                                        .get(&(r.key_id, r.route_class, region, sub))
                                        .copied()
                                },
                            )
                        })
                        .unwrap_or(Share::uniform(static_ppm));
                    static_limits = limits.scaled(static_ppm, static_ppm);
                    limits = limits.scaled(share.bucket_ppm, share.window_ppm);
                }
                let counter = (
                    r.key_id,
                    r.route_class,
                    r.region,
                    r.sub_key % sub_keys.max(1),
                );
                // One lookup: a counter seen before is updated where it lies.
                let outcome = match self.counters.get_mut(&counter) {
                    Some(state) => {
                        let (outcome, next) = decide(Some(*state), r.time_ms, &limits);
                        if let Some(next) = next {
                            *state = next;
                        }
                        outcome
                    }
                    None => {
                        let (outcome, next) = decide(None, r.time_ms, &limits);
                        if let Some(next) = next {
                            self.counters.insert(counter, next);
                        }
                        outcome
                    }
                };
                if let Some(reconcile) = &mut self.reconcile
                    && is_near_limit(
                        outcome.allowed,
                        outcome.remaining_tokens,
                        outcome.remaining_window,
                        &limits,
                        &static_limits,
                    )
                {
                    reconcile.note_near(limit_key, r.region, r.time_ms);
                }
                (
                    !outcome.allowed,
                    outcome.denied_by_bucket,
                    outcome.denied_by_window,
                    mode == Mode::Shadow,
                )
            }
        };
        let (recorded, replayed) = self.limits.entry((r.tier, r.route_class)).or_default();
        recorded.requests += 1;
        if r.refused {
            recorded.refused += 1;
            recorded.refused_by_bucket += u64::from(r.by_bucket);
            recorded.refused_by_window += u64::from(r.by_window);
        }
        replayed.requests += 1;
        if refused {
            replayed.refused += 1;
            replayed.would_deny += u64::from(shadow);
            replayed.refused_by_bucket += u64::from(by_bucket);
            replayed.refused_by_window += u64::from(by_window);
        }
        let region = self.regions.entry(r.region).or_default();
        region.0 += 1;
        region.1 += u64::from(refused);
        let key = self.keys.entry((r.key_id, r.route_class)).or_default();
        key.tier = r.tier;
        key.requests += 1;
        key.recorded += u64::from(r.refused);
        key.replayed += u64::from(refused);
        Ok(())
    }

    /// What the candidate did with everything fed so far, over all its limits: requests,
    /// refusals, keys (key × route class) and keys refused at least once; and the keys it
    /// constrained, as the review counts them (refused at least once and at least
    /// `constrained_share` of their requests), sorted.
    pub fn outcome(&self, constrained_share: f64) -> (Counts, Vec<(KeyId, u8)>) {
        let mut total = Counts::default();
        for (_, replayed) in self.limits.values() {
            total.requests += replayed.requests;
            total.refused += replayed.refused;
            total.would_deny += replayed.would_deny;
            total.refused_by_bucket += replayed.refused_by_bucket;
            total.refused_by_window += replayed.refused_by_window;
        }
        let mut constrained = Vec::new();
        for (&key, t) in &self.keys {
            total.keys += 1;
            total.keys_refused += u64::from(t.replayed > 0);
            if t.replayed > 0 && t.replayed as f64 >= constrained_share * t.requests as f64 {
                constrained.push(key);
            }
        }
        constrained.sort_unstable();
        (total, constrained)
    }

    /// Each key × route class fed so far: its requests and what the candidate refused of
    /// them.
    pub fn by_key(&self) -> impl Iterator<Item = ((KeyId, u8), u64, u64)> + '_ {
        self.keys.iter().map(|(k, t)| (*k, t.requests, t.replayed))
    }

    /// Requests replayed so far.
    pub fn decisions(&self) -> u64 {
        self.limits.values().map(|(_, c)| c.requests).sum()
    }

    /// The answer: per tier × route class, and the `keys` keys whose refusals change most.
    /// Of a sample, the counts are the estimates for every key, each limit's with its bound.
    pub fn finish(self, range: Range, keys: usize) -> WhatIf {
        let rate = self.rate();
        let mut tallies: BTreeMap<(u8, u8), (Counts, Counts)> = self.limits.into_iter().collect();
        // Per limit, the sums of the squares of each key's requests, recorded refusals,
        // refusals under the candidate, and of the keys (1 each) and keys refused: what
        // the sample's bounds are made of.
        let mut squares: BTreeMap<(u8, u8), [f64; 5]> = BTreeMap::new();
        // And the most requests a key of each limit sent.
        let mut busiest: BTreeMap<(u8, u8), u64> = BTreeMap::new();
        for (&(_, route), t) in &self.keys {
            let (recorded, replayed) = tallies.entry((t.tier, route)).or_default();
            recorded.keys += 1;
            replayed.keys += 1;
            recorded.keys_refused += u64::from(t.recorded > 0);
            replayed.keys_refused += u64::from(t.replayed > 0);
            let most = busiest.entry((t.tier, route)).or_default();
            *most = (*most).max(t.requests);
            let sq = squares.entry((t.tier, route)).or_default();
            for (sum, y) in sq.iter_mut().zip([
                t.requests as f64,
                t.recorded as f64,
                t.replayed as f64,
                1.0,
                f64::from(u8::from(t.replayed > 0)),
            ]) {
                *sum += y * y;
            }
        }
        let sample = (self.threshold < ALL_KEYS).then(|| WhatIfSample {
            rate,
            keys_in_range: self.keys_in_range,
            keys_replayed: self.keys.len() as u64,
            requests_replayed: tallies.values().map(|(_, c)| c.requests).sum(),
        });
        // Three standard errors of an estimate from the sample (Horvitz-Thompson, each key
        // in it with probability `rate`): 3 √(Σ y² (1 − rate) / rate²).
        let bound = |sum_sq: f64| (3.0 * (sum_sq * (1.0 - rate)).sqrt() / rate).ceil() as u64;
        // Where the sample saw none (no key of it refused), the standard error is nil and
        // says nothing of the keys outside it: the bound is then the keys a sample misses
        // at the same 99.7 % (each key missed with probability 1 − rate: ln 0.003 /
        // ln(1 − rate) keys), each refused as many requests as the limit's busiest key sent.
        let unseen = (0.003f64.ln() / (1.0 - rate).ln()).ceil().max(0.0);
        let of_keys = |sum_sq: f64| {
            if sum_sq > 0.0 {
                bound(sum_sq)
            } else {
                unseen as u64
            }
        };
        let of_refusals = |sum_sq: f64, most: u64| {
            if sum_sq > 0.0 {
                bound(sum_sq)
            } else {
                (unseen * most as f64).ceil() as u64
            }
        };
        // A count of the sample's as an estimate of every key's (itself without a sample).
        let up = |v: u64| (v as f64 / rate).round() as u64;
        let scale = |c: &Counts| -> Counts {
            Counts {
                requests: up(c.requests),
                refused: up(c.refused),
                would_deny: up(c.would_deny),
                refused_by_bucket: up(c.refused_by_bucket),
                refused_by_window: up(c.refused_by_window),
                keys: up(c.keys),
                keys_refused: up(c.keys_refused),
            }
        };
        let doc = self.policy.document();
        let limit_name = |tier: u8, route: u8| LimitName {
            tier_id: tier,
            tier: doc
                .tiers
                .iter()
                .find(|t| t.id == tier)
                .map(|t| t.name.clone()),
            route_class_id: route,
            route_class: doc
                .route_classes
                .iter()
                .find(|r| r.id == route)
                .map(|r| r.name.clone()),
        };
        let limits: Vec<LimitWhatIf> = tallies
            .into_iter()
            .map(|((tier, route), (recorded, replayed))| {
                let (recorded, replayed, bound) = if sample.is_some() {
                    let sq = squares.get(&(tier, route)).copied().unwrap_or_default();
                    let most = busiest.get(&(tier, route)).copied().unwrap_or_default();
                    let bounds = LimitBound {
                        requests: bound(sq[0]),
                        recorded_refused: of_refusals(sq[1], most),
                        candidate_refused: of_refusals(sq[2], most),
                        keys: bound(sq[3]),
                        candidate_keys_refused: of_keys(sq[4]),
                    };
                    (scale(&recorded), scale(&replayed), Some(bounds))
                } else {
                    (recorded, replayed, None)
                };
                LimitWhatIf {
                    limit: limit_name(tier, route),
                    refused_change: replayed.refused as i64 - recorded.refused as i64,
                    candidate: replayed,
                    recorded,
                    bound,
                }
            })
            .collect();
        let decisions = limits.iter().map(|l| l.candidate.requests).sum();
        let mut changed: Vec<KeyWhatIf> = self
            .keys
            .iter()
            .filter(|(_, t)| t.recorded != t.replayed)
            .map(|(&(key_id, route), t)| KeyWhatIf {
                key_id: key_id.to_string(),
                limit: limit_name(t.tier, route),
                requests: t.requests,
                recorded_refused: t.recorded,
                candidate_refused: t.replayed,
                refused_change: t.replayed as i64 - t.recorded as i64,
            })
            .collect();
        changed.sort_by(|a, b| {
            b.refused_change
                .unsigned_abs()
                .cmp(&a.refused_change.unsigned_abs())
                .then_with(|| a.key_id.cmp(&b.key_id))
                .then_with(|| a.limit.route_class_id.cmp(&b.limit.route_class_id))
        });
        changed.truncate(keys);
        let regions = self
            .regions
            .iter()
            .map(|(&region, &(requests, refused))| RegionWhatIf {
                region,
                name: doc
                    .regions
                    .iter()
                    .find(|r| r.id == region)
                    .map(|r| r.name.clone()),
                share: f64::from(self.policy.region_static_ppm(RegionId(region)))
                    / f64::from(verdict_limiter::algo::PPM),
                requests: up(requests),
                refused: up(refused),
            })
            .collect();
        WhatIf {
            from: range.from,
            to: range.to,
            policy_version: self.policy.version(),
            decisions,
            caveat: CAVEAT,
            limits,
            regions,
            shares: self.policy.is_multi_region().then(|| {
                self.reconcile
                    .as_ref()
                    .map_or_else(|| STATIC_SHARES.to_owned(), Reconcile::describe)
            }),
            keys: changed,
            sample,
        }
    }
}

/// A tier × route class, by id and by its names in the candidate policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LimitName {
    /// Tier id.
    pub tier_id: u8,
    /// Tier name in the candidate (`None`: the candidate has no such tier).
    pub tier: Option<String>,
    /// Route class id.
    pub route_class_id: u8,
    /// Route class name in the candidate.
    pub route_class: Option<String>,
}

impl LimitName {
    /// The tier's name, or `#id` without one.
    pub fn tier_label(&self) -> String {
        self.tier
            .clone()
            .unwrap_or_else(|| format!("#{}", self.tier_id))
    }

    /// The route class's name, or `#id` without one.
    pub fn route_label(&self) -> String {
        self.route_class
            .clone()
            .unwrap_or_else(|| format!("#{}", self.route_class_id))
    }
}

/// The answer for one tier × route class.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LimitWhatIf {
    /// Which tier × route class.
    #[serde(flatten)]
    pub limit: LimitName,
    /// What the candidate would have done.
    pub candidate: Counts,
    /// What was recorded.
    pub recorded: Counts,
    /// Candidate refusals minus recorded refusals.
    pub refused_change: i64,
    /// Of a sample of the keys: how far each estimate may be from every key's count (three
    /// standard errors). `None`: every key was replayed, the counts are exact.
    pub bound: Option<LimitBound>,
}

/// The bounds of a limit's estimates from a sample of the keys, ± each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LimitBound {
    /// Of the requests (recorded and candidate alike).
    pub requests: u64,
    /// Of the recorded refusals.
    pub recorded_refused: u64,
    /// Of the candidate's refusals.
    pub candidate_refused: u64,
    /// Of the keys.
    pub keys: u64,
    /// Of the keys the candidate refused at least once.
    pub candidate_keys_refused: u64,
}

/// The sample of keys a what-if replayed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WhatIfSample {
    /// The part of the keys replayed: those whose `verdict_key_hash(key_id)` is below
    /// `rate × 2³²`.
    pub rate: f64,
    /// The keys (key ids) the range holds, estimated (`approx_distinct`).
    pub keys_in_range: u64,
    /// Keys (key × route class) replayed.
    pub keys_replayed: u64,
    /// Requests replayed.
    pub requests_replayed: u64,
}

/// One key whose refusals change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyWhatIf {
    /// The key id, 32 hex digits.
    pub key_id: String,
    /// Its tier × route class.
    #[serde(flatten)]
    pub limit: LimitName,
    /// Its requests in the range.
    pub requests: u64,
    /// Refused when recorded.
    pub recorded_refused: u64,
    /// Refused under the candidate.
    pub candidate_refused: u64,
    /// The difference.
    pub refused_change: i64,
}

/// The what-if answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WhatIf {
    /// Start of the range, inclusive.
    pub from: DateTime<Utc>,
    /// End of the range, exclusive.
    pub to: DateTime<Utc>,
    /// The candidate's version.
    pub policy_version: u64,
    /// Recorded requests in the range (of a sample: estimated, and [`WhatIfSample`] says
    /// how many were replayed).
    pub decisions: u64,
    /// What recorded demand is (see [`CAVEAT`]).
    pub caveat: &'static str,
    /// Per tier × route class.
    pub limits: Vec<LimitWhatIf>,
    /// Per region the requests came from.
    pub regions: Vec<RegionWhatIf>,
    /// How the regions' shares were modelled, with several regions in the candidate:
    /// each region its static weight's share, or the reconcile's rounds run again (see
    /// [`crate::shares`]); `None` with one region, which enforces the whole.
    pub shares: Option<String>,
    /// The keys whose refusals change most, most first (of a sample: its keys').
    pub keys: Vec<KeyWhatIf>,
    /// The sample of the keys replayed, past [`SAMPLE_KEYS`] (or the sample asked for) in
    /// the range; `None`: every key.
    pub sample: Option<WhatIfSample>,
}

/// One region's requests in a replay.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RegionWhatIf {
    /// Region id.
    pub region: u16,
    /// Its name in the candidate (`None`: the candidate does not list it).
    pub name: Option<String>,
    /// The share of every limit it enforces by the candidate's static weights.
    pub share: f64,
    /// Requests replayed from it.
    pub requests: u64,
    /// Of those, refused by the candidate.
    pub refused: u64,
}

/// Parses and validates a candidate policy (TOML), refusing it the way the limiter does: the
/// row and the field named.
pub fn candidate(toml: &str) -> Result<PolicySnapshot, QueryError> {
    let doc = verdict_limiter::policy::parse_toml(toml)
        .map_err(|e| QueryError::Invalid(format!("the candidate policy: {e}")))?;
    PolicySnapshot::build(doc)
        .map_err(|e| QueryError::Invalid(format!("the candidate policy: {e}")))
}

/// The requests of one batch of `decisions` (the columns of [`HOUR_SQL`]).
pub fn recorded(batch: &RecordBatch) -> Result<Vec<Recorded>, QueryError> {
    let bad = || QueryError::Internal;
    let col = |i: usize| batch.column(i);
    let time = col(0)
        .as_any()
        .downcast_ref::<TimestampMillisecondArray>()
        .ok_or_else(bad)?;
    let key = col(1)
        .as_any()
        .downcast_ref::<FixedSizeBinaryArray>()
        .ok_or_else(bad)?;
    let u8s = |i: usize| col(i).as_any().downcast_ref::<UInt8Array>().ok_or_else(bad);
    let (tier, route, sub_key, verdict) = (u8s(2)?, u8s(3)?, u8s(5)?, u8s(6)?);
    let region = col(4)
        .as_any()
        .downcast_ref::<UInt16Array>()
        .ok_or_else(bad)?;
    let flags = |i: usize| {
        col(i)
            .as_any()
            .downcast_ref::<BooleanArray>()
            .ok_or_else(bad)
    };
    let (by_bucket, by_window) = (flags(7)?, flags(8)?);
    let mut out = Vec::with_capacity(batch.num_rows());
    for i in 0..batch.num_rows() {
        let mut id = [0u8; 16];
        id.copy_from_slice(key.value(i));
        out.push(Recorded {
            key_id: KeyId(id),
            route_class: route.value(i),
            time_ms: time.value(i),
            tier: tier.value(i),
            region: region.value(i),
            sub_key: sub_key.value(i),
            refused: verdict.value(i) != 0,
            by_bucket: by_bucket.value(i),
            by_window: by_window.value(i),
        });
    }
    Ok(out)
}

/// The columns the replay reads, in [`recorded`]'s order.
pub const HOUR_COLUMNS: &str = "event_time, key_id, tier, route_class, region, sub_key, \
    verdict, denied_by_bucket, denied_by_window";

/// The recorded requests of the hour starting at `hour` that lie in `range`, sorted by key,
/// route class and time (the order [`Replay::feed`] needs).
pub async fn recorded_hour(
    engine: &Engine,
    hour: DateTime<Utc>,
    range: Range,
) -> Result<Vec<Recorded>, QueryError> {
    recorded_hour_of(engine, hour, range, "TRUE").await
}

/// [`recorded_hour`] of the keys `keys` (a condition on `decisions`) keeps.
pub(crate) async fn recorded_hour_of(
    engine: &Engine,
    hour: DateTime<Utc>,
    range: Range,
    keys: &str,
) -> Result<Vec<Recorded>, QueryError> {
    let within = Range {
        from: range.from.max(hour),
        to: range.to.min(hour + Duration::hours(1)),
    };
    let sql = format!(
        "SELECT {HOUR_COLUMNS} FROM decisions WHERE hour = {} AND {} AND ({keys})",
        hour.hour(),
        replayed_in(within),
    );
    let batches = engine.collect(&sql, &RunOptions::default()).await?.batches;
    let mut requests = Vec::new();
    for batch in &batches {
        requests.extend(recorded(batch)?);
    }
    requests.sort_unstable();
    Ok(requests)
}

/// The condition on `decisions` of the requests a replay reads in `range`: those the
/// limits decided (`source` 0 or 1: the counter store or the local fallback, not the kill
/// switch or mode off) in its time, on the partitions alone where it falls on whole hours
/// (the raw table is partitioned by the events' hour).
fn replayed_in(range: Range) -> String {
    format!("{} AND source IN (0, 1)", range.sql("event_time", true))
}

/// The first hour of `range` (its start, on the hour).
pub fn first_hour(range: Range) -> DateTime<Utc> {
    crate::range::start_of_hour(range.from)
}

/// The hours of `range` the raw table holds decisions of, in order: a replay reads those
/// only (`from=1970-01-01&to=9999-12-31` is 70 million hours, of which the table keeps a
/// week).
pub async fn recorded_hours(
    engine: &Engine,
    range: Range,
) -> Result<Vec<DateTime<Utc>>, QueryError> {
    let sql = format!(
        "SELECT DISTINCT to_unixtime(CAST(date AS TIMESTAMP)) + hour * 3600 AS t FROM decisions \
         WHERE date >= DATE '{}' AND date <= DATE '{}' ORDER BY t",
        range.from.format("%Y-%m-%d"),
        range.to.format("%Y-%m-%d"),
    );
    let batches = engine.collect(&sql, &RunOptions::default()).await?.batches;
    let first = first_hour(range);
    let mut hours = Vec::new();
    for batch in &batches {
        let column = arrow::compute::cast(batch.column(0), &arrow::datatypes::DataType::Int64)
            .map_err(|e| QueryError::from_datafusion(e.into(), engine.limits()))?;
        let seconds = column.as_primitive::<arrow::datatypes::Int64Type>();
        for t in seconds.iter().flatten() {
            if let Some(hour) = DateTime::from_timestamp(t, 0)
                && hour >= first
                && hour < range.to
            {
                hours.push(hour);
            }
        }
    }
    Ok(hours)
}

/// Replays `range` of the raw table under `policy`; lists the `keys` keys that change most.
/// A range with no recorded decisions is an error that says so. What the replay holds (a
/// counter and a tally for every key it has seen) counts against a query's memory limit,
/// as a query's operators do (see [`crate::memory`]): past it the what-if is refused.
///
/// Past `sample_keys` keys in the range (estimated over its decisions), a sample of about
/// `sample_keys` of them is replayed and the counts estimated from theirs (see the module's
/// documentation).
pub async fn what_if(
    engine: &Engine,
    policy: PolicySnapshot,
    range: Range,
    keys: usize,
    sample_keys: u64,
) -> Result<WhatIf, QueryError> {
    what_if_measured(engine, policy, range, keys, sample_keys)
        .await
        .map(|(answer, _)| answer)
}

/// [`what_if`], and the most memory its count held at once, in bytes (0 when the process
/// does not count memory).
pub async fn what_if_measured(
    engine: &Engine,
    policy: PolicySnapshot,
    range: Range,
    keys: usize,
    sample_keys: u64,
) -> Result<(WhatIf, usize), QueryError> {
    let limit = engine.limits().timeout;
    let memory = QueryMemory::claim(engine.limits().memory_bytes);
    let replayed = memory.enter(async {
        let model = ShareModel::recorded(engine, range).await?;
        let in_range = keys_in_range(engine, range).await?;
        if in_range == 0 {
            return Err(no_decisions(range));
        }
        let mut replay = Replay::with_shares(policy, model).sampled_past(sample_keys, in_range);
        if replay.rate() < 1.0 {
            tracing::debug!(
                keys = in_range,
                rate = replay.rate(),
                "what-if: replaying a sample of the keys"
            );
        }
        feed_range(engine, &mut replay, range, &memory).await?;
        Ok(replay.finish(range, keys))
    });
    let answer =
        tokio::time::timeout(limit, replayed)
            .await
            .map_err(|_| QueryError::TimeLimit {
                seconds: limit.as_secs(),
            })?;
    tracing::debug!(
        peak_mib = memory.peak() >> 20,
        "what-if: the replay's memory at its largest"
    );
    answer.map(|a| (a, memory.peak()))
}

/// The keys (key ids) with decisions the replay reads in `range`, estimated
/// (`approx_distinct` of their hashes, as the review counts a limit's keys).
pub(crate) async fn keys_in_range(engine: &Engine, range: Range) -> Result<u64, QueryError> {
    let sql = format!(
        "SELECT approx_distinct(verdict_key_hash(key_id)) AS keys FROM decisions WHERE {}",
        replayed_in(range)
    );
    let batches = engine.collect(&sql, &RunOptions::default()).await?.batches;
    let keys = batches
        .first()
        .filter(|b| b.num_rows() > 0)
        .and_then(|b| arrow::compute::cast(b.column(0), &arrow::datatypes::DataType::UInt64).ok())
        .and_then(|c| {
            c.as_primitive::<arrow::datatypes::UInt64Type>()
                .iter()
                .next()
                .flatten()
        });
    keys.ok_or(QueryError::Internal)
}

/// Whether the replay counted in `memory` is still within the query's limit and the
/// service's budget: the error of a query past them otherwise.
pub(crate) fn within(engine: &Engine, memory: &QueryMemory) -> Result<(), QueryError> {
    match memory.state() {
        Some(true) => Err(memory_refusal(true, engine.limits())),
        Some(false) => Err(QueryError::MemoryLimit {
            limit_mib: memory.limit() >> 20,
        }),
        None => Ok(()),
    }
}

/// Feeds every recorded request of `range` to `replay`, an hour at a time, checking
/// `memory` (the count the replay's state is held against, see [`within`]) after each
/// hour. A range with no recorded decisions is an error that says so.
pub async fn feed_range(
    engine: &Engine,
    replay: &mut Replay,
    range: Range,
    memory: &QueryMemory,
) -> Result<(), QueryError> {
    let keys = replay.sample_condition();
    for hour in recorded_hours(engine, range).await? {
        for r in &recorded_hour_of(engine, hour, range, &keys).await? {
            replay.feed(r)?;
        }
        within(engine, memory)?;
    }
    // A sample may hold none of the range's requests; the range's own emptiness is
    // what is an error.
    if replay.decisions() == 0 && replay.threshold >= ALL_KEYS {
        return Err(no_decisions(range));
    }
    Ok(())
}

/// The error of a range the raw table holds no decisions of.
fn no_decisions(range: Range) -> QueryError {
    QueryError::NotFound(format!(
        "the raw table has no decisions from {} to {} (it keeps 7 days): nothing to replay",
        range.from.to_rfc3339(),
        range.to.to_rfc3339()
    ))
}

/// The answer as text for a terminal: one line per tier × route class, then the keys.
pub fn render(w: &WhatIf) -> String {
    let mut t = format!(
        "What-if: {} recorded requests from {} to {} replayed under candidate policy version {}\n",
        w.decisions,
        w.from.to_rfc3339(),
        w.to.to_rfc3339(),
        w.policy_version
    );
    if let Some(sample) = &w.sample {
        t += &format!(
            "Sampled: {} requests of {} keys replayed, {:.2} % of the about {} keys in the range \
             (chosen by key hash); the counts are estimates for every key, ± three standard errors.\n",
            sample.requests_replayed,
            sample.keys_replayed,
            sample.rate * 100.0,
            sample.keys_in_range
        );
    }
    if let Some(shares) = &w.shares {
        t += &format!("Regions: {shares}.\n");
    }
    t += &format!(
        "  {:<12} {:<10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8}\n",
        "tier",
        "route",
        "requests",
        "refused",
        "candidate",
        "by bucket",
        "by window",
        "keys",
        "keys now"
    );
    for l in &w.limits {
        t += &format!(
            "  {:<12} {:<10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8}\n",
            l.limit.tier_label(),
            l.limit.route_label(),
            l.recorded.requests,
            l.recorded.refused,
            l.candidate.refused,
            l.candidate.refused_by_bucket,
            l.candidate.refused_by_window,
            l.candidate.keys_refused,
            l.recorded.keys_refused,
        );
        if let Some(b) = &l.bound {
            t += &format!(
                "  {:<12} {:<10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8}\n",
                "",
                "±",
                b.requests,
                b.recorded_refused,
                b.candidate_refused,
                "",
                "",
                b.candidate_keys_refused,
                "",
            );
        }
    }
    if !w.keys.is_empty() {
        t += "Keys whose refusals change most:\n";
        for k in &w.keys {
            t += &format!(
                "  {} {:<12} {:<10} {:>8} requests: refused {} → {} ({:+})\n",
                k.key_id,
                k.limit.tier_label(),
                k.limit.route_label(),
                k.requests,
                k.recorded_refused,
                k.candidate_refused,
                k.refused_change
            );
        }
    }
    t += &format!("Caveat: {}.\n", w.caveat);
    t
}
