//! The review's recommendation, replayed. The limit review (`wrong-limits`) recommends a
//! quota, a capacity and a refill for every limit it calls too low or too high; this module
//! puts those into the policy in force and replays the review's own range under the result
//! ([`crate::whatif`]), so the answer says what share of keys and of requests the
//! recommended limits would have refused, beside what the limits in force refused.
//! How a recommendation becomes a policy is [`crate::recommendation`]'s.

use std::collections::BTreeMap;

use serde::Serialize;
use verdict_limiter::PolicySnapshot;
use verdict_limiter::policy::PolicyDocument;

use crate::engine::{Engine, RunOptions};
use crate::error::QueryError;
use crate::prove::{self, Proven, Targets};
use crate::range::Range;
use crate::recommendation::{Recommendation, apply, read, round_refill};
use crate::reports::Form;
use crate::shares::ShareModel;
use crate::weights::{self, Weights};
use crate::whatif::{self, LimitName, WhatIf};

/// One limit of the answer: what the review said, and the share refused, in force and
/// recommended.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RecommendedLimit {
    /// Which tier × route class.
    #[serde(flatten)]
    pub limit: LimitName,
    /// The review's verdict on the tier's limit (not its overrides').
    pub verdict: Option<String>,
    /// The hourly quota in force, and recommended.
    pub hourly_quota: (i64, i64),
    /// The capacity in force, and recommended.
    pub capacity: (i64, i64),
    /// Requests replayed.
    pub requests: u64,
    /// Keys (key × route class) that sent requests.
    pub keys: u64,
    /// Share of requests refused: recorded, and replayed under the recommendation.
    pub share_of_requests_refused: (f64, f64),
    /// Share of keys refused at least once: recorded, and under the recommendation.
    pub share_of_keys_refused: (f64, f64),
}

/// The recommendation replayed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Replayed {
    /// The review's rows, each recommendation proven ([`crate::prove`]).
    pub review: Vec<Recommendation>,
    /// Each row's proof: which part was wrong, whether the target was met, and what the
    /// limit in force and the recommendation refused in the replay of the row's own keys.
    pub proven: Vec<Proven>,
    /// Per tier × route class (overrides counted in their tier's), in the replay's order.
    pub limits: Vec<RecommendedLimit>,
    /// The replay itself, with the keys whose refusals change most.
    pub what_if: WhatIf,
    /// The regions' weights, judged by replaying them (see [`crate::weights`]): `None`
    /// with one region, or when each region's share of the requests is near its weight's.
    pub weights: Option<Weights>,
    /// The policy in force with every proven recommendation put in (and the weights, when
    /// recommended): what
    /// `verdict what-if --recommended --write-policy` writes.
    #[serde(skip)]
    pub candidate: PolicyDocument,
}

impl Replayed {
    /// The `verdict policy set-limit` commands that put the proven recommendations into a
    /// PostgreSQL policy, one per limit or override changed.
    pub fn set_limit_commands(&self) -> Vec<String> {
        let doc = &self.candidate;
        let name = |id: u8, tiers: bool| {
            if tiers {
                doc.tiers
                    .iter()
                    .find(|t| t.id == id)
                    .map(|t| t.name.clone())
            } else {
                doc.route_classes
                    .iter()
                    .find(|r| r.id == id)
                    .map(|r| r.name.clone())
            }
            .unwrap_or_else(|| format!("#{id}"))
        };
        self.review
            .iter()
            .filter(|r| r.changes())
            .map(|r| {
                let key = r
                    .override_key
                    .as_ref()
                    .map(|k| format!(" --key {k}"))
                    .unwrap_or_default();
                format!(
                    "verdict policy set-limit --policy-postgres \"$VERDICT_POLICY_POSTGRES\" \
                     --tier {} --route-class {}{key} --hourly-quota {} --capacity {} \
                     --refill-per-s {}",
                    name(r.tier_id, true),
                    name(r.route_class_id, false),
                    r.recommended_quota,
                    r.recommended_capacity,
                    round_refill(r.recommended_refill_per_s),
                )
            })
            .collect()
    }
}

/// Runs the review over `params` (its parameters, `from` and `to` included), puts its
/// recommendations into the policy in force and replays the same range under them.
pub async fn replay(
    engine: &Engine,
    params: &BTreeMap<String, String>,
    now: chrono::DateTime<chrono::Utc>,
    keys: usize,
) -> Result<Replayed, QueryError> {
    // The review's own default range (7 days to the next full hour).
    let range = Range::parse(
        params.get("from").map(String::as_str),
        params.get("to").map(String::as_str),
        now,
        7,
    )?;
    let mut params = params.clone();
    params.insert("from".into(), range.from.to_rfc3339());
    params.insert("to".into(), range.to.to_rfc3339());
    let sample_keys = proof_sample_keys(params.remove(PROOF_SAMPLE_KEYS).as_deref())?;
    let targets = Targets::from_params(&params)?;
    let sql = engine
        .report_sql("wrong-limits", &params, Form::Served)
        .await?;
    let batches = engine.collect(&sql, &RunOptions::default()).await?.batches;
    replay_review(engine, read(&batches)?, range, targets, keys, sample_keys).await
}

