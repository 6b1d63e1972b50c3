//! The review's recommendations, proven before they are shown. For every limit (and
//! override) the review calls too low or too high, the recommended quota, capacity and
//! refill are found by replaying the review's own range with the limiter's decision core
//! ([`crate::whatif::Replay`]), candidate after candidate, over the round values (two
//! significant digits: 1, 2, … 8, 10, 12, 15, 20, 25, 30, 40, 50, 60, 80, 100, …), and the
//! first that meets the target is the recommendation. So the figures shown beside it are
//! what its replay refused, not an estimate.
//!
//! The targets:
//! - **too low**: the keys the candidate constrains (refused at least `constrained_share`
//!   of their requests) fall below `too_low_share` of the limit's keys, and no key that the
//!   limit in force left unconstrained becomes constrained. Quota and bucket are raised
//!   apart: the one whose refusals the review counted (refused by the window: the quota;
//!   by the bucket: the bucket), the other kept; both together when both refused.
//! - **too high**: the candidate refuses at most [`REQUESTS_TOLERANCE`] more of the
//!   requests and [`KEYS_TOLERANCE`] more of the keys than the limit in force does in the
//!   same replay. The quota is lowered first (the bucket kept), then the bucket (the new
//!   quota kept).
//!
//! The replay models what the limiter enforces: each region its static share of the
//! candidate's limits, a hot key's sub-keys, shadow mode (would-deny counts as refused).
//! Each limit's requests are read from the raw table once and replayed in memory: every
//! key's up to [`SAMPLE_KEYS`] keys of the limit, past it a sample of them chosen by key
//! (each sampled key replayed whole), so that what the proof holds grows with the sample,
//! not with the keys; it counts against a query's memory limit.

use std::collections::BTreeMap;

use serde::Serialize;
use verdict_limiter::algo::MAX_LIMIT;
use verdict_limiter::{LimitLookup, PolicySnapshot};
use verdict_schemas::{KeyId, RouteClassId, TierId};

use crate::engine::Engine;
use crate::error::QueryError;
use crate::memory::QueryMemory;
use crate::range::Range;
use crate::ranks::key_hash;
use crate::recommendation::{Recommendation, apply};
use crate::shares::ShareModel;
use crate::whatif::{self, Counts, Recorded, Replay};

/// How much more of the requests a too-high limit's recommendation may refuse than the
/// limit in force: 0.1 percentage point.
pub const REQUESTS_TOLERANCE: f64 = 0.001;
/// How much more of the keys it may refuse at least once: 1 percentage point.
pub const KEYS_TOLERANCE: f64 = 0.01;
/// Keys of a limit the proof replays whole, by default: past it, a sample of about this
/// many (see [`prove`]). A share of keys from 8,192 of them is within 1.1 percentage points
/// of every key's (two standard errors at a share of a half; 0.66 at the review's 10 %).
pub const SAMPLE_KEYS: u64 = 8_192;
/// The share of a query's memory limit the proofs' recorded requests may take together, by
/// the review's counts (a vector may hold twice what it has while growing, and the replays
/// need theirs): past it, every limit's sample is made smaller in proportion (see
/// [`prove`]). A quarter of 1 GiB is 8.4 M requests of 32 bytes.
pub const REQUESTS_SHARE: f64 = 0.25;

/// The recorded requests the proofs may hold together under a query memory limit of
/// `memory_bytes` (see [`REQUESTS_SHARE`]).
pub fn max_requests(memory_bytes: usize) -> u64 {
    (memory_bytes as f64 * REQUESTS_SHARE / std::mem::size_of::<Recorded>() as f64) as u64
}
/// How far up a too-low limit's search goes: 1,000 times the limit in force.
const MAX_RAISE: f64 = 1_000.0;

/// The review's thresholds the targets use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Targets {
    /// A limit is too low while this share of its keys (or more) is constrained.
    pub too_low_share: f64,
    /// A key is constrained when at least this share of its requests is refused.
    pub constrained_share: f64,
}

