//! `wrong-limits`, the limit review: per tier × route class, and per key with an override,
//! the distribution of the active keys' demand against the limit, refusals split and
//! attributed, a verdict with its reason in words, and a recommended limit.
//!
//! It is SQL over `decisions` and `policies` that uses nothing but CTEs, window functions and
//! arithmetic: percentiles are nearest-rank, taken as the smallest value whose rank is at
//! least ⌈p·n⌉, rather than an engine's own percentile function.
//!
//! With several regions, a key's need (the global quota its busiest hour calls for) and its
//! peak span are taken against the share of the limit its region can hold, as the limiter
//! enforces shares over the range. On static shares (no round of the reconcile recorded in
//! the range, `reconcile_rounds`), each region holds its weight's share alone: the need is
//! the most any region's requests in the hour call for over its share. With the reconcile,
//! the regions pool the global quota (a round gives a key's quota to where its traffic is,
//! and keeps what a region already used there): the need is the key's requests in the hour
//! over all regions, over the most a round gives one region (all but the others' floor,
//! `1 - floor × (1 - share)`). A burst is one region's either way, over what its region can
//! hold.
//!
//! The levels up to the key are nearly all of the work (seconds over a week of raw
//! decisions), and they merge across midnights. So the query service reads each key's row
//! from `review_parts(from, to)` ([`crate::parts`], [`super::levels::REVIEW`]): the range
//! cut at midnights, each piece's rows computed once and kept while the piece's files and
//! the policy stay the same. The statement that reads the decisions all the way
//! ([`KeysFrom::Decisions`]) is the portable one, which the benchmark runs in DuckDB too,
//! and gives the same rows.

use chrono::{DateTime, Utc};

use super::levels::HOME_BASE;
use super::params::{Args, FROM, ROUTE, Report, TIER, TO};
use super::review::{
    KeysFrom, LIMIT, ReviewParams, STANDS_FOR, estimated, flagged, keyed, review_keys,
    sample_param, thresholds,
};
use crate::error::QueryError;

/// The report.
pub(super) fn report() -> Report {
    Report {
        name: "wrong-limits",
        sql,
        description: "The limit review. For each tier × route class, and for each key with an \
            override: the demand of its active keys, not only their refusals. A key's hourly \
            demand is the most requests it made in one clock hour (allowed, refused and \
            would-deny alike) over the hourly quota it had there (`demand_*`, 1.0 = all of \
            it); its burst is the most it made in one span of the bucket's own time scale \
            (capacity / refill seconds, spans counted from the Unix epoch) as a multiple of \
            the capacity (`burst_*`; a steady caller at the refill rate is at 1.0, and no \
            bucket admits more than 2.0 in a span). `demand_p50` … \
            `demand_max` and `burst_p50` … `burst_max` are their distributions over the \
            active keys (nearest rank). Refusals are split: enforced and would-deny, by \
            bucket and by window; a key is constrained when at least `constrained_share` \
            of its requests were refused; the top 1 % of keys by refusals (at least one) \
            are outliers, override or abuse candidates, and `outlier_refusal_share` is \
            their part of the refusals. A key is engaged when its demand or its burst is at \
            least `engaged_use`. Verdict: `not enough data` below `min_keys` active keys \
            (a tier row; an override row is its one key); `too low` when the \
            `percentile` engaged key needs more than the quota or the bucket and at least \
            `too_low_share` of the keys are constrained (refusals spread over many keys, \
            not a few abusers or intended bursts); `too high` when even the p99 key uses \
            less than `too_high_use` of both and no key is constrained; else `fine`. \
            `reason` says why in words. Shadow limits are judged on their would-deny the \
            same way. `recommended_quota` is the p99 engaged key's need (its busiest \
            hour in a region over that region's share) times `headroom`, and `recommended_capacity` / `recommended_refill_per_s` \
            scale the bucket so the p99 engaged key's busiest span fits with the same \
            headroom, each rounded to two significant digits; a `fine` limit keeps its \
            values. Demand is compared like with like: against the quota each region \
            enforced (its share of the global `hourly_quota`; `enforced_quota` is the \
            largest), bursts against the region's share of the bucket (`regions`), so the \
            recommendation is a global limit of which each region's share covers its \
            keys. Decisions of the kill switch and of \
            mode off count nothing and are left out. The percentiles are taken over \
            `sampled_keys`: every active key up to `sample_keys` per tier × route class, \
            past it a sample of them chosen by key (a key is in it on every day or on \
            none); `percentile_bound` is then how far the sampled p99 may lie from all \
            keys' p99, in percentile points (two standard errors), and 0 when every key is \
            in the sample. The keys, engaged keys and keys per region never refused are then \
            estimated from the sample (the refused ones counted); refusals, constrained \
            keys, the outliers' refusals, requests, the largest demand and burst and the \
            quotas are always over every key.",
        tables: &["decisions", "policies", "regions"],
        params: [FROM, TO, TIER, ROUTE]
            .into_iter()
            .chain(thresholds())
            .chain([sample_param()])
            .collect(),
    }
}

