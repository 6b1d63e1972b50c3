//! `verdict-bench log`: the raw table's Delta log after days of ingest, simulated in minutes.
//!
//! Every flush interval of simulated time each Kafka partition commits one flush, as the
//! ingest does: an `add` for the hour's file (and, for a share of flushes, one for late
//! events of the hour before) with the statistics of a real raw file, and the partition's
//! `txn`. At every hour the hour before is compacted in one commit (its files removed, one
//! added, `dataChange = false`), and every day the day past the 7-day retention is removed in
//! one commit, as `verdict jobs` does. Commits, checkpoints and log cleanup are the lake's
//! own code, on a local folder; the table reads the simulated time (commit timestamps,
//! tombstone and log-retention cut-offs) and the folder reports each file as written at the
//! simulated time it was written, so the cleanup deletes what those days would have.
//!
//! Prints one JSON object per simulated day: the log's files and bytes, the newest
//! checkpoint's bytes, the table's live files, the time a reader takes to load the latest
//! snapshot from the folder (median of `--loads`), and where the simulation's time went.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use futures::StreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, PutMode};
use serde::Serialize;
use verdict_ingest::raw_file::build_hour_file;
use verdict_ingest::{ConsumedEvent, KafkaSource, raw_add};
use verdict_lake::tables::{RAW, hour_partition};
use verdict_lake::{Action, Commit, Observed, Observer, Snapshot, Table};
use verdict_schemas::HourPartition;
use verdict_schemas::synth::{SynthConfig, SynthTraffic};

/// Options of `verdict-bench log`.
#[derive(Debug, Clone, Args)]
pub struct LogBenchArgs {
    /// Simulated days of ingest (a week, and a day past the raw table's 7-day log retention).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=60))]
    pub days: u32,
    /// Kafka partitions, each committing one flush per flush interval.
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub partitions: u32,
    /// Seconds between a partition's flushes (the ingest's `--flush-max-age`).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub flush_every_s: u32,
    /// Share of flushes that also carry late events of the hour before (a second file).
    #[arg(long, default_value_t = 0.02)]
    pub late_share: f64,
    /// Snapshot loads timed at the end of each simulated day.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub loads: u32,
    /// Folder for the table [default: a temporary folder, removed afterwards].
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
}

#[derive(Debug, Serialize)]
struct DayReport {
    bench: &'static str,
    day: u32,
    version: i64,
    commits: u64,
    log_files: usize,
    log_commit_files: usize,
    log_checkpoint_files: usize,
    log_bytes: u64,
    newest_checkpoint_bytes: u64,
    live_files: usize,
    snapshot_load_ms_p50: f64,
    snapshot_load_ms_max: f64,
    day_wall_s: f64,
    day_checkpoint_commits_s: f64,
    day_other_commits_s: f64,
}

