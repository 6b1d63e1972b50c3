//! `verdict-bench soak`: the decision path for minutes under faults. Three `verdict gateway`
//! processes (this binary) on the Redis Cluster of `scripts/services.sh`, their policy in
//! PostgreSQL (through a TCP proxy of its own), their events on Kafka and one
//! `verdict ingest` worker writing them into a raw table in a folder, each gateway paced at
//! the design's 2,000 requests/s over Zipf keys with a hot tenant. Meanwhile a seeded
//! schedule kills and restarts a Redis master, pauses a master past the deadline, adds
//! latency on the proxy to PostgreSQL, stops the Kafka broker, hangs PostgreSQL and restarts
//! a gateway with SIGTERM (its share of the load goes to the others meanwhile, as a load
//! balancer's would).
//!
//! It prints one JSON object: per window of the schedule (each fault's first second apart),
//! requests sent and answered (2xx or 429, with the rate-limit fields, and every 429 with
//! Retry-After), latency from when each request was due; per key and hour, allowed ÷ limit
//! (worst and p99) from the raw table; decisions by the fallback; every gateway's account
//! of its events (decided = sent + failed + dropped) and the raw table against it (each
//! event sent there exactly once).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::shared::{Account, Children, account, run_ok, signal, wait_listening};
use anyhow::{Context, bail};
use axum::body::Body;
use clap::Args;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use serde::Serialize;
use verdict_load::proxy::TcpProxy;
use verdict_load::{LoadReport, LoadSpec, MakeRequest};
use verdict_schemas::KeyId;

/// Options of `verdict-bench soak`.
#[derive(Debug, Clone, Args)]
pub struct SoakArgs {
    /// Length of the run, seconds (the schedule's faults scale with it).
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(60..=86_400))]
    pub seconds: u64,
    /// Seed of the schedule and of the keys' draw.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Requests per second to each gateway.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub rate: u64,
    /// Distinct API keys (Zipf popularity; one hot tenant has 8 % of the requests).
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u32).range(10..=1_000_000))]
    pub keys: u32,
    /// The Redis Cluster the gateways decide with.
    #[arg(
        long,
        env = "VERDICT_REDIS_CLUSTER_URL",
        default_value = "redis-cluster://127.0.0.1:17001"
    )]
    pub redis_cluster: String,
    /// The Kafka broker.
    #[arg(long, env = "VERDICT_KAFKA_BROKERS", default_value = "127.0.0.1:19092")]
    pub kafka_brokers: String,
    /// The PostgreSQL the policy goes into (a database of the run's own is created there).
    #[arg(
        long,
        env = "VERDICT_PG_URL",
        default_value = "postgres://verdict@127.0.0.1:15432/verdict"
    )]
    pub postgres: String,
    /// The script that starts and stops the services (the Kafka broker is stopped and
    /// started with it, a killed Redis master restarted).
    #[arg(long, default_value = "scripts/services.sh")]
    pub services: PathBuf,
}

/// The faults of the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Fault {
    /// SIGKILL to a Redis master; restarted (as a replica) after the window's first half.
    KillMaster,
    /// `CLIENT PAUSE` on a master, past the decision deadline.
    PauseMaster,
    /// Latency added on the proxy between the gateways and PostgreSQL.
    PolicyLatency,
    /// The Kafka broker stopped.
    StopKafka,
    /// PostgreSQL hung (SIGSTOP), then let go.
    HangPostgres,
    /// A gateway stopped with SIGTERM and started again.
    RestartGateway,
}

const FAULTS: [Fault; 6] = [
    Fault::KillMaster,
    Fault::PauseMaster,
    Fault::PolicyLatency,
    Fault::StopKafka,
    Fault::HangPostgres,
    Fault::RestartGateway,
];

impl Fault {
    /// How long it lasts in a run of 600 s (scaled with the run, never under 5 s).
    fn length(self, scale: f64) -> Duration {
        let s = match self {
            Self::KillMaster => 40.0,
            Self::PauseMaster => 10.0,
            Self::PolicyLatency | Self::HangPostgres => 30.0,
            Self::StopKafka => 60.0,
            Self::RestartGateway => 20.0,
        };
        Duration::from_secs_f64((s * scale).max(5.0))
    }
}

/// One window of the schedule: calm, or a fault's first second, or the rest of it.
#[derive(Debug, Clone, Serialize)]
struct Window {
    what: String,
    from_s: f64,
    seconds: f64,
    sent: u64,
    answered: u64,
    answered_share: f64,
    status_429: u64,
    failed: u64,
    without_ratelimit_fields: u64,
    limited_without_retry_after: u64,
    p50_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    max_ms: f64,
    /// What the gateways' own metrics counted over the window, read every second (a
    /// gateway restarted in it counts from its new life; a second is the window's in which
    /// it ended).
    #[serde(flatten)]
    decided: Tally,
}

