//! What the demo did ([`DemoReport`]), the questions it asks the history for it, and the
//! text it prints ([`render`]).

use std::collections::BTreeMap;

use serde::Serialize;
use verdict_query::reports::Form;
use verdict_query::{Collected, Engine, RunOptions};
use verdict_schemas::HourPartition;

use crate::config::{DemoConfig, EXAMPLE_SQL};

/// What the demo did, as printed.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct DemoReport {
    /// Hours of traffic on the limiter's clock.
    pub demo_hours: u32,
    /// Requests per second the generator aimed at.
    pub target_rate: u32,
    /// Requests sent through the gateway.
    pub requests: u64,
    /// Answers per second through the gateway.
    pub answered_per_s: f64,
    /// Client-side latency through the gateway (and the upstream), from when each request
    /// was sent, ms.
    pub p50_ms: f64,
    /// The same, 99th percentile.
    pub p99_ms: f64,
    /// Answers by HTTP status.
    pub statuses: BTreeMap<u16, u64>,
    /// Requests without an answer.
    pub failed: u64,
    /// 429s without a Retry-After (there should be none).
    pub limited_without_retry_after: u64,
    /// Decision events that reached the queue's consumer.
    pub events: u64,
    /// Allowed.
    pub allowed: u64,
    /// Refused with 429.
    pub denied: u64,
    /// Refusals shadow mode turned into allows.
    pub would_deny: u64,
    /// Decided by the local fallback rather than the counter store.
    pub degraded: u64,
    /// Each region's traffic, in the order of [`crate::regions::REGIONS`].
    pub regions: Vec<RegionTraffic>,
    /// Rounds of the regional reconcile, recorded in the lake's `reconcile_rounds`.
    pub reconcile_rounds: usize,
    /// Events the gateways' queues dropped (verdict_events_dropped_total).
    pub events_dropped: u64,
    /// Bytes of one event on the wire.
    pub wire_bytes_per_event: usize,
    /// Partitions of the queue.
    pub partitions: u16,
    /// Events that did not decode (there should be none).
    pub undecodable: u64,
    /// Raw files written.
    pub files: usize,
    /// Hour partitions written.
    pub hours: usize,
    /// Parquet bytes written.
    pub parquet_bytes: u64,
    /// Parquet bytes per event.
    pub parquet_bytes_per_event: f64,
    /// Seconds of traffic.
    pub traffic_s: f64,
    /// Seconds spent decoding, sorting, encoding Parquet and writing.
    pub write_s: f64,
    /// Where the raw table is.
    pub raw_table: String,
    /// Rows of the denied-only hourly rollup (groups with a refusal).
    pub rollup_rows: usize,
    /// Bytes of the rollup objects.
    pub rollup_bytes: usize,
    /// Denials counted by the rollup (the 429s, once each).
    pub rollup_denied: u64,
    /// Would-denies counted by the rollup.
    pub rollup_would_deny: u64,
    /// Seconds spent rolling the hours up.
    pub rollup_s: f64,
    /// The `wrong-limits` report over the demo's hours.
    pub wrong_limits: Vec<WrongLimit>,
    /// The review's recommendation replayed over the demo's hours.
    pub recommendation: Option<verdict_query::recommend::Replayed>,
    /// The `shadow-impact` report over the demo's hours.
    pub shadow_impact: Vec<ShadowImpact>,
    /// Seconds the reports took.
    pub query_s: f64,
    /// The first and the last hour of traffic, UTC.
    pub first_hour: String,
    /// See `first_hour`.
    pub last_hour: String,
    /// The hour after the last, where the analysts' page's range ends.
    pub end_hour: String,
}

/// One region's traffic.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct RegionTraffic {
    /// Its name.
    pub name: String,
    /// Its static weight in the policy.
    pub weight: f64,
    /// Decisions its gateway made.
    pub events: u64,
    /// Of those, refused (denied or would-deny).
    pub refused: u64,
}

/// One row of the `wrong-limits` report, as the demo prints it.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct WrongLimit {
    /// Tier name.
    pub tier: String,
    /// Route class name.
    pub route_class: String,
    /// The key, for the row of a key with an override.
    pub override_key: Option<String>,
    /// Active keys.
    pub keys: u64,
    /// The hourly quota in force.
    pub hourly_quota: u64,
    /// The p90 key's busiest hour, as a multiple of its quota.
    pub demand_p90: f64,
    /// too low, too high, fine or not enough data.
    pub verdict: String,
    /// Why, in words.
    pub reason: String,
    /// The hourly quota the review recommends, as proven by the replay.
    pub recommended_quota: u64,
}

