//! `verdict-bench limiter`: decisions against the real Redis from N simulated gateway
//! instances in this process (each a `Limiter` with its own connection pool), open loop at a
//! target rate (latency is measured from when a request was due, so a stall is not hidden),
//! keys uniform or Zipf with one tenant at 8 % of traffic. Prints one JSON object, with
//! `redis-benchmark` pipelining EVALSHA of the same script from the same run as the
//! ceiling of this Redis.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use fred::prelude::*;
use fred::types::InfoKind;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use serde::Serialize;
use tokio::sync::mpsc;
use verdict_counters_redis::{Layout, RedisStore};
use verdict_limiter::policy::parse_toml;
use verdict_limiter::{
    Limiter, LimiterConfig, LimiterMetrics, PolicyHandle, PolicySnapshot, Request, StoreError,
    event_queue,
};
use verdict_schemas::{DecisionSource, KeyId, RouteClassId, TierId};

/// How keys are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyDistribution {
    /// Every key equally likely.
    Uniform,
    /// Zipf (exponent 1) popularity, with one tenant making 8 % of all requests (split
    /// into 16 sub-keys, as a hot key is).
    Zipf,
}

/// Options of `verdict-bench limiter`.
#[derive(Debug, Clone, Args)]
pub struct LimiterBenchArgs {
    /// Redis to decide against [default: database 15 of the server $VERDICT_REDIS_URL
    /// names, else redis://127.0.0.1:16379/15: a database of its own on the Redis of
    /// `scripts/services.sh`, so that the bench's key layout (`rl:layout`) never meets the
    /// one the tests and gateways use in database 0].
    #[arg(long)]
    pub redis_url: Option<String>,
    /// Simulated gateway instances (each a limiter with its own connections).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub instances: u32,
    /// How each instance talks to Redis, as `verdict gateway` does (the same flags and
    /// defaults).
    #[command(flatten)]
    pub redis_store: verdict::redis_args::RedisStoreArgs,
    /// Requests in flight per instance.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub concurrency: u32,
    /// Target decisions per second, all instances together (0: as fast as possible).
    #[arg(long, default_value_t = 100_000)]
    pub rate: u64,
    /// Seconds of load.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub duration: u64,
    /// Distinct API keys.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub keys: u32,
    /// Key distribution.
    #[arg(long, value_enum, default_value_t = KeyDistribution::Zipf)]
    pub distribution: KeyDistribution,
    /// Skip the redis-benchmark ceiling.
    #[arg(long)]
    pub no_ceiling: bool,
}