/// Runs the bench.
pub async fn run(args: LogBenchArgs) -> anyhow::Result<()> {
    let tmp;
    let dir = match &args.out {
        Some(p) => {
            std::fs::create_dir_all(p).with_context(|| format!("creating {}", p.display()))?;
            p.clone()
        }
        None => {
            tmp = tempfile::tempdir()?;
            tmp.path().to_owned()
        }
    };
    let start_ms = chrono::NaiveDate::from_ymd_opt(2026, 11, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|t| t.and_utc().timestamp_millis())
        .context("the simulation's start")?;
    let now = Arc::new(std::sync::atomic::AtomicI64::new(start_ms));
    let store = Arc::new(SimulatedTimes::new(&dir, Arc::clone(&now))?);
    let table = RAW.table_at(
        Arc::clone(&store) as Arc<dyn ObjectStore>,
        Arc::new(Simulated(Arc::clone(&now))),
    );
    let snapshot = table.open_or_create(RAW.metadata(start_ms)).await?;
    let mut log = Timed {
        table,
        snapshot,
        commits: 0,
        checkpointing: Duration::ZERO,
        other: Duration::ZERO,
    };
    let template = template_add(start_ms)?;

    let step_ms = i64::from(args.flush_every_s) * 1_000;
    let flushes_per_day = 86_400_000 / step_ms;
    let mut offsets = vec![0i64; args.partitions as usize];
    let mut rng_state = 0x9e37_79b9_7f4a_7c15u64;
    let mut hour = HourPartition::from_event_time_ms(start_ms)?;
    for day in 1..=args.days {
        let day_started = Instant::now();
        (log.checkpointing, log.other) = (Duration::ZERO, Duration::ZERO);
        for step in 0..flushes_per_day {
            let t = start_ms + (i64::from(day - 1) * flushes_per_day + step) * step_ms;
            now.store(t, std::sync::atomic::Ordering::Relaxed);
            let this_hour = HourPartition::from_event_time_ms(t)?;
            if this_hour != hour {
                let commit = compaction(&log.snapshot, &hour, &template, t);
                log.commit(commit).await?;
                if this_hour.hour() == 0
                    && let Some(commit) = retention(&log.snapshot, this_hour.date(), t)
                {
                    log.commit(commit).await?;
                }
                hour = this_hour;
            }
            for (p, offset) in offsets.iter_mut().enumerate() {
                let source = KafkaSource::new("main", "verdict.decisions.v1", p as i32);
                let first = *offset;
                let last = first + 5_000;
                *offset = last + 1;
                let mut adds = vec![Action::Add(file_add(
                    &template,
                    &this_hour,
                    source.file_name(first, last),
                    t,
                ))];
                rng_state ^= rng_state << 13;
                rng_state ^= rng_state >> 7;
                rng_state ^= rng_state << 17;
                let late = (rng_state % 10_000) as f64 / 10_000.0 < args.late_share;
                if let Some(before) = HourPartition::from_event_time_ms(t - 3_600_000)
                    .ok()
                    .filter(|_| late)
                {
                    adds.push(Action::Add(file_add(
                        &template,
                        &before,
                        source.file_name(first, last),
                        t,
                    )));
                }
                let expected = (first > 0).then_some(first - 1);
                let commit = Commit::new("STREAMING UPDATE", adds)
                    .with_parameter("outputMode", "Append")
                    .with_txn(&source.app_id(), expected, last, t);
                log.commit(commit).await?;
            }
        }
        let day_wall = day_started.elapsed();
        let report = measure(&store, &log.snapshot, &args, day, log.commits).await?;
        println!(
            "{}",
            serde_json::to_string(&DayReport {
                day_wall_s: day_wall.as_secs_f64(),
                day_checkpoint_commits_s: log.checkpointing.as_secs_f64(),
                day_other_commits_s: log.other.as_secs_f64(),
                ..report
            })?
        );
    }
    Ok(())
}

/// The simulated table's writer, timing its commits.
struct Timed {
    table: Table,
    snapshot: Snapshot,
    commits: u64,
    /// Time in the commits that wrote a checkpoint (and cleaned the log).
    checkpointing: Duration,
    /// Time in the other commits.
    other: Duration,
}

impl Timed {
    async fn commit(&mut self, commit: Commit) -> anyhow::Result<()> {
        let started = Instant::now();
        let version = self.table.commit(&mut self.snapshot, commit).await?;
        if version % self.snapshot.checkpoint_interval() == 0 {
            self.checkpointing += started.elapsed();
        } else {
            self.other += started.elapsed();
        }
        self.commits += 1;
        Ok(())
    }
}

/// The `add` of a real raw file: a minute of one partition's synthetic events, encoded, its
/// statistics taken as the ingest takes them. Every simulated file is this one renamed.
fn template_add(start_ms: i64) -> anyhow::Result<verdict_lake::Add> {
    let events: Vec<ConsumedEvent> = SynthTraffic::new(SynthConfig {
        start_ms,
        ..SynthConfig::hour(300_000, 100_000)
    })
    .take(5_000)
    .enumerate()
    .map(|(offset, event)| ConsumedEvent {
        event,
        partition: 0,
        offset: offset as i64,
    })
    .collect();
    let hour = HourPartition::from_event_time_ms(start_ms)?;
    let file = build_hour_file("main", "template.parquet".to_owned(), hour, events)?
        .context("the template file has events")?;
    Ok(raw_add(&file, start_ms, true))
}

fn file_add(
    template: &verdict_lake::Add,
    hour: &HourPartition,
    name: String,
    now_ms: i64,
) -> verdict_lake::Add {
    verdict_lake::Add {
        path: format!("{}/{name}", hour.partition_path()),
        partition_values: hour_partition(hour),
        modification_time: now_ms,
        ..template.clone()
    }
}

/// What `verdict jobs` compaction commits for a closed hour: its files removed, one added.
fn compaction(
    snapshot: &Snapshot,
    hour: &HourPartition,
    template: &verdict_lake::Add,
    now_ms: i64,
) -> Commit {
    let mut actions: Vec<Action> = snapshot
        .files_under(&hour.partition_path())
        .map(|a| Action::Remove(a.remove(now_ms, false)))
        .collect();
    let inputs = actions.len();
    actions.push(Action::Add(verdict_lake::Add {
        data_change: false,
        ..file_add(template, hour, "compacted.parquet".to_owned(), now_ms)
    }));
    Commit::new("OPTIMIZE", actions)
        .with_parameter("partition", hour.partition_path())
        .with_parameter("inputs", inputs)
}

