//! `verdict ingest`: one member of the ingest consumer group, until SIGTERM or Ctrl-C, when
//! it flushes what it holds, commits, and exits 0.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use object_store::ObjectStore;
use verdict_ingest::flush::StoreCalls;
use verdict_ingest::{IngestConfig, IngestWorker};

use crate::store_args::StoreArgs;

/// Options of `verdict ingest`.
#[derive(Debug, Clone, Args)]
pub struct IngestArgs {
    /// Where the raw table is written.
    #[command(flatten)]
    pub lake: StoreArgs,
    /// Kafka bootstrap servers.
    #[arg(long, env = "VERDICT_KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub brokers: String,
    /// The Kafka cluster's name, unique among the clusters that feed one lake (one per
    /// region: `eu-west`, `us-east`, …). Each partition's progress in the raw table's log is
    /// kept under `verdict-ingest/<cluster>/<topic>/<partition>`, so two regions' clusters,
    /// with the same topic and partition numbers, write one table without colliding. Do not
    /// change it for a running cluster: its partitions would start over from Kafka's
    /// committed offsets.
    #[arg(long, env = "VERDICT_KAFKA_CLUSTER", default_value = "main")]
    pub cluster: String,
    /// The decisions topic.
    #[arg(long, default_value = "verdict.decisions.v1")]
    pub topic: String,
    /// The consumer group; workers of one group share the partitions.
    #[arg(long, default_value = "verdict-ingest")]
    pub group: String,
    /// A stable id of this worker in the group (Kafka static membership): restarted with the
    /// same id, it takes its partitions back at once.
    #[arg(long, env = "VERDICT_INGEST_INSTANCE_ID")]
    pub instance_id: Option<String>,
    /// Flush a partition once it buffers this many records (memory: ~100 bytes each).
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub flush_max_records: u64,
    /// … or once its oldest buffered record is this many seconds old.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub flush_max_age_secs: u64,
    /// Give up (exit non-zero, to be restarted) when the store has failed this long.
    #[arg(long, default_value_t = 240, value_parser = clap::value_parser!(u64).range(1..))]
    pub store_retry_secs: u64,
    /// Serve `/metrics` (Prometheus) and `/healthz` on this address, e.g. 127.0.0.1:9464.
    #[arg(long, env = "VERDICT_METRICS_ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
}

/// Runs the worker until a signal asks it to stop.
pub async fn run(args: IngestArgs) -> anyhow::Result<()> {
    run_through(args, |store| store).await
}

/// [`run`], with the lake's store as `through` makes it from the one the options name:
/// the harness's fault injection (`verdict-bench ingest-with-faults`) wraps it here.
pub async fn run_through(
    args: IngestArgs,
    through: impl FnOnce(Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore>,
) -> anyhow::Result<()> {
    // Listen for signals before anything else: joining the group and reading the raw
    // table's log can take a while, and a SIGTERM that arrives meanwhile must still mean
    // "stop cleanly".
    let shutdown = crate::signals::shutdown_signal()?;
    let store = through(args.lake.open()?);
    let cfg = IngestConfig {
        brokers: args.brokers,
        cluster: args.cluster,
        topic: args.topic,
        group_id: args.group,
        instance_id: args.instance_id,
        flush_max_records: args.flush_max_records as usize,
        flush_max_age: Duration::from_secs(args.flush_max_age_secs),
        retry: StoreCalls {
            give_up_after: Duration::from_secs(args.store_retry_secs),
            ..StoreCalls::default()
        },
        ..IngestConfig::default()
    };
    tracing::info!(cluster = %cfg.cluster, topic = %cfg.topic, group = %cfg.group_id, store = %args.lake.store, "ingest starting");
    let worker = IngestWorker::new(cfg, store).context("joining the consumer group")?;
    if let Some(addr) = args.metrics_addr {
        let metrics = worker.metrics();
        crate::serve::serve_metrics(addr, move || metrics.render()).await?;
    }
    let stats = worker.run(shutdown).await?;
    tracing::info!(?stats, "ingest stopped cleanly");
    Ok(())
}