/// The printed result. `p50_ms`…`max_ms` count from when each request was due (open
/// loop: a stall delays the requests behind it and shows); `service_*` from when it was
/// sent (the limiter's own latency, without waiting for a turn).
#[derive(Debug, Serialize)]
pub struct LimiterBenchReport {
    bench: &'static str,
    distribution: KeyDistribution,
    instances: u32,
    connections_per_instance: u32,
    concurrency_per_instance: u32,
    target_rate: u64,
    duration_s: f64,
    decisions: u64,
    decisions_per_s: f64,
    /// Decisions per second that Redis made (the rest came from the local fallback).
    store_decisions_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    max_ms: f64,
    service_p50_ms: f64,
    service_p99_ms: f64,
    service_p999_ms: f64,
    service_max_ms: f64,
    /// The decision's deadline (`--redis-timeout-ms`).
    deadline_ms: f64,
    /// The worst overshoot of a 1 ms sleep on this runtime, in 300 sleeps just before the
    /// run: how late this machine wakes a task when nothing else runs.
    scheduling_slack_ms: f64,
    /// The same, from a task sleeping 1 ms at a time throughout the run: how late the
    /// runtime woke tasks under the load.
    scheduling_slack_under_load_ms: f64,
    /// Decisions whose service time passed the deadline plus `scheduling_slack_ms`.
    late_decisions: u64,
    /// Decisions the local fallback made because the deadline passed while the request
    /// waited in this process (overload: no breaker opens for them).
    overload_decisions: u64,
    /// Times a shard's breaker opened, all instances together.
    breaker_openings: u64,
    /// Requests the fallback admitted that were handed to Redis to count, and those never
    /// counted there.
    charged_back: u64,
    charges_dropped: u64,
    allowed: u64,
    denied: u64,
    fallback: u64,
    /// Failed store calls by kind, all instances together (each sends a decision to the
    /// fallback; an open breaker sends more without a call).
    store_errors: std::collections::BTreeMap<&'static str, u64>,
    active_limit_keys: u64,
    max_over_limit_ratio: f64,
    /// The growth of Redis's key memory over the run ÷ `active_limit_keys`.
    redis_bytes_per_key: f64,
    /// The groups the limit keys were laid out in (`--redis-key-groups`).
    redis_key_groups: u32,
    /// Keys in the database before the run. Fields added to groups an earlier run left
    /// do not pay for the groups themselves: `redis_bytes_per_key` is a key's whole cost
    /// only on an empty database.
    redis_keys_before: u64,
    /// Redis's CPU time over the run ÷ the run's length: the cores Redis used (`INFO cpu`,
    /// the whole server, so other clients' work counts too). Null for a cluster.
    redis_cores: Option<f64>,
    /// Redis's CPU time ÷ the decisions Redis made, µs.
    redis_cpu_us_per_decision: Option<f64>,
    /// Script calls over the run (`INFO commandstats`), and the decisions each carried.
    redis_script_calls: Option<u64>,
    decisions_per_script_call: Option<f64>,
    /// The time Redis spent running the script ÷ the decisions Redis made, µs: the rest of
    /// `redis_cpu_us_per_decision` is reading, parsing and answering the calls.
    redis_script_us_per_decision: Option<f64>,
    /// redis-benchmark's decisions per second, one per call.
    redis_benchmark_evalsha_pipelined_per_s: Option<f64>,
    /// … and `redis_benchmark_batch` per call, as the store sends them under load.
    redis_benchmark_evalsha_batched_per_s: Option<f64>,
    redis_benchmark_batch: usize,
    /// This run's decisions per second ÷ the batched ceiling.
    vs_redis_benchmark: Option<f64>,
}

/// Decisions per call in the batched ceiling.
const CEILING_BATCH: usize = 32;

/// Route classes and their weights (as in the synthetic world).
const ROUTE_WEIGHTS: [u32; 5] = [50, 20, 15, 10, 5];
const TENANT: u32 = 0;

fn bench_policy(tenant: KeyId) -> anyhow::Result<PolicySnapshot> {
    let text = format!(
        r#"
version = 1
[[tiers]]
id = 0
name = "standard"
{routes}
[[limits]]
tier = "standard"
route_class = "*"
capacity = 20
refill_per_s = 2.0
hourly_quota = 3000
[[overrides]]
key_id = "{tenant}"
capacity = 4000
refill_per_s = 2000.0
hourly_quota = 5000000
[[hot_keys]]
key_id = "{tenant}"
sub_keys = 16
"#,
        routes = (0..ROUTE_WEIGHTS.len())
            .map(|i| format!("[[route_classes]]\nid = {i}\nname = \"r{i}\"\n"))
            .collect::<String>()
    );
    Ok(PolicySnapshot::build(parse_toml(&text)?)?)
}

/// Key ids of this run (a salt per run, so runs never share counters).
fn key_id(salt: u64, index: u32) -> KeyId {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&salt.to_le_bytes());
    id[8..12].copy_from_slice(&index.to_le_bytes());
    KeyId(id)
}

/// Bytes Redis spends on keys: the data set and the key tables, without what clients,
/// scripts and start-up take (`MEMORY STATS`), so that the connections' buffers of a
/// run do not count as memory per key.
async fn keys_memory(client: &Client) -> anyhow::Result<u64> {
    let stats: fred::types::MemoryStats = client.memory_stats().await?;
    let tables: u64 = stats
        .db
        .values()
        .map(|d| {
            d.overhead_hashtable_main
                + d.overhead_hashtable_expires
                + d.overhead_hashtable_slot_to_keys
        })
        .sum();
    Ok(stats.dataset_bytes + tables)
}

