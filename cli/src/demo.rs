//! `verdict demo`: the embedded default. No Redis, Kafka or S3: the gateway runs in this
//! process with memory counters and a file policy, in front of a built-in upstream, and a
//! traffic generator sends it an hour of API traffic over HTTP, compressed into a minute
//! (the limiter's clock runs 60× faster). Every decision goes through the 64-byte wire format
//! on an in-process queue, where Kafka stands in production, into the raw-file writer; the
//! local folder plays the object store. Then the hourly rollup runs and the query engine
//! answers `wrong-limits` and `shadow-impact`.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use axum::body::Body;
use axum::http::Request;
use clap::Args;
use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use serde::Serialize;
use verdict_gateway::load::{self, LoadProgress, LoadSpec, MakeRequest};
use verdict_gateway::{GatewayStore, KeyDirectory};
use verdict_ingest::{ConsumedEvent, KafkaSource, RawTable, WrittenFile, split_by_hour};
use verdict_limiter::{
    Clock, EventReceiver, FileSource, Limiter, LimiterConfig, LimiterMetrics, MemoryStore,
    PolicyHandle, PolicySource, ScaledClock, event_queue,
};
use verdict_query::{Engine, Limits, PoliciesTable};
use verdict_rollup::Rollup;
use verdict_schemas::layout::RAW_PREFIX;
use verdict_schemas::synth::{SynthConfig, SynthTraffic, synth_key_id};
use verdict_schemas::{DecisionEvent, EVENT_V1_LEN, HourPartition, KeyId, Verdict};

use crate::local_gateway::{LocalGateway, spawn_upstream};
use crate::synth_policy::{ROUTES, per_route_policy_toml};

/// The topic name the demo writes into file names, as production does.
pub const DEMO_TOPIC: &str = "verdict.decisions.v1";

const HOUR_MS: i64 = 3_600_000;

/// The query the summary suggests trying on the query service.
const EXAMPLE_SQL: &str = "SELECT tier, verdict, COUNT(*) AS n FROM decisions GROUP BY tier, verdict ORDER BY tier, verdict";

/// Options of `verdict demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Folder that plays the object store; the raw table goes to <OUT>/raw/, the policy and
    /// the key directory the gateway used to <OUT>/policy.toml and <OUT>/keys.csv.
    #[arg(long, default_value = "verdict-data")]
    pub out: PathBuf,
    /// How long the traffic runs, real seconds.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub seconds: u64,
    /// How much faster than real time the limiter's clock runs: at 60, each real minute is
    /// an hour of traffic, so the hourly quota and the hourly rollup have whole hours.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u32).range(1..=3_600))]
    pub speed: u32,
    /// Requests per real second the traffic generator aims at (the limits are set for it).
    #[arg(long, default_value_t = 3_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub rate: u32,
    /// Requests in flight at most.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,
    /// Distinct API keys (popularity is Zipf-distributed; one tenant makes 8 % of requests).
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub keys: u32,
    /// Seed of the traffic generator: the same seed sends the same keys in the same order.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Partitions of the in-process queue (Kafka partitions in production).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub partitions: u16,
    /// Replace a raw table already in <OUT> (otherwise the demo refuses to touch it).
    #[arg(long)]
    pub overwrite: bool,
    /// Print the summary as one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

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
    /// Events the gateway's queue dropped (verdict_events_dropped_total).
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
}

/// Runs the demo and prints its report.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let report = demo(&args).await?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", render(&report, &args));
    }
    Ok(())
}

/// The synthetic world at the rate the demo aims at: one demo hour holds `rate × 3600 /
/// speed` requests, and the limits are scaled to that, so the tiers keep their shape at any
/// rate: free too low, starter in shadow and too low, pro about right, enterprise generous
/// (and with enough keys, 0.6 % of them, for the review to judge it). The limits are per
/// route class (see [`crate::synth_policy::per_route_policy_toml`]).
fn world(args: &DemoArgs) -> SynthConfig {
    let per_hour = u64::from(args.rate) * 3_600 / u64::from(args.speed);
    let mut cfg = SynthConfig {
        seed: args.seed,
        ..SynthConfig::hour(per_hour.max(1), args.keys)
    };
    for tier in &mut cfg.tiers {
        match tier.name {
            "pro" => tier.hourly_quota = tier.hourly_quota.saturating_mul(5) / 2,
            "enterprise" => tier.key_share = 0.006,
            _ => {}
        }
    }
    cfg
}