impl Targets {
    /// The review's own parameters (`too_low_share`, `constrained_share`), with the
    /// review's defaults and ranges.
    pub fn from_params(params: &BTreeMap<String, String>) -> Result<Self, QueryError> {
        let share = |name: &str, default: f64, lo: f64| -> Result<f64, QueryError> {
            let Some(v) = params.get(name) else {
                return Ok(default);
            };
            v.trim()
                .parse::<f64>()
                .ok()
                .filter(|v| (lo..=1.0).contains(v))
                .ok_or_else(|| {
                    QueryError::Invalid(format!(
                        "parameter {name}: {v:?} is not a number from {lo} to 1"
                    ))
                })
        };
        Ok(Self {
            too_low_share: share("too_low_share", 0.1, 0.0)?,
            constrained_share: share("constrained_share", 0.01, 0.0001)?,
        })
    }
}

/// What a replay of one limit's requests refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Refused {
    /// Requests replayed.
    pub requests: u64,
    /// Keys (key × route class).
    pub keys: u64,
    /// Share of the requests refused (denied or would-deny).
    pub share_of_requests: f64,
    /// Share of the keys refused at least once.
    pub share_of_keys: f64,
    /// Share of the keys constrained.
    pub share_of_keys_constrained: f64,
}

impl Refused {
    fn of(c: &Counts, constrained: usize) -> Self {
        let share = |part: u64, whole: u64| {
            if whole == 0 {
                0.0
            } else {
                part as f64 / whole as f64
            }
        };
        Self {
            requests: c.requests,
            keys: c.keys,
            share_of_requests: c.share_of_requests_refused(),
            share_of_keys: c.share_of_keys_refused(),
            share_of_keys_constrained: share(constrained as u64, c.keys),
        }
    }
}

/// Which of a limit's two parts the review found wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Wrong {
    /// The hourly quota.
    Quota,
    /// The bucket (capacity and refill).
    Bucket,
    /// Both.
    QuotaAndBucket,
}

impl Wrong {
    /// In words, for a reason.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Quota => "the quota",
            Self::Bucket => "the bucket",
            Self::QuotaAndBucket => "the quota and the bucket",
        }
    }
}

/// One recommendation, proven.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Proven {
    /// The review's row, its recommended values replaced by the proven ones.
    #[serde(flatten)]
    pub recommendation: Recommendation,
    /// Which part the review found wrong (none for a limit it keeps).
    pub wrong: Option<Wrong>,
    /// Whether the recommendation met its target (false: no round value within the
    /// search's reach did; the recommendation is then the limit in force).
    pub met: bool,
    /// What the limit in force refused in the replay (a row judged fine or without enough
    /// data is not replayed: none).
    pub in_force: Option<Refused>,
    /// What the recommendation refused in the same replay.
    pub recommended: Option<Refused>,
    /// Candidates replayed to find it.
    pub replays: u32,
    /// The share of the limit's keys replayed (1: every key; below 1, a sample of them
    /// chosen by key, and the refused shares above are the sample's).
    pub sample_rate: f64,
}

impl Proven {
    /// A row the review does not judge too low or too high: its limits kept, nothing
    /// replayed.
    fn kept(row: &Recommendation) -> Self {
        Self {
            recommendation: Recommendation {
                recommended_quota: row.hourly_quota,
                recommended_capacity: row.capacity,
                recommended_refill_per_s: row.refill_per_s,
                ..row.clone()
            },
            wrong: None,
            met: true,
            in_force: None,
            recommended: None,
            replays: 0,
            sample_rate: 1.0,
        }
    }

    /// Whether the review judged the row too low or too high.
    fn judged(row: &Recommendation) -> bool {
        matches!(row.verdict.as_str(), "too low" | "too high")
    }
}