/// Redis's own account of its work: CPU time (`INFO cpu`) and the script's calls
/// (`INFO commandstats`), so that a run shows whether Redis was the bottleneck.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct RedisWork {
    /// `used_cpu_user` + `used_cpu_sys`, seconds.
    cpu_s: f64,
    /// `EVALSHA` calls, and the microseconds Redis spent running them.
    script_calls: u64,
    script_us: u64,
}

impl RedisWork {
    async fn read(client: &Client) -> anyhow::Result<Self> {
        let cpu: String = client.info(Some(InfoKind::Cpu)).await?;
        let stats: String = client.info(Some(InfoKind::CommandStats)).await?;
        Self::parse(&cpu, &stats)
    }

    /// From the text of `INFO cpu` and `INFO commandstats`.
    fn parse(cpu: &str, stats: &str) -> anyhow::Result<Self> {
        let field = |text: &str, name: &str| -> Option<String> {
            text.lines()
                .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
                .map(str::to_owned)
        };
        let seconds = |name: &str| -> anyhow::Result<f64> {
            let v = field(cpu, name).with_context(|| format!("INFO cpu has no {name}"))?;
            v.parse()
                .with_context(|| format!("INFO cpu: {name} = {v:?} is not a number"))
        };
        let (mut script_calls, mut script_us) = (0, 0);
        // Absent until the script's first call.
        if let Some(line) = field(stats, "cmdstat_evalsha") {
            for pair in line.split(',') {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                let number = || {
                    v.parse::<u64>().with_context(|| {
                        format!("INFO commandstats: evalsha {k} = {v:?} is not a number")
                    })
                };
                match k {
                    "calls" => script_calls = number()?,
                    "usec" => script_us = number()?,
                    _ => {}
                }
            }
        }
        Ok(Self {
            cpu_s: seconds("used_cpu_user")? + seconds("used_cpu_sys")?,
            script_calls,
            script_us,
        })
    }

    /// The work done since `before`.
    fn since(&self, before: &Self) -> Self {
        Self {
            cpu_s: (self.cpu_s - before.cpu_s).max(0.0),
            script_calls: self.script_calls.saturating_sub(before.script_calls),
            script_us: self.script_us.saturating_sub(before.script_us),
        }
    }
}