/// One row of the `shadow-impact` report, as the demo prints it.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ShadowImpact {
    /// Tier name (a tier in shadow mode).
    pub tier: String,
    /// Route class name.
    pub route_class: String,
    /// Requests.
    pub requests: u64,
    /// Requests that enforcing would have refused.
    pub would_deny: u64,
    /// Keys that sent requests.
    pub keys: u64,
    /// Keys that would have been refused at least once.
    pub keys_would_deny: u64,
}

/// The reports' `from` and `to` for the hours `first` to `last`.
fn range_params(first: HourPartition, last: HourPartition) -> BTreeMap<String, String> {
    let ts = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .map(|t| t.to_rfc3339())
            .unwrap_or_default()
    };
    [
        ("from".to_string(), ts(first.start_ms())),
        ("to".to_string(), ts(last.end_ms())),
    ]
    .into()
}

/// Asks the history of the hours `first` to `last` what the demo reports: the rollup's
/// totals, the limit review with its recommendation replayed, and `shadow-impact`.
pub(crate) async fn ask(
    engine: &Engine,
    first: HourPartition,
    last: HourPartition,
    report: &mut DemoReport,
) -> anyhow::Result<()> {
    let range = range_params(first, last);
    let totals = rows(
        engine,
        "SELECT SUM(denied) AS denied, SUM(would_deny) AS would_deny FROM denied_hourly",
    )
    .await?;
    let total = |name: &str| totals.first().map_or(0, |r| number(r, name) as u64);
    report.rollup_denied = total("denied");
    report.rollup_would_deny = total("would_deny");
    // The review runs once: its rows as printed, and its recommendation replayed.
    let sql = engine
        .report_sql("wrong-limits", &range, Form::Served)
        .await?;
    let Collected {
        schema, batches, ..
    } = engine
        .collect(&sql, &RunOptions::default().rows(100_000))
        .await?;
    report.wrong_limits = json_rows(&schema, &batches)?
        .iter()
        .map(|r| WrongLimit {
            tier: text(r, "tier"),
            route_class: text(r, "route_class"),
            override_key: r["override_key"].as_str().map(str::to_owned),
            keys: number(r, "keys") as u64,
            hourly_quota: number(r, "hourly_quota") as u64,
            demand_p90: number(r, "demand_p90"),
            verdict: text(r, "verdict"),
            reason: text(r, "reason"),
            recommended_quota: number(r, "recommended_quota") as u64,
        })
        .collect();
    let replay_range = verdict_query::range::Range::parse(
        range.get("from").map(String::as_str),
        range.get("to").map(String::as_str),
        chrono::Utc::now(),
        7,
    )?;
    let review = verdict_query::recommendation::read(&batches)?;
    let targets = verdict_query::prove::Targets::from_params(&range)?;
    let replayed = verdict_query::recommend::replay_review(
        engine,
        review,
        replay_range,
        targets,
        0,
        verdict_query::prove::SAMPLE_KEYS,
    )
    .await?;
    // The quota shown is the one the replay proved (the review's rows and the proven ones
    // are in the same order).
    for (row, proven) in report.wrong_limits.iter_mut().zip(&replayed.review) {
        if row.override_key == proven.override_key {
            row.recommended_quota = proven.recommended_quota.max(0) as u64;
        }
    }
    report.recommendation = Some(replayed);
    let sql = engine
        .report_sql("shadow-impact", &range, Form::Served)
        .await?;
    report.shadow_impact = rows(engine, &sql)
        .await?
        .iter()
        .map(|r| ShadowImpact {
            tier: text(r, "tier"),
            route_class: text(r, "route_class"),
            requests: number(r, "requests") as u64,
            would_deny: number(r, "would_deny") as u64,
            keys: number(r, "keys") as u64,
            keys_would_deny: number(r, "keys_would_deny") as u64,
        })
        .collect();
    Ok(())
}

/// Runs `sql` and returns its rows as the query service answers them: JSON objects,
/// column name → value.
pub(crate) async fn rows(engine: &Engine, sql: &str) -> anyhow::Result<Vec<serde_json::Value>> {
    let Collected {
        schema, batches, ..
    } = engine
        .collect(sql, &RunOptions::default().rows(100_000))
        .await?;
    json_rows(&schema, &batches)
}

