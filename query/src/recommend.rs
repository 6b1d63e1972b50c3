//! The review's recommendation, replayed. The limit review (`wrong-limits`) recommends a
//! quota, a capacity and a refill for every limit it calls too low or too high; this module
//! puts those into the policy in force and replays the review's own range under the result
//! ([`crate::whatif`]), so the answer says what share of keys and of requests the
//! recommended limits would have refused, beside what the limits in force refused.
//!
//! A limit row written for every route class (`route_class = "*"`) that the review changes
//! for one class gets a row of its own for that class; an override written for every class
//! gets an override of its own for the class the review changed. Everything else (mode, hot
//! keys, regions, kill switches) is the policy in force, untouched.

use std::collections::BTreeMap;

use arrow::array::{Array, AsArray, FixedSizeBinaryArray, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Float64Type, Int64Type};
use serde::Serialize;
use verdict_limiter::PolicySnapshot;
use verdict_limiter::policy::{ALL_ROUTES, LimitRow, OverrideRow, PolicyDocument};
use verdict_schemas::KeyId;

use crate::engine::Engine;
use crate::error::QueryError;
use crate::prove::{self, Proven, Targets};
use crate::reports::Range;
use crate::shares::ShareModel;
use crate::weights::{self, Weights};
use crate::whatif::{self, LimitName, WhatIf};

/// One row of the review, as the recommendation needs it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recommendation {
    /// Tier id.
    pub tier_id: u8,
    /// Route class id.
    pub route_class_id: u8,
    /// The key, for the row of a key with an override (32 hex digits).
    pub override_key: Option<String>,
    /// The review's verdict.
    pub verdict: String,
    /// The hourly quota in force.
    pub hourly_quota: i64,
    /// The capacity in force.
    pub capacity: i64,
    /// The refill in force, tokens per second.
    pub refill_per_s: f64,
    /// The recommended hourly quota.
    pub recommended_quota: i64,
    /// The recommended capacity.
    pub recommended_capacity: i64,
    /// The recommended refill, tokens per second.
    pub recommended_refill_per_s: f64,
    /// Refusals in the range in which the bucket refused.
    pub refused_by_bucket: i64,
    /// Refusals in the range in which the window (the hourly quota) refused.
    pub refused_by_window: i64,
}

impl Recommendation {
    /// Whether the review would change this limit.
    pub fn changes(&self) -> bool {
        self.recommended_quota != self.hourly_quota
            || self.recommended_capacity != self.capacity
            || self.recommended_refill_per_s != self.refill_per_s
    }
}

/// The review's rows (the columns `wrong-limits` answers).
pub fn read(batches: &[RecordBatch]) -> Result<Vec<Recommendation>, QueryError> {
    let mut out = Vec::new();
    for batch in batches {
        let column = |name: &str, to: &DataType| {
            let c = batch.column_by_name(name).ok_or_else(|| {
                QueryError::Invalid(format!("the review's answer has no column {name}"))
            })?;
            cast(c, to).map_err(|e| {
                QueryError::Invalid(format!("the review's column {name} as {to}: {e}"))
            })
        };
        let ints = |name: &str| column(name, &DataType::Int64);
        let (tier, route) = (ints("tier_id")?, ints("route_class_id")?);
        let (quota, capacity) = (ints("hourly_quota")?, ints("capacity")?);
        let (rec_quota, rec_capacity) = (ints("recommended_quota")?, ints("recommended_capacity")?);
        let refill = column("refill_per_s", &DataType::Float64)?;
        let rec_refill = column("recommended_refill_per_s", &DataType::Float64)?;
        let verdict = column("verdict", &DataType::Utf8)?;
        let (by_bucket, by_window) = (ints("refused_by_bucket")?, ints("refused_by_window")?);
        let key = batch.column_by_name("override_key").ok_or_else(|| {
            QueryError::Invalid("the review's answer has no column override_key".into())
        })?;
        let key = key.as_any().downcast_ref::<FixedSizeBinaryArray>();
        let i64s = |a: &arrow::array::ArrayRef, i: usize| a.as_primitive::<Int64Type>().value(i);
        let f64s = |a: &arrow::array::ArrayRef, i: usize| a.as_primitive::<Float64Type>().value(i);
        for i in 0..batch.num_rows() {
            let override_key = key.filter(|k| k.is_valid(i)).map(|k| {
                let mut id = [0u8; 16];
                id.copy_from_slice(k.value(i));
                KeyId(id).to_string()
            });
            out.push(Recommendation {
                tier_id: u8::try_from(i64s(&tier, i)).map_err(|_| QueryError::Internal)?,
                route_class_id: u8::try_from(i64s(&route, i)).map_err(|_| QueryError::Internal)?,
                override_key,
                verdict: verdict.as_string::<i32>().value(i).to_owned(),
                hourly_quota: i64s(&quota, i),
                capacity: i64s(&capacity, i),
                refill_per_s: f64s(&refill, i),
                recommended_quota: i64s(&rec_quota, i),
                recommended_capacity: i64s(&rec_capacity, i),
                recommended_refill_per_s: f64s(&rec_refill, i),
                refused_by_bucket: i64s(&by_bucket, i),
                refused_by_window: i64s(&by_window, i),
            });
        }
    }
    Ok(out)
}

