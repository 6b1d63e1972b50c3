//! `verdict-bench gateway`: HTTP load through the gateway to a trivial upstream, and the same
//! load sent straight to the upstream, in the same run and the same process; with `--nginx`
//! also through nginx's own limiter (`limit_req`) in front of the same upstream, the peer a
//! platform team would otherwise deploy. Two phases, each alternating the targets round by
//! round so that drift on a noisy machine falls on all: closed loop (as fast as answers
//! come) for the requests per second, then paced at a rate all can hold for the latency
//! each adds (service time: from when each request was sent). With `--kafka-brokers` the
//! gateway's decision events go to the real Kafka, as in production. Prints one JSON object.
//!
//! The load generator, the gateway and the upstream share this machine's cores, so the
//! absolute figures are a floor; the ratios are the point.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use axum::body::Body;
use axum::http::{HeaderName, Request, StatusCode};
use clap::Args;
use serde::Serialize;
use verdict_counters_redis::RedisStore;
use verdict_gateway::{BuiltGateway, GatewayBuilder, GatewayStore, KeyDirectory, KeyEntry};
use verdict_limiter::policy::parse_toml;
use verdict_limiter::{LimiterMetrics, PolicyHandle, PolicySnapshot};
use verdict_load::{self as load, LoadReport, LoadSpec, MakeRequest};
use verdict_schemas::KeyId;

use verdict_demo::{LocalGateway, spawn_upstream};

use super::nginx::Nginx;

/// The load of the HTTP benches (`gateway`, `envoy`): rounds alternating the targets,
/// closed loop then paced.
#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// Seconds of load per round and target.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub seconds: u64,
    /// Rounds per phase; each round loads every target in turn.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,
    /// Requests in flight.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,
    /// Rate of the latency phase, requests/s [default: half the closed-loop rate of the
    /// slowest measured target].
    #[arg(long)]
    pub rate: Option<u32>,
    /// API keys the load spreads over (round robin).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub keys: u32,
}

/// The two phases' medians per target: closed loop, then paced.
pub(crate) struct Phases {
    /// Closed loop, per target.
    pub closed_loop: Vec<Figures>,
    /// Paced, per target.
    pub paced: Vec<Figures>,
    /// The paced rate.
    pub rate: u32,
    /// Requests not answered 200.
    pub errors: u64,
}

impl LoadArgs {
    /// Both phases on `targets`, alternating them round by round; the paced rate is
    /// `--rate`, or half the closed-loop rate of the slowest of the `measured` targets.
    pub(crate) async fn phases(&self, targets: &[SocketAddr], measured: &[usize]) -> Phases {
        let duration = Duration::from_secs(self.seconds);
        let closed = LoadSpec::closed(duration, usize::from(self.concurrency));
        let mut errors = 0;
        let closed_loop = alternate(self.rounds, self.keys, &closed, targets, &mut errors).await;
        let slowest = measured
            .iter()
            .map(|&i| closed_loop[i].requests_per_s)
            .fold(f64::INFINITY, f64::min);
        let rate = self.rate.unwrap_or((slowest / 2.0).max(1.0) as u32);
        let paced_spec = LoadSpec {
            rate_per_s: Some(f64::from(rate)),
            ..closed
        };
        let paced = alternate(self.rounds, self.keys, &paced_spec, targets, &mut errors).await;
        Phases {
            closed_loop,
            paced,
            rate,
            errors,
        }
    }
}

/// Options of `verdict-bench gateway`.
#[derive(Debug, Clone, Args)]
pub struct GatewayBenchArgs {
    /// The load.
    #[command(flatten)]
    pub load: LoadArgs,
    /// Decide on this Redis (redis://host:port) instead of memory counters.
    #[arg(long)]
    pub redis: Option<String>,
    /// How the gateway talks to Redis, as for `verdict gateway`.
    #[command(flatten)]
    pub redis_store: verdict::redis_args::RedisStoreArgs,
    /// Send the gateway's decision events to these Kafka brokers (host:port,…), as in
    /// production; without, they are drained and discarded in the process.
    #[arg(long)]
    pub kafka_brokers: Option<String>,
    /// The topic of the events with --kafka-brokers.
    #[arg(long, default_value = "verdict.bench.gateway")]
    pub kafka_topic: String,
    /// Also measure nginx's limit_req in front of the same upstream (Debian's nginx, started
    /// by the bench: scripts/services.sh up nginx installs it).
    #[arg(long)]
    pub nginx: bool,
}

/// One target's figures in one phase, each the median over the rounds. `p50_ms` and
/// `p99_ms` count from when a request was due (in the paced phase that includes the
/// timer's lateness, up to a millisecond); `service_*` from when it was sent.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Figures {
    pub(crate) requests_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    pub(crate) service_p50_ms: f64,
    pub(crate) service_p99_ms: f64,
}

/// nginx's figures beside the gateway's.
#[derive(Debug, Serialize)]
pub struct NginxFigures {
    closed_loop: Figures,
    paced: Figures,
    /// The gateway's closed-loop requests/s ÷ nginx's.
    gateway_vs_nginx_rps: f64,
    /// nginx's service p99 less the upstream's alone, paced.
    added_p99_ms: f64,
}

/// What became of the gateway's decision events.
#[derive(Debug, Serialize)]
pub struct EventFigures {
    sink: &'static str,
    sent: u64,
    dropped: u64,
    failed: u64,
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
    /// With --nginx: nginx's limit_req in front of the same upstream, its figures and the
    /// gateway's requests/s ÷ nginx's (closed loop), and nginx's added p99 (paced).
    nginx: Option<NginxFigures>,
    /// Where the decision events went: "kafka" or "discarded", and what became of them.
    events: EventFigures,
    /// Requests of the whole run that did not get the answer expected (should be 0).
    errors: u64,
}