/// The API key the demo gives synthetic key `id`.
fn api_key(id: &KeyId) -> String {
    format!("demo-{id}")
}

/// Writes the key directory the gateway reads: every synthetic key with its tier.
fn write_keys(path: &Path, traffic: &SynthTraffic) -> anyhow::Result<()> {
    let cfg = traffic.config();
    let mut csv = String::from("api_key,key_id,tier\n");
    for index in 0..cfg.keys {
        let id = synth_key_id(index);
        let tier = cfg.tiers[usize::from(traffic.tier_of(index).0)].name;
        csv += &format!("{},{id},{tier}\n", api_key(&id));
    }
    std::fs::write(path, csv).with_context(|| format!("writing {}", path.display()))
}

/// The requests: keys and route classes as the synthetic world draws them (Zipf keys, the
/// 8 % tenant, bursts of one key), plus one deliberate burst: 600 back-to-back requests of
/// a pro key at 40 % of the run.
fn traffic(args: &DemoArgs, gateway: std::net::SocketAddr, synth: SynthTraffic) -> MakeRequest {
    let planned = u64::from(args.rate) * args.seconds;
    let burst = planned * 2 / 5..planned * 2 / 5 + 600;
    let pro = (0..args.keys)
        .rev()
        .find(|i| synth.config().tiers[usize::from(synth.tier_of(*i).0)].name == "pro")
        .map(synth_key_id);
    let synth = Mutex::new(synth);
    Arc::new(move |i| {
        let (key, route) = match pro {
            Some(k) if burst.contains(&i) => (k, 0),
            _ => synth
                .lock()
                .ok()
                .and_then(|mut s| s.next())
                .map_or((synth_key_id(0), 0), |e| (e.key_id, e.route_class.0)),
        };
        let route = ROUTES[usize::from(route) % ROUTES.len()];
        Request::get(format!("http://{gateway}/v1/{route}/{i}"))
            .header("x-api-key", api_key(&key))
            .body(Body::empty())
            .unwrap_or_default()
    })
}

