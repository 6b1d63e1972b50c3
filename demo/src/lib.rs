//! `verdict demo`: the embedded default. No Redis, Kafka or S3: three regions' gateways run
//! in this process, each with memory counters of its own and the same file policy, each
//! enforcing its region's share of every global limit (shares moved by the regional
//! reconcile, run in the process too), in front of a built-in upstream, and a traffic
//! generator sends them an hour of API traffic over HTTP, compressed into a minute (the
//! limiter's clock runs 60× faster). Every decision goes through the 64-byte wire format
//! on an in-process queue, where Kafka stands in production, and into the raw table by the
//! ingest worker's own flush; the local folder plays the object store. Then the hourly
//! rollup runs and the query engine answers `wrong-limits` and `shadow-impact`.
//!
//! - [`config`]: what the demo runs (how long, how fast, how many keys, where it writes).
//! - [`world`]: the synthetic world at the demo's rate, its key directory and its requests.
//! - [`policy`]: that world's tiers and route classes as a policy document.
//! - [`regions`]: the three regions, where each key's requests come from, and the
//!   reconcile's rounds over the regions' gateways.
//! - [`local_gateway`]: a gateway and an upstream on loopback (also what `verdict-bench
//!   gateway` measures).
//! - [`queue`]: the in-process queue's consumer and the raw table's writes from it.
//! - [`report`]: what the demo did and the text it prints.
//!
//! [`demo`] runs the steps in order: [`prepare_out`], the gateway and its traffic, the raw
//! table, the rollup, the reports.

pub mod config;
pub mod local_gateway;
pub mod policy;
pub mod queue;
pub mod regions;
pub mod report;
pub mod world;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use verdict_gateway::{BuiltGateway, GatewayBuilder, GatewayStore, KeyDirectory};
use verdict_limiter::{
    Clock, FileSource, LimiterConfig, LimiterMetrics, MemoryStore, PolicyHandle, PolicySource,
    Regional, ScaledClock,
};
use verdict_load::{LoadProgress, LoadSpec};
use verdict_query::{Engine, Limits, PoliciesTable};
use verdict_reconcile::ReconcileConfig;
use verdict_reconcile::round_log::RoundLog;
use verdict_rollup::Rollup;
use verdict_schemas::EVENT_V1_LEN;
use verdict_schemas::RegionId;
use verdict_schemas::layout::{RAW_PREFIX, RECONCILE_ROUNDS_PREFIX};
use verdict_schemas::synth::SynthTraffic;

pub use config::{DemoConfig, EXAMPLE_SQL};
pub use local_gateway::{LocalGateway, spawn_upstream};
pub use queue::{DEMO_TOPIC, partition_of};
pub use report::{DemoReport, ShadowImpact, WrongLimit, render, render_review};

const HOUR_MS: i64 = 3_600_000;

/// How the traffic is going, every few seconds while it runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    /// Real seconds since the traffic started.
    pub elapsed_s: f64,
    /// Real seconds it runs for.
    pub seconds: u64,
    /// The limiter's clock, UTC ms.
    pub demo_clock_ms: i64,
    /// Requests answered or failed.
    pub requests: u64,
    /// Answers with 429.
    pub limited: u64,
    /// Would-deny decisions (shadow mode) the queue has carried.
    pub would_deny: u64,
    /// Requests without an answer.
    pub failed: u64,
}

