//! `verdict gateway`: the reverse proxy with the limiter in front of an upstream.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use verdict_counters_redis::RedisStore;
use verdict_events_kafka::{KafkaSink, KafkaSinkConfig};
use verdict_gateway::{
    BuiltGateway, GatewayBuilder, GatewayStore, KeyDirectory, spawn_key_refresher,
};
use verdict_limiter::moving::MovingStore;
use verdict_limiter::{
    CachedSource, EventReceiver, LimiterConfig, LimiterMetrics, PolicyHandle, PolicySource,
    RegionalTimings, SystemClock, spawn_drain, spawn_refresher,
};
use verdict_policy_store::PgShares;
use verdict_schemas::RegionId;

use crate::policy_args::PolicyArgs;
use crate::redis_args::RedisStoreArgs;

/// The Kafka producer's default wait to fill a batch, ms (`--kafka-linger-ms`).
pub const KAFKA_LINGER_MS: u32 = verdict_events_kafka::LINGER_MS;

/// Options of `verdict gateway`.
#[derive(Debug, Clone, Args)]
pub struct GatewayArgs {
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:8088")]
    pub listen: SocketAddr,
    /// The upstream's base URL (http://host:port[/prefix]). Without one the gateway only
    /// decides: `/v1/check` for Caddy, Traefik and nginx, and Envoy's rate limit service
    /// with --rls-listen; every other path is 404.
    #[arg(long)]
    pub upstream: Option<String>,
    /// Also serve Envoy's rate limit service (gRPC, `envoy.service.ratelimit.v3`) here,
    /// deciding with this gateway's limiter, keys and policy, with the gRPC health service.
    #[arg(long)]
    pub rls_listen: Option<SocketAddr>,
    /// How the rate limit service maps descriptors (TOML: the entries carrying the API key,
    /// key id, tier, route class and path, and imported rules; see `verdict policy
    /// import-envoy`), re-read every 5 s: a change is in force once it reads whole. Default:
    /// entries `api_key`, `key_id`, `tier`, `route_class`, `path`.
    #[arg(long, requires = "rls_listen")]
    pub rls_descriptors: Option<PathBuf>,
    /// What the rate limit service answers a descriptor that does not map: allow (and count
    /// it) or deny. Overrides the descriptors file.
    #[arg(long, requires = "rls_listen")]
    pub rls_unmapped: Option<verdict_rls::Unmapped>,
    /// Rate limit service requests deciding at once; one that waits past 5 ms for its turn
    /// is answered UNAVAILABLE (Envoy's failure_mode_deny decides then).
    #[arg(long, default_value_t = 1024, requires = "rls_listen")]
    pub rls_max_in_flight: usize,
    /// The key directory: CSV `api_key,key_id,tier` with that header (re-read when it
    /// changes).
    #[arg(long)]
    pub keys_file: PathBuf,
    /// The header carrying the API key.
    #[arg(long, default_value = "x-api-key")]
    pub key_header: String,
    /// The policy (one of the two is needed).
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// How often the policy is polled (a change is in force within this).
    #[arg(long, default_value_t = 5)]
    pub policy_refresh_secs: u64,
    /// A copy of the last policy in force, kept in this file. When the policy source
    /// cannot be read at start (the policy store down), the gateway starts from the copy,
    /// says so in its log, and its verdict_policy_age_seconds counts from the copy's time;
    /// without this option it refuses to start.
    #[arg(long, env = "VERDICT_POLICY_CACHE")]
    pub policy_cache: Option<PathBuf>,
    /// The counter store, redis://host:port (or redis-cluster://…). Without it the
    /// counters are in this process's memory: right for one instance, wrong for several.
    #[arg(long, env = "VERDICT_REDIS_URL")]
    pub redis: Option<String>,
    /// Moving the counters to another Redis: the new one. With --store-phase dual-write
    /// the gateway decides on --redis and applies every allowed request to this one too;
    /// after two window lengths (two hours) of dual writes on every gateway, cut-over
    /// decides here, and no key's count resets.
    #[arg(long, requires = "redis")]
    pub redis_next: Option<String>,
    /// Where a move stands: old, dual-write or cut-over.
    #[arg(long, default_value = "dual-write", requires = "redis_next")]
    pub store_phase: verdict_limiter::moving::Phase,
    /// How the gateway talks to Redis.
    #[command(flatten)]
    pub redis_store: RedisStoreArgs,
    /// Kafka brokers for the decision events. Without them the events are dropped (and
    /// counted in verdict_events_dropped_total).
    #[arg(long, env = "VERDICT_KAFKA_BROKERS")]
    pub kafka_brokers: Option<String>,
    /// The decisions topic.
    #[arg(long, default_value = "verdict.decisions.v1")]
    pub kafka_topic: String,
    /// How long the Kafka producer waits to fill a batch, ms: longer means fewer, larger
    /// requests (less CPU for the producer and the broker) and events that reach Kafka that
    /// much later.
    #[arg(long, default_value_t = KAFKA_LINGER_MS)]
    pub kafka_linger_ms: u32,
    /// After SIGTERM (or Ctrl-C) the gateway stops accepting at once; requests in flight
    /// get this many seconds to finish before it stops anyway.
    #[arg(long, default_value_t = 10)]
    pub shutdown_grace_secs: u64,
    /// Then the events still queued get this many seconds to reach Kafka and be
    /// acknowledged; what is not is counted in verdict_events_failed_total and said in the
    /// log, so that decisions = events sent + failed + dropped, always.
    #[arg(long, default_value_t = 10)]
    pub event_flush_secs: u64,
    /// Events the queue holds before it drops.
    #[arg(long, default_value_t = 65_536)]
    pub event_queue: usize,
    /// This gateway's region id (as in the policy's regions; stamped on events).
    #[arg(long, default_value_t = 0)]
    pub region: u16,
    /// This instance's id (stamped on events).
    #[arg(long, default_value_t = 0)]
    pub instance: u32,
    /// How many instances share the limits: the local fallback enforces limit / N.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub instance_count: u32,
    /// How long the upstream has to send its response head, ms (then 504).
    #[arg(long, default_value_t = 30_000)]
    pub upstream_timeout_ms: u64,
}

