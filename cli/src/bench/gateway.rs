//! `verdict bench gateway`: HTTP load through the gateway to a trivial upstream, and the same
//! load sent straight to the upstream, in the same run and the same process. Two phases,
//! each alternating the two targets round by round so that drift on a noisy machine falls
//! on both: closed loop (as fast as answers come) for the requests per second, then paced
//! at a rate both can hold for the latency the gateway adds (service time: from when each
//! request was sent). Prints one JSON object.
//!
//! The load generator, the gateway and the upstream share this machine's cores, so the
//! absolute figures are a floor; the ratios are the point.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use clap::Args;
use serde::Serialize;
use verdict_counters_redis::{RedisStore, RedisStoreConfig};
use verdict_gateway::{GatewayStore, KeyDirectory, KeyEntry};
use verdict_limiter::policy::parse_toml;
use verdict_limiter::{
    Limiter, LimiterConfig, LimiterMetrics, MemoryStore, PolicyHandle, PolicySnapshot, event_queue,
};
use verdict_load::{self as load, LoadReport, LoadSpec, MakeRequest};
use verdict_schemas::KeyId;

use verdict_demo::{LocalGateway, spawn_upstream};

/// Options of `verdict bench gateway`.
#[derive(Debug, Clone, Args)]
pub struct GatewayBenchArgs {
    /// Seconds of load per round and target.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub seconds: u64,
    /// Rounds per phase; each round loads the upstream, then the gateway.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,
    /// Requests in flight.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,
    /// Rate of the latency phase, requests/s [default: half the gateway's closed-loop rate].
    #[arg(long)]
    pub rate: Option<u32>,
    /// API keys the load spreads over (round robin).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub keys: u32,
    /// Decide on this Redis (redis://host:port) instead of memory counters.
    #[arg(long)]
    pub redis: Option<String>,
}

/// One target's figures in one phase, each the median over the rounds. `p50_ms` and
/// `p99_ms` count from when a request was due (in the paced phase that includes the
/// timer's lateness, up to a millisecond); `service_*` from when it was sent.
#[derive(Debug, Serialize)]
pub struct Figures {
    requests_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    service_p50_ms: f64,
    service_p99_ms: f64,
}

/// The printed result.
#[derive(Debug, Serialize)]
pub struct GatewayBenchReport {
    bench: &'static str,
    store: &'static str,
    cores: usize,
    concurrency: u16,
    seconds_per_round: u64,
    rounds: u32,
    keys: u32,
    /// Closed loop: as many requests as the target answers.
    closed_loop_direct: Figures,
    closed_loop_gateway: Figures,
    /// The gateway's requests/s ÷ the upstream's alone.
    gateway_vs_direct_rps: f64,
    /// Paced at `rate`.
    rate: u32,
    paced_direct: Figures,
    paced_gateway: Figures,
    /// The gateway's service p50 and p99 less the upstream's alone, paced.
    added_p50_ms: f64,
    added_p99_ms: f64,
    /// Requests of the whole run that did not get the answer expected (should be 0).
    errors: u64,
}

/// A policy nobody reaches: every request is decided and allowed, so the bench measures
/// the proxy path (decision, headers, forwarding), not refusals.
const POLICY: &str = r#"
version = 1

[[tiers]]
id = 0
name = "bench"

[[route_classes]]
id = 0
name = "all"
prefixes = ["/"]

[[limits]]
tier = "bench"
route_class = "*"
capacity = 1000000000
refill_per_s = 1000000000
hourly_quota = 1000000000
"#;