/// The round values (two significant digits from the series 1, 1.2, 1.5, 2, 2.5, 3, 4, 5,
/// 6, 8) from 1 up to [`MAX_LIMIT`], ascending.
fn round_values() -> Vec<u32> {
    const MANTISSAS: [u64; 10] = [10, 12, 15, 20, 25, 30, 40, 50, 60, 80];
    let mut out = Vec::new();
    let mut scale: u64 = 1;
    while scale <= u64::from(MAX_LIMIT) {
        for m in MANTISSAS {
            let v = m * scale;
            if v.is_multiple_of(10) && (1..=u64::from(MAX_LIMIT)).contains(&(v / 10)) {
                out.push((v / 10) as u32);
            }
        }
        scale *= 10;
    }
    out.dedup();
    out
}

/// The first index of `candidates` (ordered so that a later one meets the target whenever
/// an earlier one does) whose replay meets it, by bisection: `meets` is asked about
/// O(log n) candidates, and the index returned is one it answered true for.
fn first_meeting<T>(
    candidates: &[T],
    mut meets: impl FnMut(&T) -> Result<bool, QueryError>,
) -> Result<Option<usize>, QueryError> {
    let (mut lo, mut hi) = (0, candidates.len());
    let mut found = None;
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if meets(&candidates[mid])? {
            found = Some(mid);
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Ok(found)
}

/// A limit's values: quota, capacity, refill per second.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Values {
    quota: i64,
    capacity: i64,
    refill_per_s: f64,
}

impl Values {
    fn in_force(r: &Recommendation) -> Self {
        Self {
            quota: r.hourly_quota,
            capacity: r.capacity,
            refill_per_s: r.refill_per_s,
        }
    }

    /// With capacity `c`, the refill scaled with it (the bucket's time scale kept).
    fn with_capacity(self, c: i64) -> Self {
        Self {
            refill_per_s: self.refill_per_s * c as f64 / self.capacity.max(1) as f64,
            capacity: c,
            ..self
        }
    }
}

/// One limit's requests, and how to replay them under candidate values.
struct Trial<'a> {
    doc: &'a verdict_limiter::PolicyDocument,
    row: &'a Recommendation,
    trace: &'a [Recorded],
    model: &'a ShareModel,
    constrained_share: f64,
    replays: u32,
}

impl Trial<'_> {
    /// Replays the trace with the row's limit at `v`: what was refused, and the keys
    /// constrained.
    fn replay(&mut self, v: Values) -> Result<(Refused, Vec<(KeyId, u8)>), QueryError> {
        self.replays += 1;
        let candidate = Recommendation {
            recommended_quota: v.quota,
            recommended_capacity: v.capacity,
            recommended_refill_per_s: v.refill_per_s,
            ..self.row.clone()
        };
        let policy = apply(self.doc, std::slice::from_ref(&candidate))?;
        let mut replay = Replay::with_shares(policy, self.model.clone());
        for r in self.trace {
            replay.feed(r)?;
        }
        let (counts, constrained) = replay.outcome(self.constrained_share);
        Ok((Refused::of(&counts, constrained.len()), constrained))
    }
}