/// Runs the gateway until SIGTERM or Ctrl-C.
pub async fn run(args: GatewayArgs) -> anyhow::Result<()> {
    let source = args.policy.source().context(
        "the gateway needs a policy: --policy-file policy.toml or --policy-postgres URL",
    )?;
    let now = chrono::Utc::now().timestamp_millis();
    let (source, snapshot, confirmed_ms) = match &args.policy_cache {
        Some(path) => {
            let cached = Arc::new(CachedSource::new(source, path));
            let started = cached.start(now).await.with_context(|| {
                format!(
                    "loading the policy (and its copy in {} could not be read either)",
                    path.display()
                )
            })?;
            if let Some(e) = &started.source_error {
                tracing::warn!(
                    error = %e,
                    copy = %path.display(),
                    version = started.snapshot.version(),
                    age_s = (now - started.confirmed_ms).max(0) / 1000,
                    "the policy source did not answer; starting from the last copy, and polling the source"
                );
            }
            let source: Arc<dyn PolicySource> = cached;
            (source, started.snapshot, started.confirmed_ms)
        }
        None => {
            let snapshot = source.load().await.context(
                "loading the policy (with --policy-cache FILE a gateway starts from its last copy when the source is down)",
            )?;
            (source, snapshot, now)
        }
    };
    let handle = PolicyHandle::new(snapshot, confirmed_ms);
    let metrics = Arc::new(LimiterMetrics::new());
    let clock = Arc::new(SystemClock);
    spawn_refresher(
        source.clone(),
        handle.clone(),
        Arc::clone(&metrics),
        clock.clone(),
        Duration::from_secs(args.policy_refresh_secs.max(1)),
    );

    let keys = KeyDirectory::load(&args.keys_file)?;
    tracing::info!(keys = keys.len(), file = %args.keys_file.display(), "key directory loaded");
    spawn_key_refresher(args.keys_file.clone(), keys.clone(), Duration::from_secs(5));

    let upstream = args
        .upstream
        .as_deref()
        .map(|u| {
            u.parse::<axum::http::Uri>()
                .with_context(|| format!("--upstream {u}: not a URL"))
        })
        .transpose()?;
    if upstream.is_none() && args.rls_listen.is_none() {
        tracing::info!("no --upstream: this gateway only decides (/v1/check, /v1/check/nginx)");
    }
    let rls = args.rls_listen.map(|_| rls_config(&args)).transpose()?;
    let key_header = args
        .key_header
        .parse()
        .with_context(|| format!("--key-header {}: not a header name", args.key_header))?;
    let mut builder = GatewayBuilder::deciding_for(upstream)
        .key_header(key_header)
        .upstream_timeout(Duration::from_millis(args.upstream_timeout_ms.max(1)))
        .event_queue(args.event_queue)
        .limiter(LimiterConfig {
            region: RegionId(args.region),
            instance: args.instance,
            instance_count: args.instance_count,
            ..LimiterConfig::default()
        });
    let connect = |url: String| {
        let config = args.redis_store.config(&url);
        async move {
            RedisStore::connect(&config)
                .await
                .with_context(|| format!("connecting to Redis at {url}"))
        }
    };
    let (store, redis) = match (&args.redis, &args.redis_next) {
        (Some(url), Some(next)) => {
            let (old, new) = (connect(url.clone()).await?, connect(next.clone()).await?);
            tracing::info!(phase = ?args.store_phase, from = %url, to = %next, "moving the counters");
            let reports_to = if args.store_phase == verdict_limiter::moving::Phase::CutOver {
                new.clone()
            } else {
                old.clone()
            };
            let moving = MovingStore::new(old, new, args.store_phase);
            (GatewayStore::Moving(Arc::new(moving)), Some(reports_to))
        }
        (Some(url), None) => {
            let r = connect(url.clone()).await?;
            (GatewayStore::Redis(r.clone()), Some(r))
        }
        (None, _) => {
            tracing::warn!("no --redis: counters are in this process's memory (one instance only)");
            (builder.memory_counters(), None)
        }
    };
    // Several regions in a PostgreSQL policy: this region's shares, and the near-limit
    // reports the reconcile job computes them from.
    if let (Some(redis), Some(pg)) = (&redis, &args.policy.policy_postgres)
        && handle.load().is_multi_region()
    {
        let regional = verdict_gateway::regional::start(
            PgShares::new(pg.clone()),
            RegionId(args.region),
            redis.client().clone(),
            Arc::clone(&metrics),
            clock,
            RegionalTimings {
                share_poll: Duration::from_secs(args.policy_refresh_secs.max(1)),
                ..RegionalTimings::default()
            },
        );
        builder = builder.regional(regional);
        tracing::info!(region = args.region, "enforcing this region's shares");
    }
    let BuiltGateway { gateway, events } =
        builder.build(store, handle.clone(), Arc::clone(&metrics), keys);
    let flush = Duration::from_secs(args.event_flush_secs);
    let drain = match &args.kafka_brokers {
        Some(brokers) => Some(drain_to_kafka(
            events,
            brokers,
            &args.kafka_topic,
            args.kafka_linger_ms,
            flush,
            &metrics,
        )?),
        None => {
            tracing::warn!(
                "no --kafka-brokers: decision events are dropped (verdict_events_dropped_total counts them)"
            );
            drop(events);
            None
        }
    };
    let gateway = Arc::new(gateway);
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let upstream = args.upstream.as_deref().unwrap_or("none");
    tracing::info!(listen = %listener.local_addr()?, upstream, "gateway listening");
    // One signal stops both listeners.
    let shutdown = crate::signals::shutdown_signal()?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let rls_server = match (args.rls_listen, rls) {
        (Some(addr), Some(cfg)) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding --rls-listen {addr}"))?;
            tracing::info!(listen = %listener.local_addr()?, "rate limit service listening (gRPC, envoy.service.ratelimit.v3)");
            let rls = Arc::new(verdict_rls::Rls::new(Arc::clone(&gateway), cfg));
            if let Some(path) = &args.rls_descriptors {
                Arc::clone(&rls).spawn_descriptor_refresher(
                    path.clone(),
                    args.rls_unmapped,
                    Duration::from_secs(5),
                );
            }
            Some(tokio::spawn(verdict_rls::serve(
                listener,
                rls,
                stopped(stop_rx.clone()),
            )))
        }
        _ => None,
    };
    let server = verdict_gateway::serve(listener, Arc::clone(&gateway), stopped(stop_rx.clone()));
    let grace = Duration::from_secs(args.shutdown_grace_secs);
    let served = async {
        server.await?;
        if let Some(rls) = rls_server {
            rls.await
                .context("the rate limit service's task")?
                .context("the rate limit service")?;
        }
        anyhow::Ok(())
    };
    tokio::select! {
        served = served => served?,
        () = async {
            stopped(stop_rx.clone()).await;
            tokio::time::sleep(grace).await;
        } => tracing::warn!(?grace, "requests still in flight after the grace period; stopping without them"),
    }
    // Dropping the gateway closes the event queue; the drain hands what is queued to Kafka
    // and waits for the acknowledgements (up to `flush`).
    drop(gateway);
    if let Some(d) = drain {
        // The queue's last events reach the producer in far less than a second; the
        // margin is for that.
        let abort = d.abort_handle();
        if tokio::time::timeout(flush + Duration::from_secs(5), d)
            .await
            .is_err()
        {
            abort.abort();
        }
    }
    let decisions = metrics.decisions_total();
    let accounted =
        metrics.events_sent.get() + metrics.events_failed.get() + metrics.events_dropped.get();
    if decisions > accounted {
        // Still queued or unacknowledged when the drain gave up: lost, and said so.
        metrics.events_failed.inc_by(decisions - accounted);
        tracing::error!(
            lost = decisions - accounted,
            "decision events not delivered to Kafka by the flush deadline"
        );
    }
    tracing::info!(
        decisions,
        events_sent = metrics.events_sent.get(),
        events_failed = metrics.events_failed.get(),
        events_dropped = metrics.events_dropped.get(),
        "gateway stopped"
    );
    Ok(())
}

