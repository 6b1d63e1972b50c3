//! The regions' static weights, judged by the replay. With several regions each enforces
//! its weight's share of every limit (until the reconcile moves it). When a region sends a
//! share of the requests far from its weight's share, the weights may be what is wrong
//! rather than the limits: the review proposes weights in proportion to where the requests
//! came from and replays the range under the policy in force with them, beside the policy
//! in force as it is. The weights are recommended only when that replay refuses fewer
//! requests than the weights in force and leaves no more than the proof's keys tolerance
//! of the keys worse off (a key is worse off when it is refused more than one request, or
//! 1 % of its requests, more than with the weights in force): weights that help a busy
//! region's keys at the expense of another region's are not a fix (a key living in one
//! region is the reconcile's to serve). Weights help where keys send from several regions
//! in a mix unlike the weights. The limits' recommendations are
//! then proven with the recommended weights (so they raise less where the weights were the
//! problem). Otherwise the answer says the weights were judged and are kept, with both
//! replays' figures.

use serde::Serialize;
use verdict_limiter::PolicySnapshot;
use verdict_limiter::policy::PolicyDocument;

use crate::engine::Engine;
use crate::error::QueryError;
use crate::memory::QueryMemory;
use crate::prove::{KEYS_TOLERANCE, REQUESTS_TOLERANCE};
use crate::range::Range;
use crate::shares::ShareModel;
use rustc_hash::FxHashMap;
use verdict_schemas::KeyId;

use crate::whatif::{self, Replay, WhatIf};

/// How far a region's share of the requests must be from its weight's share (percentage
/// points, as a fraction) before the weights are judged.
pub const MISMATCH: f64 = 0.10;
/// No region is recommended less than this weight, in percent of the whole: a region with
/// little traffic today still needs a share to start from.
pub const MIN_WEIGHT_PERCENT: f64 = 5.0;

/// One region's weight, in force and recommended.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RegionWeight {
    /// Region id.
    pub region: u16,
    /// Its name in the policy.
    pub name: String,
    /// Its weight in force.
    pub weight: f64,
    /// The share of every limit that weight gives it.
    pub share: f64,
    /// Its share of the range's requests.
    pub share_of_requests: f64,
    /// The weight recommended: its share of the requests in whole percent, at least
    /// [`MIN_WEIGHT_PERCENT`].
    pub recommended_weight: f64,
}

/// What a replay refused over the whole range: shares of requests and of keys.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Refused {
    /// Share of the requests refused.
    pub share_of_requests: f64,
    /// Share of the keys (key × route class) refused at least once.
    pub share_of_keys: f64,
}

impl Refused {
    /// Over every limit of `w`.
    pub fn of(w: &WhatIf) -> Self {
        let sum = |f: fn(&whatif::Counts) -> u64| w.limits.iter().map(|l| f(&l.candidate)).sum();
        let (requests, refused, keys, keys_refused): (u64, u64, u64, u64) = (
            sum(|c| c.requests),
            sum(|c| c.refused),
            sum(|c| c.keys),
            sum(|c| c.keys_refused),
        );
        Self {
            share_of_requests: refused as f64 / requests.max(1) as f64,
            share_of_keys: keys_refused as f64 / keys.max(1) as f64,
        }
    }
}

/// The weights judged.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Weights {
    /// Every listed region, in id order.
    pub regions: Vec<RegionWeight>,
    /// The replay of the range under the policy in force, and under it with the weights
    /// recommended.
    pub refused_with_weights_in_force: Refused,
    pub refused_with_recommended_weights: Refused,
    /// Whether the weights are recommended (their replay refuses fewer requests than the
    /// weights in force, beyond the proof's tolerance, and leaves at most the keys
    /// tolerance of the keys worse off).
    pub recommended: bool,
    /// The share of the range's keys both replays replayed (1: every key; below 1, a sample
    /// of about [`whatif::SAMPLE_KEYS`] keys chosen by key, as the what-if's, and the shares
    /// above are estimated from it).
    pub sample_rate: f64,
    /// Why, in words.
    pub reason: String,
    /// The policy in force with the weights recommended.
    #[serde(skip)]
    pub weighted: Option<PolicyDocument>,
}

/// Judges the weights of `in_force` over `range`: `None` with fewer than two regions, or
/// when every region's share of the requests is within [`MISMATCH`] of its weight's share.
/// Past [`whatif::SAMPLE_KEYS`] keys in the range, both replays are of the what-if's sample
/// of them; what they hold counts against a query's memory limit.
pub async fn judge(
    engine: &Engine,
    in_force: &PolicySnapshot,
    range: Range,
    model: &ShareModel,
) -> Result<Option<Weights>, QueryError> {
    if !in_force.is_multi_region() {
        return Ok(None);
    }
    let memory = QueryMemory::claim(engine.limits().memory_bytes);
    let judged = memory
        .enter(judge_counted(engine, in_force, range, model, &memory))
        .await;
    tracing::debug!(
        peak_mib = memory.peak() >> 20,
        "weights: the replays' memory at its largest"
    );
    judged
}