/// The parameter that sets the keys of a limit its proof replays whole (past it, a
/// sample): [`prove::SAMPLE_KEYS`] unless given.
pub const PROOF_SAMPLE_KEYS: &str = "proof_sample_keys";

/// The value of [`PROOF_SAMPLE_KEYS`]: a whole number from 1 to 1,000,000,000.
fn proof_sample_keys(value: Option<&str>) -> Result<u64, QueryError> {
    match value {
        Some(v) => v
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|k| (1..=1_000_000_000).contains(k))
            .ok_or_else(|| {
                QueryError::Invalid(format!(
                    "parameter {PROOF_SAMPLE_KEYS}: {} is not a whole number from 1 to \
                     1000000000",
                    crate::error::shown(v)
                ))
            }),
        None => Ok(prove::SAMPLE_KEYS),
    }
}

/// Proves the recommendations of `review` (the review's rows over `range`, see [`read`],
/// judged with `targets`, each limit's proof replaying up to `sample_keys` of its keys, see
/// [`prove::prove`]), puts them into the policy in force and replays `range` under them.
pub async fn replay_review(
    engine: &Engine,
    review: Vec<Recommendation>,
    range: Range,
    targets: Targets,
    keys: usize,
    sample_keys: u64,
) -> Result<Replayed, QueryError> {
    let in_force = engine
        .policies()
        .snapshot()
        .await
        .map_err(|e| QueryError::from_datafusion(e, engine.limits()))?
        .ok_or_else(|| {
            QueryError::Invalid(
                "no policy source is configured (--policy-file or --policy-pg): there is no \
                 policy in force to put the recommendation into"
                    .into(),
            )
        })?;
    // The weights first: where they are what is wrong, the limits are proven with the
    // weights recommended.
    let model = ShareModel::recorded(engine, range).await?;
    // The weights' replays, the proof and the what-if below each count their memory
    // against a query's limit.
    let weights = weights::judge(engine, &in_force, range, &model).await?;
    let in_force = match weights.as_ref().and_then(|w| w.weighted.clone()) {
        Some(doc) => std::sync::Arc::new(PolicySnapshot::build(doc).map_err(|e| {
            QueryError::Invalid(format!("the policy with the recommended weights: {e}"))
        })?),
        None => in_force,
    };
    let proven = prove::prove(
        engine,
        &in_force,
        &review,
        range,
        &model,
        targets,
        sample_keys,
    )
    .await?;
    let review: Vec<Recommendation> = proven.iter().map(|p| p.recommendation.clone()).collect();
    let candidate = apply(in_force.document(), &review)?;
    let what_if =
        whatif::what_if(engine, candidate.clone(), range, keys, whatif::SAMPLE_KEYS).await?;
    let limits = what_if
        .limits
        .iter()
        .map(|l| {
            let own = review.iter().find(|r| {
                r.override_key.is_none()
                    && r.tier_id == l.limit.tier_id
                    && r.route_class_id == l.limit.route_class_id
            });
            let rule = |s: &PolicySnapshot| {
                s.rule(
                    verdict_schemas::TierId(l.limit.tier_id),
                    verdict_schemas::RouteClassId(l.limit.route_class_id),
                )
                .map_or((0, 0), |r| {
                    (i64::from(r.limits.quota), i64::from(r.limits.capacity))
                })
            };
            let (now, rec) = (rule(&in_force), rule(&candidate));
            RecommendedLimit {
                limit: l.limit.clone(),
                verdict: own.map(|r| r.verdict.clone()),
                hourly_quota: (now.0, rec.0),
                capacity: (now.1, rec.1),
                requests: l.candidate.requests,
                keys: l.candidate.keys,
                share_of_requests_refused: (
                    l.recorded.share_of_requests_refused(),
                    l.candidate.share_of_requests_refused(),
                ),
                share_of_keys_refused: (
                    l.recorded.share_of_keys_refused(),
                    l.candidate.share_of_keys_refused(),
                ),
            }
        })
        .collect();
    Ok(Replayed {
        review,
        proven,
        limits,
        what_if,
        weights,
        candidate: candidate.document().clone(),
    })
}