/// Runs the demo: gateway, traffic, queue, raw table, rollup, reports. `on_progress` is
/// called every `progress_every` while the traffic runs. Returns what it did.
pub async fn demo(
    cfg: &DemoConfig,
    progress_every: Duration,
    on_progress: impl Fn(Progress) + Send + 'static,
) -> anyhow::Result<DemoReport> {
    prepare_out(&cfg.out, cfg.overwrite)?;
    std::fs::create_dir_all(&cfg.out).with_context(|| format!("creating {}", cfg.out.display()))?;
    let mut report = DemoReport {
        target_rate: cfg.rate,
        partitions: cfg.partitions,
        wire_bytes_per_event: EVENT_V1_LEN,
        raw_table: cfg.out.join(RAW_PREFIX).display().to_string(),
        ..DemoReport::default()
    };

    // The demo's hours lie wholly in the past, so they are closed when the rollup runs.
    let span_ms = cfg.seconds as i64 * 1_000 * i64::from(cfg.speed);
    let hours = (span_ms + HOUR_MS - 1) / HOUR_MS;
    let now = chrono::Utc::now().timestamp_millis();
    let start_ms = now.div_euclid(HOUR_MS) * HOUR_MS - hours * HOUR_MS;
    report.demo_hours = hours as u32;

    let world = world::world(cfg);
    let synth = SynthTraffic::new(world.clone());
    let policy_path = cfg.out.join("policy.toml");
    let policy_text = policy::per_route_policy_toml(&world, 1) + &regions::regions_toml();
    std::fs::write(&policy_path, policy_text)
        .with_context(|| format!("writing {}", policy_path.display()))?;
    let keys_path = cfg.out.join("keys.csv");
    world::write_keys(&keys_path, &synth)?;

    // A gateway per region, as `verdict gateway` builds it, on the demo's clock and memory
    // counters of the region's own; one policy, one key directory.
    let clock: Arc<dyn Clock> = Arc::new(ScaledClock::starting_at(start_ms, f64::from(cfg.speed)));
    let source: Arc<dyn PolicySource> = Arc::new(FileSource::new(&policy_path));
    let snapshot = source.load().await.context("loading the demo's policy")?;
    let policy = PolicyHandle::new(snapshot, clock.now_ms());
    let metrics = Arc::new(LimiterMetrics::new());
    let upstream = spawn_upstream().await?;
    let keys = KeyDirectory::load(&keys_path)?;
    let reconcile_cfg = ReconcileConfig::default();
    let mut gateways = Vec::new();
    let mut states = Vec::new();
    let mut consumers = Vec::new();
    let counts = Arc::new(queue::Counts::new(regions::REGIONS.len()));
    for region in 0..regions::REGIONS.len() {
        let builder =
            GatewayBuilder::new(format!("http://{upstream}").parse()?).clock(Arc::clone(&clock));
        let limiter = LimiterConfig {
            region: RegionId(region as u16),
            ..builder.limiter_config().clone()
        };
        let builder = builder.limiter(limiter);
        let store = Arc::new(MemoryStore::with_clock(
            builder.limiter_config().fallback_max_keys,
            Arc::clone(&clock),
        ));
        let regional = Regional::new(reconcile_cfg.share_ttl);
        let BuiltGateway { gateway, events } = builder.regional(regional.clone()).build(
            GatewayStore::Memory(Arc::clone(&store)),
            policy.clone(),
            Arc::clone(&metrics),
            keys.clone(),
        );
        gateways.push(LocalGateway::start(gateway).await?);
        states.push(regions::RegionState { store, regional });
        // Where Kafka stands: every event encoded to its wire form, on its key's partition.
        let (finish, finished) = tokio::sync::oneshot::channel::<()>();
        let consumer = tokio::spawn(queue::consume(
            events,
            cfg.partitions,
            Arc::clone(&counts),
            finished,
        ));
        consumers.push((finish, consumer));
    }
    let (stop_rounds, rounds_stopped) = tokio::sync::oneshot::channel::<()>();
    let rounds = tokio::spawn(regions::reconcile(
        Arc::clone(&clock),
        cfg.speed,
        policy.load(),
        states,
        reconcile_cfg,
        start_ms,
        rounds_stopped,
    ));

    let addrs: Vec<std::net::SocketAddr> = gateways.iter().map(|g| g.addr).collect();
    tracing::info!(
        gateways = ?addrs,
        upstream = %upstream,
        keys = cfg.keys,
        rate = cfg.rate,
        seconds = cfg.seconds,
        "sending traffic through the regions' gateways"
    );
    let spec = LoadSpec {
        concurrency: usize::from(cfg.concurrency),
        rate_per_s: Some(f64::from(cfg.rate)),
        requests: None,
        // The last tenth of a second is left to the answers in flight, so that every
        // decision falls inside the demo's hours.
        duration: Some(Duration::from_secs(cfg.seconds).saturating_sub(Duration::from_millis(100))),
        timeout: Duration::from_secs(10),
    };
    let progress = Arc::new(LoadProgress::default());
    let ticker = tokio::spawn(report_progress(
        Arc::clone(&progress),
        Arc::clone(&counts),
        Arc::clone(&clock),
        cfg.seconds,
        progress_every,
        on_progress,
    ));
    let sent = verdict_load::run(&spec, world::traffic(cfg, addrs, synth), progress).await;
    ticker.abort();
    let _ = stop_rounds.send(());
    let rounds = rounds.await.context("the reconcile task failed")?;
    // Every request was answered, so every decision's event is in a queue by now.
    let mut partitions: queue::Partitions = vec![Vec::new(); usize::from(cfg.partitions)];
    for (gateway, (finish, consumer)) in gateways.into_iter().zip(consumers) {
        gateway.stop().await?;
        let _ = finish.send(());
        let region = consumer.await.context("a queue consumer failed")?;
        for (all, more) in partitions.iter_mut().zip(region) {
            all.extend(more);
        }
    }

    report.requests = sent.sent;
    report.answered_per_s = sent.rate();
    report.p50_ms = sent.service_ms(0.5);
    report.p99_ms = sent.service_ms(0.99);
    report.statuses = sent.statuses.clone();
    report.failed = sent.failed;
    report.limited_without_retry_after = sent.limited_without_retry_after;
    report.traffic_s = sent.elapsed.as_secs_f64();
    report.events_dropped = metrics.events_dropped.get();
    counts.fill(&mut report);

    // The ingest worker's flush, one per partition.
    let started = Instant::now();
    let store: Arc<dyn ObjectStore> = Arc::new(
        LocalFileSystem::new_with_prefix(&cfg.out)
            .with_context(|| format!("opening {} as an object store", cfg.out.display()))?,
    );
    let written = queue::write_raw(Arc::clone(&store), partitions).await?;
    report.write_s = started.elapsed().as_secs_f64();
    report.files = written.files;
    report.undecodable = written.quarantined as u64;
    report.parquet_bytes = written.bytes as u64;
    report.parquet_bytes_per_event = report.parquet_bytes as f64 / report.events.max(1) as f64;
    report.hours = written.hours.len();
    let (Some(first), Some(last)) = (
        written.hours.first().copied(),
        written.hours.last().copied(),
    ) else {
        bail!("no decision reached the raw table: did the gateway answer at all?");
    };
    // The reconcile's rounds, recorded as the job records them.
    let mut log = RoundLog::new(Arc::clone(&store), rounds.len().max(1));
    for round in &rounds {
        log.push(*round);
    }
    report.reconcile_rounds = log
        .append(clock.now_ms())
        .await
        .context("recording the reconcile's rounds")?;
    report.first_hour = first.to_string();
    report.last_hour = last.to_string();
    report.end_hour = last.next().unwrap_or(last).to_string();

    // The hourly job: each hour rolled up into the keys that were refused.
    let started = Instant::now();
    let threads = std::thread::available_parallelism().map_or(2, usize::from);
    let rollup = Rollup::new(store, threads);
    for hour in &written.hours {
        let r = rollup.run_hour(*hour).await?;
        report.rollup_rows += r.rows;
        report.rollup_bytes += r.bytes;
    }
    report.rollup_s = started.elapsed().as_secs_f64();

    // The questions the history answers.
    let started = Instant::now();
    let engine = Engine::new(
        LocalFileSystem::new_with_prefix(&cfg.out)?,
        PoliciesTable::new(Some(source)),
        threads,
        Limits::default(),
    )?;
    report::ask(&engine, first, last, &mut report).await?;
    report.query_s = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Calls `on_progress` every `every` until aborted.
async fn report_progress(
    progress: Arc<LoadProgress>,
    counts: Arc<queue::Counts>,
    clock: Arc<dyn Clock>,
    seconds: u64,
    every: Duration,
    on_progress: impl Fn(Progress),
) {
    let started = Instant::now();
    let mut tick = tokio::time::interval(every.max(Duration::from_millis(100)));
    tick.tick().await;
    loop {
        tick.tick().await;
        on_progress(Progress {
            elapsed_s: started.elapsed().as_secs_f64(),
            seconds,
            demo_clock_ms: clock.now_ms(),
            requests: progress.done.load(Ordering::Relaxed),
            limited: progress.limited.load(Ordering::Relaxed),
            would_deny: counts.would_deny.load(Ordering::Relaxed),
            failed: progress.failed.load(Ordering::Relaxed),
        });
    }
}

/// Refuses to mix a new raw table into an old one unless asked to replace it (then removes
/// the raw table, the rollup and the reconcile's rounds).
pub fn prepare_out(out: &Path, overwrite: bool) -> anyhow::Result<()> {
    let raw = out.join(RAW_PREFIX);
    if raw.exists() {
        if !overwrite {
            bail!(
                "{} already holds a raw table; pass --overwrite to replace it, or --out to use another folder",
                raw.display()
            );
        }
        std::fs::remove_dir_all(&raw).with_context(|| format!("removing {}", raw.display()))?;
        for table in ["rollup", RECONCILE_ROUNDS_PREFIX] {
            let path = out.join(table);
            if path.exists() {
                std::fs::remove_dir_all(&path)
                    .with_context(|| format!("removing {}", path.display()))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use report::{number, rows};

    fn config(out: &Path) -> DemoConfig {
        DemoConfig {
            out: out.to_owned(),
            // One demo hour in 5 s.
            seconds: 5,
            speed: 720,
            rate: 800,
            concurrency: 8,
            keys: 100,
            seed: 7,
            partitions: 4,
            overwrite: false,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_demo_sends_traffic_through_the_gateway_into_the_lake() {
        let dir = tempfile::tempdir().unwrap();
        let a = config(dir.path());
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let r = demo(&a, Duration::from_secs(1), move |p| {
            log.lock().unwrap().push(p)
        })
        .await
        .unwrap();
        let status = |code: u16| r.statuses.get(&code).copied().unwrap_or_default();

        // Every request was answered by the gateway: proxied or refused, nothing else.
        assert!(r.requests > 1_000, "{r:?}");
        assert_eq!(r.failed, 0);
        assert_eq!(status(200) + status(429), r.requests, "{:?}", r.statuses);
        assert_eq!(r.limited_without_retry_after, 0);
        // One event per decision, none dropped; the refused ones are the 429s.
        assert_eq!(r.events_dropped, 0);
        assert_eq!(r.events, r.requests);
        assert_eq!(r.allowed + r.denied + r.would_deny, r.events);
        assert_eq!(r.denied, status(429));
        assert!(r.denied > 0 && r.would_deny > 0, "{r:?}");
        assert_eq!(r.undecodable, 0);

        // The raw table holds them in the production layout, inside the demo's hour.
        assert_eq!(r.demo_hours, 1);
        assert_eq!(r.hours, 1, "{} to {}", r.first_hour, r.last_hour);
        let mut files = 0;
        for date in std::fs::read_dir(dir.path().join("raw")).unwrap() {
            let date = date.unwrap().path();
            if date.ends_with(verdict_lake::log::LOG_DIR) {
                continue;
            }
            for hour in std::fs::read_dir(date).unwrap() {
                for f in std::fs::read_dir(hour.unwrap().path()).unwrap() {
                    let path = f.unwrap().path();
                    let rel = path.strip_prefix(dir.path()).unwrap().to_str().unwrap();
                    verdict_schemas::HourPartition::from_path(rel).unwrap();
                    files += 1;
                }
            }
        }
        assert_eq!(files, r.files);
        // Every file is in the raw table's log, once.
        let snapshot = verdict_lake::tables::RAW
            .table(Arc::new(
                LocalFileSystem::new_with_prefix(dir.path()).unwrap(),
            ))
            .snapshot()
            .await
            .unwrap();
        assert_eq!(snapshot.files().count(), r.files);
        assert_eq!(snapshot.num_records(), r.events);

        // Three regions decided, by their keys' homes: the largest the most.
        assert_eq!(r.regions.len(), 3, "{:?}", r.regions);
        assert_eq!(r.regions.iter().map(|g| g.events).sum::<u64>(), r.events);
        assert!(
            r.regions[0].events > r.regions[1].events
                && r.regions[1].events > r.regions[2].events
                && r.regions[2].events > 0,
            "{:?}",
            r.regions
        );
        // The reconcile ran every 30 s of the demo's hour (4.9 s of traffic at 720×: 117
        // rounds), and its rounds are in the lake, as the job records them.
        assert!(
            (110..=120).contains(&r.reconcile_rounds),
            "{}",
            r.reconcile_rounds
        );
        let what_if = &r.recommendation.as_ref().unwrap().what_if;
        let shares = what_if.shares.as_deref().unwrap_or_default();
        assert!(
            shares.starts_with(&format!(
                "shares moved by the regional reconcile as recorded: {} rounds",
                r.reconcile_rounds
            )),
            "{shares}"
        );
        assert_eq!(what_if.regions.len(), 3, "{:?}", what_if.regions);
        // Every recommendation shown is proven by that replay, and its quota is the one
        // printed.
        let replayed = r.recommendation.as_ref().unwrap();
        let judged: Vec<_> = replayed
            .proven
            .iter()
            .filter(|p| matches!(p.recommendation.verdict.as_str(), "too low" | "too high"))
            .collect();
        assert!(!judged.is_empty(), "{:#?}", r.wrong_limits);
        for p in &judged {
            assert!(p.met, "{p:#?}");
            let shown = r.wrong_limits.iter().find(|w| {
                w.verdict == p.recommendation.verdict
                    && w.override_key == p.recommendation.override_key
                    && w.recommended_quota == p.recommendation.recommended_quota as u64
            });
            assert!(shown.is_some(), "{p:#?} not in {:#?}", r.wrong_limits);
        }

        // The rollup counts every refusal once.
        assert_eq!(r.rollup_denied, r.denied);
        assert_eq!(r.rollup_would_deny, r.would_deny);

        // The reports read the world the generator built: free is set too low; starter,
        // in shadow mode, would have refused some of its keys.
        let verdict = |tier: &str, route: &str| {
            r.wrong_limits
                .iter()
                .find(|w| w.tier == tier && w.route_class == route)
                .map(|w| w.verdict.clone())
        };
        assert_eq!(
            verdict("free", "read").as_deref(),
            Some("too low"),
            "{:#?}",
            r.wrong_limits
        );
        assert!(
            r.shadow_impact
                .iter()
                .all(|s| s.tier == "starter" && s.would_deny <= s.requests)
        );
        assert!(
            r.shadow_impact
                .iter()
                .any(|s| s.would_deny > 0 && s.keys_would_deny > 0),
            "{:#?}",
            r.shadow_impact
        );
        assert_eq!(
            r.shadow_impact.iter().map(|s| s.would_deny).sum::<u64>(),
            r.would_deny
        );
        let text = render(&r, &a);
        assert!(text.contains("too low") && text.contains("verdict query serve"));
        // The query the summary suggests runs on the folder: 2 tiers × verdicts at least,
        // and its counts add up to the events.
        let engine = Engine::new(
            LocalFileSystem::new_with_prefix(dir.path()).unwrap(),
            PoliciesTable::new(None),
            2,
            Limits::default(),
        )
        .unwrap();
        let answer = rows(&engine, EXAMPLE_SQL).await.unwrap();
        assert!(answer.len() >= 3, "{answer:?}");
        assert_eq!(
            answer.iter().map(|r| number(r, "n") as u64).sum::<u64>(),
            r.events
        );

        // Progress came while the traffic ran (5 s, a line a second), counting up.
        let seen = seen.lock().unwrap().clone();
        assert!((3..=5).contains(&seen.len()), "{seen:?}");
        assert!(
            seen.windows(2)
                .all(|w| w[0].requests <= w[1].requests && w[0].demo_clock_ms < w[1].demo_clock_ms),
            "{seen:?}"
        );
        assert!(seen.last().unwrap().requests <= r.requests);

        // A second run into the same folder is refused.
        let err = demo(&a, Duration::from_secs(60), |_| {})
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("--overwrite"), "{err}");
    }
}
