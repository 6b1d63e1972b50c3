//! `verdict demo`: the embedded default. No Redis, Kafka or S3: an hour of synthetic
//! decisions goes through the same wire format and the same raw-file writer as production,
//! with an in-process queue standing where Kafka stands and a local folder as the object
//! store.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;
use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use serde::Serialize;
use verdict_ingest::{ConsumedEvent, WrittenFile, split_by_hour, write_hour_file};
use verdict_limiter::{FileSource, PolicySource};
use verdict_query::{Engine, Limits, PoliciesTable};
use verdict_rollup::Rollup;
use verdict_schemas::layout::RAW_PREFIX;
use verdict_schemas::synth::{SynthConfig, SynthTraffic};
use verdict_schemas::{DecisionEvent, EVENT_V1_LEN, Verdict};

use crate::synth_policy::policy_toml;

/// The topic name the demo writes into file names, as production does.
pub const DEMO_TOPIC: &str = "verdict.decisions.v1";

/// Options of `verdict demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Folder that plays the object store; the raw table goes to <OUT>/raw/.
    #[arg(long, default_value = "verdict-data")]
    pub out: PathBuf,
    /// Decisions to generate: one hour of fleet traffic at this many per hour.
    #[arg(long, default_value_t = 2_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub events: u64,
    /// Distinct API keys (popularity is Zipf-distributed; one tenant makes 8 % of requests).
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub keys: u32,
    /// Seed of the traffic generator: the same seed gives the same decisions and files.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Partitions of the in-process queue (Kafka partitions in production).
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u16).range(1..=1024))]
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
    /// Decisions generated.
    pub events: u64,
    /// Allowed.
    pub allowed: u64,
    /// Refused with 429.
    pub denied: u64,
    /// Refusals shadow mode turned into allows.
    pub would_deny: u64,
    /// Decided by the local fallback rather than the shared counters.
    pub degraded: u64,
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
    /// Seconds spent generating and encoding.
    pub generate_s: f64,
    /// Seconds spent decoding, sorting, encoding Parquet and writing.
    pub write_s: f64,
    /// Where the raw table is.
    pub raw_table: String,
    /// Rows of the denied-only hourly rollup (groups with a refusal).
    pub rollup_rows: usize,
    /// Bytes of the rollup objects.
    pub rollup_bytes: usize,
    /// Seconds spent rolling the hours up.
    pub rollup_s: f64,
    /// The `wrong-limits` report over the hour.
    pub wrong_limits: Vec<WrongLimit>,
    /// Seconds the report took (writing the policy file included).
    pub query_s: f64,
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