/// Runs the demo: gateway, traffic, queue, raw table, rollup, reports. Returns what it did.
pub async fn demo(args: &DemoArgs) -> anyhow::Result<DemoReport> {
    prepare_out(&args.out, args.overwrite)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let mut report = DemoReport {
        target_rate: args.rate,
        partitions: args.partitions,
        wire_bytes_per_event: EVENT_V1_LEN,
        ..DemoReport::default()
    };

    // The demo's hours lie wholly in the past, so they are closed when the rollup runs.
    let span_ms = args.seconds as i64 * 1_000 * i64::from(args.speed);
    let hours = (span_ms + HOUR_MS - 1) / HOUR_MS;
    let now = chrono::Utc::now().timestamp_millis();
    let start_ms = now.div_euclid(HOUR_MS) * HOUR_MS - hours * HOUR_MS;
    report.demo_hours = hours as u32;

    let world = world(args);
    let synth = SynthTraffic::new(world.clone());
    let policy_path = args.out.join("policy.toml");
    std::fs::write(&policy_path, per_route_policy_toml(&world, 1))
        .with_context(|| format!("writing {}", policy_path.display()))?;
    let keys_path = args.out.join("keys.csv");
    write_keys(&keys_path, &synth)?;

    // The gateway, as `verdict gateway` builds it, on the demo's clock and memory counters.
    let clock: Arc<dyn Clock> = Arc::new(ScaledClock::starting_at(start_ms, f64::from(args.speed)));
    let source: Arc<dyn PolicySource> = Arc::new(FileSource::new(&policy_path));
    let snapshot = source.load().await.context("loading the demo's policy")?;
    let metrics = Arc::new(LimiterMetrics::new());
    let (queue, events) = event_queue(65_536, Arc::clone(&metrics));
    let cfg = LimiterConfig::default();
    let store = GatewayStore::Memory(Arc::new(MemoryStore::with_clock(
        cfg.fallback_max_keys,
        Arc::clone(&clock),
    )));
    let limiter = Limiter::with_clock(
        store,
        PolicyHandle::new(snapshot, clock.now_ms()),
        queue,
        Arc::clone(&metrics),
        cfg,
        Arc::clone(&clock),
    );
    let keys = KeyDirectory::load(&keys_path)?;
    let upstream = spawn_upstream().await?;
    let gateway = LocalGateway::start(limiter, keys, upstream).await?;

    // Where Kafka stands: every event encoded to its wire form, on its key's partition.
    let counts = Arc::new(Counts::default());
    let (finish_queue, finish) = tokio::sync::oneshot::channel::<()>();
    let consumer = tokio::spawn(queue_consumer(
        events,
        args.partitions,
        Arc::clone(&counts),
        finish,
    ));

    tracing::info!(
        gateway = %gateway.addr,
        upstream = %upstream,
        keys = args.keys,
        rate = args.rate,
        seconds = args.seconds,
        "sending traffic through the gateway"
    );
    let spec = LoadSpec {
        concurrency: usize::from(args.concurrency),
        rate_per_s: Some(f64::from(args.rate)),
        requests: None,
        // The last tenth of a second is left to the answers in flight, so that every
        // decision falls inside the demo's hours.
        duration: Some(
            Duration::from_secs(args.seconds).saturating_sub(Duration::from_millis(100)),
        ),
        timeout: Duration::from_secs(10),
    };
    let progress = Arc::new(LoadProgress::default());
    let ticker = tokio::spawn(show_progress(
        Arc::clone(&progress),
        Arc::clone(&counts),
        Arc::clone(&clock),
        args.seconds,
    ));
    let sent = load::run(&spec, traffic(args, gateway.addr, synth), progress).await;
    ticker.abort();
    // Every request was answered, so every decision's event is in the queue by now.
    gateway.stop().await?;
    let _ = finish_queue.send(());
    let queues = consumer.await.context("the queue consumer failed")?;

    report.requests = sent.sent;
    report.answered_per_s = sent.rate();
    report.p50_ms = sent.service_ms(0.5);
    report.p99_ms = sent.service_ms(0.99);
    report.statuses = sent.statuses.clone();
    report.failed = sent.failed;
    report.limited_without_retry_after = sent.limited_without_retry_after;
    report.traffic_s = sent.elapsed.as_secs_f64();
    report.events_dropped = metrics.events_dropped.get();
    let c = |n: &AtomicU64| n.load(Ordering::Relaxed);
    report.events = c(&counts.events);
    report.allowed = c(&counts.allowed);
    report.denied = c(&counts.denied);
    report.would_deny = c(&counts.would_deny);
    report.degraded = c(&counts.degraded);

    // The ingest writer: one file per partition and hour.
    let started = Instant::now();
    let store: Arc<dyn ObjectStore> = Arc::new(
        LocalFileSystem::new_with_prefix(&args.out)
            .with_context(|| format!("opening {} as an object store", args.out.display()))?,
    );
    let raw = RawTable::open(Arc::clone(&store))
        .await
        .context("creating the raw table")?;
    let mut tasks = tokio::task::JoinSet::new();
    for (partition, records) in queues.into_iter().enumerate() {
        let mut raw = raw.clone();
        tasks.spawn(async move {
            let partition = partition as i32;
            consume_partition(&mut raw, partition, records).await
        });
    }
    let mut written: Vec<WrittenFile> = Vec::new();
    while let Some(done) = tasks.join_next().await {
        let (files, undecodable) = done.context("a partition writer panicked")??;
        report.undecodable += undecodable;
        written.extend(files);
    }
    report.write_s = started.elapsed().as_secs_f64();
    written.sort_by(|a, b| a.path.cmp(&b.path));
    report.files = written.len();
    let mut hours: Vec<HourPartition> = written.iter().map(|w| w.hour).collect();
    hours.sort();
    hours.dedup();
    report.hours = hours.len();
    report.parquet_bytes = written.iter().map(|w| w.bytes as u64).sum();
    report.parquet_bytes_per_event = report.parquet_bytes as f64 / report.events.max(1) as f64;
    report.raw_table = args.out.join(RAW_PREFIX).display().to_string();
    let (Some(first), Some(last)) = (hours.first().copied(), hours.last().copied()) else {
        bail!("no decision reached the raw table: did the gateway answer at all?");
    };
    report.first_hour = first.to_string();
    report.last_hour = last.to_string();

    // The hourly job: each hour rolled up into the keys that were refused.
    let started = Instant::now();
    let threads = std::thread::available_parallelism().map_or(2, usize::from);
    let rollup = Rollup::new(store, threads);
    for hour in &hours {
        let r = rollup.run_hour(*hour).await?;
        report.rollup_rows += r.rows;
        report.rollup_bytes += r.bytes;
    }
    report.rollup_s = started.elapsed().as_secs_f64();

    // The questions the history answers.
    let started = Instant::now();
    let engine = Engine::new(
        LocalFileSystem::new_with_prefix(&args.out)?,
        PoliciesTable::new(Some(source)),
        threads,
        Limits::default(),
    )?;
    let ts = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .map(|t| t.to_rfc3339())
            .unwrap_or_default()
    };
    let range: BTreeMap<String, String> = [
        ("from".to_string(), ts(first.start_ms())),
        ("to".to_string(), ts(last.end_ms())),
    ]
    .into();
    let totals = rows(
        &engine,
        "SELECT SUM(denied) AS denied, SUM(would_deny) AS would_deny FROM denied_hourly",
    )
    .await?;
    let total = |name: &str| totals.first().map_or(0, |r| number(r, name) as u64);
    report.rollup_denied = total("denied");
    report.rollup_would_deny = total("would_deny");
    // The review runs once: its rows as printed, and its recommendation replayed.
    let sql = engine.report_sql("wrong-limits", &range).await?;
    let (schema, batches) = engine.collect(&sql, 100_000).await?;
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
    let replay_range = verdict_query::reports::Range::parse(
        range.get("from").map(String::as_str),
        range.get("to").map(String::as_str),
        chrono::Utc::now(),
        7,
    )?;
    let review = verdict_query::recommend::read(&batches)?;
    report.recommendation =
        Some(verdict_query::recommend::replay_review(&engine, review, replay_range, 0).await?);
    let sql = engine.report_sql("shadow-impact", &range).await?;
    report.shadow_impact = rows(&engine, &sql)
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
    report.query_s = started.elapsed().as_secs_f64();
    Ok(report)
}

