//! The limit review (`wrong-limits`) judged against worlds with known answers
//! (`verdict_tests::review_world`): three seeds at two scales, each decided by the limiter's
//! own pure core and written as raw files to a local folder. The review must name exactly the
//! truth of every limit, and recommend a quota within ±20 % of the world's p99 demand.
//!
//! `cargo test -p verdict-tests --test services limit_review:: -- --nocapture` prints every world's rows.

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use serde_json::Value;
use verdict_query::range::Range;
use verdict_query::{Engine, Limits, PoliciesTable};
use verdict_query::{recommend, whatif};
use verdict_reconcile::round_log::RoundRecord;
use verdict_schemas::layout::HourPartition;
use verdict_schemas::{DecisionEvent, KeyId, Verdict};
use verdict_tests::query_fixture::{report_in, served_and_portable};
use verdict_tests::review_world::{
    HOURS, Regions, START_MS, TIERS, World, decide_all, limits, policy_text, policy_toml,
    snapshot_of, world, world_in, write_rounds, write_world,
};

/// An engine over a local folder holding `events` as raw files, with the world's policy.
async fn lake(events: &[DecisionEvent]) -> (Engine, tempfile::TempDir) {
    lake_with(events, &policy_toml(2)).await
}

/// An engine over a local folder holding `events` as raw files, with `policy` in force.
async fn lake_with(events: &[DecisionEvent], policy: &str) -> (Engine, tempfile::TempDir) {
    lake_of(events, policy, &[]).await
}

/// A lake of `events` and the reconcile's `rounds`, the policy in force `policy`.
async fn lake_of(
    events: &[DecisionEvent],
    policy: &str,
    rounds: &[RoundRecord],
) -> (Engine, tempfile::TempDir) {
    lake_limited(events, policy, rounds, Limits::default()).await
}

/// [`lake_of`] with the engine's `limits`.
async fn lake_limited(
    events: &[DecisionEvent],
    policy: &str,
    rounds: &[RoundRecord],
    limits: Limits,
) -> (Engine, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalFileSystem::new_with_prefix(dir.path()).expect("a local store"));
    let policy = write_world(&store, dir.path(), events, policy).await;
    if !rounds.is_empty() {
        write_rounds(&store, rounds).await;
    }
    // The hourly rollup, as the jobs run it: the denied rollup and the demand histogram.
    let rollup = verdict_rollup::Rollup::new(Arc::clone(&store), 2);
    for h in 0..HOURS {
        let hour = HourPartition::from_event_time_ms(START_MS + h * 3_600_000).unwrap();
        rollup.run_hour(hour).await.expect("the rollup of an hour");
    }
    let source: std::sync::Arc<dyn verdict_limiter::PolicySource> =
        std::sync::Arc::new(verdict_limiter::FileSource::new(policy));
    let engine = Engine::new(
        Arc::clone(&store),
        PoliciesTable::new(Some(source)),
        2,
        limits,
    )
    .expect("an engine");
    (engine, dir)
}

/// The reconcile's rounds in `w`, as the job records them (none without it).
fn rounds_of(w: &World) -> Vec<RoundRecord> {
    w.regions
        .as_ref()
        .and_then(|r| r.reconcile)
        .map(|r| r.rounds())
        .unwrap_or_default()
}

fn world_range() -> Range {
    Range {
        from: chrono::DateTime::from_timestamp_millis(START_MS).unwrap(),
        to: chrono::DateTime::from_timestamp_millis(START_MS + HOURS * 3_600_000).unwrap(),
    }
}

async fn review(events: &[DecisionEvent], params: &[(&str, &str)]) -> Vec<Value> {
    named_report(events, "wrong-limits", params).await
}

async fn named_report(events: &[DecisionEvent], name: &str, params: &[(&str, &str)]) -> Vec<Value> {
    let (engine, _dir) = lake(events).await;
    let range = world_range();
    let (from, to) = (range.from.to_rfc3339(), range.to.to_rfc3339());
    report_in(&engine, name, &from, &to, params).await
}

