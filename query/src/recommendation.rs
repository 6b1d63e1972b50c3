//! The review's rows as a recommendation: each limit's verdict, the values in force and the
//! recommended ones, read from the answer of `wrong-limits`, and put into a policy document
//! (see [`apply`]), which [`crate::prove`] replays and [`crate::recommend`] answers with.
//!
//! A limit row written for every route class (`route_class = "*"`) that the review changes
//! for one class gets a row of its own for that class; an override written for every class
//! gets an override of its own for the class the review changed. Everything else (mode, hot
//! keys, regions, kill switches) is the policy in force, untouched.

use arrow::array::{Array, AsArray, FixedSizeBinaryArray, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Float64Type, Int64Type};
use serde::Serialize;
use verdict_limiter::PolicySnapshot;
use verdict_limiter::policy::{ALL_ROUTES, LimitRow, OverrideRow, PolicyDocument};
use verdict_schemas::KeyId;

use crate::error::QueryError;

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
    /// The limit's active keys (key × route class) in the range, as the review counted
    /// them (estimated where it sampled): the proof replays a sample of them past
    /// [`crate::prove::SAMPLE_KEYS`].
    pub keys: i64,
    /// The limit's requests in the range, as the review counted them: what its proof would
    /// hold with every key (see [`crate::prove::max_requests`]).
    pub requests: i64,
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
        let (keys, requests) = (ints("keys")?, ints("requests")?);
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
                keys: i64s(&keys, i),
                requests: i64s(&requests, i),
            });
        }
    }
    Ok(out)
}

/// A refill as a policy writes it: three decimals at most (the limiter's resolution).
pub fn round_refill(r: f64) -> f64 {
    (r * 1000.0).round() / 1000.0
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