/// Runs the bench and prints its JSON.
pub async fn run(args: GatewayBenchArgs) -> anyhow::Result<()> {
    let report = bench(&args).await?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

async fn bench(args: &GatewayBenchArgs) -> anyhow::Result<GatewayBenchReport> {
    let upstream = spawn_upstream().await?;
    let metrics = Arc::new(LimiterMetrics::new());
    let (queue, mut events) = event_queue(65_536, Arc::clone(&metrics));
    // Where the Kafka producer would take the events: drained, so the queue never fills.
    tokio::spawn(async move { while events.recv().await.is_some() {} });
    let cfg = LimiterConfig::default();
    let (store, store_name) = match &args.redis {
        Some(url) => {
            let r = RedisStore::connect(&RedisStoreConfig {
                url: url.clone(),
                ..RedisStoreConfig::default()
            })
            .await
            .with_context(|| format!("connecting to Redis at {url}"))?;
            (GatewayStore::Redis(r), "redis")
        }
        None => (
            GatewayStore::Memory(Arc::new(MemoryStore::new(cfg.fallback_max_keys))),
            "memory",
        ),
    };
    let policy = PolicySnapshot::build(parse_toml(POLICY)?)?;
    let limiter = Limiter::new(
        store,
        PolicyHandle::new(policy, chrono::Utc::now().timestamp_millis()),
        queue,
        Arc::clone(&metrics),
        cfg,
    );
    let tier: Arc<str> = Arc::from("bench");
    let keys = KeyDirectory::new(
        (0..args.keys)
            .map(|i| {
                let mut id = [0u8; 16];
                id[12..].copy_from_slice(&i.to_be_bytes());
                id[0] = 0xbe;
                (
                    format!("bench-{i}"),
                    KeyEntry {
                        key_id: KeyId(id),
                        tier: Arc::clone(&tier),
                    },
                )
            })
            .collect::<HashMap<_, _>>(),
    );
    let gateway = LocalGateway::start(limiter, keys, upstream).await?;

    let duration = Duration::from_secs(args.seconds);
    let closed = LoadSpec::closed(duration, usize::from(args.concurrency));
    let mut errors = 0;
    let (direct, through) = alternate(args, &closed, upstream, gateway.addr, &mut errors).await;
    let closed_loop_direct = median(&direct);
    let closed_loop_gateway = median(&through);
    let rate = args
        .rate
        .unwrap_or((closed_loop_gateway.requests_per_s / 2.0).max(1.0) as u32);
    let paced = LoadSpec {
        rate_per_s: Some(f64::from(rate)),
        ..closed
    };
    let (direct, through) = alternate(args, &paced, upstream, gateway.addr, &mut errors).await;
    let paced_direct = median(&direct);
    let paced_gateway = median(&through);
    gateway.stop().await?;
    if metrics
        .decisions
        .get_metric_with_label_values(&["allowed", "counter_store"])?
        .get()
        == 0
    {
        bail!("the gateway made no decision: the bench measured nothing");
    }
    Ok(GatewayBenchReport {
        bench: "gateway",
        store: store_name,
        cores: std::thread::available_parallelism().map_or(1, usize::from),
        concurrency: args.concurrency,
        seconds_per_round: args.seconds,
        rounds: args.rounds,
        keys: args.keys,
        gateway_vs_direct_rps: closed_loop_gateway.requests_per_s
            / closed_loop_direct.requests_per_s.max(1e-9),
        closed_loop_direct,
        closed_loop_gateway,
        rate,
        added_p50_ms: paced_gateway.service_p50_ms - paced_direct.service_p50_ms,
        added_p99_ms: paced_gateway.service_p99_ms - paced_direct.service_p99_ms,
        paced_direct,
        paced_gateway,
        errors,
    })
}

/// `rounds` rounds of `spec`, each on the upstream and then through the gateway; counts
/// in `errors` the requests not answered 200.
async fn alternate(
    args: &GatewayBenchArgs,
    spec: &LoadSpec,
    upstream: SocketAddr,
    gateway: SocketAddr,
    errors: &mut u64,
) -> (Vec<LoadReport>, Vec<LoadReport>) {
    let (mut direct, mut through) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        for (target, into) in [(upstream, &mut direct), (gateway, &mut through)] {
            let r = load::run(spec, requests(target, args.keys), Arc::default()).await;
            *errors += r.sent - r.count(StatusCode::OK);
            tracing::info!(
                round,
                %target,
                rate = r.rate(),
                p99_ms = r.latency_ms(0.99),
                "round done"
            );
            into.push(r);
        }
    }
    (direct, through)
}

/// GET /v1/items/<i> with key bench-<i mod keys>.
fn requests(target: SocketAddr, keys: u32) -> MakeRequest {
    Arc::new(move |i| {
        Request::get(format!("http://{target}/v1/items/{i}"))
            .header("x-api-key", format!("bench-{}", i % u64::from(keys)))
            .body(Body::empty())
            .unwrap_or_default()
    })
}

/// The median over the rounds of each figure.
fn median(rounds: &[LoadReport]) -> Figures {
    let mid = |f: &dyn Fn(&LoadReport) -> f64| {
        let mut v: Vec<f64> = rounds.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or_default()
    };
    Figures {
        requests_per_s: mid(&|r| r.rate()),
        p50_ms: mid(&|r| r.latency_ms(0.5)),
        p99_ms: mid(&|r| r.latency_ms(0.99)),
        service_p50_ms: mid(&|r| r.service_ms(0.5)),
        service_p99_ms: mid(&|r| r.service_ms(0.99)),
    }
}