/// The header carrying the API key, for the gateway and nginx alike.
const KEY_HEADER: &str = "x-api-key";

/// A policy nobody reaches: every request is decided and allowed, so the bench measures
/// the proxy path (decision, headers, forwarding), not refusals.
const POLICY: &str = include_str!("../fixtures/policies/never_reached.toml");

/// Runs the bench and prints its JSON.
pub async fn run(args: GatewayBenchArgs) -> anyhow::Result<()> {
    let report = bench(&args).await?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

async fn bench(args: &GatewayBenchArgs) -> anyhow::Result<GatewayBenchReport> {
    let upstream = spawn_upstream().await?;
    let metrics = Arc::new(LimiterMetrics::new());
    let builder = GatewayBuilder::new(format!("http://{upstream}").parse()?)
        .key_header(HeaderName::from_static(KEY_HEADER));
    let (store, store_name) = match &args.redis {
        Some(url) => {
            let r = RedisStore::connect(&args.redis_store.config(url))
                .await
                .with_context(|| format!("connecting to Redis at {url}"))?;
            (GatewayStore::Redis(r), "redis")
        }
        None => (builder.memory_counters(), "memory"),
    };
    let policy = PolicySnapshot::build(parse_toml(POLICY)?)?;
    let tier: Arc<str> = Arc::from("bench");
    let keys = KeyDirectory::new(
        (0..args.load.keys)
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
    let BuiltGateway {
        gateway,
        mut events,
    } = builder.build(
        store,
        PolicyHandle::new(policy, chrono::Utc::now().timestamp_millis()),
        Arc::clone(&metrics),
        keys,
    );
    let drain = match &args.kafka_brokers {
        Some(brokers) => verdict::gateway::drain_to_kafka(
            events,
            brokers,
            &args.kafka_topic,
            verdict::gateway::KAFKA_LINGER_MS,
            std::time::Duration::from_secs(10),
            &metrics,
        )?,
        // Where the Kafka producer would take the events: drained, so the queue never fills.
        None => tokio::spawn(async move { while events.recv().await.is_some() {} }),
    };
    let gateway = LocalGateway::start(gateway).await?;
    let nginx = if args.nginx {
        Some(Nginx::start(upstream, KEY_HEADER)?)
    } else {
        None
    };
    let mut targets = vec![upstream, gateway.addr];
    targets.extend(nginx.as_ref().map(|n| n.addr));

    let Phases {
        closed_loop,
        paced,
        rate,
        errors,
    } = args.load.phases(&targets, &[1]).await;
    let mut closed_loop = closed_loop.into_iter();
    let (closed_loop_direct, closed_loop_gateway, closed_nginx) = (
        closed_loop.next().unwrap_or_default(),
        closed_loop.next().unwrap_or_default(),
        closed_loop.next(),
    );
    let mut paced = paced.into_iter();
    let (paced_direct, paced_gateway, paced_nginx) = (
        paced.next().unwrap_or_default(),
        paced.next().unwrap_or_default(),
        paced.next(),
    );
    let nginx = match (nginx, closed_nginx, paced_nginx) {
        (Some(n), Some(closed), Some(paced)) => {
            let log = n.errors();
            if !log.trim().is_empty() {
                tracing::warn!(%log, "nginx's error log");
            }
            Some(NginxFigures {
                gateway_vs_nginx_rps: closed_loop_gateway.requests_per_s
                    / closed.requests_per_s.max(1e-9),
                added_p99_ms: paced.service_p99_ms - paced_direct.service_p99_ms,
                closed_loop: closed,
                paced,
            })
        }
        _ => None,
    };
    gateway.stop().await?;
    // The gateway held the last queue handle: the drain flushes to Kafka and ends.
    let _ = tokio::time::timeout(Duration::from_secs(30), drain).await;
    let events = EventFigures {
        sink: if args.kafka_brokers.is_some() {
            "kafka"
        } else {
            "discarded"
        },
        sent: metrics.events_sent.get(),
        dropped: metrics.events_dropped.get(),
        failed: metrics.events_failed.get(),
    };
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
        concurrency: args.load.concurrency,
        seconds_per_round: args.load.seconds,
        rounds: args.load.rounds,
        keys: args.load.keys,
        gateway_vs_direct_rps: closed_loop_gateway.requests_per_s
            / closed_loop_direct.requests_per_s.max(1e-9),
        closed_loop_direct,
        closed_loop_gateway,
        rate,
        added_p50_ms: paced_gateway.service_p50_ms - paced_direct.service_p50_ms,
        added_p99_ms: paced_gateway.service_p99_ms - paced_direct.service_p99_ms,
        paced_direct,
        paced_gateway,
        nginx,
        events,
        errors,
    })
}

/// `rounds` rounds of `spec`, each on every target in turn (the upstream first); counts in
/// `errors` the requests not answered 200. Returns each target's medians, in order.
async fn alternate(
    rounds: u32,
    keys: u32,
    spec: &LoadSpec,
    targets: &[SocketAddr],
    errors: &mut u64,
) -> Vec<Figures> {
    let mut reports: Vec<Vec<LoadReport>> = vec![Vec::new(); targets.len()];
    for round in 0..rounds {
        for (target, into) in targets.iter().zip(&mut reports) {
            let r = load::run(spec, requests(*target, keys), Arc::default()).await;
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
    reports.iter().map(|r| median(r)).collect()
}

/// GET /v1/items/<i> with key bench-<i mod keys>.
fn requests(target: SocketAddr, keys: u32) -> MakeRequest {
    Arc::new(move |i| {
        Request::get(format!("http://{target}/v1/items/{i}"))
            .header(KEY_HEADER, format!("bench-{}", i % u64::from(keys)))
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