/// The answer as text for a terminal: a line per limit, then the overrides changed.
pub fn render(r: &Replayed) -> String {
    let pct = |x: f64| format!("{:.2} %", x * 100.0);
    let w = &r.what_if;
    let mut t = format!(
        "The review's recommendation replayed: {} recorded requests from {} to {}\n",
        w.decisions,
        w.from.to_rfc3339(),
        w.to.to_rfc3339(),
    );
    t += &format!(
        "  {:<12} {:<10} {:<16} {:>17} {:>15} {:>21} {:>21}\n",
        "tier",
        "route",
        "verdict",
        "quota now → rec.",
        "bucket now → rec.",
        "requests refused",
        "keys refused"
    );
    for l in &r.limits {
        t += &format!(
            "  {:<12} {:<10} {:<16} {:>17} {:>15} {:>21} {:>21}\n",
            l.limit.tier_label(),
            l.limit.route_label(),
            l.verdict.as_deref().unwrap_or("-"),
            format!("{} → {}", l.hourly_quota.0, l.hourly_quota.1),
            format!("{} → {}", l.capacity.0, l.capacity.1),
            format!(
                "{} → {}",
                pct(l.share_of_requests_refused.0),
                pct(l.share_of_requests_refused.1)
            ),
            format!(
                "{} → {}",
                pct(l.share_of_keys_refused.0),
                pct(l.share_of_keys_refused.1)
            ),
        );
    }
    let overrides: Vec<&Recommendation> = r
        .review
        .iter()
        .filter(|o| o.override_key.is_some() && o.changes())
        .collect();
    for o in overrides {
        let route = r
            .limits
            .iter()
            .find(|l| l.limit.route_class_id == o.route_class_id)
            .map_or_else(
                || format!("#{}", o.route_class_id),
                |l| l.limit.route_label(),
            );
        t += &format!(
            "  override of key {} on {route} ({}): quota {} → {}, bucket {} → {}\n",
            o.override_key.as_deref().unwrap_or_default(),
            o.verdict,
            o.hourly_quota,
            o.recommended_quota,
            o.capacity,
            o.recommended_capacity
        );
    }
    if let Some(shares) = &w.shares {
        t += &format!("Regions: {shares}.\n");
    }
    if let Some(weights) = &r.weights {
        t += &format!("The regions' weights: {}.\n", weights.reason);
        if weights.sample_rate < 1.0 {
            t += &format!(
                "  (both replays of a sample of {:.1} % of the keys)\n",
                weights.sample_rate * 100.0
            );
        }
        for g in &weights.regions {
            t += &format!(
                "  {:<16} weight {} ({:.0} % of every limit), {:.0} % of the requests{}\n",
                g.name,
                g.weight,
                g.share * 100.0,
                g.share_of_requests * 100.0,
                if weights.recommended {
                    format!(": weight {} recommended", g.recommended_weight)
                } else {
                    String::new()
                },
            );
        }
    }
    t += "Each recommendation, proven by replaying its own keys' requests (refused: requests, keys):\n";
    for p in &r.proven {
        let rec = &p.recommendation;
        let Some(wrong) = p.wrong else { continue };
        let route = r
            .limits
            .iter()
            .find(|l| l.limit.route_class_id == rec.route_class_id)
            .map_or_else(
                || format!("#{}", rec.route_class_id),
                |l| l.limit.route_label(),
            );
        let tier = r
            .limits
            .iter()
            .find(|l| l.limit.tier_id == rec.tier_id)
            .map_or_else(|| format!("#{}", rec.tier_id), |l| l.limit.tier_label());
        let whose = rec
            .override_key
            .as_ref()
            .map_or_else(|| format!("{tier} {route}"), |k| format!("key {k} {route}"));
        t += &format!(
            "  {whose} ({}, {}): quota {} → {}, bucket {} → {} (refill {} → {}/s); in force {} / {}, recommended {} / {}{}\n",
            rec.verdict,
            wrong.as_str(),
            rec.hourly_quota,
            rec.recommended_quota,
            rec.capacity,
            rec.recommended_capacity,
            round_refill(rec.refill_per_s),
            round_refill(rec.recommended_refill_per_s),
            pct(p.in_force.unwrap_or_default().share_of_requests),
            pct(p.in_force.unwrap_or_default().share_of_keys),
            pct(p.recommended.unwrap_or_default().share_of_requests),
            pct(p.recommended.unwrap_or_default().share_of_keys),
            if p.met {
                String::new()
            } else {
                " (no round value within reach met the target: kept)".to_owned()
            } + &if p.sample_rate < 1.0 {
                format!(
                    " [a sample of {:.1} % of its {} keys]",
                    p.sample_rate * 100.0,
                    rec.keys
                )
            } else {
                String::new()
            },
        );
    }
    t += &format!("Caveat: {}.\n", w.caveat);
    t
}