/// Runs the bench and prints its JSON.
pub async fn run(args: LimiterBenchArgs) -> anyhow::Result<()> {
    let report = bench(&args).await?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

struct TaskResult {
    latencies_us: Vec<u32>,
    service_us: Vec<u32>,
    allowed: u64,
    denied: u64,
    fallback: u64,
}

/// The bench's own database (15) on the server `url` names: a single Redis's URL with its
/// database replaced; a cluster's (which has one database) as it is.
fn bench_database(url: &str) -> String {
    let Some(rest) = url.strip_prefix("redis://") else {
        return url.to_owned();
    };
    let (address, query) = rest
        .split_once('?')
        .map_or((rest, None), |(a, q)| (a, Some(q)));
    let server = address
        .split_once('/')
        .map_or(address, |(server, _)| server);
    match query {
        Some(q) => format!("redis://{server}/15?{q}"),
        None => format!("redis://{server}/15"),
    }
}

/// Runs the load and measures it.
pub async fn bench(args: &LimiterBenchArgs) -> anyhow::Result<LimiterBenchReport> {
    let url = args.redis_url.clone().unwrap_or_else(|| {
        bench_database(
            &std::env::var("VERDICT_REDIS_URL")
                .unwrap_or_else(|_| "redis://127.0.0.1:16379".into()),
        )
    });
    let salt: u64 = rand::random();
    let policy = bench_policy(key_id(salt, TENANT))?;
    let tenant_limits = match policy.resolve(&key_id(salt, TENANT), RouteClassId(0), TierId(0)) {
        verdict_limiter::LimitLookup::Check {
            limits, sub_keys, ..
        } => (limits, sub_keys),
        other => bail!("bench policy resolves the tenant to {other:?}"),
    };
    let standard = policy
        .rule(TierId(0), RouteClassId(0))
        .context("bench policy has no standard rule")?
        .limits;

    let mut store_cfg = args.redis_store.config(&url);
    if args.redis_store.redis_key_groups.is_none() {
        // Laid out as a deployment of this many limit keys would be (a group per 48):
        // the default's 2^20 groups would hold about one field each, and a hash of one
        // field costs Redis about three times the bytes per key.
        store_cfg.layout = Layout::sized_for(u64::from(args.keys) * ROUTE_WEIGHTS.len() as u64);
    }
    let probe = RedisStore::connect(&store_cfg).await.with_context(|| {
        format!("connecting to {url} (start it with `scripts/services.sh up redis`)")
    })?;
    // The bench's own questions to Redis (INFO, DBSIZE) on a client of their own: the
    // store's connections give up at the decision's deadline, which an overloaded machine
    // misses.
    let admin = Client::new(Config::from_url(&url)?, None, None, None);
    admin
        .init()
        .await
        .with_context(|| format!("connecting to {url}"))?;
    let memory_before = keys_memory(&admin).await?;
    let redis_keys_before: u64 = admin.dbsize().await?;

    let mut limiters = Vec::new();
    let mut all_metrics = Vec::new();
    for i in 0..args.instances {
        let store = RedisStore::connect(&store_cfg).await?;
        let metrics = Arc::new(LimiterMetrics::new());
        all_metrics.push(Arc::clone(&metrics));
        let (queue, mut rx) = event_queue(65_536, Arc::clone(&metrics));
        // The events are drained and discarded: the bench measures decisions.
        tokio::spawn(async move { while rx.recv().await.is_some() {} });
        let cfg = LimiterConfig {
            instance: i,
            instance_count: args.instances,
            ..LimiterConfig::default()
        };
        limiters.push(Arc::new(Limiter::new(
            store,
            PolicyHandle::new(policy.clone(), 0),
            queue,
            metrics,
            cfg,
        )));
    }

    let routes = ROUTE_WEIGHTS.len();
    let allowed_per_key: Arc<Vec<AtomicU32>> = Arc::new(
        (0..args.keys as usize * routes)
            .map(|_| AtomicU32::new(0))
            .collect(),
    );
    let duration = Duration::from_secs(args.duration);
    let zipf = Zipf::new(f64::from(args.keys), 1.0).context("zipf")?;
    // Redis's account of the run (a cluster's nodes would each need asking).
    let work_before = if admin.is_clustered() {
        None
    } else {
        Some(RedisWork::read(&admin).await?)
    };
    let deadline = store_cfg.timeout;
    let slack_idle = sleep_overshoot(300, None).await;
    let started = Instant::now();
    let slack_under_load = tokio::spawn(sleep_overshoot(u32::MAX, Some(started + duration)));
    // Paced: each task takes the due instants the pacer hands it, one request each.
    let (pacer, mut inboxes) = if args.rate > 0 {
        let tasks_total = args.instances as usize * args.concurrency as usize;
        let (dues, inboxes): (Vec<_>, Vec<_>) = (0..tasks_total)
            .map(|_| mpsc::unbounded_channel::<Instant>())
            .unzip();
        (Some(pace(dues, started, args.rate, duration)), inboxes)
    } else {
        (None, Vec::new())
    };
    let mut handles = Vec::new();
    for (i, limiter) in limiters.iter().enumerate() {
        for t in 0..args.concurrency {
            let limiter = Arc::clone(limiter);
            let allowed_per_key = Arc::clone(&allowed_per_key);
            let (keys, distribution) = (args.keys, args.distribution);
            let seed = salt ^ ((i as u64) << 32) ^ u64::from(t);
            let mut inbox = inboxes.pop();
            handles.push(tokio::spawn(async move {
                let mut rng = SmallRng::seed_from_u64(seed);
                let mut r = TaskResult {
                    latencies_us: Vec::new(),
                    service_us: Vec::new(),
                    allowed: 0,
                    denied: 0,
                    fallback: 0,
                };
                let route_total: u32 = ROUTE_WEIGHTS.iter().sum();
                loop {
                    let due = match &mut inbox {
                        Some(rx) => match rx.recv().await {
                            Some(due) => due,
                            None => break,
                        },
                        None if started.elapsed() < duration => Instant::now(),
                        None => break,
                    };
                    let key = match distribution {
                        KeyDistribution::Uniform => rng.random_range(0..keys),
                        KeyDistribution::Zipf if rng.random::<f64>() < 0.08 => TENANT,
                        KeyDistribution::Zipf => {
                            (zipf.sample(&mut rng) as u32).clamp(1, keys) % keys
                        }
                    };
                    let mut x = rng.random_range(0..route_total);
                    let route = ROUTE_WEIGHTS
                        .iter()
                        .position(|w| {
                            if x < *w {
                                true
                            } else {
                                x -= w;
                                false
                            }
                        })
                        .unwrap_or(0);
                    let caller: [u8; 8] = rng.random();
                    let req = Request {
                        key_id: key_id(salt, key),
                        route_class: RouteClassId(route as u8),
                        tier: TierId(0),
                        caller: &caller,
                    };
                    let sent = Instant::now();
                    let d = limiter.check(&req).await;
                    r.latencies_us.push(micros(due.elapsed()));
                    r.service_us.push(micros(sent.elapsed()));
                    if d.is_allowed() {
                        r.allowed += 1;
                        allowed_per_key[key as usize * routes + route]
                            .fetch_add(1, Ordering::Relaxed);
                    } else {
                        r.denied += 1;
                    }
                    r.fallback += u64::from(d.source == DecisionSource::LocalFallback);
                }
                r
            }));
        }
    }
    let mut latencies = Vec::new();
    let mut service = Vec::new();
    let (mut allowed, mut denied, mut fallback) = (0, 0, 0);
    for h in handles {
        let r = h.await?;
        latencies.extend(r.latencies_us);
        service.extend(r.service_us);
        allowed += r.allowed;
        denied += r.denied;
        fallback += r.fallback;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let slack_under_load = slack_under_load.await?;
    let late = service
        .iter()
        .filter(|&&us| Duration::from_micros(u64::from(us)) > deadline + slack_idle)
        .count() as u64;
    let total = |m: fn(&LimiterMetrics) -> u64| all_metrics.iter().map(|x| m(x)).sum::<u64>();
    let work = match work_before {
        Some(before) => Some(RedisWork::read(&admin).await?.since(&before)),
        None => None,
    };
    if let Some(pacer) = pacer {
        pacer
            .join()
            .map_err(|_| anyhow::anyhow!("the pacer thread panicked"))?;
    }
    let store_errors = StoreError::KINDS
        .into_iter()
        .map(|kind| {
            let n = all_metrics
                .iter()
                .map(|m| m.store_errors.with_label_values(&[kind]).get())
                .sum::<u64>();
            (kind, n)
        })
        .collect();
    let memory_after = keys_memory(&admin).await?;

    // Worst key: allowed over the run ÷ what its limits admit over the run.
    let secs = elapsed;
    let admits = |l: &verdict_limiter::Limits, n: f64| {
        let bucket = f64::from(l.capacity) + l.refill_units_per_ms as f64 / 1000.0 * secs;
        bucket.min(f64::from(l.quota)) * n
    };
    let mut active = 0u64;
    let mut worst = 0.0f64;
    for (i, a) in allowed_per_key.iter().enumerate() {
        let a = a.load(Ordering::Relaxed);
        if a == 0 {
            continue;
        }
        active += 1;
        let limit = if i / routes == TENANT as usize {
            admits(&tenant_limits.0, f64::from(tenant_limits.1))
        } else {
            admits(&standard, 1.0)
        };
        worst = worst.max(f64::from(a) / limit);
    }
    // Each of the tenant's sub-keys is a counter of its own in Redis.
    let tenant_routes = (0..routes)
        .filter(|r| allowed_per_key[TENANT as usize * routes + r].load(Ordering::Relaxed) > 0)
        .count() as u64;
    let redis_keys = active + tenant_routes * (u64::from(tenant_limits.1) - 1);

    latencies.sort_unstable();
    service.sort_unstable();
    let pct = |p: f64| percentile_ms(&latencies, p);
    let ceiling = |batch: usize| {
        if args.no_ceiling {
            return None;
        }
        redis_benchmark_ceiling(&url, probe.script_sha(), batch)
            .inspect_err(|e| tracing::warn!("redis-benchmark: {e:#}"))
            .ok()
    };
    let (ceiling_single, ceiling_batched) = (ceiling(1), ceiling(CEILING_BATCH));
    let decisions = latencies.len() as u64;
    let store_decisions = decisions.saturating_sub(fallback);
    let per_s = decisions as f64 / elapsed;
    Ok(LimiterBenchReport {
        bench: "limiter",
        distribution: args.distribution,
        instances: args.instances,
        connections_per_instance: args.redis_store.redis_connections,
        concurrency_per_instance: args.concurrency,
        target_rate: args.rate,
        duration_s: elapsed,
        decisions,
        decisions_per_s: per_s,
        store_decisions_per_s: store_decisions as f64 / elapsed,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        p999_ms: pct(0.999),
        max_ms: latencies.last().map_or(0.0, |us| f64::from(*us) / 1000.0),
        service_p50_ms: percentile_ms(&service, 0.50),
        service_p99_ms: percentile_ms(&service, 0.99),
        service_p999_ms: percentile_ms(&service, 0.999),
        service_max_ms: service.last().map_or(0.0, |us| f64::from(*us) / 1000.0),
        deadline_ms: deadline.as_secs_f64() * 1000.0,
        scheduling_slack_ms: slack_idle.as_secs_f64() * 1000.0,
        scheduling_slack_under_load_ms: slack_under_load.as_secs_f64() * 1000.0,
        late_decisions: late,
        overload_decisions: total(|m| m.overload_decisions.get()),
        breaker_openings: total(|m| m.breaker_openings.get()),
        charged_back: total(|m| m.charged_back.get()),
        charges_dropped: total(|m| m.charges_dropped.get()),
        allowed,
        denied,
        fallback,
        store_errors,
        active_limit_keys: redis_keys,
        max_over_limit_ratio: worst,
        redis_bytes_per_key: memory_after.saturating_sub(memory_before) as f64
            / redis_keys.max(1) as f64,
        redis_key_groups: probe.layout().groups(),
        redis_keys_before,
        redis_cores: work.map(|w| w.cpu_s / elapsed),
        redis_cpu_us_per_decision: work.map(|w| w.cpu_s * 1e6 / store_decisions.max(1) as f64),
        redis_script_calls: work.map(|w| w.script_calls),
        decisions_per_script_call: work
            .map(|w| store_decisions as f64 / w.script_calls.max(1) as f64),
        redis_script_us_per_decision: work
            .map(|w| w.script_us as f64 / store_decisions.max(1) as f64),
        redis_benchmark_evalsha_pipelined_per_s: ceiling_single,
        redis_benchmark_evalsha_batched_per_s: ceiling_batched,
        redis_benchmark_batch: CEILING_BATCH,
        vs_redis_benchmark: ceiling_batched.map(|c| per_s / c),
    })
}

/// Shortest sleep of the pacer between releases.
const PACER_TICK: Duration = Duration::from_micros(100);

/// Releases request `n` at `started + n / rate`, to task `n mod tasks`, until `duration`
/// has passed, from a thread of its own that sleeps at least [`PACER_TICK`] between
/// releases. Tokio's timer fires at whole milliseconds: tasks sleeping on it would leave
/// in a burst at each millisecond, up to a millisecond after they were due, and the
/// latency counted from when due would charge that to the limiter. Here a request leaves
/// within a tick and the OS's wake-up slack (about 0.1 to 0.2 ms) of its due instant.
///
/// Each release goes as one message to a task on the runtime that hands the requests to
/// their tasks: a wake from outside the runtime costs a syscall, one from inside it
/// mostly does not.
fn pace(
    tasks: Vec<mpsc::UnboundedSender<Instant>>,
    started: Instant,
    rate: u64,
    duration: Duration,
) -> std::thread::JoinHandle<()> {
    let (releases, mut rx) = mpsc::unbounded_channel::<(u64, Vec<Instant>)>();
    tokio::spawn(async move {
        while let Some((first, dues)) = rx.recv().await {
            for (n, due) in (first..).zip(dues) {
                // A task that has ended (none does before its channel closes) only loses
                // its turn.
                let _ = tasks[(n % tasks.len() as u64) as usize].send(due);
            }
        }
    });
    std::thread::spawn(move || {
        let total = (duration.as_secs_f64() * rate as f64) as u64;
        let due = |n: u64| started + Duration::from_secs_f64(n as f64 / rate as f64);
        let mut n = 0u64;
        while n < total {
            let now = Instant::now();
            let first = n;
            let mut dues = Vec::new();
            while n < total && due(n) <= now {
                dues.push(due(n));
                n += 1;
            }
            if !dues.is_empty() && releases.send((first, dues)).is_err() {
                return;
            }
            if n < total {
                std::thread::sleep(due(n).saturating_duration_since(now).max(PACER_TICK));
            }
        }
    })
}

/// The worst overshoot of `count` sleeps of 1 ms (or of as many as fit before `until`).
pub(crate) async fn sleep_overshoot(count: u32, until: Option<Instant>) -> Duration {
    let mut worst = Duration::ZERO;
    for _ in 0..count {
        if until.is_some_and(|u| Instant::now() >= u) {
            break;
        }
        let t = Instant::now();
        tokio::time::sleep(Duration::from_millis(1)).await;
        worst = worst.max(t.elapsed().saturating_sub(Duration::from_millis(1)));
    }
    worst
}

fn micros(d: Duration) -> u32 {
    d.as_micros().min(u128::from(u32::MAX)) as u32
}

/// The `p` quantile of sorted microseconds, in ms.
fn percentile_ms(sorted_us: &[u32], p: f64) -> f64 {
    let i = ((sorted_us.len() as f64 * p) as usize).min(sorted_us.len().saturating_sub(1));
    sorted_us.get(i).map_or(0.0, |us| f64::from(*us) / 1000.0)
}

/// `redis-benchmark` pipelining (16 deep, 50 clients) EVALSHA of the decision script on
/// random keys, `batch` decisions per call: what this Redis can do at best, in decisions
/// per second.
fn redis_benchmark_ceiling(url: &str, sha: &str, batch: usize) -> anyhow::Result<f64> {
    let mut parts = url.trim_start_matches("redis://").split('/');
    let hostport = parts.next().unwrap_or("127.0.0.1:6379");
    let db = parts.next().filter(|d| !d.is_empty()).unwrap_or("0");
    let (host, port) = hostport.rsplit_once(':').unwrap_or((hostport, "6379"));
    // Each `__rand_int__` is drawn on its own, so every decision of a call has its key.
    let mut command = vec!["EVALSHA".to_owned(), sha.to_owned(), batch.to_string()];
    command.extend((0..batch).map(|_| "rl:{bench__rand_int__}".to_owned()));
    // No charges: every key is a decision.
    command.extend(["".to_owned(), "2".to_owned(), "0".to_owned()]);
    for _ in 0..batch {
        command.extend(["0.0", "20", "2000", "3000", "3600000"].map(str::to_owned));
    }
    let calls = (1_000_000 / batch).max(10_000).to_string();
    let out = std::process::Command::new("redis-benchmark")
        .args(["-h", host, "-p", port, "--dbnum", db])
        .args(["-n", &calls, "-c", "50", "-P", "16"])
        .args(["-r", "1000000", "--csv"])
        .args(&command)
        .output()
        .context("running redis-benchmark (from Debian's redis-tools)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("\"EVALSHA"))
        .context("redis-benchmark printed no EVALSHA line")?;
    let rps: f64 = line
        .split(',')
        .nth(1)
        .context("no rps column")?
        .trim_matches('"')
        .parse()?;
    Ok(rps * batch as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bench_decides_in_database_15_of_the_server_it_is_given() {
        assert_eq!(
            bench_database("redis://127.0.0.1:16379"),
            "redis://127.0.0.1:16379/15"
        );
        assert_eq!(
            bench_database("redis://:pw@10.0.0.1:6379/0?protocol=resp3"),
            "redis://:pw@10.0.0.1:6379/15?protocol=resp3"
        );
        let cluster = "redis-cluster://127.0.0.1:17001?node=127.0.0.1:17002";
        assert_eq!(bench_database(cluster), cluster);
    }

    #[test]
    fn redis_work_is_read_from_info_and_nonsense_is_named() {
        let cpu = "# CPU\r\nused_cpu_sys:1.250000\r\nused_cpu_user:2.500000\r\n\
                   used_cpu_sys_children:0.000000\r\n";
        let stats = "# Commandstats\r\ncmdstat_get:calls=3,usec=4,usec_per_call=1.33\r\n\
                     cmdstat_evalsha:calls=63887,usec=7319618,usec_per_call=114.57,\
                     rejected_calls=0,failed_calls=0\r\n";
        let w = RedisWork::parse(cpu, stats).unwrap();
        assert_eq!(
            w,
            RedisWork {
                cpu_s: 3.75,
                script_calls: 63_887,
                script_us: 7_319_618
            }
        );
        // Before the script's first call there is no line for it.
        assert_eq!(
            RedisWork::parse(cpu, "# Commandstats\r\n")
                .unwrap()
                .script_calls,
            0
        );
        let later = RedisWork {
            cpu_s: 5.0,
            script_calls: 70_000,
            script_us: 8_000_000,
        };
        assert_eq!(
            later.since(&w),
            RedisWork {
                cpu_s: 1.25,
                script_calls: 6_113,
                script_us: 680_382
            }
        );
        let e = RedisWork::parse("used_cpu_sys:x\r\nused_cpu_user:1\r\n", "").unwrap_err();
        assert!(format!("{e:#}").contains("used_cpu_sys = \"x\""), "{e:#}");
        let e = RedisWork::parse("used_cpu_user:1\r\n", "").unwrap_err();
        assert!(format!("{e:#}").contains("no used_cpu_sys"), "{e:#}");
    }

    #[tokio::test]
    async fn the_pacer_hands_each_task_its_turns_at_the_rate_and_ends_with_the_duration() {
        let (tasks, mut inboxes): (Vec<_>, Vec<_>) =
            (0..3).map(|_| mpsc::unbounded_channel()).unzip();
        let started = Instant::now();
        let pacer = pace(tasks, started, 1_000, Duration::from_millis(30));
        let mut all = Vec::new();
        for inbox in &mut inboxes {
            let mut dues = Vec::new();
            while let Some(due) = inbox.recv().await {
                dues.push(due);
            }
            all.push(dues);
        }
        pacer.join().unwrap();
        let received = Instant::now();
        for (task, (dues, inbox)) in all.iter().zip(&mut inboxes).enumerate() {
            // Request n is due n ms after the start and goes to task n mod 3.
            let wanted: Vec<Instant> = (0..10)
                .map(|k| started + Duration::from_millis(3 * k + task as u64))
                .collect();
            assert_eq!(dues.len(), wanted.len(), "task {task}");
            for (due, want) in dues.iter().zip(&wanted) {
                let off = due.max(want).duration_since(*due.min(want));
                assert!(off < Duration::from_micros(1), "task {task}: {off:?}");
            }
            assert!(dues.iter().all(|d| *d <= received));
            // The channel closed with the pacer: the task ends.
            assert!(inbox.try_recv().is_err() && inbox.is_closed());
        }
    }
}