/// The SQL of `wrong-limits`.
fn sql(a: &Args<'_>, now: DateTime<Utc>) -> Result<String, QueryError> {
    Ok(review_sql(&review_keys(a, now)?, &ReviewParams::of(a)?))
}

/// A number rounded to two significant digits, as SQL over a positive `x` (at least 1).
fn two_digits(x: &str) -> String {
    format!(
        "GREATEST(1, CAST(ROUND(({x}) / POWER(10.0, FLOOR(LOG10(GREATEST(({x}), 1.0))) - 1)) \
         * POWER(10.0, FLOOR(LOG10(GREATEST(({x}), 1.0))) - 1) AS BIGINT))"
    )
}

/// `x` as text with two decimals at most, as SQL.
fn two_decimals(x: &str) -> String {
    format!("CAST(ROUND(({x}), 2) AS VARCHAR)")
}

/// `x` (a share) as a whole percentage, as SQL.
fn percent(x: &str) -> String {
    format!("CAST(CAST(ROUND(100.0 * ({x})) AS BIGINT) AS VARCHAR)")
}

/// How much larger a region's part of a limit's constrained keys must be than its part of
/// the limit's keys, at least, for the reason of a limit too low to name it (it must also
/// hold half of the constrained keys at least).
pub const DRIVING_RATIO: f64 = 1.5;

/// How far apart (as a ratio) the largest regional quotas of two policy versions must be
/// for the review to say the quota in force changed (see `review_sql`).
pub const VERSION_QUOTA_RATIO: f64 = 1.1;

/// The nearest-rank percentile `q` of `v` among a limit's keys (only the engaged ones when
/// `engaged`): the smallest value ranked at least ⌈q·n⌉, by the window functions' ranks
/// (`rn_…` of `ranked`) or by `verdict_nearest_rank` (see `crate::ranks`).
fn nearest_rank(windows: bool, v: &str, q: f64, engaged: bool) -> String {
    if windows {
        let (cond, rn, n) = if engaged {
            ("engaged AND ", format!("rn_e_{v}"), "n_engaged")
        } else {
            ("", format!("rn_{v}"), "n")
        };
        return format!("MIN(CASE WHEN {cond}{rn} >= CEIL({q} * {n}) THEN {v} END)");
    }
    // The sampled keys' values (every key's where the limit has no more keys than the
    // sample takes).
    let x = if engaged {
        format!("CASE WHEN sampled AND engaged THEN CAST({v} AS DOUBLE) END")
    } else {
        format!("CASE WHEN sampled THEN CAST({v} AS DOUBLE) END")
    };
    format!("verdict_nearest_rank({x}, {q})")
}

