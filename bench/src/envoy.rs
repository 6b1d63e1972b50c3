//! `verdict-bench envoy`: HTTP load through one Envoy 1.40 to a trivial upstream, on three
//! listeners of the same configuration: without a rate limit filter (Envoy alone), with its
//! `ratelimit` filter asking envoyproxy/ratelimit, and asking verdict's rate limit service;
//! both services count in the same Redis and read one configuration (each API key its own
//! counter, a limit far above the load: every request is decided and allowed, so the bench
//! measures the decision's path, not refusals). Two phases, each alternating the targets
//! round by round: closed loop for the requests per second, then paced at a rate all
//! targets hold, for the latency each adds to Envoy alone (service time). With
//! `--kafka-brokers` verdict's decision events go to the real Kafka. Prints one JSON object.
//!
//! The load generator, Envoy, both services, Redis and the upstream share this machine's
//! cores: the absolute figures are a floor, the ratios are the point.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use serde::Serialize;
use verdict_counters_redis::RedisStore;
use verdict_gateway::{GatewayBuilder, GatewayStore, KeyDirectory};
use verdict_limiter::{LimiterMetrics, PolicyHandle, PolicySnapshot};
use verdict_load::proxies::{envoy_beside, envoy_ratelimit, free_port};
use verdict_rls::RlsConfig;

use verdict_demo::spawn_upstream;

use super::gateway::{Figures, LoadArgs, Phases};

/// One configuration for both services: each API key a counter of its own, a billion a
/// second (no key of the bench comes near it).
const CONFIG: &str = "\
domain: bench
descriptors:
  - key: api_key
    rate_limit:
      unit: second
      requests_per_unit: 1000000000
";

/// Envoy's descriptor: the API key (the load sends `x-api-key: bench-<i>`, as to the
/// gateway).
const RATE_LIMITS: &str = r#"              - actions:
                - request_headers: {header_name: x-api-key, descriptor_key: api_key}"#;

/// Options of `verdict-bench envoy`.
#[derive(Debug, Clone, Args)]
pub struct EnvoyBenchArgs {
    /// The Redis both services count in (redis://host:port).
    #[arg(long, env = "VERDICT_REDIS_URL")]
    pub redis: String,
    /// The load.
    #[command(flatten)]
    pub load: LoadArgs,
    /// How verdict talks to Redis, as for `verdict gateway`.
    #[command(flatten)]
    pub redis_store: verdict::redis_args::RedisStoreArgs,
    /// Send verdict's decision events to these Kafka brokers, as in production; without,
    /// they are drained and discarded in the process.
    #[arg(long)]
    pub kafka_brokers: Option<String>,
    /// The topic of the events with --kafka-brokers.
    #[arg(long, default_value = "verdict.bench.envoy")]
    pub kafka_topic: String,
}

/// A service behind Envoy: its figures and what it adds to Envoy alone.
#[derive(Debug, Serialize)]
pub struct ServiceFigures {
    /// Closed loop.
    pub closed_loop: Figures,
    /// Paced.
    pub paced: Figures,
    /// Paced p50 minus Envoy alone's.
    pub added_p50_ms: f64,
    /// Paced p99 minus Envoy alone's.
    pub added_p99_ms: f64,
}