/// [`judge`] of several regions, its memory counted in `memory`.
async fn judge_counted(
    engine: &Engine,
    in_force: &PolicySnapshot,
    range: Range,
    model: &ShareModel,
    memory: &QueryMemory,
) -> Result<Option<Weights>, QueryError> {
    let in_range = whatif::keys_in_range(engine, range).await?;
    let replay = |policy: PolicySnapshot| {
        Replay::with_shares(policy, model.clone()).sampled_past(whatif::SAMPLE_KEYS, in_range)
    };
    let mut in_force_replay = replay(in_force.clone());
    whatif::feed_range(engine, &mut in_force_replay, range, memory).await?;
    let sample_rate = in_force_replay.rate();
    let before: FxHashMap<(KeyId, u8), u64> = in_force_replay
        .by_key()
        .map(|(k, _, refused)| (k, refused))
        .collect();
    let replayed = &in_force_replay.finish(range, 0);
    let doc = in_force.document();
    let total: u64 = replayed.regions.iter().map(|r| r.requests).sum();
    if total == 0 {
        return Ok(None);
    }
    let mut regions: Vec<RegionWeight> = doc
        .regions
        .iter()
        .map(|r| {
            let requests = replayed
                .regions
                .iter()
                .find(|x| x.region == r.id)
                .map_or(0, |x| x.requests);
            let share_of_requests = requests as f64 / total as f64;
            RegionWeight {
                region: r.id,
                name: r.name.clone(),
                weight: r.weight,
                share: f64::from(in_force.region_static_ppm(verdict_schemas::RegionId(r.id)))
                    / f64::from(verdict_limiter::algo::PPM),
                share_of_requests,
                recommended_weight: (share_of_requests * 100.0).round().max(MIN_WEIGHT_PERCENT),
            }
        })
        .collect();
    regions.sort_by_key(|r| r.region);
    let worst = regions
        .iter()
        .max_by(|a, b| {
            (a.share_of_requests - a.share)
                .abs()
                .total_cmp(&(b.share_of_requests - b.share).abs())
        })
        .cloned();
    let Some(worst) = worst.filter(|w| (w.share_of_requests - w.share).abs() >= MISMATCH) else {
        return Ok(None);
    };
    let mut weighted = doc.clone();
    for r in &mut weighted.regions {
        if let Some(w) = regions.iter().find(|w| w.region == r.id) {
            r.weight = w.recommended_weight;
        }
    }
    let weighted_doc = weighted.clone();
    let weighted = PolicySnapshot::build(weighted).map_err(|e| {
        QueryError::Invalid(format!("the policy with the recommended weights: {e}"))
    })?;
    let mut weighted_replay = replay(weighted.clone());
    whatif::feed_range(engine, &mut weighted_replay, range, memory).await?;
    let (mut keys, mut worse) = (0u64, 0u64);
    for (k, requests, refused) in weighted_replay.by_key() {
        keys += 1;
        let was = before.get(&k).copied().unwrap_or(0);
        let slack = 1.max((requests as f64 * 0.01).ceil() as u64);
        worse += u64::from(refused > was + slack);
    }
    let worse_share = worse as f64 / keys.max(1) as f64;
    let with = weighted_replay.finish(range, 0);
    let (now, rec) = (Refused::of(replayed), Refused::of(&with));
    let recommended = rec.share_of_requests + REQUESTS_TOLERANCE < now.share_of_requests
        && worse_share <= KEYS_TOLERANCE;
    let pct = |x: f64| format!("{:.0} %", x * 100.0);
    let pct2 = |x: f64| format!("{:.2} %", x * 100.0);
    let reason = format!(
        "{} sends {} of the requests with {} of every limit; with weights by the requests the \
         limits in force refuse {} of the requests and {} of the keys, against {} and {} with \
         the weights in force{}",
        worst.name,
        pct(worst.share_of_requests),
        pct(worst.share),
        pct2(rec.share_of_requests),
        pct(rec.share_of_keys),
        pct2(now.share_of_requests),
        pct(now.share_of_keys),
        if recommended {
            ": the weights are recommended, and the limits below proven with them".to_owned()
        } else if worse_share > KEYS_TOLERANCE {
            format!(
                ": the weights in force are kept ({} of the keys would be refused more, {} of \
                 them)",
                pct(worse_share),
                worse
            )
        } else {
            ": the weights in force are kept (they refuse no more requests)".to_owned()
        },
    );
    Ok(Some(Weights {
        regions,
        refused_with_weights_in_force: now,
        refused_with_recommended_weights: rec,
        recommended,
        reason,
        weighted: recommended.then_some(weighted_doc),
        sample_rate,
    }))
}