/// Drains a gateway's events into Kafka (`brokers`, `topic`, batching for `linger_ms`), the
/// production producer; the task ends when the gateway is dropped, flushed (for up to
/// `close_timeout`; what is unacknowledged then counts as failed).
///
/// # Errors
/// When librdkafka refuses the configuration.
pub fn drain_to_kafka(
    events: EventReceiver,
    brokers: &str,
    topic: &str,
    linger_ms: u32,
    close_timeout: Duration,
    metrics: &Arc<LimiterMetrics>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let sink = KafkaSink::new(
        &KafkaSinkConfig {
            brokers: brokers.to_owned(),
            topic: topic.to_owned(),
            linger_ms,
            close_timeout,
        },
        Arc::clone(metrics),
    )
    .with_context(|| format!("a Kafka producer for {brokers}"))?;
    Ok(spawn_drain(events, sink, Arc::clone(metrics)))
}

/// The rate limit service's settings from the options: the descriptors file (or the
/// defaults), the unmapped rule, the concurrency.
fn rls_config(args: &GatewayArgs) -> anyhow::Result<verdict_rls::RlsConfig> {
    let mut descriptors = match &args.rls_descriptors {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading --rls-descriptors {}", path.display()))?;
            verdict_rls::DescriptorMap::from_toml(&path.display().to_string(), &text)
                .map_err(anyhow::Error::msg)?
        }
        None => verdict_rls::DescriptorMap::default(),
    };
    if let Some(unmapped) = args.rls_unmapped {
        descriptors.unmapped = unmapped;
    }
    Ok(verdict_rls::RlsConfig {
        descriptors,
        max_in_flight: args.rls_max_in_flight,
        ..verdict_rls::RlsConfig::default()
    })
}