/// An answer's rows as JSON objects (key ids as hex).
fn json_rows(
    schema: &arrow::datatypes::SchemaRef,
    batches: &[arrow::array::RecordBatch],
) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut answer: serde_json::Value =
        serde_json::from_slice(&verdict_query::format::json(schema, batches)?)?;
    Ok(match answer["rows"].take() {
        serde_json::Value::Array(rows) => rows,
        _ => Vec::new(),
    })
}

fn text(row: &serde_json::Value, name: &str) -> String {
    row[name].as_str().unwrap_or_default().to_owned()
}

pub(crate) fn number(row: &serde_json::Value, name: &str) -> f64 {
    row[name].as_f64().unwrap_or(0.0)
}

fn pct(part: u64, whole: u64) -> f64 {
    100.0 * part as f64 / whole.max(1) as f64
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1_000_000.0
}

/// The limit review's rows as the demo prints them: one line per limit with its verdict,
/// the reason and, where the review would change it, the recommended quota.
pub fn render_review(rows: &[WrongLimit]) -> String {
    let mut t = String::new();
    for w in rows {
        let limit = match &w.override_key {
            Some(key) => format!("{} {} key {key}", w.tier, w.route_class),
            None => format!("{} {}", w.tier, w.route_class),
        };
        let advice = if w.recommended_quota != w.hourly_quota {
            format!(
                "; recommended quota {} (now {})",
                w.recommended_quota, w.hourly_quota
            )
        } else {
            String::new()
        };
        t += &format!(
            "  {limit:<20} {:<15} {:>5} keys: {}{advice}\n",
            w.verdict, w.keys, w.reason
        );
    }
    t
}