/// What `verdict-bench envoy` prints.
#[derive(Debug, Serialize)]
pub struct EnvoyBenchReport {
    /// `envoy`.
    pub bench: &'static str,
    /// Cores of the machine (everything shares them).
    pub cores: usize,
    /// Requests in flight.
    pub concurrency: u16,
    /// Seconds per round and target.
    pub seconds_per_round: u64,
    /// Rounds per phase.
    pub rounds: u32,
    /// Keys.
    pub keys: u32,
    /// The paced phase's rate.
    pub rate: u32,
    /// Envoy without a rate limit filter, closed loop and paced.
    pub envoy_alone: (Figures, Figures),
    /// Envoy asking envoyproxy/ratelimit.
    pub envoyproxy_ratelimit: ServiceFigures,
    /// Envoy asking verdict.
    pub verdict: ServiceFigures,
    /// verdict's closed-loop requests/s over envoyproxy/ratelimit's (the budget: at least 2).
    pub verdict_vs_ratelimit_rps: f64,
    /// verdict's events: where they went, sent, dropped, failed.
    pub events: (&'static str, u64, u64, u64),
    /// Requests not answered 200.
    pub errors: u64,
}

/// Runs the bench and prints its report.
pub async fn run(args: EnvoyBenchArgs) -> anyhow::Result<()> {
    let report = bench(&args).await?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

async fn bench(args: &EnvoyBenchArgs) -> anyhow::Result<EnvoyBenchReport> {
    let upstream = spawn_upstream().await?;
    // verdict: a gateway without an upstream, its rate limit service on loopback.
    let imported = verdict_rls::import::import("bench.yaml", CONFIG)?;
    let store = RedisStore::connect(&args.redis_store.config(&args.redis))
        .await
        .with_context(|| format!("connecting to Redis at {}", args.redis))?;
    let metrics = Arc::new(LimiterMetrics::new());
    let now = chrono::Utc::now().timestamp_millis();
    let built = GatewayBuilder::deciding_for(None).build(
        GatewayStore::Redis(store),
        PolicyHandle::new(PolicySnapshot::build(imported.policy)?, now),
        Arc::clone(&metrics),
        KeyDirectory::default(),
    );
    let mut events = built.events;
    let drain = match &args.kafka_brokers {
        Some(brokers) => verdict::gateway::drain_to_kafka(
            events,
            brokers,
            &args.kafka_topic,
            Duration::from_secs(10),
            &metrics,
        )?,
        None => tokio::spawn(async move { while events.recv().await.is_some() {} }),
    };
    let rls = verdict_rls::Rls::new(
        Arc::new(built.gateway),
        RlsConfig {
            descriptors: imported.descriptors,
            ..RlsConfig::default()
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let ours = listener.local_addr()?.port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(verdict_rls::serve(listener, Arc::new(rls), async move {
        let _ = stopped.await;
    }));
    // envoyproxy/ratelimit on the same Redis.
    let redis_host = args
        .redis
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    let peer_port = free_port();
    let peer = envoy_ratelimit(CONFIG, &redis_host, peer_port);
    // One Envoy, three listeners.
    let (alone, to_peer, to_verdict) = (free_port(), free_port(), free_port());
    let envoy = envoy_beside(
        &[
            (alone, None),
            (to_peer, Some(peer_port)),
            (to_verdict, Some(ours)),
        ],
        free_port(),
        upstream.port(),
        "bench",
        RATE_LIMITS,
    );
    let targets = [alone, to_peer, to_verdict].map(|p| SocketAddr::from(([127, 0, 0, 1], p)));

    let Phases {
        closed_loop,
        paced,
        rate,
        errors,
    } = args.load.phases(&targets, &[1, 2]).await;
    let service = |i: usize| ServiceFigures {
        closed_loop: closed_loop[i].clone(),
        paced: paced[i].clone(),
        added_p50_ms: paced[i].service_p50_ms - paced[0].service_p50_ms,
        added_p99_ms: paced[i].service_p99_ms - paced[0].service_p99_ms,
    };
    let report_events = |metrics: &LimiterMetrics| {
        (
            if args.kafka_brokers.is_some() {
                "kafka"
            } else {
                "discarded"
            },
            metrics.events_sent.get(),
            metrics.events_dropped.get(),
            metrics.events_failed.get(),
        )
    };
    drop(envoy);
    drop(peer);
    let _ = stop.send(());
    served.await??;
    let _ = tokio::time::timeout(Duration::from_secs(30), drain).await;
    let decided = metrics
        .decisions
        .get_metric_with_label_values(&["allowed", "counter_store"])?
        .get();
    if decided == 0 {
        bail!("verdict made no decision: the bench measured nothing");
    }
    Ok(EnvoyBenchReport {
        bench: "envoy",
        cores: std::thread::available_parallelism().map_or(1, usize::from),
        concurrency: args.load.concurrency,
        seconds_per_round: args.load.seconds,
        rounds: args.load.rounds,
        keys: args.load.keys,
        rate,
        envoy_alone: (closed_loop[0].clone(), paced[0].clone()),
        verdict_vs_ratelimit_rps: closed_loop[2].requests_per_s
            / closed_loop[1].requests_per_s.max(1e-9),
        envoyproxy_ratelimit: service(1),
        verdict: service(2),
        events: report_events(&metrics),
        errors,
    })
}