/// The gateways' decisions over some seconds, against the deadline.
#[derive(Debug, Clone, Default, Serialize)]
struct Tally {
    /// Decisions.
    decisions: u64,
    /// The share of them within the deadline plus each second's scheduling slack (the worst
    /// overshoot of a thread's 1 ms sleeps over that second, a thread of this process on
    /// the same cores as the gateways), counted at the gateways' histogram bound at or
    /// under it: a lower bound.
    decided_within_deadline_and_slack: f64,
    /// The share within 7.5 ms, whatever the slack.
    decided_within_7_5_ms: f64,
    /// The worst second's slack, and the median second's.
    worst_slack_ms: f64,
    median_slack_ms: f64,
    /// Decisions of the local fallback, and those of them made because a gateway process
    /// was overloaded.
    fallback_decisions: u64,
    overload_decisions: u64,
    #[serde(skip)]
    within_slack: u64,
    #[serde(skip)]
    within_fixed: u64,
    #[serde(skip)]
    slacks_us: Vec<u64>,
}

impl Tally {
    /// Adds one second's counts, with that second's slack.
    fn add(&mut self, second: &Scrape, slack: Duration) {
        self.decisions += second.decisions;
        self.within_slack += second.within(second.bound(DEADLINE + slack));
        self.within_fixed += second.within(second.bound(Duration::from_micros(7_500)));
        self.fallback_decisions += second.fallback;
        self.overload_decisions += second.overload;
        self.slacks_us.push(slack.as_micros() as u64);
    }

    /// The shares and the slack's figures from what was added.
    fn finish(mut self) -> Self {
        let of = |n: u64| n as f64 / self.decisions.max(1) as f64;
        self.decided_within_deadline_and_slack = of(self.within_slack);
        self.decided_within_7_5_ms = of(self.within_fixed);
        self.slacks_us.sort_unstable();
        let ms = |us: Option<&u64>| us.map_or(0.0, |us| *us as f64 / 1000.0);
        self.worst_slack_ms = ms(self.slacks_us.last());
        self.median_slack_ms = ms(self.slacks_us.get(self.slacks_us.len() / 2));
        self
    }
}

/// Every second, the gateways' counts since the second before, credited to the window
/// running then.
struct Sampler {
    window: Arc<std::sync::atomic::AtomicUsize>,
    tallies: Arc<std::sync::Mutex<Vec<Tally>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    fn start(ports: Vec<u16>, windows: usize) -> Self {
        let window = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let tallies = Arc::new(std::sync::Mutex::new(vec![Tally::default(); windows]));
        let (w, t) = (Arc::clone(&window), Arc::clone(&tallies));
        let task = tokio::spawn(async move {
            let meter = SlackMeter::start();
            let mut last = scrape_all(&ports).await;
            meter.take();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                tick.tick().await;
                let now = scrape_all(&ports).await;
                let slack = meter.take();
                let mut second = Scrape::default();
                for (after, before) in now.iter().zip(&last) {
                    second.add(&after.since(before));
                }
                last = now;
                let at = w.load(Ordering::Acquire);
                if let Some(tally) = t.lock().unwrap_or_else(|e| e.into_inner()).get_mut(at) {
                    tally.add(&second, slack);
                }
            }
        });
        Self {
            window,
            tallies,
            task,
        }
    }

    /// From now on, seconds are window `w`'s.
    fn enter(&self, w: usize) {
        self.window.store(w, Ordering::Release);
    }

    /// Stops, after one more second, and gives each window's tally.
    async fn finish(self) -> Vec<Tally> {
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        self.task.abort();
        let tallies = std::mem::take(&mut *self.tallies.lock().unwrap_or_else(|e| e.into_inner()));
        tallies.into_iter().map(Tally::finish).collect()
    }
}

impl Window {
    fn of(what: String, from_s: f64, r: &LoadReport) -> Self {
        let answered = r.count(axum::http::StatusCode::OK)
            + r.count(axum::http::StatusCode::TOO_MANY_REQUESTS);
        Self {
            what,
            from_s,
            seconds: r.elapsed.as_secs_f64(),
            sent: r.sent,
            answered,
            answered_share: answered as f64 / r.sent.max(1) as f64,
            status_429: r.count(axum::http::StatusCode::TOO_MANY_REQUESTS),
            failed: r.failed,
            without_ratelimit_fields: r.without_ratelimit_fields,
            limited_without_retry_after: r.limited_without_retry_after,
            p50_ms: r.latency_ms(0.5),
            p99_ms: r.latency_ms(0.99),
            p999_ms: r.latency_ms(0.999),
            max_ms: r.latency_ms(1.0),
            decided: Tally::default(),
        }
    }
}

/// What one scrape of gateways' `/metrics` counted, or the difference of two.
#[derive(Debug, Clone, Default, PartialEq)]
struct Scrape {
    /// `verdict_gateway_decision_seconds`: (bound in seconds, decisions at or under it).
    buckets: Vec<(f64, u64)>,
    decisions: u64,
    fallback: u64,
    overload: u64,
}