/// The review's SQL over each key's row from `keys`.
fn review_sql(keys: &KeysFrom, p: &ReviewParams) -> String {
    let ReviewParams {
        percentile,
        too_low_share,
        too_high_use,
        min_keys,
        headroom,
        ..
    } = *p;
    let pct_name = format!("p{}", (percentile * 100.0).round() as i64);
    let limit = LIMIT;
    // Keys read from the decisions are ranked with window functions (the portable
    // statement); keys read from kept parts with the service's own aggregates, which give
    // the same values (see `crate::ranks`).
    let windows = matches!(keys, KeysFrom::Decisions { .. });
    let nearest = |v: &str, q: f64, engaged: bool| nearest_rank(windows, v, q, engaged);
    // Over kept parts the keys' rows are the sample's and the refused keys' (see
    // `review::per_key_from_parts`): what is said of every key of a limit (its requests,
    // the largest demand and burst, the quotas) comes from `totals`, carried on each row as
    // `limit_…`; the keys are the sample's, each standing for `weight` keys.
    let sampled = keys.sampled();
    let whole = |portable: &str, from_totals: &str| -> String {
        if sampled {
            from_totals.to_owned()
        } else {
            portable.to_owned()
        }
    };
    let maxima = [
        whole("MAX(demand)", "MAX(limit_demand_max)"),
        whole(
            "MAX(burst)",
            "MAX(limit_span_max) / GREATEST(1, MAX(capacity))",
        ),
    ];
    let mut dist = String::new();
    for (v, max) in ["demand", "burst"].into_iter().zip(maxima) {
        for (suffix, q) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99)] {
            dist += &format!(",\n    {} AS {v}_{suffix}", nearest(v, q, false));
        }
        dist += &format!(",\n    {max} AS {v}_max");
    }
    let over_limit = format!(" OVER (PARTITION BY {limit})");
    let in_region = whole(
        &format!("COUNT(*) OVER (PARTITION BY {limit}, home_region)"),
        &format!("SUM({STANDS_FOR}) OVER (PARTITION BY {limit}, home_region)"),
    );
    let key_count = whole("COUNT(*)", &estimated("TRUE", ""));
    let engaged_count = whole(
        "SUM(CASE WHEN engaged THEN 1 ELSE 0 END)",
        &estimated("engaged", ""),
    );
    let sampled_count = whole("COUNT(*)", "SUM(CASE WHEN sampled THEN 1 ELSE 0 END)");
    let limit_rows = whole(
        "",
        &format!(",\n    {} AS key_estimate", estimated("TRUE", &over_limit)),
    );
    let quotas = whole(
        "MIN(quota_low) AS quota_low, MAX(quota_high) AS quota_high,
    MIN(quota_ceiling) AS quota_ceiling, MAX(enforced) AS enforced",
        "MIN(limit_quota_low) AS quota_low, MAX(limit_quota_high) AS quota_high,
    MIN(limit_quota_ceiling) AS quota_ceiling, MAX(limit_enforced) AS enforced",
    );
    let requests = whole("SUM(requests)", "MAX(limit_requests)");
    let typical_demand = nearest("demand", percentile, true);
    let typical_burst = nearest("burst", percentile, true);
    let need_p99 = nearest("need", 0.99, true);
    let peak_burst_p99 = nearest("burst", 0.99, true);
    let all_need_p99 = nearest("need", 0.99, false);
    let (ctes, source, outlier_keys, outlier_refused) = if windows {
        (
            format!("{}\n)", keyed(keys, p)),
            "ranked",
            "CAST(MAX(GREATEST(1, CEIL(0.01 * n))) AS BIGINT)".to_owned(),
            "SUM(CASE WHEN rn_refused <= GREATEST(1, CEIL(0.01 * n)) THEN refused ELSE 0 END)"
                .to_owned(),
        )
    } else {
        // The top 1 % of the limit's keys by refusals: of its keys estimated, from the
        // refused keys, every one of which is read.
        (
            flagged(keys, p),
            "flagged",
            format!(
                "CAST(GREATEST(1, CEIL(0.01 * {})) AS BIGINT)",
                estimated("TRUE", "")
            ),
            "CAST(verdict_top_sum_of(CAST(refused AS DOUBLE), \
             GREATEST(1.0, CEIL(0.01 * key_estimate))) AS BIGINT)"
                .to_owned(),
        )
    };
    let verdict = format!(
        "CASE WHEN l.override_key IS NULL AND l.keys < {min_keys} THEN 'not enough data'
       WHEN (l.typical_demand > 1.0 OR l.typical_burst > 1.0)
         AND l.constrained_keys >= {too_low_share} * l.keys THEN 'too low'
       WHEN l.demand_p99 < {too_high_use} AND l.burst_p99 < {too_high_use}
         AND l.constrained_keys = 0 THEN 'too high'
       ELSE 'fine' END"
    );
    let needs = format!(
        "'{pct_name} engaged key needs ' || {} || '× the hourly quota and ' || {} || '× the bucket'",
        two_decimals("COALESCE(l.typical_demand, 0.0)"),
        two_decimals("COALESCE(l.typical_burst, 0.0)"),
    );
    let constrained = format!(
        "{} || ' % of keys constrained'",
        percent("CAST(l.constrained_keys AS DOUBLE) / l.keys")
    );
    let outliers = format!(
        "CASE WHEN l.refused > 0 THEN '; the top 1 % of keys (' || CAST(l.outlier_keys AS VARCHAR) \
         || ') made ' || {} || ' % of the refusals' ELSE '' END",
        percent("CAST(l.outlier_refused AS DOUBLE) / l.refused")
    );
    // The quota in force changed only where the policy did (two versions in the range) and
    // where the regions' quotas say so twice: over their static shares they disagree (a
    // region's quota is its share of the global one rounded down, so q / share lies within
    // 1 / share below the global quota, and those ranges do not meet), and the largest
    // regional quota of one version is more than a tenth off another's. The reconcile moves
    // a key's regional quota between rounds, which the first test alone takes for a
    // change; under it, the largest regional quota of each version is its global quota
    // times the largest share any key's region was given (which stays near the whole while
    // some key's traffic is in one region), so a change of less than a tenth is not named.
    let changed = format!(
        "CASE WHEN l.versions > 1 AND l.quota_high > l.quota_ceiling \
           AND l.enforced_high > {VERSION_QUOTA_RATIO} * l.enforced_low \
         THEN '; the quota in force changed in the range (policy versions with regional quotas up to ' \
         || CAST(l.enforced_low AS VARCHAR) || ' and up to ' \
         || CAST(l.enforced_high AS VARCHAR) || ')' ELSE '' END"
    );
    // A region drives a verdict of too low when it holds most of the constrained keys and
    // clearly fewer of the keys: its keys meet the limit where the others' do not (its
    // share is too small for them, or its keys send more). The region holding the most
    // constrained keys (the lowest id among equals) is found with window functions over
    // the keys already ranked, so that the keys' levels are computed once (a second
    // reference to them is a second scan of the decisions): the largest of its constrained
    // keys × `HOME_BASE` + (`HOME_BASE` - 1 - its id) over the limit's keys, one maximum
    // over an unordered window (with `FIRST_VALUE` over a window ordered by the constrained
    // keys, the review over the bench's 33.6 M decisions from stored parts took 5.2 s; with
    // this, 1.8 s). The division is floored: DuckDB and Spark divide integers into a double.
    // (`HOME_BASE` - 1 is written as one number: DataFusion names a window over an
    // expression with a constant subtraction in it one way when planning and another once
    // simplified, and then cannot find it.)
    let (base, last) = (HOME_BASE, HOME_BASE - 1);
    let top = format!("constrained_in_region * {base} + ({last} - home_region)");
    let driving = format!(
        "CASE WHEN l.constrained_keys > 0 \
           AND l.region_constrained >= 0.5 * l.constrained_keys \
           AND CAST(l.region_constrained AS DOUBLE) / l.constrained_keys \
             >= {DRIVING_RATIO} * CAST(l.region_keys AS DOUBLE) / l.keys \
         THEN '; ' || COALESCE(l.region_name, 'region ' || CAST(l.home_region AS VARCHAR)) \
           || '''s keys are ' || {} || ' % of those constrained and ' || {} || ' % of the keys' \
         ELSE '' END",
        percent("CAST(l.region_constrained AS DOUBLE) / l.constrained_keys"),
        percent("CAST(l.region_keys AS DOUBLE) / l.keys"),
    );
    let reason = format!(
        "CASE WHEN l.override_key IS NULL AND l.keys < {min_keys} THEN CAST(l.keys AS VARCHAR) \
           || ' active keys, fewer than the ' || CAST({min_keys} AS VARCHAR) || ' needed to judge'
       WHEN (l.typical_demand > 1.0 OR l.typical_burst > 1.0)
         AND l.constrained_keys >= {too_low_share} * l.keys THEN {needs} || '; ' || {constrained} \
           || {driving} || {changed}
       WHEN l.demand_p99 < {too_high_use} AND l.burst_p99 < {too_high_use}
         AND l.constrained_keys = 0 THEN 'p99 key uses ' || {p99d} || '× the hourly quota and ' \
           || {p99b} || '× the bucket; no key constrained'
       ELSE {needs} || '; ' || {constrained} || {outliers} || {changed} END",
        p99d = two_decimals("l.demand_p99"),
        p99b = two_decimals("l.burst_p99"),
    );
    let versions = keys.versions();
    let judged = "v.verdict IN ('too low', 'too high')";
    // Scaling capacity and refill by the same factor keeps the bucket's time scale, and scales
    // what it admits in one span by that factor: the burst (a share of that) says how much.
    let rec_quota = two_digits(&format!(
        "COALESCE(v.need_p99, v.all_need_p99) * {headroom}"
    ));
    let rec_capacity = two_digits(&format!(
        "COALESCE(v.peak_burst_p99, v.burst_p99) * {headroom} * v.capacity"
    ));
    format!(
        "{ctes}, regional AS (
  SELECT *,
    {in_region} AS in_region,
    SUM(CASE WHEN constrained THEN 1 ELSE 0 END) OVER (PARTITION BY {limit}, home_region)
      AS constrained_in_region{limit_rows}
  FROM {source}
), driven AS (
  SELECT *,
    MAX({top}) OVER (PARTITION BY {limit}) AS top
  FROM regional
), per_limit AS (
  SELECT {limit}, MAX(mode) AS mode, MAX(capacity) AS capacity,
    MAX(refill_per_s) AS refill_per_s, MAX(hourly_quota) AS hourly_quota, MAX(span_s) AS span_s,
    {quotas},
    {key_count} AS keys, {engaged_count} AS engaged_keys, {sampled_count} AS sampled_keys,
    SUM(CASE WHEN constrained THEN 1 ELSE 0 END) AS constrained_keys,
    {requests} AS requests, SUM(denied) AS denied, SUM(would_deny) AS would_deny,
    SUM(by_bucket) AS refused_by_bucket, SUM(by_window) AS refused_by_window,
    SUM(refused) AS refused,
    {outlier_keys} AS outlier_keys,
    {outlier_refused} AS outlier_refused{dist},
    {typical_demand} AS typical_demand,
    {typical_burst} AS typical_burst,
    {need_p99} AS need_p99,
    {peak_burst_p99} AS peak_burst_p99,
    {all_need_p99} AS all_need_p99,
    {last} - MAX(top) % {base} AS home_region, CAST(FLOOR(MAX(top) / {base}) AS BIGINT) AS region_constrained,
    MAX(CASE WHEN {top} = top THEN in_region END) AS region_keys
  FROM driven
  GROUP BY {limit}
), version_quotas AS (
  SELECT tier, route_class, COUNT(*) AS versions, MIN(enforced) AS enforced_low,
    MAX(enforced) AS enforced_high
  FROM ({versions}) v
  GROUP BY tier, route_class
), judged AS (
  SELECT l.*, {verdict} AS verdict, {reason} AS reason
  FROM (SELECT p.*, q.versions, q.enforced_low, q.enforced_high, g.name AS region_name
    FROM per_limit p
    LEFT JOIN version_quotas q ON q.tier = p.tier AND q.route_class = p.route_class
    LEFT JOIN regions g ON g.region = p.home_region) l
)
SELECT v.tier AS tier_id, p.tier, v.route_class AS route_class_id, p.route_class,
  v.override_key, v.mode, v.hourly_quota, v.enforced AS enforced_quota, v.capacity,
  v.refill_per_s, v.keys, v.engaged_keys, v.constrained_keys,
  CAST(v.constrained_keys AS DOUBLE) / v.keys AS share_keys_constrained,
  v.requests, v.denied, v.would_deny, v.refused_by_bucket, v.refused_by_window,
  CAST(v.refused AS DOUBLE) / v.requests AS refusal_rate,
  v.outlier_keys,
  CASE WHEN v.refused > 0 THEN CAST(v.outlier_refused AS DOUBLE) / v.refused ELSE 0.0 END AS outlier_refusal_share,
  v.demand_p50, v.demand_p90, v.demand_p99, v.demand_max,
  v.burst_p50, v.burst_p90, v.burst_p99, v.burst_max,
  v.verdict, v.reason,
  CASE WHEN {judged} THEN {rec_quota} ELSE v.hourly_quota END AS recommended_quota,
  CASE WHEN {judged} THEN {rec_capacity} ELSE v.capacity END AS recommended_capacity,
  CASE WHEN {judged} THEN v.refill_per_s * {rec_capacity} / GREATEST(v.capacity, 1)
       ELSE v.refill_per_s END AS recommended_refill_per_s,
  v.sampled_keys,
  CASE WHEN v.sampled_keys < v.keys
    THEN 200.0 * SQRT(0.99 * 0.01 / v.sampled_keys) ELSE 0.0 END AS percentile_bound
FROM judged v
LEFT JOIN policies p ON p.kind = 'limit' AND p.tier_id = v.tier AND p.route_class_id = v.route_class
ORDER BY v.tier, v.route_class, v.override_key NULLS FIRST"
    )
}