/// What the queue's consumer has seen so far.
#[derive(Debug, Default)]
struct Counts {
    events: AtomicU64,
    allowed: AtomicU64,
    denied: AtomicU64,
    would_deny: AtomicU64,
    degraded: AtomicU64,
}

/// Takes events off the gateway's queue until told to finish (then takes what is left):
/// each is counted, encoded to its wire form and appended to its key's partition.
async fn queue_consumer(
    mut events: EventReceiver,
    partitions: u16,
    counts: Arc<Counts>,
    mut finish: tokio::sync::oneshot::Receiver<()>,
) -> Vec<Vec<[u8; EVENT_V1_LEN]>> {
    let mut queues = vec![Vec::new(); usize::from(partitions)];
    let mut take = |e: DecisionEvent| {
        counts.events.fetch_add(1, Ordering::Relaxed);
        match e.verdict {
            Verdict::Allowed => &counts.allowed,
            Verdict::Denied => &counts.denied,
            Verdict::WouldDeny => &counts.would_deny,
        }
        .fetch_add(1, Ordering::Relaxed);
        if e.is_degraded() {
            counts.degraded.fetch_add(1, Ordering::Relaxed);
        }
        queues[partition_of(&e, u32::from(partitions))].push(e.encode());
    };
    loop {
        tokio::select! {
            e = events.recv() => match e {
                Some(e) => take(e),
                None => break,
            },
            _ = &mut finish => {
                while let Some(e) = events.try_recv() {
                    take(e);
                }
                break;
            }
        }
    }
    queues
}