fn text(v: &Value, field: &str) -> String {
    v[field].as_str().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_review_names_the_truth_of_every_limit_in_every_world() {
    for scale in [1, 3] {
        for seed in [1, 2, 3] {
            names_the_truth(&world(seed, scale), &format!("seed {seed}, scale {scale}")).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_review_names_the_truth_of_every_limit_in_a_world_of_regions() {
    for (name, regions) in [
        ("three regions", Regions::three()),
        ("two", Regions::two()),
        ("three regions, reconciled", Regions::three().reconciled()),
        ("two, reconciled", Regions::two().reconciled()),
    ] {
        for seed in [1, 2, 3, 4, 5, 6] {
            let w = world_in(seed, 1, Some(regions.clone()));
            names_the_truth(&w, &format!("{name}, seed {seed}")).await;
        }
    }
}

/// With a sample of 45 keys per tier × route class, about half of each of the worlds' tiers
/// of 90 keys: the review still names every limit's truth (with its recommended quota
/// within ±20 % of the world's p99 need), says the sample and its bound, estimates the keys,
/// and what it says of the refusals (requests, refusals, constrained keys, outliers, the
/// largest demand and burst, the quotas) is what the review of every key says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_review_of_a_sample_of_the_keys_names_the_truth_and_counts_the_refusals_exactly() {
    let exact = [
        "tier",
        "override_key",
        "requests",
        "denied",
        "would_deny",
        "refused_by_bucket",
        "refused_by_window",
        "constrained_keys",
        "demand_max",
        "burst_max",
        "enforced_quota",
    ];
    for seed in [1, 2, 3] {
        let w = world(seed, 3);
        let label = format!("seed {seed}, a sample of 45 keys");
        let sampled = names_the_truth_with(&w, &label, &[("sample_keys", "45")]).await;
        let whole = names_the_truth_with(&w, &format!("seed {seed}"), &[]).await;
        for (s, a) in sampled.iter().zip(&whole) {
            for column in exact {
                assert_eq!(s[column], a[column], "{label}: {column}\n{s}\n{a}");
            }
            // The outliers are the top 1 % of the keys estimated: where that is as many
            // keys, the same keys and the same share of the refusals.
            if s["outlier_keys"] == a["outlier_keys"] {
                assert_eq!(
                    s["outlier_refusal_share"], a["outlier_refusal_share"],
                    "{label}\n{s}\n{a}"
                );
            }
            let (keys, in_sample) = (
                a["keys"].as_i64().unwrap(),
                s["sampled_keys"].as_i64().unwrap(),
            );
            assert_eq!(a["sampled_keys"].as_i64(), Some(keys), "{a}");
            assert_eq!(a["percentile_bound"].as_f64(), Some(0.0), "{a}");
            if keys > 45 {
                // About half of the keys, chosen by key; the keys estimated from them.
                assert!((20..=70).contains(&in_sample), "{label}: {s}");
                let estimate = s["keys"].as_i64().unwrap();
                assert!(
                    (estimate - keys).abs() <= keys / 4,
                    "{label}: {estimate} keys estimated of {keys}: {s}"
                );
                let bound = s["percentile_bound"].as_f64().unwrap();
                let want = 200.0 * (0.99 * 0.01 / in_sample as f64).sqrt();
                assert!((bound - want).abs() < 1e-9, "{label}: {s}");
            } else {
                assert_eq!(s["sampled_keys"], a["sampled_keys"], "{label}: {s}");
                assert_eq!(s["percentile_bound"].as_f64(), Some(0.0), "{label}: {s}");
            }
        }
    }
}

/// The review of `w` names its truth: every limit's verdict, a reason, a recommended quota
/// within ±20 % of the world's p99 need, and the quota said to have changed only where the
/// policy changed it.
async fn names_the_truth(w: &World, label: &str) {
    names_the_truth_with(w, label, &[]).await;
}

/// [`names_the_truth`] with the review's `params`; its rows.
async fn names_the_truth_with(w: &World, label: &str, params: &[(&str, &str)]) -> Vec<Value> {
    let events = w.events().await;
    let (engine, _dir) = lake_of(&events, &w.policy_toml(2), &rounds_of(w)).await;
    let range = world_range();
    let (from, to) = (range.from.to_rfc3339(), range.to.to_rfc3339());
    let got = report_in(&engine, "wrong-limits", &from, &to, params).await;
    println!(
        "{label}: {} decisions, {} keys",
        events.len(),
        w.demand.len()
    );
    let named: Vec<(String, Option<String>, String)> = got
        .iter()
        .map(|r| {
            (
                text(r, "tier"),
                r["override_key"].as_str().map(str::to_owned),
                text(r, "verdict"),
            )
        })
        .collect();
    let truth: Vec<(String, Option<String>, String)> = w
        .truth
        .iter()
        .map(|t| {
            (
                t.tier.to_string(),
                t.override_key.map(|k| k.to_string()),
                t.verdict.to_string(),
            )
        })
        .collect();
    assert_eq!(named, truth, "{label}: {got:#?}");
    for (row, t) in got.iter().zip(&w.truth) {
        let recommended = row["recommended_quota"].as_f64().unwrap();
        println!(
            "  {:<8} {:<9} {:<16} keys {:>3} (sampled {:>3}) p90 demand {:>5.2} p99 {:>5.2} \
             burst p99 {:>5.2}  recommended quota {:>5} (world p99 need {:>5})  {}",
            t.tier,
            if t.override_key.is_some() {
                "override"
            } else {
                "tier"
            },
            t.verdict,
            row["keys"],
            row["sampled_keys"],
            row["demand_p90"].as_f64().unwrap_or(f64::NAN),
            row["demand_p99"].as_f64().unwrap_or(f64::NAN),
            row["burst_p99"].as_f64().unwrap_or(f64::NAN),
            recommended,
            t.p99_peak_hour.map_or("-".to_string(), |p| p.to_string()),
            text(row, "reason"),
        );
        assert!(!text(row, "reason").is_empty(), "{row}");
        assert_eq!(
            text(row, "reason").contains("the quota in force changed"),
            t.tier == "changed" && t.verdict != "not enough data",
            "{label}: {row}"
        );
        if matches!(t.verdict, "too low" | "too high") {
            let p99 = t.p99_peak_hour.unwrap() as f64;
            assert!(
                (recommended - p99).abs() <= 0.2 * p99,
                "{label}, {}: recommended {recommended} against the world's p99 {p99}: {row}",
                t.tier
            );
        }
    }
    got
}

/// A limit too low only for the keys of one region (two regions of equal weight; 30 keys
/// in us-east-1 send 24 requests an hour, within their region's half of the quota of 100;
/// 10 keys in eu-central-1 send 90, past theirs): the reason names eu-central-1, in the
/// served review and in the portable one; a limit whose constrained keys are spread as its
/// keys are names none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reason_names_the_region_whose_keys_the_limit_constrains() {
    use std::collections::BTreeMap;
    use verdict_tests::review_world::{decide_in, key};
    let regions = "[[regions]]\nid = 0\nname = \"us-east-1\"\nweight = 1\n\
                   [[regions]]\nid = 1\nname = \"eu-central-1\"\nweight = 1\n";
    // "low" (tier 0) is constrained in eu-central-1 only; "fine" (tier 1) everywhere.
    let mut rows = limits(2);
    rows[0] = ("low", 1_000, 10.0, 100, "enforce");
    rows[1] = ("fine", 1_000, 10.0, 100, "enforce");
    let policy = policy_text(2, &rows) + regions;
    let mut demand: BTreeMap<(u8, KeyId), Vec<i64>> = BTreeMap::new();
    let mut places = BTreeMap::new();
    let evenly = |per_hour: i64| -> Vec<i64> {
        (0..HOURS * per_hour)
            .map(|i| START_MS + i * 3_600_000 / per_hour)
            .collect()
    };
    for n in 0..40u16 {
        let far = n >= 30;
        let k = key(0, n);
        demand.insert((0, k), evenly(if far { 90 } else { 24 }));
        places.insert((0, k), if far { (1, 1) } else { (0, 0) });
        // Every "fine" key sends 90 an hour, in both regions alike.
        let k = key(1, n);
        demand.insert((1, k), evenly(90));
        places.insert((1, k), if n % 4 == 0 { (1, 1) } else { (0, 0) });
    }
    let snapshot = snapshot_of(&policy);
    let events = decide_in(&demand, &places, None, None, [snapshot.clone(), snapshot]).await;
    let (engine, _dir) = lake_with(&events, &policy).await;
    let range = world_range();
    let (from, to) = (range.from.to_rfc3339(), range.to.to_rfc3339());
    let (served, portable) = served_and_portable(&engine, "wrong-limits", &from, &to, &[]).await;
    for rows in [&served, &portable] {
        let row = |tier: &str| {
            rows.iter()
                .find(|r| text(r, "tier") == tier && r["override_key"].is_null())
                .unwrap_or_else(|| panic!("{tier} in {rows:#?}"))
        };
        let low = row("low");
        assert_eq!(text(low, "verdict"), "too low", "{low}");
        assert!(
            text(low, "reason").ends_with(
                "; eu-central-1's keys are 100 % of those constrained and 25 % of the keys"
            ),
            "{low}"
        );
        let fine = row("fine");
        assert_eq!(text(fine, "verdict"), "too low", "{fine}");
        assert!(!text(fine, "reason").contains("'s keys are"), "{fine}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_review_splits_and_attributes_the_refusals_of_a_fine_limit() {
    let events = world(7, 1).events().await;
    let got = review(&events, &[]).await;
    let fine = got
        .iter()
        .find(|r| r["tier"] == "fine" && r["override_key"].is_null())
        .expect("the fine tier's row");
    // The two scrapers are the top 1 % (at least one key: one of them) and make about half
    // of the refusals each; most refusals are by the window (the scrapers' quota).
    assert_eq!(fine["outlier_keys"], 1, "{fine}");
    let outlier = fine["outlier_refusal_share"].as_f64().unwrap();
    assert!((0.4..0.6).contains(&outlier), "{fine}");
    let by_window = fine["refused_by_window"].as_f64().unwrap();
    let denied = fine["denied"].as_f64().unwrap();
    assert!(by_window > 0.5 * denied, "{fine}");
    // Only the scrapers are constrained: the bursty keys lose a handful each.
    assert_eq!(fine["constrained_keys"], 2, "{fine}");
    assert_eq!(fine["would_deny"], 0, "{fine}");
    // The outliers, listed: the scraper that made the most refusals.
    let outliers = named_report(&events, "limit-outliers", &[("tier", "fine")]).await;
    assert_eq!(outliers.len(), 2, "{outliers:#?}");
    assert!(outliers[0]["override_key"].is_null());
    let scrapers = [
        verdict_tests::review_world::key(1, 200).to_string(),
        verdict_tests::review_world::key(1, 201).to_string(),
    ];
    assert!(
        scrapers.contains(&text(&outliers[0], "key_id")),
        "{outliers:#?}"
    );
    let share = outliers[0]["share_of_refusals"].as_f64().unwrap();
    assert!((0.4..0.6).contains(&share), "{outliers:#?}");
    // The override's row: its one key.
    assert_eq!(
        text(&outliers[1], "key_id"),
        verdict_tests::review_world::override_key().to_string()
    );
    // The shadow tier's refusals are all would-deny.
    let shadow = got.iter().find(|r| r["tier"] == "shadow").unwrap();
    assert_eq!(shadow["denied"], 0, "{shadow}");
    assert!(shadow["would_deny"].as_f64().unwrap() > 0.0, "{shadow}");
    assert_eq!(shadow["mode"], "shadow", "{shadow}");
    // The changed tier's reason names the change of quota.
    let changed = got.iter().find(|r| r["tier"] == "changed").unwrap();
    assert!(
        text(changed, "reason").contains(
            "changed in the range (policy versions with regional quotas up to 100 and up to 400)"
        ),
        "{changed}"
    );
    // The thresholds are parameters: with min_keys above every tier's count, only the
    // override row is judged.
    let strict = review(&events, &[("min_keys", "1000")]).await;
    let judged: Vec<String> = strict
        .iter()
        .filter(|r| r["verdict"] != "not enough data")
        .map(|r| text(r, "tier"))
        .collect();
    assert_eq!(judged, ["fine"], "{strict:#?}");
}

/// A candidate that changes every kind of limit: a quota raised, a bucket halved, a
/// generous quota cut below demand, a shadow limit enforced.
fn candidate_toml() -> String {
    let mut l = limits(2);
    l[0].3 = 250;
    l[1].1 = 10;
    l[2].3 = 150;
    l[3].4 = "enforce";
    policy_text(9, &l)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_if_predicts_what_the_limiter_does_under_the_candidate() {
    for seed in [1, 2, 3] {
        let w = world(seed, 1);
        let (engine, _dir) = lake(&w.events().await).await;
        let candidate = candidate_toml();
        // The truth: the same demand through the limiter under the candidate.
        let truth = decide_all(
            &w.demand,
            [snapshot_of(&candidate), snapshot_of(&candidate)],
        )
        .await;
        let answer = whatif::what_if(
            &engine,
            whatif::candidate(&candidate).unwrap(),
            world_range(),
            5,
            whatif::SAMPLE_KEYS,
        )
        .await
        .unwrap();
        assert_eq!(answer.sample, None, "the world's keys are replayed whole");
        assert_eq!(answer.decisions as usize, truth.len());
        assert_eq!(answer.limits.len(), TIERS.len(), "{answer:#?}");
        for l in &answer.limits {
            let refused = truth
                .iter()
                .filter(|e| e.tier.0 == l.limit.tier_id && e.verdict != Verdict::Allowed)
                .count() as f64;
            let predicted = l.candidate.refused as f64;
            println!(
                "seed {seed} {:<8} recorded refusals {:>6}, what-if {:>6}, limiter {:>6}",
                l.limit.tier.as_deref().unwrap_or("?"),
                l.recorded.refused,
                predicted,
                refused
            );
            assert!(
                (predicted - refused).abs() <= 0.02 * refused.max(1.0),
                "seed {seed}, tier {:?}: what-if {predicted}, limiter {refused}",
                l.limit.tier
            );
        }
        // The candidate raised low's quota (fewer refusals) and cut high's (more).
        let by = |tier: &str| {
            answer
                .limits
                .iter()
                .find(|l| l.limit.tier.as_deref() == Some(tier))
                .unwrap()
        };
        assert!(by("low").refused_change < 0, "{:?}", by("low"));
        assert!(by("high").refused_change > 0, "{:?}", by("high"));
        assert_eq!(by("shadow").candidate.would_deny, 0);
        assert_eq!(answer.keys.len(), 5);
        assert!(
            answer
                .keys
                .windows(2)
                .all(|k| k[0].refused_change.abs() >= k[1].refused_change.abs())
        );
        assert!(whatif::render(&answer).contains("Caveat: recorded demand includes the retries"));
    }
}

/// Past its `sample_keys`, a what-if replays a sample of the keys and estimates every
/// key's counts from theirs: each estimate within the bound it states of the whole
/// replay's count, the sample said, and less replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sampled_what_if_estimates_every_keys_counts_within_the_bounds_it_states() {
    for seed in [1, 2, 3] {
        let w = world(seed, 1);
        let (engine, _dir) = lake(&w.events().await).await;
        let run = |sample_keys: u64| {
            let engine = &engine;
            async move {
                whatif::what_if(
                    engine,
                    whatif::candidate(&candidate_toml()).unwrap(),
                    world_range(),
                    5,
                    sample_keys,
                )
                .await
                .unwrap()
            }
        };
        let whole = run(1_000_000_000).await;
        assert_eq!(whole.sample, None);
        let keys: u64 = whole.limits.iter().map(|l| l.candidate.keys).sum();
        let sampled = run(keys / 2).await;
        let sample = sampled.sample.clone().expect("half the keys: a sample");
        assert!(
            (0.35..=0.65).contains(&sample.rate),
            "seed {seed}: rate {} for half of {keys} keys",
            sample.rate
        );
        assert!(
            sample.keys_replayed < keys && sample.keys_replayed > 0,
            "{sample:?}"
        );
        assert!(sample.requests_replayed < whole.decisions, "{sample:?}");
        let text = whatif::render(&sampled);
        assert!(text.contains("Sampled: "), "{text}");
        assert_eq!(sampled.limits.len(), whole.limits.len());
        for (e, x) in sampled.limits.iter().zip(&whole.limits) {
            assert_eq!(e.limit, x.limit);
            let b = e.bound.clone().expect("each estimate has its bound");
            let tier = x.limit.tier.clone().unwrap_or_default();
            for (what, estimate, exact, bound) in [
                (
                    "requests",
                    e.candidate.requests,
                    x.candidate.requests,
                    b.requests,
                ),
                (
                    "recorded refusals",
                    e.recorded.refused,
                    x.recorded.refused,
                    b.recorded_refused,
                ),
                (
                    "candidate refusals",
                    e.candidate.refused,
                    x.candidate.refused,
                    b.candidate_refused,
                ),
                ("keys", e.candidate.keys, x.candidate.keys, b.keys),
                (
                    "keys refused",
                    e.candidate.keys_refused,
                    x.candidate.keys_refused,
                    b.candidate_keys_refused,
                ),
            ] {
                println!(
                    "seed {seed} {tier:<8} {what:<18} every key {exact:>7}, sample {estimate:>7} ± {bound}"
                );
                assert!(
                    estimate.abs_diff(exact) <= bound,
                    "seed {seed}, {tier}: {what} estimated {estimate} ± {bound}, every key's {exact}"
                );
            }
            assert!(b.requests > 0, "a sample's estimate is not exact: {b:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recommendation_replayed_says_what_it_would_have_refused() {
    for seed in [1, 2, 3] {
        replays_what_the_limiter_does(&world(seed, 1), &format!("seed {seed}")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recommendation_replayed_in_a_world_of_regions_is_what_its_limiters_do() {
    for (name, regions) in [
        ("three regions", Regions::three()),
        ("two", Regions::two()),
        ("lopsided", Regions::lopsided()),
        ("spread", Regions::spread()),
        ("three regions, reconciled", Regions::three().reconciled()),
        ("two, reconciled", Regions::two().reconciled()),
        ("spread, reconciled", Regions::spread().reconciled()),
    ] {
        for seed in [1, 2, 3] {
            let w = world_in(seed, 1, Some(regions.clone()));
            replays_what_the_limiter_does(&w, &format!("{name}, seed {seed}")).await;
        }
    }
}

/// The review's recommendations for `w`, proven by the replay: applied and decided by the
/// world's own limiters, each refuses what its row says (±2 %), a too-low limit's refuses
/// fewer requests and keys and is never lower, a too-high limit's refuses at most the
/// tolerance more.
async fn replays_what_the_limiter_does(w: &World, label: &str) {
    let (engine, _dir) = lake_of(&w.events().await, &w.policy_toml(2), &rounds_of(w)).await;
    let range = world_range();
    let params = [
        ("from".to_string(), range.from.to_rfc3339()),
        ("to".to_string(), range.to.to_rfc3339()),
    ]
    .into();
    let answer = recommend::replay(&engine, &params, chrono::Utc::now(), 5)
        .await
        .unwrap();
    print!("{label}: {}", recommend::render(&answer));
    // The weights: judged wherever a region's part of the requests is far from its
    // weight's, by replaying the policy in force with weights by the requests beside it as
    // it is; recommended only where they refuse fewer requests and no region's keys more
    // (the limits are then proven with them, and the candidate has them).
    let reconciled = w.regions.as_ref().is_some_and(|r| r.reconcile.is_some());
    assert_eq!(
        answer
            .what_if
            .shares
            .as_deref()
            .map(|s| s.starts_with("shares moved by the regional reconcile")),
        w.regions.as_ref().map(|_| reconciled),
        "{label}: {:?}",
        answer.what_if.shares
    );
    assert_eq!(
        recommend::render(&answer).contains("Regions: each region enforced its static"),
        w.regions.is_some() && !reconciled,
        "{label}"
    );
    match &w.regions {
        None => assert!(answer.weights.is_none(), "{label}"),
        Some(regions) => {
            let weights = answer.weights.as_ref().expect("the weights judged");
            let (now, rec) = (
                weights.refused_with_weights_in_force,
                weights.refused_with_recommended_weights,
            );
            let in_force = engine.policies().snapshot().await.unwrap().unwrap();
            let replayed =
                whatif::what_if(&engine, (*in_force).clone(), range, 0, whatif::SAMPLE_KEYS)
                    .await
                    .unwrap();
            assert_eq!(
                now,
                verdict_query::weights::Refused::of(&replayed),
                "{label}"
            );
            if weights.recommended {
                assert!(
                    rec.share_of_requests + verdict_query::prove::REQUESTS_TOLERANCE
                        < now.share_of_requests,
                    "{label}: {weights:?}"
                );
            }
            let in_candidate: Vec<f64> =
                answer.candidate.regions.iter().map(|r| r.weight).collect();
            let expected: Vec<f64> = weights
                .regions
                .iter()
                .map(|r| {
                    if weights.recommended {
                        r.recommended_weight
                    } else {
                        r.weight
                    }
                })
                .collect();
            assert_eq!(in_candidate, expected, "{label}");
            // Keys living in one region: weights by the requests would refuse the small
            // regions' keys more, and are kept. Keys sending from every region in a mix
            // unlike the weights: they are recommended, near the mix; unless the reconcile
            // runs, moving every key's shares to where its requests are, when the weights
            // change little and are kept.
            if regions.spread && regions.reconcile.is_none() {
                assert!(weights.recommended, "{label}: {weights:?}");
                let got: Vec<f64> = weights
                    .regions
                    .iter()
                    .map(|r| r.recommended_weight)
                    .collect();
                assert!(
                    (got[0] - 70.0).abs() <= 3.0 && (got[1] - 30.0).abs() <= 3.0,
                    "{label}: {weights:?}"
                );
            } else if !regions.scaled {
                assert!(
                    !weights.recommended && weights.reason.contains("would be refused more"),
                    "{label}: {weights:?}"
                );
            }
        }
    }
    // The truth: the same demand through the limiter under the recommended policy (with
    // the weights recommended, if they are).
    let recommended = verdict_limiter::PolicySnapshot::build(answer.candidate.clone()).unwrap();
    let truth = w.decide([recommended.clone(), recommended]).await;
    assert_eq!(answer.what_if.decisions as usize, truth.len());
    assert_eq!(answer.limits.len(), TIERS.len(), "{answer:#?}");
    for l in &answer.limits {
        let of_tier = || truth.iter().filter(|e| e.tier.0 == l.limit.tier_id);
        let refused = of_tier().filter(|e| e.verdict != Verdict::Allowed).count() as f64;
        let requests = of_tier().count() as f64;
        let predicted = l.share_of_requests_refused.1 * l.requests as f64;
        println!(
            "{label}, {:?} {}: quota {} -> {}, capacity {} -> {}; refused under the recommendation: replay {predicted:.0}, limiter {refused} of {requests}",
            l.limit.tier.as_deref().unwrap_or("?"),
            l.verdict.as_deref().unwrap_or("?"),
            l.hourly_quota.0,
            l.hourly_quota.1,
            l.capacity.0,
            l.capacity.1,
        );
        assert!(
            (predicted - refused).abs() <= 0.02 * refused.max(1.0),
            "{label}, tier {:?}: replay {predicted}, limiter {refused}",
            l.limit.tier
        );
        assert_eq!(l.requests as f64, requests);
        let verdict = l.verdict.as_deref().unwrap();
        let ((now, rec), (refused_now, refused_rec)) =
            (l.hourly_quota, l.share_of_requests_refused);
        match verdict {
            // Raised (the quota, the bucket or both; neither lowered): it refuses less,
            // of requests and of keys.
            "too low" => {
                assert!(
                    rec >= now
                        && l.capacity.1 >= l.capacity.0
                        && (rec > now || l.capacity.1 > l.capacity.0),
                    "{label}: {l:?}"
                );
                assert!(refused_rec < refused_now, "{label}: {l:?}");
                assert!(
                    l.share_of_keys_refused.1 < l.share_of_keys_refused.0,
                    "{label}: {l:?}"
                );
            }
            // Lowered to the busiest keys' need, with headroom: it still refuses next to
            // nothing.
            "too high" => {
                assert!(rec < now, "{label}: {l:?}");
                assert!(refused_rec < 0.01, "{label}: {l:?}");
            }
            _ => assert_eq!((rec, l.capacity.1), (now, l.capacity.0), "{label}: {l:?}"),
        }
    }
    // Each judged row's recommendation was proven against its target, and what its
    // replay refused is what the real limiter refuses under it (the tiers' rows above).
    for p in &answer.proven {
        let r = &p.recommendation;
        let (in_force, recommended) = (
            p.in_force.unwrap_or_default(),
            p.recommended.unwrap_or_default(),
        );
        match r.verdict.as_str() {
            "too low" => {
                assert!(p.met, "{label}: {p:?}");
                assert!(
                    recommended.share_of_keys_constrained < 0.1,
                    "{label}: {p:?}"
                );
                assert!(
                    r.recommended_quota >= r.hourly_quota && r.recommended_capacity >= r.capacity,
                    "{label}: never lower than in force: {p:?}"
                );
                assert!(
                    recommended.share_of_requests < in_force.share_of_requests
                        && recommended.share_of_keys <= in_force.share_of_keys,
                    "{label}: {p:?}"
                );
            }
            "too high" => {
                assert!(
                    recommended.share_of_requests
                        <= in_force.share_of_requests + verdict_query::prove::REQUESTS_TOLERANCE
                        && recommended.share_of_keys
                            <= in_force.share_of_keys + verdict_query::prove::KEYS_TOLERANCE,
                    "{label}: {p:?}"
                );
            }
            _ => assert!(p.wrong.is_none() && !r.changes(), "{label}: {p:?}"),
        }
    }
    // "The quota in force changed" only where the policy changed it, whether the regions'
    // quotas stayed at their static shares or the reconcile moved them.
    let (from, to) = (range.from.to_rfc3339(), range.to.to_rfc3339());
    for r in report_in(&engine, "wrong-limits", &from, &to, &[]).await {
        assert_eq!(
            text(&r, "reason").contains("the quota in force changed"),
            text(&r, "tier") == "changed" && text(&r, "verdict") != "not enough data",
            "{label}: {r}"
        );
    }
    // The override the review judged is changed in the candidate's overrides.
    let rendered = recommend::render(&answer);
    for o in answer.review.iter().filter(|o| o.override_key.is_some()) {
        assert_eq!(
            rendered.contains(o.override_key.as_deref().unwrap()),
            o.changes(),
            "{rendered}"
        );
    }
}

/// Past its `proof_sample_keys`, a limit's proof replays a sample of its keys, each whole,
/// and says so: every judged limit of a world of 120 keys a tier proven on 40 of them
/// finds the verdict's recommendation of every key's proof or the round value next to it,
/// and meets its target; an override's one key is replayed whatever the sample. A sample
/// that is not a whole number from 1 is refused by the parameter's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proof_on_a_sample_of_the_keys_finds_every_keys_recommendation() {
    let step = |a: i64, b: i64| {
        let (lo, hi) = (a.min(b).max(1) as f64, a.max(b) as f64);
        hi / lo <= 1.34
    };
    for seed in [1, 2, 3] {
        let w = world(seed, 4);
        let (engine, _dir) = lake_of(&w.events().await, &w.policy_toml(2), &rounds_of(&w)).await;
        let range = world_range();
        let mut params: std::collections::BTreeMap<String, String> = [
            ("from".to_string(), range.from.to_rfc3339()),
            ("to".to_string(), range.to.to_rfc3339()),
        ]
        .into();
        let now = chrono::Utc::now();
        let every = recommend::replay(&engine, &params, now, 0).await.unwrap();
        params.insert(recommend::PROOF_SAMPLE_KEYS.into(), "40".into());
        let sampled = recommend::replay(&engine, &params, now, 0).await.unwrap();
        print!(
            "seed {seed}, proven on a sample: {}",
            recommend::render(&sampled)
        );
        assert_eq!(every.proven.len(), sampled.proven.len());
        let mut judged = 0;
        for (e, s) in every.proven.iter().zip(&sampled.proven) {
            let (er, sr) = (&e.recommendation, &s.recommendation);
            let label = format!(
                "seed {seed}, tier {} route {} {:?} ({})",
                sr.tier_id, sr.route_class_id, sr.override_key, sr.verdict
            );
            assert_eq!(
                (er.verdict.as_str(), er.keys),
                (sr.verdict.as_str(), sr.keys),
                "{label}"
            );
            assert_eq!(e.sample_rate, 1.0, "{label}: every key's proof");
            if e.replays == 0 {
                assert_eq!((s.replays, s.sample_rate), (0, 1.0), "{label}");
                continue;
            }
            judged += 1;
            let (in_force, rec) = (s.in_force.unwrap(), s.recommended.unwrap());
            if sr.override_key.is_some() || sr.keys <= 40 {
                assert_eq!(s.sample_rate, 1.0, "{label}");
                assert_eq!(s.in_force, e.in_force, "{label}");
            } else {
                let rate = 40.0 / sr.keys as f64;
                assert!(
                    (s.sample_rate - rate).abs() < 1e-6,
                    "{label}: {}",
                    s.sample_rate
                );
                assert!(
                    in_force.keys < e.in_force.unwrap().keys && in_force.keys > 0,
                    "{label}: {in_force:?}"
                );
                assert!(
                    recommend::render(&sampled).contains(&format!("of its {} keys", sr.keys)),
                    "{label}"
                );
            }
            println!(
                "{label}: quota {} -> {} (every key's {}), capacity {} -> {} (every key's {}); \
                 sample {:.2}: refused {:.3} -> {:.3}",
                sr.hourly_quota,
                sr.recommended_quota,
                er.recommended_quota,
                sr.capacity,
                sr.recommended_capacity,
                er.recommended_capacity,
                s.sample_rate,
                in_force.share_of_requests,
                rec.share_of_requests
            );
            assert_eq!(s.met, e.met, "{label}");
            assert!(
                step(sr.recommended_quota, er.recommended_quota)
                    && step(sr.recommended_capacity, er.recommended_capacity),
                "{label}: sampled {sr:?}, every key's {er:?}"
            );
        }
        assert!(judged >= 2, "seed {seed}: the world judges limits to prove");
    }
    let (engine, _dir) = lake(&world(1, 1).events().await).await;
    for bad in ["0", "many", "-3"] {
        let params = [(recommend::PROOF_SAMPLE_KEYS.to_string(), bad.to_string())].into();
        let err = recommend::replay(&engine, &params, chrono::Utc::now(), 0)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("parameter proof_sample_keys"), "{bad}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_if_refuses_an_invalid_candidate_and_an_empty_range_by_name() {
    let bad = candidate_toml().replace("capacity = 10", "capacity = 0");
    let err = whatif::candidate(&bad).unwrap_err().to_string();
    assert!(
        err.contains("limits[1] (tier=fine, route_class=*): capacity"),
        "{err}"
    );
    let (engine, _dir) = lake(&world(1, 1).events().await).await;
    let empty = Range {
        from: chrono::DateTime::from_timestamp_millis(START_MS - 48 * 3_600_000).unwrap(),
        to: chrono::DateTime::from_timestamp_millis(START_MS - 24 * 3_600_000).unwrap(),
    };
    let err = whatif::what_if(
        &engine,
        whatif::candidate(&candidate_toml()).unwrap(),
        empty,
        5,
        whatif::SAMPLE_KEYS,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("the raw table has no decisions from"), "{err}");
}

/// The replay's state counts against a query's memory (as a query's operators do): a
/// what-if's counters and tallies past its limit stop it with the query's memory error
/// after the hour that passed it, whatever the hour's own query used; within the limit,
/// the count has what the replay held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_past_its_memory_limit_is_refused_and_its_state_is_counted() {
    use verdict_query::QueryError;
    use verdict_query::memory::QueryMemory;

    let (engine, _dir) = lake(&world(1, 1).events().await).await;
    let candidate = whatif::candidate(&candidate_toml()).unwrap();

    let memory = QueryMemory::claim(1 << 30);
    let mut replay = whatif::Replay::new(candidate.clone());
    memory
        .enter(whatif::feed_range(
            &engine,
            &mut replay,
            world_range(),
            &memory,
        ))
        .await
        .expect("replayed within 1 GiB");
    let decisions = replay.decisions();
    assert!(decisions > 1_000, "{decisions} decisions replayed");
    // Counted in steps of 256 KiB a thread (see `verdict_query::memory`): the replay's
    // counters and tallies and each hour's requests are the query's.
    assert!(memory.peak() > 0, "the replay's state is counted");

    let small = QueryMemory::claim(16 << 10);
    let mut replay = whatif::Replay::new(candidate);
    let err = small
        .enter(whatif::feed_range(
            &engine,
            &mut replay,
            world_range(),
            &small,
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(err, QueryError::MemoryLimit { limit_mib: 0 }),
        "{err:?}"
    );
    assert!(
        replay.decisions() < decisions,
        "stopped after the hour that passed the limit: {} of {decisions}",
        replay.decisions()
    );
}

/// The demand histogram the rollup keeps (5 years) says the same of the generous limit as the
/// raw table's review: too high; the others are not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demand_history_finds_the_limit_too_high_from_the_rollup_alone() {
    let w = world(4, 1);
    let got = named_report(&w.events().await, "demand-history", &[]).await;
    let verdicts: Vec<(String, String)> = got
        .iter()
        .map(|r| (text(r, "tier"), text(r, "verdict")))
        .collect();
    assert_eq!(
        verdicts,
        [
            ("low".to_string(), "not too high".to_string()),
            ("fine".into(), "not too high".into()),
            ("high".into(), "too high".into()),
            ("shadow".into(), "not too high".into()),
            ("sparse".into(), "not enough data".into()),
            ("changed".into(), "not too high".into()),
        ],
        "{got:#?}"
    );
    // Each percentile is the upper bound of its bucket, within a factor of 2^(1/4) above
    // the truth: the high tier's busiest keys send at most 220 of 5000 an hour.
    let high = &got[2];
    let p99 = high["demand_p99"].as_f64().unwrap();
    assert!((0.04..0.06).contains(&p99), "{high}");
    assert_eq!(high["key_hours"], 120, "{high}");
}

/// Parts of two days: the world's events on its day, and the same keys again the next day
/// with every other event left out, so a key's row merges two different days.
async fn two_days() -> (Vec<DecisionEvent>, Engine, tempfile::TempDir) {
    let events = world(2, 1).events().await;
    let mut all = events.clone();
    all.extend(events.iter().step_by(2).map(|e| DecisionEvent {
        event_time_ms: e.event_time_ms + 86_400_000,
        ..*e
    }));
    let (engine, dir) = lake(&all).await;
    (all, engine, dir)
}

/// The reports over the rollup (`demand-history`, `top-denied`) from each day's kept parts
/// give the rows of their statements over the rollup's files: over whole days, over a
/// range that starts and ends inside hours, filtered; and when an hour is rolled up again
/// (a late file), that day's parts are computed again and count it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rollups_reports_from_kept_day_parts_are_those_from_its_files() {
    let (events, engine, dir) = two_days().await;
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
    // The second day rolled up too (the lake rolls up the first).
    let rollup = verdict_rollup::Rollup::new(Arc::clone(&store), 2);
    let roll = |h: i64| {
        let hour = HourPartition::from_event_time_ms(START_MS + 86_400_000 + h * 3_600_000);
        let rollup = &rollup;
        async move { rollup.run_hour(hour.unwrap()).await.expect("a rollup") }
    };
    for h in 0..HOURS {
        roll(h).await;
    }
    let ranges = [
        (at_day(0, 0), at_day(2, 0)),
        (at_day(0, 5_400_000), at_day(1, 8_100_000)),
        (at_day(1, 0), at_day(1, 7_200_000)),
    ];
    let tier = TIERS[0].to_string();
    let reports = ["demand-history", "top-denied"];
    for (from, to) in &ranges {
        for filter in [vec![], vec![("tier", tier.as_str())]] {
            for name in reports {
                let (served, portable) =
                    served_and_portable(&engine, name, from, to, &filter).await;
                assert!(
                    !portable.is_empty(),
                    "{name} {from} {to} {filter:?}: no rows"
                );
                assert_eq!(served, portable, "{name} {from} {to} {filter:?}");
            }
        }
    }

    // A late file into the second day's first hour, rolled up again: the reports count it.
    let whole = (at_day(0, 0), at_day(2, 0));
    let total = |rows: &[Value], column: &str| -> i64 {
        rows.iter().map(|r| r[column].as_i64().unwrap_or(0)).sum()
    };
    let answers = || async {
        let mut out = Vec::new();
        for name in reports {
            // Every key of top-denied, so that its sums are the whole rollup's.
            let params: &[(&str, &str)] = if name == "top-denied" {
                &[("limit", "100000")]
            } else {
                &[]
            };
            out.push(served_and_portable(&engine, name, &whole.0, &whole.1, params).await);
        }
        out
    };
    let before = answers().await;
    late_into_the_second_day(&store, &events, 500).await;
    roll(0).await;
    let after = answers().await;
    for ((name, (served, portable)), (old, _)) in reports.iter().zip(&after).zip(&before) {
        assert_eq!(served, portable, "{name} after the late hour");
        let column = if *name == "demand-history" {
            "requests"
        } else {
            "allowed"
        };
        assert!(
            total(served, column) > total(old, column),
            "{name}: {column} {} before the late hour, {} after",
            total(old, column),
            total(served, column)
        );
    }
}

/// `ms` milliseconds into the `d`-th day of [`two_days`], as a report's parameter.
fn at_day(d: i64, ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(START_MS + d * 86_400_000 + ms)
        .unwrap()
        .to_rfc3339()
}

/// A late file into the second day of [`two_days`]: `n` of the first hour's `events` a day
/// later, from a topic of their own (the raw table writes each Kafka offset once).
async fn late_into_the_second_day(
    store: &Arc<dyn ObjectStore>,
    events: &[DecisionEvent],
    n: usize,
) -> Vec<DecisionEvent> {
    let late: Vec<DecisionEvent> = events
        .iter()
        .filter(|e| e.event_time_ms < START_MS + 3_600_000)
        .take(n)
        .map(|e| DecisionEvent {
            event_time_ms: e.event_time_ms + 86_400_000,
            ..*e
        })
        .collect();
    let hour = HourPartition::from_event_time_ms(START_MS + 86_400_000).unwrap();
    verdict_tests::rollup_check::write_raw_hour(
        store,
        "verdict.decisions.late",
        hour,
        &late,
        2,
        1_000_000,
    )
    .await;
    late
}

/// The first levels `verdict query levels` stores in the lake are what a new query service
/// reads instead of the decisions: every level's part of each closed day written once, then
/// found unchanged; a service started over the lake reads them all (computes none) and
/// answers every report over raw decisions as the portable statement does; a late file
/// makes its day's parts stale (that day computed, not read) until the next run rewrites
/// that day alone; a day the raw table no longer holds loses its stored parts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_levels_stored_once_are_read_by_a_new_service_and_stored_again_when_stale() {
    let (events, engine, dir) = two_days().await;
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
    let clock: verdict_lake::Clock = Arc::new(verdict_schemas::SystemClock);
    let levels = verdict_query::reports::levels::LEVELS.len();
    let store_levels = || engine.write_levels(Arc::clone(&store));
    let done = store_levels().await.unwrap();
    assert_eq!(
        (done.written, done.unchanged, done.removed),
        (2 * levels, 0, 0)
    );
    let done = store_levels().await.unwrap();
    assert_eq!(
        (done.written, done.unchanged, done.removed),
        (0, 2 * levels, 0)
    );

    // A service started over the lake reads every part and computes none.
    let policy = dir.path().join("policy.toml");
    let fresh = || {
        let source: Arc<dyn verdict_limiter::PolicySource> =
            Arc::new(verdict_limiter::FileSource::new(policy.clone()));
        Engine::new(
            Arc::clone(&store),
            PoliciesTable::new(Some(source)),
            2,
            Limits::default(),
        )
        .unwrap()
    };
    let second = fresh();
    let warmed = second.warm_parts().await.unwrap();
    assert_eq!((warmed.kept, warmed.read, warmed.computed), (0, 2, 0));
    let day = |d: i64| {
        chrono::DateTime::from_timestamp_millis(START_MS + d * 86_400_000)
            .unwrap()
            .to_rfc3339()
    };
    let reports: [(&str, &[(&str, &str)]); 6] = [
        ("wrong-limits", &[("min_keys", "2")]),
        ("limit-outliers", &[]),
        ("shadow-impact", &[]),
        ("policy-changes", &[]),
        ("degraded", &[]),
        ("denial-rate", &[("source", "raw")]),
    ];
    for (name, params) in reports {
        let (served, portable) = served_and_portable(&second, name, &day(0), &day(2), params).await;
        // This world's decisions are all of Redis: `degraded` has no rows to give.
        assert_eq!(
            portable.is_empty(),
            name == "degraded",
            "{name}: {portable:?}"
        );
        assert_eq!(served, portable, "{name} from the stored parts");
    }
    // What a query read from the stored parts is counted: their rows.
    let count = format!(
        "SELECT COUNT(*) AS n FROM review_parts('{}', '{}')",
        day(0),
        day(2)
    );
    let read = second
        .collect(&count, &verdict_query::RunOptions::default())
        .await
        .unwrap();
    let rows = arrow::array::AsArray::as_primitive::<arrow::datatypes::Int64Type>(
        read.batches[0].column(0),
    )
    .value(0) as u64;
    assert!(rows > 0);
    assert_eq!(read.rows_read, rows, "the rows read of the stored parts");

    // A late file into the second day: a new service computes that day's parts (the stored
    // ones are stale) and reads the first day's; the next run stores the second day again.
    late_into_the_second_day(&store, &events, 300).await;
    let warmed = fresh().warm_parts().await.unwrap();
    assert_eq!((warmed.kept, warmed.read, warmed.computed), (0, 1, 1));
    let done = store_levels().await.unwrap();
    assert_eq!(
        (done.written, done.unchanged, done.removed),
        (levels, levels, 0)
    );
    let third = fresh();
    let warmed = third.warm_parts().await.unwrap();
    assert_eq!((warmed.kept, warmed.read, warmed.computed), (0, 2, 0));
    let (served, portable) = served_and_portable(
        &third,
        "wrong-limits",
        &day(0),
        &day(2),
        &[("min_keys", "2")],
    )
    .await;
    assert_eq!(served, portable, "wrong-limits after the late file");

    // Retention takes the first day from the raw table: its stored parts go too; the files
    // replaced a moment ago stay for the queries planned with them (an hour).
    let now = START_MS + 7 * 86_400_000 + 12 * 3_600_000;
    let lake = verdict_jobs::Lake {
        store: &store,
        clock: &clock,
        windows: &verdict_jobs::Windows::default(),
        now_ms: now,
    };
    verdict_jobs::retention::run(lake, false).await.unwrap();
    let done = store_levels().await.unwrap();
    assert_eq!(
        (done.written, done.unchanged, done.removed, done.deleted),
        (0, levels, levels, 0)
    );
}

/// A day's part computed an hour at a time (each hour a block of its own, as a day of the
/// design's traffic is computed in blocks) and folded gives the rows of the part computed at
/// once, and so the review of the decisions: in a world of regions with the reconcile
/// running (whether it ran is read over the whole day, not the hour).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_computed_an_hour_at_a_time_and_folded_is_the_day_computed_at_once() {
    let w = world_in(1, 1, Some(Regions::three().reconciled()));
    let events = w.events().await;
    let limits = Limits {
        part_block_bytes: 1,
        ..Limits::default()
    };
    let (engine, _dir) = lake_limited(&events, &w.policy_toml(2), &rounds_of(&w), limits).await;
    let warmed = engine.warm_parts().await.unwrap();
    assert!(warmed.computed > 0, "{warmed:?}");
    let range = world_range();
    let (from, to) = (range.from.to_rfc3339(), range.to.to_rfc3339());
    for name in ["wrong-limits", "limit-outliers"] {
        let params: Vec<(&str, &str)> = if name == "wrong-limits" {
            vec![("min_keys", "2")]
        } else {
            vec![]
        };
        let (served, portable) = served_and_portable(&engine, name, &from, &to, &params).await;
        assert!(!portable.is_empty(), "{name}: no rows");
        assert_eq!(served, portable, "{name}");
    }
}

/// The review from the kept parts of a range cut at midnights gives the rows of the review
/// that reads the decisions all the way: over whole days, over a range that starts and ends
/// inside hours, and filtered; the closed days' parts stay kept, and a day whose files
/// change is computed again and its new decisions counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_review_from_kept_parts_is_the_review_from_the_decisions() {
    let (events, engine, dir) = two_days().await;
    // Both days are closed: the warming computes every level's part of each.
    let warmed = engine.warm_parts().await.unwrap();
    assert_eq!((warmed.kept, warmed.computed), (0, 2), "{warmed:?}");
    let ranges = [
        (at_day(0, 0), at_day(2, 0)),
        (at_day(0, 5_400_000), at_day(1, 8_100_000)),
        (at_day(0, 0), at_day(0, 7_200_000)),
    ];
    let tier = TIERS[0].to_string();
    for (from, to) in &ranges {
        for filter in [vec![], vec![("tier", tier.as_str())]] {
            for name in ["wrong-limits", "limit-outliers"] {
                let mut params = filter.clone();
                if name == "wrong-limits" {
                    params.push(("min_keys", "2"));
                }
                let (served, portable) =
                    served_and_portable(&engine, name, from, to, &params).await;
                assert!(
                    !portable.is_empty(),
                    "{name} {from} {to} {params:?}: no rows"
                );
                assert_eq!(served, portable, "{name} {from} {to} {params:?}");
            }
        }
    }
    println!("{} decisions over two days", events.len());

    // And the reviews above left them kept.
    let warmed = engine.warm_parts().await.unwrap();
    assert_eq!((warmed.kept, warmed.computed), (2, 0), "{warmed:?}");

    // A late file into the second day: its part is computed again, the first day's is not,
    // and the review counts the new decisions.
    let whole = (at_day(0, 0), at_day(2, 0));
    let requests =
        |rows: &[Value]| -> i64 { rows.iter().map(|r| r["requests"].as_i64().unwrap()).sum() };
    let params = [("min_keys", "2")];
    let review = || served_and_portable(&engine, "wrong-limits", &whole.0, &whole.1, &params);
    let (before, _) = review().await;
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
    let late = late_into_the_second_day(&store, &events, 500).await;
    let warmed = engine.warm_parts().await.unwrap();
    assert_eq!((warmed.kept, warmed.computed), (1, 1), "{warmed:?}");
    let (after, portable) = review().await;
    assert_eq!(after, portable);
    let counted = late.iter().filter(|e| (e.source as u8) < 2).count() as i64;
    assert_eq!(requests(&after) - requests(&before), counted);
}