impl Scrape {
    /// Reads the Prometheus text of one gateway.
    fn parse(text: &str) -> Self {
        let mut s = Self::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((name, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(v) = value.parse::<f64>() else {
                continue;
            };
            let v = v as u64;
            if let Some(le) = name
                .strip_prefix("verdict_gateway_decision_seconds_bucket{le=\"")
                .and_then(|r| r.strip_suffix("\"}"))
            {
                if let Ok(le) = le.parse::<f64>() {
                    s.buckets.push((le, v));
                }
            } else if name == "verdict_gateway_decision_seconds_count" {
                s.decisions = v;
            } else if name.starts_with("verdict_fallback_decisions_total") {
                s.fallback += v;
            } else if name.starts_with("verdict_overload_decisions_total") {
                s.overload += v;
            }
        }
        s
    }

    /// What was counted between `before` and `self`, one gateway's; a process that
    /// restarted in between counts from zero.
    fn since(&self, before: &Self) -> Self {
        if self.decisions < before.decisions || self.buckets.len() != before.buckets.len() {
            return self.clone();
        }
        Self {
            buckets: self
                .buckets
                .iter()
                .zip(&before.buckets)
                .map(|(a, b)| (a.0, a.1.saturating_sub(b.1)))
                .collect(),
            decisions: self.decisions - before.decisions,
            fallback: self.fallback.saturating_sub(before.fallback),
            overload: self.overload.saturating_sub(before.overload),
        }
    }

    /// Adds another gateway's.
    fn add(&mut self, other: &Self) {
        if self.buckets.is_empty() {
            self.buckets = other.buckets.iter().map(|(le, _)| (*le, 0)).collect();
        }
        for (mine, theirs) in self.buckets.iter_mut().zip(&other.buckets) {
            mine.1 += theirs.1;
        }
        self.decisions += other.decisions;
        self.fallback += other.fallback;
        self.overload += other.overload;
    }

    /// The histogram's largest bound not above `limit`, in seconds (0 if none is).
    fn bound(&self, limit: Duration) -> f64 {
        let limit = limit.as_secs_f64() + 1e-9;
        self.buckets
            .iter()
            .map(|(le, _)| *le)
            .filter(|le| *le <= limit)
            .fold(0.0, f64::max)
    }

    /// Decisions at or under the bound `le` seconds.
    fn within(&self, le: f64) -> u64 {
        self.buckets
            .iter()
            .filter(|(b, _)| *b <= le)
            .map(|(_, n)| *n)
            .max()
            .unwrap_or(0)
    }
}

/// The decision deadline of the gateways (the limiter's default).
const DEADLINE: Duration = Duration::from_millis(5);

/// A thread that sleeps 1 ms at a time for the whole run and keeps the worst overshoot
/// since it was last asked: the scheduling slack the cores give a thread right now.
struct SlackMeter {
    worst_us: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl SlackMeter {
    fn start() -> Self {
        let (worst_us, stop) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (w, s) = (Arc::clone(&worst_us), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let t = Instant::now();
                std::thread::sleep(Duration::from_millis(1));
                let over = t.elapsed().saturating_sub(Duration::from_millis(1));
                w.fetch_max(over.as_micros() as u64, Ordering::Relaxed);
            }
        });
        Self { worst_us, stop }
    }

    /// The worst overshoot since the last call.
    fn take(&self) -> Duration {
        Duration::from_micros(self.worst_us.swap(0, Ordering::Relaxed))
    }
}

impl Drop for SlackMeter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Every gateway's `/metrics`, in the order of `ports`.
async fn scrape_all(ports: &[u16]) -> Vec<Scrape> {
    let mut all = Vec::with_capacity(ports.len());
    for port in ports {
        all.push(scrape(*port).await);
    }
    all
}

/// One gateway's `/metrics` (empty when it does not answer: stopped, or starting).
async fn scrape(port: u16) -> Scrape {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fetch = async {
        let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await?;
        let mut text = String::new();
        conn.read_to_string(&mut text).await?;
        Ok::<_, std::io::Error>(text)
    };
    match tokio::time::timeout(Duration::from_secs(2), fetch).await {
        Ok(Ok(text)) => Scrape::parse(&text),
        _ => Scrape::default(),
    }
}

/// The printed result.
#[derive(Debug, Serialize)]
struct SoakReport {
    bench: &'static str,
    seed: u64,
    seconds: u64,
    gateways: usize,
    rate_per_gateway: u64,
    keys: u32,
    schedule: Vec<(Fault, f64, f64)>,
    windows: Vec<Window>,
    /// Over the windows outside a fault's first second.
    answered_share_outside_first_seconds: f64,
    /// The scheduling slack measured on the quiet machine before the run (a 1 ms sleep's
    /// worst overshoot); the share of decisions the gateways made within 5 ms + each
    /// second's slack, and within 7.5 ms (see [`Tally`]), and of requests answered within
    /// 5 ms + the quiet slack of when they were due (from each window's percentiles: a
    /// lower bound), all outside a fault's first second.
    scheduling_slack_ms: f64,
    decided_within_deadline_and_slack_outside_first_seconds: f64,
    decided_within_7_5_ms_outside_first_seconds: f64,
    answered_within_deadline_share_outside_first_seconds: f64,
    accounts: Vec<Account>,
    decisions: u64,
    events_sent: u64,
    events_failed: u64,
    events_dropped: u64,
    events_unaccounted: i64,
    raw_rows: u64,
    raw_distinct_offsets: u64,
    raw_fallback_decisions: u64,
    key_hours: u64,
    worst_allowed_over_limit: f64,
    p99_allowed_over_limit: f64,
    key_hours_over_1_10: u64,
}

