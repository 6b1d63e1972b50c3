//! `verdict-bench envoy`: HTTP load through one Envoy 1.40 to a trivial upstream, on three
//! listeners of the same configuration: without a rate limit filter (Envoy alone), with its
//! `ratelimit` filter asking envoyproxy/ratelimit, and asking verdict's rate limit service;
//! both services count in the same Redis and read one configuration (each API key its own
//! counter, a limit far above the load: every request is decided and allowed, so the bench
//! measures the decision's path, not refusals). Two phases, each alternating the targets
//! round by round: closed loop for the requests per second, then paced at a rate all
//! targets hold, for the latency each adds to Envoy alone (service time). verdict is
//! `verdict gateway --rls-listen` (the `verdict` built beside this program), in a process of
//! its own as envoyproxy/ratelimit is; with `--kafka-brokers` its decision events go to the
//! real Kafka. Prints one JSON object.
//!
//! The load generator (this process), Envoy, both services, Redis, Kafka and the upstream
//! share this machine's cores: the absolute figures are a floor, the ratios are the point.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use serde::Serialize;
use verdict_load::proxies::{envoy_beside, envoy_ratelimit, free_port};

use verdict_demo::spawn_upstream;

use super::gateway::{Figures, LoadArgs, Phases};
use super::shared::{Account, Children, account, sibling, signal, wait_listening};

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
    /// verdict's Kafka producer's wait to fill a batch, ms (`verdict gateway
    /// --kafka-linger-ms`).
    #[arg(long, default_value_t = verdict::gateway::KAFKA_LINGER_MS)]
    pub kafka_linger_ms: u32,
    /// Envoy's worker threads (its --concurrency; Envoy's own default is one per core).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub envoy_workers: u16,
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
    /// Envoy's worker threads.
    pub envoy_workers: u16,
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
    /// verdict's decisions: by Redis, and by its local fallback (Redis past the deadline).
    pub verdict_decisions: (u64, u64),
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
    // verdict: `verdict gateway` without an upstream, its rate limit service on loopback,
    // deciding under the configuration imported as `verdict policy import-envoy` writes it.
    let imported = verdict_rls::import::import("bench.yaml", CONFIG)?;
    let dir = tempfile::tempdir().context("a temporary folder")?;
    let file = |name: &str, text: &str| -> anyhow::Result<String> {
        let path = dir.path().join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        Ok(path.display().to_string())
    };
    let policy = file("policy.toml", &toml::to_string(&imported.policy)?)?;
    let descriptors = file("descriptors.toml", &toml::to_string(&imported.descriptors)?)?;
    let keys = file("keys.csv", "api_key,key_id,tier\n")?;
    let (http, ours) = (free_port(), free_port());
    let mut gateway_args = vec![
        "gateway".to_owned(),
        format!("--listen=127.0.0.1:{http}"),
        format!("--rls-listen=127.0.0.1:{ours}"),
        format!("--keys-file={keys}"),
        format!("--policy-file={policy}"),
        format!("--rls-descriptors={descriptors}"),
        format!("--redis={}", args.redis),
    ];
    gateway_args.extend(args.redis_store.to_args());
    if let Some(brokers) = &args.kafka_brokers {
        gateway_args.extend([
            format!("--kafka-brokers={brokers}"),
            format!("--kafka-topic={}", args.kafka_topic),
            format!("--kafka-linger-ms={}", args.kafka_linger_ms),
        ]);
    }
    let log = dir.path().join("verdict.log");
    // Its events go to Kafka only with --kafka-brokers: not to brokers named in the
    // environment (scripts/env.sh names the local one).
    let gateway = Command::new(sibling("verdict")?)
        .args(&gateway_args)
        .env_remove("VERDICT_KAFKA_BROKERS")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .context("starting verdict gateway")?;
    let mut children = Children(vec![gateway]);
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_listening(ours, Duration::from_secs(30))
        .await
        .with_context(|| format!("verdict's rate limit service; its log:\n{}", log_text()))?;
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
        args.envoy_workers,
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
    drop(envoy);
    drop(peer);
    // What verdict decided, from its metrics; then SIGTERM, and its account of the events
    // once it has flushed them.
    let metrics = reqwest::get(format!("http://127.0.0.1:{http}/metrics"))
        .await
        .context("verdict's /metrics")?
        .text()
        .await?;
    let decided = |source: &str| {
        let series = format!("verdict_decisions_total{{source=\"{source}\",verdict=\"allowed\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&series)?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let verdict_decisions = (decided("counter_store"), decided("local_fallback"));
    if verdict_decisions.0 == 0 {
        bail!(
            "verdict made no decision in Redis: the bench measured nothing; its log:\n{}",
            log_text()
        );
    }
    for child in &mut children.0 {
        signal(child, "-TERM")?;
        child.wait()?;
    }
    let Account {
        events_sent,
        events_failed,
        events_dropped,
        ..
    } = account(&log)?;
    Ok(EnvoyBenchReport {
        bench: "envoy",
        cores: std::thread::available_parallelism().map_or(1, usize::from),
        concurrency: args.load.concurrency,
        seconds_per_round: args.load.seconds,
        rounds: args.load.rounds,
        envoy_workers: args.envoy_workers,
        keys: args.load.keys,
        rate,
        envoy_alone: (closed_loop[0].clone(), paced[0].clone()),
        verdict_vs_ratelimit_rps: closed_loop[2].requests_per_s
            / closed_loop[1].requests_per_s.max(1e-9),
        envoyproxy_ratelimit: service(1),
        verdict: service(2),
        verdict_decisions,
        events: (
            if args.kafka_brokers.is_some() {
                "kafka"
            } else {
                "discarded"
            },
            events_sent,
            events_dropped,
            events_failed,
        ),
        errors,
    })
}