/// Proves `row` (a row of the review) over `trace` (its limit's recorded requests, in the
/// replay's order) under the policy in force `doc`.
fn prove_row(
    doc: &verdict_limiter::PolicyDocument,
    row: &Recommendation,
    trace: &[Recorded],
    model: &ShareModel,
    targets: Targets,
) -> Result<Proven, QueryError> {
    let mut t = Trial {
        doc,
        row,
        trace,
        model,
        constrained_share: targets.constrained_share,
        replays: 0,
    };
    let now = Values::in_force(row);
    let (in_force, constrained_now) = t.replay(now)?;
    let keep = |t: &Trial<'_>, wrong, met| Proven {
        wrong,
        met,
        in_force: Some(in_force),
        recommended: Some(in_force),
        replays: t.replays,
        ..Proven::kept(row)
    };
    let rounds = round_values();
    let found = match row.verdict.as_str() {
        "too low" => {
            let quota_short = row.refused_by_window > 0;
            let bucket_short = row.refused_by_bucket > 0;
            let wrong = match (quota_short, bucket_short) {
                (true, true) => Wrong::QuotaAndBucket,
                (false, true) => Wrong::Bucket,
                _ => Wrong::Quota,
            };
            let above = |v: i64| -> Vec<i64> {
                let cap = (v as f64 * MAX_RAISE).min(f64::from(MAX_LIMIT));
                rounds
                    .iter()
                    .map(|&r| i64::from(r))
                    .filter(|&r| r > v && r as f64 <= cap)
                    .collect()
            };
            let candidates = |wrong: Wrong| -> Vec<Values> {
                match wrong {
                    Wrong::Quota => above(now.quota)
                        .into_iter()
                        .map(|q| Values { quota: q, ..now })
                        .collect(),
                    Wrong::Bucket => above(now.capacity)
                        .into_iter()
                        .map(|c| now.with_capacity(c))
                        .collect(),
                    // Both by one factor: each round quota above the one in force, with the
                    // bucket raised by as much, rounded up to a round value.
                    Wrong::QuotaAndBucket => above(now.quota)
                        .into_iter()
                        .filter_map(|q| {
                            let least = now.capacity as f64 * q as f64 / now.quota.max(1) as f64;
                            let c = rounds
                                .iter()
                                .map(|&r| i64::from(r))
                                .find(|&r| r as f64 >= least && r > now.capacity)?;
                            Some(Values {
                                quota: q,
                                ..now.with_capacity(c)
                            })
                        })
                        .collect(),
                }
            };
            let limit = targets.too_low_share;
            let mut meets = |v: &Values| -> Result<bool, QueryError> {
                let (refused, constrained) = t.replay(*v)?;
                let newly = constrained
                    .iter()
                    .any(|k| constrained_now.binary_search(k).is_err());
                Ok(refused.share_of_keys_constrained < limit && !newly)
            };
            // What refused first is what the review saw; the other part may be short as
            // well, hidden behind it (a bucket that refills a few tokens an hour behind a
            // quota of one): when raising the one alone meets no target, both are raised.
            let mut found = None;
            for wrong in [wrong, Wrong::QuotaAndBucket] {
                let tried = candidates(wrong);
                if let Some(i) = first_meeting(&tried, &mut meets)? {
                    found = Some((tried[i], wrong));
                    break;
                }
                if wrong == Wrong::QuotaAndBucket {
                    break;
                }
            }
            match found {
                Some(found) => Some(found),
                None => return Ok(keep(&t, Some(wrong), false)),
            }
        }
        "too high" => {
            let within = |r: &Refused| {
                r.share_of_requests <= in_force.share_of_requests + REQUESTS_TOLERANCE
                    && r.share_of_keys <= in_force.share_of_keys + KEYS_TOLERANCE
            };
            let below = |v: i64| -> Vec<i64> {
                rounds
                    .iter()
                    .map(|&r| i64::from(r))
                    .filter(|&r| r < v)
                    .collect()
            };
            let quotas: Vec<Values> = below(now.quota)
                .into_iter()
                .map(|q| Values { quota: q, ..now })
                .collect();
            let quota = match first_meeting(&quotas, |v| Ok(within(&t.replay(*v)?.0)))? {
                Some(i) => quotas[i],
                None => now,
            };
            let buckets: Vec<Values> = below(now.capacity)
                .into_iter()
                .map(|c| quota.with_capacity(c))
                .collect();
            let both = match first_meeting(&buckets, |v| Ok(within(&t.replay(*v)?.0)))? {
                Some(i) => buckets[i],
                None => quota,
            };
            let wrong = match (both.quota < now.quota, both.capacity < now.capacity) {
                (true, true) => Wrong::QuotaAndBucket,
                (false, true) => Wrong::Bucket,
                (true, false) => Wrong::Quota,
                (false, false) => return Ok(keep(&t, Some(Wrong::QuotaAndBucket), false)),
            };
            Some((both, wrong))
        }
        _ => None,
    };
    let Some((v, wrong)) = found else {
        return Ok(keep(&t, None, true));
    };
    // The shown figures are this replay's: the values recommended, replayed once more.
    let (recommended, _) = t.replay(v)?;
    Ok(Proven {
        recommendation: Recommendation {
            recommended_quota: v.quota,
            recommended_capacity: v.capacity,
            recommended_refill_per_s: v.refill_per_s,
            ..row.clone()
        },
        wrong: Some(wrong),
        met: true,
        in_force: Some(in_force),
        recommended: Some(recommended),
        replays: t.replays,
        sample_rate: 1.0,
    })
}