/// The policy of the run: the standard tier (most keys) and the tenant's (one key, hot,
/// split four ways).
const STANDARD: (i64, f64, i64) = (20, 0.5, 600);
const TENANT: (i64, f64, i64) = (400, 40.0, 100_000);

/// The key id of API key `n` in this run.
fn key_id(salt: u64, n: u32) -> KeyId {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&salt.to_le_bytes());
    id[12..].copy_from_slice(&n.to_le_bytes());
    KeyId(id)
}

/// Runs the soak and prints its JSON.
pub async fn run(args: SoakArgs) -> anyhow::Result<()> {
    let report = soak(&args).await?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

async fn soak(args: &SoakArgs) -> anyhow::Result<SoakReport> {
    let exe = super::shared::sibling("verdict")?;
    let dir = tempfile::tempdir().context("a folder for the run")?;
    let salt: u64 = args.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(std::process::id());
    let run_name = format!("soak_{}_{}", args.seed, std::process::id());
    let topic = format!("verdict.soak.{run_name}");
    let lake = dir.path().join("lake");
    std::fs::create_dir_all(&lake)?;

    // The keys: `keys` of the standard tier, and the tenant.
    let mut csv = String::from("api_key,key_id,tier\n");
    for n in 0..args.keys {
        csv.push_str(&format!("k{n},{},standard\n", key_id(salt, n)));
    }
    let tenant = key_id(salt, u32::MAX);
    csv.push_str(&format!("tenant,{tenant},tenant\n"));
    let keys_file = dir.path().join("keys.csv");
    std::fs::write(&keys_file, csv)?;

    // The policy, in a database of its own, reached through a proxy that can slow it.
    let pg = policy_database(&args.postgres, &run_name, tenant).await?;
    let pg_port: u16 = pg
        .rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next())
        .and_then(|p| p.parse().ok())
        .context("the PostgreSQL URL's port")?;
    let pg_proxy = TcpProxy::start(pg_port).await?;
    let pg_via_proxy = pg.replacen(
        &format!(":{pg_port}/"),
        &format!(":{}/", pg_proxy.port()),
        1,
    );

    let upstream = verdict_demo::spawn_upstream().await?.port();
    let gateways = 3usize;
    let ports: Vec<u16> = (0..gateways)
        .map(|_| free_port())
        .collect::<Result<_, _>>()?;
    let gateway_args = |i: usize| -> Vec<String> {
        [
            "gateway",
            "--upstream",
            &format!("http://127.0.0.1:{upstream}"),
            "--keys-file",
            &keys_file.display().to_string(),
            "--policy-postgres",
            &pg_via_proxy,
            "--policy-refresh-secs",
            "2",
            "--redis",
            &args.redis_cluster,
            "--kafka-brokers",
            &args.kafka_brokers,
            "--kafka-topic",
            &topic,
            "--listen",
            &format!("127.0.0.1:{}", ports[i]),
            "--instance",
            &i.to_string(),
            "--instance-count",
            &gateways.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let log_of = |i: usize, life: usize| dir.path().join(format!("gateway-{i}-{life}.log"));
    let start_gateway = |i: usize, life: usize| -> anyhow::Result<Child> {
        Command::new(&exe)
            .args(gateway_args(i))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log_of(i, life))?)
            .spawn()
            .context("starting verdict gateway")
    };
    let mut children = Children(Vec::new());
    for i in 0..gateways {
        children.0.push(start_gateway(i, 0)?);
    }
    let mut lives = vec![0usize; gateways];
    let ingest = Command::new(&exe)
        .args([
            "ingest",
            "--store",
            &lake.display().to_string(),
            "--brokers",
            &args.kafka_brokers,
            "--topic",
            &topic,
            "--group",
            &run_name,
            "--flush-max-age-secs",
            "2",
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("ingest.log"))?)
        .spawn()
        .context("starting verdict ingest")?;
    let ingest_at = children.0.len();
    children.0.push(ingest);
    for port in &ports {
        wait_listening(*port, Duration::from_secs(30)).await?;
    }
    eprintln!(
        "soak: {gateways} gateways on {ports:?}, the raw table in {}",
        lake.display()
    );

    // The schedule: the faults in a seeded order, one per slot, each starting a seeded
    // while into its slot.
    let mut rng = SmallRng::seed_from_u64(args.seed);
    let mut order = FAULTS;
    order.shuffle(&mut rng);
    let total = Duration::from_secs(args.seconds);
    let scale = args.seconds as f64 / 600.0;
    let slot = total / (FAULTS.len() as u32 + 1);
    let mut schedule = Vec::new();
    for (k, fault) in order.iter().enumerate() {
        let jitter = slot.mul_f64(rng.random_range(0.0..0.25));
        let start = slot * (k as u32 + 1) + jitter;
        let length = fault.length(scale).min(slot.mul_f64(0.7));
        schedule.push((*fault, start, length));
    }
    // The windows: calm stretches, each fault's first second, the rest of it.
    let mut cuts = vec![(Duration::ZERO, "calm".to_string(), None)];
    for (fault, start, length) in &schedule {
        let name = serde_json::to_value(fault)?
            .as_str()
            .unwrap_or_default()
            .to_owned();
        cuts.push((
            *start,
            format!("{name}: first second"),
            Some((*fault, true)),
        ));
        cuts.push((*start + Duration::from_secs(1), name.clone(), None));
        cuts.push((*start + *length, "calm".to_string(), Some((*fault, false))));
    }

    let slack = super::limiter::sleep_overshoot(300, None).await;
    let sampler = Sampler::start(ports.clone(), cuts.len());
    let mut cut_of = Vec::new();
    let zipf = Zipf::new(f64::from(args.keys), 1.0).context("zipf")?;
    let down: Arc<Vec<AtomicBool>> =
        Arc::new((0..gateways).map(|_| AtomicBool::new(false)).collect());
    let faults = Arc::new(FaultState::new(args, &pg_proxy, &pg));
    let mut windows = Vec::new();
    let mut acting = Vec::new();
    let started = Instant::now();
    for (w, (at, what, action)) in cuts.iter().enumerate() {
        let end = cuts.get(w + 1).map_or(total, |c| c.0);
        if end <= *at {
            continue;
        }
        // The window's fault begins or ends as it starts.
        match action {
            Some((Fault::RestartGateway, true)) => {
                // Its share goes to the others from now; SIGTERM, and a new life once it
                // has stopped (in the background: the window's load goes on).
                down[0].store(true, Ordering::Release);
                signal(&children.0[0], "-TERM")?;
            }
            Some((Fault::RestartGateway, false)) => {
                let status = tokio::task::block_in_place(|| children.0[0].wait())?;
                if !status.success() {
                    bail!("gateway 0 stopped with {status} after SIGTERM");
                }
                lives[0] += 1;
                children.0[0] = start_gateway(0, lives[0])?;
                wait_listening(ports[0], Duration::from_secs(30)).await?;
                down[0].store(false, Ordering::Release);
            }
            // In the background: the window's load starts at once.
            Some((fault, begins)) => {
                let (faults, fault, begins) = (Arc::clone(&faults), *fault, *begins);
                acting.push(tokio::spawn(async move { faults.act(fault, begins).await }));
            }
            None => {}
        }
        let length = end.saturating_sub(started.elapsed().max(*at));
        let from_s = started.elapsed().as_secs_f64();
        sampler.enter(w);
        let report = load_window(args, &ports, &down, w as u64, &zipf, length).await;
        eprintln!(
            "soak: {what} at {from_s:.0} s: {} sent, {} failed, p99 {:.2} ms from due",
            report.sent,
            report.failed,
            report.latency_ms(0.99),
        );
        windows.push(Window::of(what.clone(), from_s, &report));
        cut_of.push(w);
    }
    let tallies = sampler.finish().await;
    for (window, cut) in windows.iter_mut().zip(&cut_of) {
        window.decided = tallies[*cut].clone();
        eprintln!(
            "soak: {} at {:.0} s: {} decided, {:.5} within the deadline and slack (median \
             {:.1} ms, worst {:.1} ms), {:.5} within 7.5 ms, {} by the fallback ({} overload)",
            window.what,
            window.from_s,
            window.decided.decisions,
            window.decided.decided_within_deadline_and_slack,
            window.decided.median_slack_ms,
            window.decided.worst_slack_ms,
            window.decided.decided_within_7_5_ms,
            window.decided.fallback_decisions,
            window.decided.overload_decisions,
        );
    }
    for a in acting {
        if let Err(e) = a.await? {
            faults.undo().await;
            return Err(e.context("a fault of the schedule"));
        }
    }
    faults.undo().await;

    // Every gateway stops (SIGTERM: each flushes its events and says what it did), then
    // the ingest worker catches up and stops.
    for c in children.0.iter().take(gateways) {
        signal(c, "-TERM")?;
    }
    let mut accounts = Vec::new();
    for (i, c) in children.0.iter_mut().take(gateways).enumerate() {
        let status = tokio::task::block_in_place(|| c.wait())?;
        if !status.success() {
            bail!("gateway {i} stopped with {status}");
        }
        for life in 0..=lives[i] {
            accounts.push(account(&log_of(i, life))?);
        }
    }
    let sum = |f: fn(&Account) -> u64| accounts.iter().map(f).sum::<u64>();
    let (decisions, sent, failed, dropped) = (
        sum(|a| a.decisions),
        sum(|a| a.events_sent),
        sum(|a| a.events_failed),
        sum(|a| a.events_dropped),
    );
    let engine = verdict_query::Engine::new(
        verdict_query::ReaderView::folder(verdict_lake::open_folder(&lake.display().to_string())?),
        verdict_query::PoliciesTable::new(None),
        2,
        verdict_query::Limits::default(),
    )?;
    let count = |sql: &'static str| {
        let engine = &engine;
        async move { first_u64(engine, sql).await }
    };
    let caught_up = Instant::now();
    while caught_up.elapsed() < Duration::from_secs(180)
        && count("SELECT COUNT(*) FROM decisions").await.unwrap_or(0) < sent
    {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    // A few more flushes' time, for anything past what was counted sent.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let raw_rows = count("SELECT COUNT(*) FROM decisions").await?;
    signal(&children.0[ingest_at], "-TERM")?;
    let raw_distinct = count(
        "SELECT COUNT(*) FROM (SELECT DISTINCT kafka_partition, kafka_offset FROM decisions)",
    )
    .await?;
    let fallback = count("SELECT COUNT(*) FROM decisions WHERE source = 1").await?;
    let ratios = allowed_over_limit(&engine, tenant).await?;
    let outside: Vec<&Window> = windows
        .iter()
        .filter(|w| !w.what.ends_with("first second"))
        .collect();
    let share = |num: fn(&Window) -> u64| {
        outside.iter().map(|&w| num(w)).sum::<u64>() as f64
            / outside.iter().map(|w| w.sent).sum::<u64>().max(1) as f64
    };
    let within = within_deadline(&windows, slack);
    let decided = |n: fn(&Tally) -> u64| {
        outside.iter().map(|w| n(&w.decided)).sum::<u64>() as f64
            / outside
                .iter()
                .map(|w| w.decided.decisions)
                .sum::<u64>()
                .max(1) as f64
    };
    let mut sorted = ratios.clone();
    sorted.sort_by(f64::total_cmp);
    Ok(SoakReport {
        bench: "soak",
        seed: args.seed,
        seconds: args.seconds,
        gateways,
        rate_per_gateway: args.rate,
        keys: args.keys,
        schedule: schedule
            .iter()
            .map(|(f, s, l)| (*f, s.as_secs_f64(), l.as_secs_f64()))
            .collect(),
        answered_share_outside_first_seconds: share(|w| w.answered),
        scheduling_slack_ms: slack.as_secs_f64() * 1000.0,
        decided_within_deadline_and_slack_outside_first_seconds: decided(|t| t.within_slack),
        decided_within_7_5_ms_outside_first_seconds: decided(|t| t.within_fixed),
        answered_within_deadline_share_outside_first_seconds: within,
        windows,
        accounts,
        decisions,
        events_sent: sent,
        events_failed: failed,
        events_dropped: dropped,
        events_unaccounted: decisions as i64 - (sent + failed + dropped) as i64,
        raw_rows,
        raw_distinct_offsets: raw_distinct,
        raw_fallback_decisions: fallback,
        key_hours: sorted.len() as u64,
        worst_allowed_over_limit: sorted.last().copied().unwrap_or(0.0),
        p99_allowed_over_limit: sorted
            .get((sorted.len() as f64 * 0.99) as usize)
            .or(sorted.last())
            .copied()
            .unwrap_or(0.0),
        key_hours_over_1_10: sorted.iter().filter(|r| **r > 1.10).count() as u64,
    })
}