/// Runs the demo: generate, queue, write. Returns what it did.
pub async fn demo(args: &DemoArgs) -> anyhow::Result<DemoReport> {
    prepare_out(&args.out, args.overwrite)?;
    let mut report = DemoReport {
        partitions: args.partitions,
        wire_bytes_per_event: EVENT_V1_LEN,
        ..DemoReport::default()
    };

    let started = Instant::now();
    let cfg = SynthConfig {
        seed: args.seed,
        ..SynthConfig::hour(args.events, args.keys)
    };
    tracing::info!(
        events = args.events,
        keys = args.keys,
        seed = args.seed,
        "generating one hour of decisions"
    );
    let queues = produce(
        SynthTraffic::new(cfg.clone()).take(args.events as usize),
        args.partitions,
        &mut report,
    );
    report.generate_s = started.elapsed().as_secs_f64();

    let started = Instant::now();
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let store = Arc::new(
        LocalFileSystem::new_with_prefix(&args.out)
            .with_context(|| format!("opening {} as an object store", args.out.display()))?,
    );
    let mut tasks = tokio::task::JoinSet::new();
    for (partition, records) in queues.into_iter().enumerate() {
        let store = Arc::clone(&store);
        tasks.spawn(async move {
            let partition = partition as i32;
            consume_partition(store.as_ref(), partition, records)
                .await
                .map(|r| (partition, r))
        });
    }
    let mut written: Vec<WrittenFile> = Vec::new();
    while let Some(done) = tasks.join_next().await {
        let (partition, (files, undecodable)) = done.context("a partition writer panicked")??;
        report.undecodable += undecodable;
        tracing::info!(
            partition,
            files = files.len(),
            rows = files.iter().map(|f| f.rows).sum::<usize>(),
            remaining = tasks.len(),
            "queue partition written to the raw table"
        );
        written.extend(files);
    }
    report.write_s = started.elapsed().as_secs_f64();

    written.sort_by(|a, b| a.path.cmp(&b.path));
    report.files = written.len();
    let mut hours: Vec<_> = written.iter().map(|w| w.hour).collect();
    hours.dedup();
    report.hours = hours.len();
    report.parquet_bytes = written.iter().map(|w| w.bytes as u64).sum();
    report.parquet_bytes_per_event = report.parquet_bytes as f64 / report.events.max(1) as f64;
    report.raw_table = args.out.join(RAW_PREFIX).display().to_string();

    // The hourly job: each hour rolled up into the keys that were refused.
    let started = Instant::now();
    let threads = std::thread::available_parallelism().map_or(2, usize::from);
    let rollup = Rollup::new(store as Arc<dyn ObjectStore>, threads);
    for hour in hours {
        let r = rollup.run_hour(hour).await?;
        report.rollup_rows += r.rows;
        report.rollup_bytes += r.bytes;
    }
    report.rollup_s = started.elapsed().as_secs_f64();

    // The question the history answers: which limits were wrong?
    let started = Instant::now();
    let policy = args.out.join("policy.toml");
    std::fs::write(&policy, policy_toml(&cfg, cfg.policy_version))
        .with_context(|| format!("writing {}", policy.display()))?;
    report.wrong_limits = wrong_limits(rollup.store(), &policy, &written, threads).await?;
    report.query_s = started.elapsed().as_secs_f64();
    Ok(report)
}

/// One row of the `wrong-limits` report, as the demo prints it.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct WrongLimit {
    /// Tier name.
    pub tier: String,
    /// Route class name.
    pub route_class: String,
    /// Share of the keys refused at least once.
    pub share_keys_refused: f64,
    /// Share of the hourly quota the busiest key used.
    pub busiest_use: f64,
    /// too low, too high or fine.
    pub verdict: String,
}

/// Runs the `wrong-limits` report over the hours the demo wrote.
async fn wrong_limits(
    store: &Arc<dyn ObjectStore>,
    policy: &Path,
    written: &[WrittenFile],
    threads: usize,
) -> anyhow::Result<Vec<WrongLimit>> {
    let (Some(first), Some(last)) = (
        written.iter().map(|w| w.hour).min(),
        written.iter().map(|w| w.hour).max(),
    ) else {
        return Ok(Vec::new());
    };
    let source = PolicySource::File(FileSource::new(policy));
    let engine = Engine::new(
        Arc::clone(store),
        PoliciesTable::new(Some(source)),
        threads,
        Limits::default(),
    )?;
    let ts = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .map(|t| t.to_rfc3339())
            .unwrap_or_default()
    };
    let params: BTreeMap<String, String> = [
        ("from".to_string(), ts(first.start_ms())),
        ("to".to_string(), ts(last.end_ms())),
    ]
    .into();
    let sql = engine.report_sql("wrong-limits", &params).await?;
    let (_, batches) = engine.collect(&sql, 10_000).await?;
    let mut rows = Vec::new();
    for b in &batches {
        let text = |name: &str, i: usize| {
            b.column_by_name(name)
                .and_then(|c| arrow::util::display::array_value_to_string(c, i).ok())
                .unwrap_or_default()
        };
        let number = |name: &str, i: usize| text(name, i).parse::<f64>().unwrap_or(0.0);
        for i in 0..b.num_rows() {
            rows.push(WrongLimit {
                tier: text("tier", i),
                route_class: text("route_class", i),
                share_keys_refused: number("share_keys_refused", i),
                busiest_use: number("busiest_use", i),
                verdict: text("verdict", i),
            });
        }
    }
    Ok(rows)
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