/// Which row of the review a recorded request belongs to: its limit's (tier, route class),
/// and its key when an override in force sets its limits.
type RowKey = (u8, u8, Option<KeyId>);

fn row_key(r: &Recommendation) -> Result<RowKey, QueryError> {
    let key = match &r.override_key {
        Some(k) => Some(k.parse::<KeyId>().map_err(|_| QueryError::Internal)?),
        None => None,
    };
    Ok((r.tier_id, r.route_class_id, key))
}

/// Proves every row of `review` (the review's rows over `range`) under the policy in force
/// `in_force`: the rows it judges too low or too high get proven recommendations; the
/// others keep their limits, with what the limit in force refused beside them.
///
/// Each judged limit's requests are read from the raw table in one pass over the range and
/// held for its replays: every key's, up to `sample_keys` keys of the limit (as the review
/// counted them), and past it a sample of about `sample_keys` of them, chosen by key
/// (`verdict_key_hash(key_id)` below `sample_keys / keys × 2³²`, as the review's and the
/// what-if's samples are), each of which is replayed whole; where the samples' requests
/// would pass [`max_requests`] of the query's memory limit by the review's counts, every
/// limit's sample is made smaller by the same factor. An override's one key is always
/// replayed. What the requests and the replays hold counts against a query's memory limit,
/// as a query's operators do (see [`crate::memory`]): past it the proof is refused.
pub async fn prove(
    engine: &Engine,
    in_force: &PolicySnapshot,
    review: &[Recommendation],
    range: Range,
    model: &ShareModel,
    targets: Targets,
    sample_keys: u64,
) -> Result<Vec<Proven>, QueryError> {
    let memory = QueryMemory::claim(engine.limits().memory_bytes);
    let proven = memory
        .enter(async {
            let traces = traces(engine, in_force, review, range, sample_keys, &memory).await?;
            let mut proven = Vec::with_capacity(review.len());
            for row in review {
                if !Proven::judged(row) {
                    proven.push(Proven::kept(row));
                    continue;
                }
                let (below, trace) = traces
                    .get(&row_key(row)?)
                    .map_or((whatif::ALL_KEYS, &[][..]), |(b, t)| (*b, t.as_slice()));
                let mut p = prove_row(in_force.document(), row, trace, model, targets)?;
                p.sample_rate = below as f64 / whatif::ALL_KEYS as f64;
                proven.push(p);
                whatif::within(engine, &memory)?;
            }
            Ok(proven)
        })
        .await;
    tracing::debug!(
        peak_mib = memory.peak() >> 20,
        "proof: its requests and replays' memory at its largest"
    );
    proven
}

/// The keys of each of `judged` (rows of the review) its proof replays: those whose
/// `verdict_key_hash` is below this ([`whatif::ALL_KEYS`]: every key). A limit's sample is
/// `sample_keys` of its keys; where the samples would hold more than `max_requests`
/// requests by the review's counts, every limit's is made smaller by the same factor. An
/// override's one key is always replayed.
fn thresholds(judged: &[&Recommendation], sample_keys: u64, max_requests: u64) -> Vec<i64> {
    let count = |v: i64| u64::try_from(v).unwrap_or(0) as f64;
    let rates: Vec<f64> = judged
        .iter()
        .map(|r| {
            if r.override_key.is_some() {
                1.0
            } else {
                (sample_keys as f64 / count(r.keys).max(1.0)).min(1.0)
            }
        })
        .collect();
    let (mut held, mut overrides) = (0.0, 0.0);
    for (r, rate) in judged.iter().zip(&rates) {
        if r.override_key.is_some() {
            overrides += count(r.requests);
        } else {
            held += rate * count(r.requests);
        }
    }
    let most = max_requests as f64;
    let room = (most - overrides).max(most / 4.0);
    let scale = if held > room { room / held } else { 1.0 };
    judged
        .iter()
        .zip(rates)
        .map(|(r, rate)| {
            let rate = if r.override_key.is_some() {
                1.0
            } else {
                rate * scale
            };
            if rate >= 1.0 {
                whatif::ALL_KEYS
            } else {
                ((rate * whatif::ALL_KEYS as f64) as i64).clamp(1, whatif::ALL_KEYS)
            }
        })
        .collect()
}