/// One window's load: each gateway paced at the rate, the requests of a stopped gateway
/// sent to the next one up.
async fn load_window(
    args: &SoakArgs,
    ports: &[u16],
    down: &Arc<Vec<AtomicBool>>,
    window: u64,
    zipf: &Zipf<f64>,
    length: Duration,
) -> LoadReport {
    let mut runs = tokio::task::JoinSet::new();
    for (g, _) in ports.iter().enumerate() {
        let (ports, down, zipf) = (ports.to_vec(), Arc::clone(down), *zipf);
        let seed = args.seed ^ (window << 40) ^ ((g as u64) << 32);
        let keys = args.keys;
        let make: MakeRequest = Arc::new(move |i| {
            let mut rng = SmallRng::seed_from_u64(seed ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let api_key = if rng.random::<f64>() < 0.08 {
                "tenant".to_string()
            } else {
                let n = (zipf.sample(&mut rng) as u32).clamp(1, keys) - 1;
                format!("k{n}")
            };
            let mut target = g;
            for _ in 0..ports.len() {
                if !down[target].load(Ordering::Acquire) {
                    break;
                }
                target = (target + 1) % ports.len();
            }
            axum::http::Request::get(format!("http://127.0.0.1:{}/v1/items/{i}", ports[target]))
                .header("x-api-key", api_key)
                .body(Body::empty())
                .unwrap_or_default()
        });
        let spec = LoadSpec {
            concurrency: 64,
            rate_per_s: Some(args.rate as f64),
            requests: None,
            duration: Some(length),
            timeout: Duration::from_secs(2),
        };
        runs.spawn(async move { verdict_load::run(&spec, make, Arc::default()).await });
    }
    let mut all = LoadReport::default();
    for r in runs.join_all().await {
        all.merge(r);
    }
    all
}

/// The share of requests answered within the decision deadline (5 ms) plus `slack` of
/// when they were due, outside a fault's first second, from each window's percentiles: the
/// windows whose p99.9 is within count 99.9 % of their requests, those whose p99 is 99 %,
/// those whose p50 is 50 %, else none (a lower bound).
fn within_deadline(windows: &[Window], slack: Duration) -> f64 {
    let limit = 5.0 + slack.as_secs_f64() * 1000.0;
    let (mut within, mut sent) = (0.0, 0u64);
    for w in windows.iter().filter(|w| !w.what.ends_with("first second")) {
        let share = if w.max_ms <= limit {
            1.0
        } else if w.p999_ms <= limit {
            0.999
        } else if w.p99_ms <= limit {
            0.99
        } else if w.p50_ms <= limit {
            0.5
        } else {
            0.0
        };
        within += share * w.answered as f64;
        sent += w.sent;
    }
    within / sent.max(1) as f64
}

/// Per key (all its sub-keys together) and hour of the raw table: allowed ÷ what its limits
/// admit in the part of the hour it was active (capacity + refill × seconds, at most the
/// quota).
async fn allowed_over_limit(
    engine: &verdict_query::Engine,
    tenant: KeyId,
) -> anyhow::Result<Vec<f64>> {
    let sql = "SELECT key_id, date, hour, \
        SUM(CASE WHEN verdict = 0 THEN 1 ELSE 0 END) AS allowed, \
        (MAX(date_part('epoch', event_time)) - MIN(date_part('epoch', event_time))) AS span_s \
        FROM decisions WHERE source IN (0, 1) GROUP BY key_id, date, hour";
    let batches = engine
        .collect(sql, &verdict_query::RunOptions::default())
        .await?
        .batches;
    let mut out = Vec::new();
    for b in &batches {
        let keys = b
            .column(0)
            .as_any()
            .downcast_ref::<arrow::array::FixedSizeBinaryArray>()
            .context("key_id")?;
        let allowed = arrow::compute::cast(b.column(3), &arrow::datatypes::DataType::Float64)?;
        let span = arrow::compute::cast(b.column(4), &arrow::datatypes::DataType::Float64)?;
        let allowed = allowed
            .as_any()
            .downcast_ref::<arrow::array::Float64Array>()
            .context("allowed")?;
        let span = span
            .as_any()
            .downcast_ref::<arrow::array::Float64Array>()
            .context("span")?;
        for i in 0..b.num_rows() {
            let (capacity, refill, quota) = if keys.value(i) == tenant.0 {
                TENANT
            } else {
                STANDARD
            };
            let limit = (capacity as f64 + refill * span.value(i).max(0.0)).min(quota as f64);
            out.push(allowed.value(i) / limit.max(1.0));
        }
    }
    Ok(out)
}

async fn first_u64(engine: &verdict_query::Engine, sql: &str) -> anyhow::Result<u64> {
    let batches = engine
        .collect(sql, &verdict_query::RunOptions::default().rows(1))
        .await?
        .batches;
    let b = batches.first().context("no answer")?;
    let v = arrow::compute::cast(b.column(0), &arrow::datatypes::DataType::UInt64)?;
    Ok(v.as_any()
        .downcast_ref::<arrow::array::UInt64Array>()
        .context("a count")?
        .value(0))
}

/// The faults' state: what to undo if the run ends early.
struct FaultState {
    args: SoakArgs,
    pg_proxy: TcpProxy,
    pg: String,
    /// The postmaster while PostgreSQL is hung.
    hung: std::sync::Mutex<Option<u32>>,
}

impl FaultState {
    fn new(args: &SoakArgs, pg_proxy: &TcpProxy, pg: &str) -> Self {
        Self {
            args: args.clone(),
            pg_proxy: pg_proxy.clone(),
            pg: pg.to_owned(),
            hung: std::sync::Mutex::new(None),
        }
    }

    /// Begins (`begins`) or ends `fault`.
    async fn act(&self, fault: Fault, begins: bool) -> anyhow::Result<()> {
        match (fault, begins) {
            (Fault::KillMaster, true) => {
                let port = self.master_port().await?;
                let pid = redis_info(port, "process_id")?;
                eprintln!("soak: SIGKILL to the Redis master on port {port} (pid {pid})");
                run_ok(Command::new("kill").args(["-KILL", &pid]))?;
            }
            (Fault::KillMaster, false) => {
                run_ok(Command::new(&self.args.services).args(["up", "redis-cluster"]))?;
            }
            (Fault::PauseMaster, true) => {
                let port = self.master_port().await?;
                let ms = (Fault::PauseMaster
                    .length(self.args.seconds as f64 / 600.0)
                    .as_millis() as u64)
                    .saturating_sub(1_000)
                    .max(1_000);
                eprintln!("soak: CLIENT PAUSE {ms} on the Redis master on port {port}");
                run_ok(Command::new("redis-cli").args([
                    "-p",
                    &port.to_string(),
                    "CLIENT",
                    "PAUSE",
                    &ms.to_string(),
                    "ALL",
                ]))?;
            }
            (Fault::PauseMaster, false) => {}
            (Fault::PolicyLatency, begins) => {
                self.pg_proxy.set_delay_ms(if begins { 500 } else { 0 });
            }
            (Fault::StopKafka, begins) => {
                let verb = if begins { "down" } else { "up" };
                run_ok(Command::new(&self.args.services).args([verb, "kafka"]))?;
            }
            (Fault::HangPostgres, true) => {
                let postmaster = postmaster(&self.pg).await?;
                signal_tree(postmaster, "-STOP")?;
                *self.hung.lock().unwrap_or_else(|e| e.into_inner()) = Some(postmaster);
            }
            (Fault::HangPostgres, false) => {
                if let Some(p) = self.hung.lock().unwrap_or_else(|e| e.into_inner()).take() {
                    signal_tree(p, "-CONT")?;
                }
            }
            (Fault::RestartGateway, _) => {}
        }
        Ok(())
    }

    /// Leaves the services as they were: PostgreSQL going, the proxy fast, Kafka and the
    /// cluster up.
    async fn undo(&self) {
        if let Some(p) = self.hung.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = signal_tree(p, "-CONT");
        }
        self.pg_proxy.set_delay_ms(0);
        let _ = run_ok(Command::new(&self.args.services).args(["up", "kafka", "redis-cluster"]));
    }

    /// A master of the cluster (the first the first node lists).
    async fn master_port(&self) -> anyhow::Result<u16> {
        let seed = self
            .args
            .redis_cluster
            .trim_start_matches("redis-cluster://")
            .split(['/', '?'])
            .next()
            .unwrap_or_default()
            .to_owned();
        let port = seed.rsplit(':').next().unwrap_or("17001").to_owned();
        let out = Command::new("redis-cli")
            .args(["-p", &port, "CLUSTER", "NODES"])
            .output()
            .context("redis-cli CLUSTER NODES")?;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|l| l.contains("master") && !l.contains("fail"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|a| a.split('@').next())
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .context("no master in CLUSTER NODES")
    }
}