/// The gateway side: every decision is encoded to its wire form and appended to the queue
/// partition of its key (Kafka keys records by key id the same way), and counted.
fn produce(
    events: impl Iterator<Item = DecisionEvent>,
    partitions: u16,
    report: &mut DemoReport,
) -> Vec<Vec<[u8; EVENT_V1_LEN]>> {
    let mut queues = vec![Vec::new(); usize::from(partitions)];
    for e in events {
        report.events += 1;
        match e.verdict {
            Verdict::Allowed => report.allowed += 1,
            Verdict::Denied => report.denied += 1,
            Verdict::WouldDeny => report.would_deny += 1,
        }
        report.degraded += u64::from(e.is_degraded());
        queues[partition_of(&e, u32::from(partitions))].push(e.encode());
    }
    queues
}

/// The queue partition of an event, as Kafka keys records by key id: the key id is already a
/// hash, so its first bytes spread keys evenly over partitions.
pub(crate) fn partition_of(e: &DecisionEvent, partitions: u32) -> usize {
    let k = e.key_id.as_bytes();
    (u32::from_le_bytes([k[0], k[1], k[2], k[3]]) % partitions.max(1)) as usize
}

/// The ingest side for one partition: decode each record at its offset, split by hour,
/// write one file per hour. Returns the files and the count of records that did not decode.
async fn consume_partition(
    store: &LocalFileSystem,
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
    for (hour, events) in split.hours {
        if let Some(f) = write_hour_file(store, DEMO_TOPIC, partition, hour, events).await? {
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
    let n = r.events;
    let wire = r.wire_bytes_per_event as u64 * n;
    format!(
        "verdict demo: one hour of decisions, {n} events over {keys} keys (seed {seed})\n\
         \n\
         decisions     allowed {allowed} ({allowed_p:.1} %), denied {denied} ({denied_p:.1} %), \
         would-deny in shadow mode {would} ({would_p:.1} %), by the local fallback {degraded}\n\
         on the wire   {wire_per} bytes per event, {wire_mb:.1} MB through {parts} queue partitions \
         in {gen_s:.2} s ({gen_rate:.0} events/s)\n\
         raw table     {files} Parquet files in {hours} hour partitions, {pq_mb:.2} MB, \
         {pq_per:.2} bytes per event ({ratio:.1}x smaller than the wire), written in {write_s:.2} s \
         ({write_rate:.0} events/s)\n\
         rollup        {rollup_rows} rows (key, tier, route class and region with a refusal) \
         in {hours} hourly objects, {rollup_kb:.1} KB, in {rollup_s:.2} s\n\
         undecodable   {undecodable}\n\
         \n\
         The raw table is in {raw}/date=YYYY-MM-DD/hour=HH/, one file per queue partition and \
         hour, named <topic>+<partition>+<first offset>+<last offset>.parquet; the rollup in \
         {out}/rollup/denied_hourly/.\n\
         Look inside with any Parquet reader, for example:\n  \
         python3 -c \"import duckdb; print(duckdb.sql(\\\"select tier, verdict, count(*) \
         from '{raw}/*/*/*.parquet' group by all order by all\\\"))\"\n",
        keys = args.keys,
        seed = args.seed,
        allowed = r.allowed,
        allowed_p = pct(r.allowed, n),
        denied = r.denied,
        denied_p = pct(r.denied, n),
        would = r.would_deny,
        would_p = pct(r.would_deny, n),
        degraded = r.degraded,
        wire_per = r.wire_bytes_per_event,
        wire_mb = mb(wire),
        parts = r.partitions,
        gen_s = r.generate_s,
        gen_rate = n as f64 / r.generate_s.max(1e-9),
        files = r.files,
        hours = r.hours,
        pq_mb = mb(r.parquet_bytes),
        pq_per = r.parquet_bytes_per_event,
        ratio = wire as f64 / r.parquet_bytes.max(1) as f64,
        write_s = r.write_s,
        write_rate = n as f64 / r.write_s.max(1e-9),
        undecodable = r.undecodable,
        raw = r.raw_table,
        rollup_rows = r.rollup_rows,
        rollup_kb = r.rollup_bytes as f64 / 1000.0,
        rollup_s = r.rollup_s,
        out = args.out.display(),
    ) + &render_wrong_limits(r, args)
}

/// The `wrong-limits` part of the summary.
fn render_wrong_limits(r: &DemoReport, args: &DemoArgs) -> String {
    let mut t = format!(
        "\nWhich limits were wrong? The wrong-limits report over the hour ({:.2} s):\n",
        r.query_s
    );
    for w in &r.wrong_limits {
        t += &format!(
            "  {:<12} {:<8} {:<9} {:>5.1} % of keys refused, the busiest used {:>5.1} % of its hourly quota\n",
            w.tier,
            w.route_class,
            w.verdict,
            w.share_keys_refused * 100.0,
            w.busiest_use * 100.0
        );
    }
    let out = args.out.display();
    t += &format!(
        "Ask more in SQL, for example:\n  \
         verdict sql --store {out} --policy-file {out}/policy.toml --report shadow-impact -p from=2026-11-30 -p to=2026-12-01\n  \
         verdict query serve --store {out} --policy-file {out}/policy.toml   # HTTP on 127.0.0.1:8089\n"
    );
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(out: &Path) -> DemoArgs {
        DemoArgs {
            out: out.to_owned(),
            events: 50_000,
            keys: 500,
            seed: 7,
            partitions: 4,
            overwrite: false,
            json: false,
        }
    }

    #[tokio::test]
    async fn demo_writes_every_event_once_into_the_raw_layout() {
        let dir = tempfile::tempdir().unwrap();
        let a = args(dir.path());
        let r = demo(&a).await.unwrap();
        assert_eq!(r.events, 50_000);
        assert_eq!(r.allowed + r.denied + r.would_deny, r.events);
        assert!(r.denied > 0 && r.would_deny > 0, "{r:?}");
        assert_eq!(r.undecodable, 0);
        assert_eq!(r.wire_bytes_per_event, 64);

        // Every file is in a date/hour folder, named by its partition and offsets; the
        // offsets of each partition's files cover 0..n without overlap.
        let mut files = Vec::new();
        for date in std::fs::read_dir(dir.path().join("raw")).unwrap() {
            let date = date.unwrap().path();
            for hour in std::fs::read_dir(&date).unwrap() {
                for f in std::fs::read_dir(hour.unwrap().path()).unwrap() {
                    let path = f.unwrap().path();
                    let rel = path
                        .strip_prefix(dir.path())
                        .unwrap()
                        .to_str()
                        .unwrap()
                        .to_owned();
                    verdict_schemas::HourPartition::from_path(&rel).unwrap();
                    files.push(rel.parse::<verdict_schemas::RawFileName>().unwrap());
                }
            }
        }
        assert_eq!(files.len(), r.files);
        assert!(r.parquet_bytes > 0 && r.parquet_bytes_per_event < 64.0);
        // The hourly rollup ran on every hour written: some groups were refused, and
        // there are far fewer of them than events.
        assert!(
            r.rollup_rows > 0 && (r.rollup_rows as u64) < r.denied + r.would_deny,
            "{r:?}"
        );
        // The report reads the world the generator built: free's busiest route class is set
        // too low, enterprise is generous everywhere.
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
        assert_eq!(
            verdict("enterprise", "read").as_deref(),
            Some("too high"),
            "{:#?}",
            r.wrong_limits
        );
        assert_eq!(r.wrong_limits.len(), 20, "4 tiers × 5 route classes");
        let rollups = std::fs::read_dir(dir.path().join("rollup/denied_hourly"))
            .unwrap()
            .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
            .count();
        assert_eq!(rollups, r.hours);

        // A second run into the same folder is refused, and replaces with --overwrite.
        let err = demo(&a).await.unwrap_err().to_string();
        assert!(err.contains("--overwrite"), "{err}");
        let again = demo(&DemoArgs {
            overwrite: true,
            ..a
        })
        .await
        .unwrap();
        assert_eq!(
            (
                again.denied,
                again.files,
                again.parquet_bytes,
                again.rollup_bytes
            ),
            (r.denied, r.files, r.parquet_bytes, r.rollup_bytes)
        );
    }

    #[test]
    fn partitioning_is_stable_and_in_range() {
        let events: Vec<_> = SynthTraffic::new(SynthConfig::hour(1_000, 100))
            .take(1_000)
            .collect();
        for e in &events {
            let p = partition_of(e, 12);
            assert!(p < 12);
            assert_eq!(p, partition_of(e, 12));
        }
    }
}