/// `doc` with every recommendation that changes a limit put in, validated as the limiter
/// validates a policy; its version is one past `doc`'s.
pub fn apply(
    doc: &PolicyDocument,
    recommendations: &[Recommendation],
) -> Result<PolicySnapshot, QueryError> {
    let mut out = doc.clone();
    out.version = doc.version + 1;
    let unknown = |what: &str, id: u8| {
        QueryError::Invalid(format!(
            "the review names {what} id {id}, which the policy in force does not have"
        ))
    };
    for r in recommendations.iter().filter(|r| r.changes()) {
        let tier = doc
            .tiers
            .iter()
            .find(|t| t.id == r.tier_id)
            .ok_or_else(|| unknown("tier", r.tier_id))?;
        let route = doc
            .route_classes
            .iter()
            .find(|c| c.id == r.route_class_id)
            .ok_or_else(|| unknown("route class", r.route_class_id))?;
        let (capacity, refill_per_s, hourly_quota) = (
            r.recommended_capacity,
            round_refill(r.recommended_refill_per_s).max(0.001),
            r.recommended_quota,
        );
        match &r.override_key {
            None => {
                let own = out
                    .limits
                    .iter()
                    .position(|l| l.tier == tier.name && l.route_class == route.name);
                let row = match own {
                    Some(i) => &mut out.limits[i],
                    None => {
                        let all = out
                            .limits
                            .iter()
                            .find(|l| l.tier == tier.name && l.route_class == ALL_ROUTES)
                            .ok_or_else(|| unknown("tier", r.tier_id))?;
                        out.limits.push(LimitRow {
                            route_class: route.name.clone(),
                            ..all.clone()
                        });
                        out.limits.last_mut().ok_or(QueryError::Internal)?
                    }
                };
                (row.capacity, row.refill_per_s, row.hourly_quota) =
                    (capacity, refill_per_s, hourly_quota);
            }
            Some(key) => {
                let key_id: KeyId = key.parse().map_err(|_| QueryError::Internal)?;
                let own = out
                    .overrides
                    .iter()
                    .position(|o| o.key_id == key_id && o.route_class == route.name);
                let row = match own {
                    Some(i) => &mut out.overrides[i],
                    None => {
                        let all = out
                            .overrides
                            .iter()
                            .find(|o| o.key_id == key_id && o.route_class == ALL_ROUTES)
                            .ok_or_else(|| {
                                QueryError::Invalid(format!(
                                    "the review names an override of key {key}, which the policy \
                                     in force does not have"
                                ))
                            })?;
                        out.overrides.push(OverrideRow {
                            route_class: route.name.clone(),
                            ..all.clone()
                        });
                        out.overrides.last_mut().ok_or(QueryError::Internal)?
                    }
                };
                (row.capacity, row.refill_per_s, row.hourly_quota) =
                    (capacity, refill_per_s, hourly_quota);
            }
        }
    }
    PolicySnapshot::build(out)
        .map_err(|e| QueryError::Invalid(format!("the recommended policy does not validate: {e}")))
}

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

/// A refill as a policy writes it: three decimals at most (the limiter's resolution).
fn round_refill(r: f64) -> f64 {
    (r * 1000.0).round() / 1000.0
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
    let targets = Targets::from_params(&params)?;
    let sql = engine.report_sql("wrong-limits", &params).await?;
    let (_, batches) = engine.collect(&sql, usize::MAX).await?;
    replay_review(engine, read(&batches)?, range, targets, keys).await
}

/// Proves the recommendations of `review` (the review's rows over `range`, see [`read`],
/// judged with `targets`), puts them into the policy in force and replays `range` under
/// them.
pub async fn replay_review(
    engine: &Engine,
    review: Vec<Recommendation>,
    range: Range,
    targets: Targets,
    keys: usize,
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
    let weights = weights::judge(engine, &in_force, range, &model).await?;
    let in_force = match weights.as_ref().and_then(|w| w.weighted.clone()) {
        Some(doc) => std::sync::Arc::new(PolicySnapshot::build(doc).map_err(|e| {
            QueryError::Invalid(format!("the policy with the recommended weights: {e}"))
        })?),
        None => in_force,
    };
    let proven = prove::prove(engine, &in_force, &review, range, &model, targets).await?;
    let review: Vec<Recommendation> = proven.iter().map(|p| p.recommendation.clone()).collect();
    let candidate = apply(in_force.document(), &review)?;
    let what_if = whatif::what_if(engine, candidate.clone(), range, keys).await?;
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
                ""
            } else {
                " (no round value within reach met the target: kept)"
            },
        );
    }
    t += &format!("Caveat: {}.\n", w.caveat);
    t
}