/// What `verdict jobs` retention commits at the start of `today`: the files of the day past
/// the raw table's 7 days removed, if it holds any.
fn retention(snapshot: &Snapshot, today: chrono::NaiveDate, now_ms: i64) -> Option<Commit> {
    let expired = today - chrono::Days::new(8);
    let actions: Vec<Action> = snapshot
        .files_under(&format!("date={expired}"))
        .map(|a| Action::Remove(a.remove(now_ms, true)))
        .collect();
    (!actions.is_empty()).then(|| Commit::new("DELETE", actions))
}

async fn measure(
    store: &Arc<Observed<SimulatedTimes>>,
    snapshot: &Snapshot,
    args: &LogBenchArgs,
    day: u32,
    commits: u64,
) -> anyhow::Result<DayReport> {
    let log: Vec<ObjectMeta> = store
        .list(Some(&Path::from("raw/_delta_log")))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let is_checkpoint = |m: &ObjectMeta| m.location.as_ref().ends_with(".checkpoint.parquet");
    let is_commit = |m: &ObjectMeta| m.location.as_ref().ends_with(".json");
    let newest_checkpoint = log
        .iter()
        .filter(|m| is_checkpoint(m))
        .max_by(|a, b| a.location.cmp(&b.location))
        .map_or(0, |m| m.size);
    // A reader opening the table: a fresh handle on the folder, nothing cached.
    let reader = RAW.table(Arc::new(LocalFileSystem::new_with_prefix(
        &store.observer().root,
    )?));
    let mut loads = Vec::new();
    for _ in 0..args.loads {
        let started = Instant::now();
        let loaded = reader.snapshot().await?;
        loads.push(started.elapsed().as_secs_f64() * 1_000.0);
        anyhow::ensure!(
            loaded.version() == snapshot.version(),
            "the loaded snapshot is at version {}, the writer's at {}",
            loaded.version(),
            snapshot.version()
        );
    }
    loads.sort_by(f64::total_cmp);
    Ok(DayReport {
        bench: "log",
        day,
        version: snapshot.version(),
        commits,
        log_files: log.len(),
        log_commit_files: log.iter().filter(|m| is_commit(m)).count(),
        log_checkpoint_files: log.iter().filter(|m| is_checkpoint(m)).count(),
        log_bytes: log.iter().map(|m| m.size).sum(),
        newest_checkpoint_bytes: newest_checkpoint,
        live_files: snapshot.files().count(),
        snapshot_load_ms_p50: loads[loads.len() / 2],
        snapshot_load_ms_max: loads[loads.len() - 1],
        day_wall_s: 0.0,
        day_checkpoint_commits_s: 0.0,
        day_other_commits_s: 0.0,
    })
}

/// A local folder that reports each object (listed, read or looked up) as last modified at
/// the simulated time it was written: the log cleanup compares those times with its
/// retention. [`SimulatedTimes::new`] makes it.
#[derive(Debug)]
struct SimulatedTimes {
    root: std::path::PathBuf,
    now: Arc<std::sync::atomic::AtomicI64>,
    written: Mutex<HashMap<Path, i64>>,
}

impl SimulatedTimes {
    #[allow(clippy::new_ret_no_self)]
    fn new(
        root: &std::path::Path,
        now: Arc<std::sync::atomic::AtomicI64>,
    ) -> anyhow::Result<Observed<Self>> {
        Ok(Observed::new(
            Arc::new(LocalFileSystem::new_with_prefix(root)?),
            Self {
                root: root.to_owned(),
                now,
                written: Mutex::default(),
            },
        ))
    }

    fn wrote(&self, location: &Path) {
        let t = self.now.load(std::sync::atomic::Ordering::Relaxed);
        self.written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(location.clone(), t);
    }

    fn dated(&self, meta: &mut ObjectMeta) {
        let written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = written
            .get(&meta.location)
            .and_then(|&ms| chrono::DateTime::from_timestamp_millis(ms))
        {
            meta.last_modified = at;
        }
    }
}

impl Observer for SimulatedTimes {
    fn name(&self) -> &str {
        "SimulatedTimes"
    }

    async fn written(&self, location: &Path, _: &PutMode) {
        self.wrote(location);
    }

    fn upload_started(&self, location: &Path) {
        self.wrote(location);
    }

    fn got(&self, meta: &mut ObjectMeta) {
        self.dated(meta);
    }

    fn listed(&self, meta: &mut ObjectMeta) {
        self.dated(meta);
    }
}

/// The simulation's time, which the bench moves: the raw table's clock.
#[derive(Debug)]
struct Simulated(Arc<std::sync::atomic::AtomicI64>);

impl verdict_schemas::Clock for Simulated {
    fn now_ms(&self) -> i64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}