/// A line on stderr every few seconds while the traffic runs.
async fn show_progress(
    progress: Arc<LoadProgress>,
    counts: Arc<Counts>,
    clock: Arc<dyn Clock>,
    seconds: u64,
) {
    let every = if std::io::stderr().is_terminal() {
        5
    } else {
        10
    };
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(every));
    tick.tick().await;
    loop {
        tick.tick().await;
        let elapsed = started.elapsed().as_secs_f64();
        let done = progress.done.load(Ordering::Relaxed);
        let clock = chrono::DateTime::from_timestamp_millis(clock.now_ms())
            .map(|t| t.format("%H:%M").to_string())
            .unwrap_or_default();
        eprintln!(
            "  {elapsed:>4.0} s of {seconds}: demo clock {clock} UTC, {done} requests ({rate:.0}/s), \
             {limited} answered 429, {would} would-deny in shadow mode, {failed} failed",
            rate = done as f64 / elapsed.max(1e-9),
            limited = progress.limited.load(Ordering::Relaxed),
            would = counts.would_deny.load(Ordering::Relaxed),
            failed = progress.failed.load(Ordering::Relaxed),
        );
    }
}

/// Runs `sql` and returns its rows as the query service answers them: JSON objects,
/// column name → value.
async fn rows(engine: &Engine, sql: &str) -> anyhow::Result<Vec<serde_json::Value>> {
    let (schema, batches) = engine.collect(sql, 100_000).await?;
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

fn number(row: &serde_json::Value, name: &str) -> f64 {
    row[name].as_f64().unwrap_or(0.0)
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
    /// The hourly quota the review recommends.
    pub recommended_quota: u64,
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

/// Refuses to mix a new raw table into an old one unless asked to replace it.
fn prepare_out(out: &Path, overwrite: bool) -> anyhow::Result<()> {
    let raw = out.join(RAW_PREFIX);
    if raw.exists() {
        if !overwrite {
            bail!(
                "{} already holds a raw table; pass --overwrite to replace it, or --out to use another folder",
                raw.display()
            );
        }
        std::fs::remove_dir_all(&raw).with_context(|| format!("removing {}", raw.display()))?;
        let rollup = out.join("rollup");
        if rollup.exists() {
            std::fs::remove_dir_all(&rollup)
                .with_context(|| format!("removing {}", rollup.display()))?;
        }
    }
    Ok(())
}

/// The queue partition of an event, as Kafka keys records by key id: the key id is already a
/// hash, so its first bytes spread keys evenly over partitions.
pub(crate) fn partition_of(e: &DecisionEvent, partitions: u32) -> usize {
    let k = e.key_id.as_bytes();
    (u32::from_le_bytes([k[0], k[1], k[2], k[3]]) % partitions.max(1)) as usize
}

/// The ingest side for one partition: decode each record at its offset, split by hour,
/// write one file per hour, each committed to the raw table. Returns the files and the
/// count of records that did not decode.
async fn consume_partition(
    raw: &mut RawTable,
    partition: i32,
    records: Vec<[u8; EVENT_V1_LEN]>,
) -> anyhow::Result<(Vec<WrittenFile>, u64)> {
    let mut undecodable = 0;
    let consumed = records.iter().enumerate().filter_map(|(offset, bytes)| {
        match DecisionEvent::decode(bytes) {
            Ok(event) => Some(ConsumedEvent {
                event,
                partition,
                offset: offset as i64,
            }),
            Err(e) => {
                tracing::warn!(partition, offset, error = %e, "undecodable record");
                undecodable += 1;
                None
            }
        }
    });
    let split = split_by_hour(consumed);
    undecodable += split.unplaceable.len() as u64;
    let mut files = Vec::new();
    let source = KafkaSource::new("local", DEMO_TOPIC, partition);
    for (hour, events) in split.hours {
        if let Some(f) = raw.append(&source, hour, events).await? {
            tracing::debug!(path = %f.path, rows = f.rows, bytes = f.bytes, "raw file written");
            files.push(f);
        }
    }
    Ok((files, undecodable))
}

fn pct(part: u64, whole: u64) -> f64 {
    100.0 * part as f64 / whole.max(1) as f64
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1_000_000.0
}

/// The text summary.
pub fn render(r: &DemoReport, args: &DemoArgs) -> String {
    let status = |code: u16| r.statuses.get(&code).copied().unwrap_or_default();
    let others: u64 = r
        .statuses
        .iter()
        .filter(|(code, _)| **code != 200 && **code != 429)
        .map(|(_, n)| n)
        .sum();
    let n = r.events;
    let out = args.out.display();
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
         on the wire   {wire} bytes per event, {wire_mb:.1} MB through {parts} queue partitions\n\
         raw table     {files} Parquet files in {hour_parts} hour partitions ({first} to {last}), \
         {pq_mb:.2} MB, {pq_per:.2} bytes per event, written in {write_s:.2} s\n\
         rollup        {rollup_rows} rows (key, tier, route class and region with a refusal), \
         {rollup_kb:.1} KB, in {rollup_s:.2} s; it counts {rollup_denied} denials (the client \
         saw {limited} 429s) and {rollup_would} would-denies\n\
         undecodable   {undecodable}\n",
        minutes = r.traffic_s * f64::from(args.speed) / 60.0,
        secs = r.traffic_s,
        speed = args.speed,
        keys = args.keys,
        seed = args.seed,
        requests = r.requests,
        rate = r.target_rate,
        answered = r.answered_per_s,
        p50 = r.p50_ms,
        p99 = r.p99_ms,
        ok = status(200),
        limited = status(429),
        no_retry = r.limited_without_retry_after,
        failed = r.failed,
        allowed = r.allowed,
        allowed_p = pct(r.allowed, n),
        denied = r.denied,
        denied_p = pct(r.denied, n),
        would = r.would_deny,
        would_p = pct(r.would_deny, n),
        degraded = r.degraded,
        dropped = r.events_dropped,
        wire = r.wire_bytes_per_event,
        wire_mb = mb(r.wire_bytes_per_event as u64 * n),
        parts = r.partitions,
        files = r.files,
        hour_parts = r.hours,
        first = r.first_hour,
        last = r.last_hour,
        pq_mb = mb(r.parquet_bytes),
        pq_per = r.parquet_bytes_per_event,
        write_s = r.write_s,
        rollup_rows = r.rollup_rows,
        rollup_kb = r.rollup_bytes as f64 / 1000.0,
        rollup_s = r.rollup_s,
        rollup_denied = r.rollup_denied,
        rollup_would = r.rollup_would_deny,
        undecodable = r.undecodable,
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
         then, for example,\n  \
         curl -s 'http://127.0.0.1:8089/v1/reports/top-denied?from={first}:00:00Z&to={last}:59:59Z'\n  \
         curl -s http://127.0.0.1:8089/v1/sql -d \"{EXAMPLE_SQL}\"\n\
         The same gateway stands alone in front of any upstream:\n  \
         verdict gateway --upstream http://127.0.0.1:8080 --keys-file {out}/keys.csv --policy-file {out}/policy.toml\n",
        raw = r.raw_table,
        first = r.first_hour,
        last = r.last_hour,
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

    fn args(out: &Path) -> DemoArgs {
        DemoArgs {
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
            json: false,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_demo_sends_traffic_through_the_gateway_into_the_lake() {
        let dir = tempfile::tempdir().unwrap();
        let a = args(dir.path());
        let r = demo(&a).await.unwrap();
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

        // A second run into the same folder is refused.
        let err = demo(&a).await.unwrap_err().to_string();
        assert!(err.contains("--overwrite"), "{err}");
    }
}