/// Each region's weight and traffic, in a line.
fn render_regions(r: &DemoReport) -> String {
    let weights: f64 = r.regions.iter().map(|g| g.weight).sum();
    r.regions
        .iter()
        .map(|g| {
            format!(
                "{} (weight {:.0} %) {} decisions ({:.1} %), {:.1} % refused",
                g.name,
                100.0 * g.weight / weights.max(f64::MIN_POSITIVE),
                g.events,
                pct(g.events, r.events),
                pct(g.refused, g.events)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The text summary.
pub fn render(r: &DemoReport, cfg: &DemoConfig) -> String {
    let status = |code: u16| r.statuses.get(&code).copied().unwrap_or_default();
    let others: u64 = r
        .statuses
        .iter()
        .filter(|(code, _)| **code != 200 && **code != 429)
        .map(|(_, n)| n)
        .sum();
    let DemoReport {
        events: n,
        requests,
        target_rate: rate,
        answered_per_s: answered,
        p50_ms: p50,
        p99_ms: p99,
        limited_without_retry_after: no_retry,
        failed,
        allowed,
        denied,
        would_deny: would,
        degraded,
        events_dropped: dropped,
        reconcile_rounds: rounds,
        wire_bytes_per_event: wire,
        partitions: parts,
        files,
        hours: hour_parts,
        first_hour: first,
        last_hour: last,
        parquet_bytes_per_event: pq_per,
        write_s,
        rollup_rows,
        rollup_s,
        rollup_denied,
        rollup_would_deny: rollup_would,
        undecodable,
        traffic_s: secs,
        ..
    } = r;
    let DemoConfig {
        speed, keys, seed, ..
    } = cfg;
    let out = cfg.out.display();
    let minutes = secs * f64::from(*speed) / 60.0;
    let (ok, limited) = (status(200), status(429));
    let (allowed_p, denied_p, would_p) = (pct(*allowed, *n), pct(*denied, *n), pct(*would, *n));
    let regions = render_regions(r);
    let wire_mb = mb(*wire as u64 * n);
    let pq_mb = mb(r.parquet_bytes);
    let rollup_kb = r.rollup_bytes as f64 / 1000.0;
    let mut t = format!(
        "verdict demo: {minutes:.0} minutes of API traffic through the gateway in {secs:.0} s \
         (the limiter's clock runs {speed}x faster), {keys} keys (seed {seed})\n\
         \n\
         traffic       {requests} requests aimed at {rate}/s, answered at {answered:.0}/s; \
         client latency through the gateway p50 {p50:.2} ms, p99 {p99:.2} ms\n\
         answers       200: {ok}, 429: {limited} ({no_retry} without Retry-After), \
         other: {others}, no answer: {failed}\n\
         decisions     {n} events: allowed {allowed} ({allowed_p:.1} %), denied {denied} \
         ({denied_p:.1} %), would-deny in shadow mode {would} ({would_p:.1} %), by the local \
         fallback {degraded}; the queue dropped {dropped}\n\
         regions       {regions}; the reconcile ran {rounds} rounds (recorded in {out}/reconcile_rounds/)\n\
         on the wire   {wire} bytes per event, {wire_mb:.1} MB through {parts} queue partitions\n\
         raw table     {files} Parquet files in {hour_parts} hour partitions ({first} to {last}), \
         {pq_mb:.2} MB, {pq_per:.2} bytes per event, written in {write_s:.2} s\n\
         rollup        {rollup_rows} rows (key, tier, route class and region with a refusal), \
         {rollup_kb:.1} KB, in {rollup_s:.2} s; it counts {rollup_denied} denials (the client \
         saw {limited} 429s) and {rollup_would} would-denies\n\
         undecodable   {undecodable}\n",
    );
    t += &format!(
        "\nWhich limits were wrong? wrong-limits over {} to {} ({:.2} s for the reports and the replay):\n",
        r.first_hour, r.last_hour, r.query_s
    );
    t += &render_review(&r.wrong_limits);
    if let Some(replayed) = &r.recommendation {
        t += "\nWhat would the recommended limits have refused? ";
        t += &verdict_query::recommend::render(replayed);
    }
    t += "\nWhat would enforcing the tiers in shadow mode do? shadow-impact:\n";
    if r.shadow_impact.is_empty() {
        t += "  (no tier in shadow mode sent traffic)\n";
    }
    for s in &r.shadow_impact {
        t += &format!(
            "  {:<12} {:<8} {:>8} requests, {:>7} would get 429 ({:>4.1} %), {} of {} keys\n",
            s.tier,
            s.route_class,
            s.requests,
            s.would_deny,
            pct(s.would_deny, s.requests),
            s.keys_would_deny,
            s.keys
        );
    }
    t += &format!(
        "\nThe raw table is in {raw}/date=YYYY-MM-DD/hour=HH/, the rollup in {out}/rollup/denied_hourly/.\n\
         Ask more in SQL: start the query service on the same folder,\n  \
         verdict query serve --store {out} --policy-file {out}/policy.toml\n\
         then open the analysts' page on these hours,\n  \
         http://127.0.0.1:8089/#range=custom&from={first}:00&to={end}:00\n\
         or ask it directly, for example,\n  \
         curl -s 'http://127.0.0.1:8089/v1/reports/top-denied?from={first}:00:00Z&to={last}:59:59Z'\n  \
         curl -s http://127.0.0.1:8089/v1/sql -d \"{EXAMPLE_SQL}\"\n\
         The same gateway stands alone in front of any upstream:\n  \
         verdict gateway --upstream http://127.0.0.1:8080 --keys-file {out}/keys.csv --policy-file {out}/policy.toml\n",
        raw = r.raw_table,
        first = r.first_hour,
        last = r.last_hour,
        end = r.end_hour,
    );
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The review as the demo prints it, for rows of each verdict (the demo's own run
    /// prints its world's truth: free and starter too low, pro fine, enterprise too high).
    #[test]
    fn the_printed_review_gives_each_verdict_its_reason_and_recommendation() {
        let row =
            |tier: &str, verdict: &str, quota: u64, recommended: u64, reason: &str| WrongLimit {
                tier: tier.into(),
                route_class: "read".into(),
                override_key: None,
                keys: 60,
                hourly_quota: quota,
                demand_p90: 0.0,
                verdict: verdict.into(),
                reason: reason.into(),
                recommended_quota: recommended,
            };
        let mut rows = vec![
            row(
                "free",
                "too low",
                2,
                25,
                "p90 engaged key needs 7.5× the hourly quota and 0.9× the bucket; 97 % of keys constrained",
            ),
            row(
                "starter",
                "too low",
                30,
                150,
                "p90 engaged key needs 2.87× the hourly quota and 0.63× the bucket; 52 % of keys constrained",
            ),
            row(
                "pro",
                "fine",
                1500,
                1500,
                "p90 engaged key needs 0.49× the hourly quota and 0.33× the bucket; 2 % of keys constrained; the top 1 % of keys (1) made 100 % of the refusals",
            ),
            row(
                "enterprise",
                "too high",
                720605,
                11000,
                "p99 key uses 0.01× the hourly quota and 0.02× the bucket; no key constrained",
            ),
            row(
                "tiny",
                "not enough data",
                10,
                10,
                "4 active keys, fewer than the 10 needed to judge",
            ),
        ];
        rows[2].override_key = Some("a0000000000000000000000000000000".into());
        insta::assert_snapshot!(render_review(&rows));
    }
}