/// The judged rows' requests over `range`, each row's with the hash its keys are below (see
/// [`thresholds`]), read in one pass, checking `memory` after each hour.
async fn traces(
    engine: &Engine,
    in_force: &PolicySnapshot,
    review: &[Recommendation],
    range: Range,
    sample_keys: u64,
    memory: &QueryMemory,
) -> Result<BTreeMap<RowKey, (i64, Vec<Recorded>)>, QueryError> {
    // Only the judged rows' requests are read and kept: the others are not replayed. Each
    // row's requests are its limit's (an override's: its key's) of the keys it replays.
    let mut traces: BTreeMap<RowKey, (i64, Vec<Recorded>)> = BTreeMap::new();
    let mut read = Vec::new();
    let judged: Vec<&Recommendation> = review.iter().filter(|r| Proven::judged(r)).collect();
    let most = max_requests(engine.limits().memory_bytes);
    for (r, below) in judged.iter().zip(thresholds(&judged, sample_keys, most)) {
        tracing::debug!(
            tier = r.tier_id,
            route_class = r.route_class_id,
            override_key = r.override_key.as_deref().unwrap_or("-"),
            keys = r.keys,
            requests = r.requests,
            rate = below as f64 / whatif::ALL_KEYS as f64,
            "proof: the keys of a judged limit it replays"
        );
        traces.insert(row_key(r)?, (below, Vec::new()));
        let mut condition = format!(
            "tier = {} AND route_class = {}",
            r.tier_id, r.route_class_id
        );
        if let Some(key) = &r.override_key {
            condition += &format!(" AND key_id = X'{key}'");
        }
        if below < whatif::ALL_KEYS {
            condition += &format!(" AND verdict_key_hash(key_id) < {below}");
        }
        read.push(format!("({condition})"));
    }
    if !traces.is_empty() {
        let read = read.join(" OR ");
        // One pass over the range: each request to its row's trace (an overridden key's to
        // its override's row), the hours in order, each hour sorted as the replay needs.
        for hour in whatif::recorded_hours(engine, range).await? {
            for r in whatif::recorded_hour_of(engine, hour, range, &read).await? {
                let overridden = matches!(
                    in_force.resolve(&r.key_id, RouteClassId(r.route_class), TierId(r.tier)),
                    LimitLookup::Check {
                        overridden: true,
                        ..
                    }
                );
                let key = (r.tier, r.route_class, overridden.then_some(r.key_id));
                if let Some((below, trace)) = traces.get_mut(&key)
                    && key_hash(&r.key_id.0) < *below
                {
                    trace.push(r);
                }
            }
            tracing::trace!(
                hour = %hour,
                held = traces.values().map(|(_, t)| t.len()).sum::<usize>(),
                used_mib = memory.used() >> 20,
                "proof: an hour's requests read"
            );
            whatif::within(engine, memory)?;
        }
    }
    Ok(traces)
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: &str = include_str!("../fixtures/policies/prove.toml");

    const T0: i64 = 1_796_047_200_000;

    /// `keys` keys each sending `per_hour` requests evenly over one hour.
    fn trace(keys: u8, per_hour: i64) -> Vec<Recorded> {
        let mut t: Vec<Recorded> = (0..keys)
            .flat_map(|k| {
                (0..per_hour).map(move |i| Recorded {
                    key_id: KeyId([k; 16]),
                    route_class: 0,
                    time_ms: T0 + i * 3_600_000 / per_hour,
                    tier: 0,
                    region: 0,
                    sub_key: 0,
                    refused: false,
                    by_bucket: false,
                    by_window: false,
                })
            })
            .collect();
        t.sort_unstable();
        t
    }

    fn row(doc: &verdict_limiter::PolicyDocument, verdict: &str, by_window: i64) -> Recommendation {
        let l = &doc.limits[0];
        Recommendation {
            tier_id: 0,
            route_class_id: 0,
            override_key: None,
            verdict: verdict.into(),
            hourly_quota: l.hourly_quota,
            capacity: l.capacity,
            refill_per_s: l.refill_per_s,
            recommended_quota: l.hourly_quota,
            recommended_capacity: l.capacity,
            recommended_refill_per_s: l.refill_per_s,
            refused_by_bucket: 0,
            refused_by_window: by_window,
            keys: 20,
            requests: 3_000,
        }
    }

    const TARGETS: Targets = Targets {
        too_low_share: 0.1,
        constrained_share: 0.01,
    };

    /// Twenty keys each sending 150 an hour under `policy`, its limit judged too low by
    /// its quota, proven.
    fn too_low_at_150(policy: &str) -> Proven {
        let doc = verdict_limiter::policy::parse_toml(policy).unwrap();
        prove_row(
            &doc,
            &row(&doc, "too low", 1_000),
            &trace(20, 150),
            &ShareModel::Static,
            TARGETS,
        )
        .unwrap()
    }

    #[test]
    fn a_quota_too_low_is_raised_to_the_first_round_value_its_replay_clears() {
        // Every key needs 150 an hour against 100: each is refused a third.
        let p = too_low_at_150(POLICY);
        assert_eq!(p.wrong, Some(Wrong::Quota));
        assert!(p.met);
        let r = &p.recommendation;
        assert_eq!(
            (r.recommended_quota, r.recommended_capacity),
            (150, 1000),
            "the bucket is kept: only the quota was short"
        );
        let (in_force, recommended) = (p.in_force.unwrap(), p.recommended.unwrap());
        assert!(
            (in_force.share_of_requests - 1.0 / 3.0).abs() < 0.01,
            "{p:?}"
        );
        assert_eq!(in_force.share_of_keys_constrained, 1.0);
        assert_eq!(
            (recommended.share_of_requests, recommended.share_of_keys),
            (0.0, 0.0)
        );
        assert!(p.replays <= 12, "{} replays", p.replays);
    }

    #[test]
    fn a_bucket_short_behind_a_quota_too_low_is_raised_with_it() {
        // A quota of 10 an hour in front of a bucket of 5 that refills 3.6 tokens an hour:
        // the window refuses first, so the review sees the quota alone short; raising it
        // alone, the bucket refuses instead. Both are raised by one factor.
        let p = too_low_at_150(
            &POLICY
                .replace("capacity = 1000", "capacity = 5")
                .replace("refill_per_s = 100.0", "refill_per_s = 0.001")
                .replace("hourly_quota = 100", "hourly_quota = 10"),
        );
        assert!(p.met, "{p:#?}");
        assert_eq!(p.wrong, Some(Wrong::QuotaAndBucket));
        let r = &p.recommendation;
        assert!(r.recommended_quota >= 150, "{r:?}");
        assert!(r.recommended_capacity > 5, "{r:?}");
        assert_eq!(p.recommended.unwrap().share_of_keys_constrained, 0.0);
    }

    #[test]
    fn a_limit_too_high_is_lowered_while_it_refuses_no_more_than_in_force() {
        let doc =
            verdict_limiter::policy::parse_toml(&POLICY.replace("= 100\n", "= 1000\n")).unwrap();
        assert_eq!(doc.limits[0].hourly_quota, 1000);
        let p = prove_row(
            &doc,
            &row(&doc, "too high", 0),
            &trace(20, 10),
            &ShareModel::Static,
            TARGETS,
        )
        .unwrap();
        assert!(p.met);
        assert_eq!(p.wrong, Some(Wrong::QuotaAndBucket));
        let r = &p.recommendation;
        // Ten a key an hour, one every six minutes: a quota of 10 and a bucket of one token
        // (refilled at a tenth a second, the bucket's time scale kept) refuse nothing.
        assert_eq!((r.recommended_quota, r.recommended_capacity), (10, 1));
        assert!((r.recommended_refill_per_s - 0.1).abs() < 1e-9, "{r:?}");
        assert_eq!(p.recommended.unwrap().share_of_requests, 0.0);
    }

    #[test]
    fn a_fine_limit_is_kept_and_not_replayed() {
        let doc = verdict_limiter::policy::parse_toml(POLICY).unwrap();
        let p = Proven::kept(&row(&doc, "fine", 0));
        assert_eq!((p.wrong, p.met, p.replays), (None, true, 0));
        assert_eq!(p.recommendation.recommended_quota, 100);
        assert!(!p.recommendation.changes());
        assert_eq!((p.in_force, p.recommended), (None, None));
    }

    #[test]
    fn round_values_have_two_significant_digits_and_ascend() {
        let v = round_values();
        assert_eq!(&v[..12], &[1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25]);
        assert!(v.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(*v.last().unwrap(), 1_000_000_000);
        assert!(v.contains(&1_500) && v.contains(&250_000) && !v.contains(&1_700));
    }

    #[test]
    fn the_first_meeting_candidate_is_found_by_bisection_and_was_tried() {
        let c: Vec<u32> = (0..100).collect();
        let mut asked = Vec::new();
        let i = first_meeting(&c, |&v| {
            asked.push(v);
            Ok(v >= 37)
        })
        .unwrap();
        assert_eq!(i, Some(37));
        assert!(asked.contains(&37));
        assert!(asked.len() <= 8, "{asked:?}");
        assert_eq!(first_meeting(&c, |_| Ok(false)).unwrap(), None);
        assert_eq!(first_meeting::<u32>(&[], |_| Ok(true)).unwrap(), None);
    }

    /// The keys a limit's proof replays: every key up to the sample; past it about the
    /// sample; past the requests the proofs may hold, every limit's share made smaller by
    /// one factor; an override's key always.
    #[test]
    fn the_proofs_samples_follow_the_keys_and_the_requests_they_hold() {
        let doc = verdict_limiter::policy::parse_toml(POLICY).unwrap();
        let limit = |keys: i64, requests: i64| Recommendation {
            keys,
            requests,
            ..row(&doc, "too low", 1)
        };
        let rate = |t: i64| t as f64 / whatif::ALL_KEYS as f64;
        let (small, large) = (limit(100, 50_000), limit(100_000, 2_000_000));
        let t = thresholds(&[&small, &large], 8_192, 4_000_000);
        assert_eq!(t[0], whatif::ALL_KEYS);
        assert!((rate(t[1]) - 0.08192).abs() < 1e-9, "{}", rate(t[1]));
        // 100 keys sending 50 M and 100,000 sending 2 billion: 50 M + 164 M requests held
        // at these rates; an override's key holds 3 M of the 4 M, so both rates are the
        // 1 M left / 213.84 M of theirs.
        let (busy, huge) = (limit(100, 50_000_000), limit(100_000, 2_000_000_000));
        let mut key = limit(1, 3_000_000);
        key.override_key = Some("00112233445566778899aabbccddeeff".into());
        let t = thresholds(&[&busy, &huge, &key], 8_192, 4_000_000);
        let scale = 1_000_000.0 / (50_000_000.0 + 0.08192 * 2_000_000_000.0);
        assert!((rate(t[0]) - scale).abs() < 1e-6, "{}", rate(t[0]));
        assert!(
            (rate(t[1]) - 0.08192 * scale).abs() < 1e-6,
            "{}",
            rate(t[1])
        );
        assert_eq!(t[2], whatif::ALL_KEYS, "an override's key is replayed");
        // A quarter of 1 GiB holds 8.4 M requests of 32 bytes.
        assert_eq!(std::mem::size_of::<Recorded>(), 32);
        assert_eq!(max_requests(1 << 30), 8_388_608);
    }
}