/// A field of Redis's `INFO server` on `port`.
fn redis_info(port: u16, field: &str) -> anyhow::Result<String> {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "INFO", "server"])
        .output()
        .context("redis-cli INFO")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_owned())
        .with_context(|| format!("no {field} in INFO server of port {port}"))
}

/// The postmaster of the PostgreSQL at `url`: the parent of a backend.
async fn postmaster(url: &str) -> anyhow::Result<u32> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let backend: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await?
        .get(0);
    let status = std::fs::read_to_string(format!("/proc/{backend}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|p| p.trim().parse().ok())
        .context("the backend's parent")
}

/// `signal` to a process's children, then to it.
fn signal_tree(pid: u32, signal: &str) -> anyhow::Result<()> {
    let _ = Command::new("pkill")
        .args([signal, "-P", &pid.to_string()])
        .status();
    run_ok(Command::new("kill").args([signal, &pid.to_string()]))
}

/// A free loopback port, for a child to listen on.
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A database of the run's own on `base`'s PostgreSQL with the policy: the standard tier
/// and the tenant's (its key split four ways), one route class.
async fn policy_database(base: &str, name: &str, tenant: KeyId) -> anyhow::Result<String> {
    let (client, conn) = tokio_postgres::connect(base, tokio_postgres::NoTls)
        .await
        .with_context(|| format!("connecting to {base} (scripts/services.sh up postgres)"))?;
    tokio::spawn(conn);
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await?;
    let url = match base.rsplit_once('/') {
        Some((b, _)) => format!("{b}/{name}"),
        None => bail!("{base} names no database"),
    };
    let source = verdict_policy_store::PgSource::new(&url);
    source.migrate().await?;
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let (c, r, q) = STANDARD;
    let (tc, tr, tq) = TENANT;
    client
        .batch_execute(&format!(
            "insert into verdict_policy.tiers (id, name) values (0, 'standard'), (1, 'tenant');
             insert into verdict_policy.route_classes (id, name, prefixes) values (0, 'api', '{{/v1}}');
             insert into verdict_policy.limits values ('standard', '*', {c}, {r}, {q}, 'enforce');
             insert into verdict_policy.limits values ('tenant', '*', {tc}, {tr}, {tq}, 'enforce');
             insert into verdict_policy.hot_keys values ('{tenant}', 4);"
        ))
        .await?;
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::Scrape;

    const TEXT: &str = "# HELP verdict_gateway_decision_seconds The limiter's part.\n\
        verdict_gateway_decision_seconds_bucket{le=\"0.005\"} 90\n\
        verdict_gateway_decision_seconds_bucket{le=\"0.006\"} 95\n\
        verdict_gateway_decision_seconds_bucket{le=\"0.0075\"} 99\n\
        verdict_gateway_decision_seconds_bucket{le=\"+Inf\"} 100\n\
        verdict_gateway_decision_seconds_count 100\n\
        verdict_fallback_decisions_total{reason=\"overload\"} 7\n\
        verdict_fallback_decisions_total{reason=\"breaker_open\"} 3\n\
        verdict_overload_decisions_total 7\n";

    #[test]
    fn a_scrape_counts_decisions_within_a_bound_and_by_the_fallback() {
        let s = Scrape::parse(TEXT);
        assert_eq!((s.decisions, s.fallback, s.overload), (100, 10, 7));
        let bound = s.bound(std::time::Duration::from_micros(6_660));
        assert_eq!((bound, s.within(bound)), (0.006, 95));
        assert_eq!(s.bound(std::time::Duration::from_millis(4)), 0.0);
        assert_eq!(s.within(0.0), 0);
    }

    #[test]
    fn a_restarted_gateway_counts_from_its_new_life() {
        let before = Scrape::parse(TEXT);
        let fresh = Scrape::parse(&TEXT.replace(" 100\n", " 4\n").replace(" 99\n", " 4\n"));
        assert_eq!(fresh.since(&before).decisions, 4);
        let mut later = before.clone();
        later.decisions += 10;
        later.buckets[0].1 += 10;
        let d = later.since(&before);
        assert_eq!((d.decisions, d.buckets[0].1, d.fallback), (10, 10, 0));
    }
}
