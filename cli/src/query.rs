//! `verdict query serve` and `verdict sql`: the query service and its terminal client.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use futures::StreamExt;
use verdict_query::http::{AppState, QueryMetrics, load_tokens};
use verdict_query::reports::Form;
use verdict_query::spill::Spill;
use verdict_query::{Engine, Limits, PoliciesTable, ReaderView, RunOptions};

use crate::policy_args::PolicyArgs;
use crate::store_args::StoreArgs;

/// The engine's options, shared by `verdict query serve` and `verdict sql`.
#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// The policy in force, for the `policies` table and report names.
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Memory each query may use for its operators, MiB.
    #[arg(long, default_value_t = 1024)]
    pub memory_mib: usize,
    /// Wall time each query may take, seconds.
    #[arg(long, default_value_t = 60)]
    pub timeout_s: u64,
    /// Rows a JSON answer may carry (CSV, Arrow and Parquet stream without a limit).
    #[arg(long, default_value_t = 100_000)]
    pub json_rows: usize,
    /// Size a JSON answer may have, MiB (of its data before encoding; CSV, Arrow and
    /// Parquet stream without a limit).
    #[arg(long, default_value_t = 64)]
    pub json_mib: usize,
    /// Memory all running queries may use together, MiB: at most this over --memory-mib
    /// queries run at once, the next waits in line.
    #[arg(long, default_value_t = 4096)]
    pub budget_mib: usize,
    /// How long a query waits in line for a place before it is refused as busy (503 with
    /// Retry-After), seconds.
    #[arg(long, default_value_t = 10)]
    pub queue_timeout_s: u64,
    /// The named reports' JSON answers kept while the tables and the policy they read are
    /// unchanged, MiB (0: none kept); ad-hoc SQL is never kept.
    #[arg(long, default_value_t = 64)]
    pub answer_cache_mib: usize,
    /// The reports' parts kept, MiB (0: none kept): the first level of each report over raw
    /// decisions (for the limit review, each key's row) over a day, computed once and kept
    /// while the day's files and the policy are unchanged, so that a report reads its days'
    /// parts instead of a week of decisions. A part larger than a quarter of this is computed
    /// again by every report that needs it.
    #[arg(long, default_value_t = 256)]
    pub part_cache_mib: usize,
    /// Connections each front end (HTTP, PostgreSQL) keeps open at once: past it, the
    /// connection idle longest is closed to make room; when none is idle, the new one is
    /// refused (HTTP 503, SQLSTATE 53300).
    #[arg(long, default_value_t = 1_000)]
    pub max_connections: usize,
    /// How long a connection may wait for its next request before it is closed, seconds
    /// (HTTP: until its whole head is in; PostgreSQL: until its startup message is in, a
    /// session then waiting up to 10 minutes between statements).
    #[arg(long, default_value_t = 30)]
    pub idle_timeout_s: u64,
    /// Partitions each query runs on (default: the machine's cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// The directory queries spill to: a sort or an aggregation that needs more than 3/4
    /// of its query's --memory-mib writes sorted runs here and merges them back instead of
    /// failing. The service makes a directory of its own inside it (`datafusion-…`),
    /// removed when it stops. Default: `verdict-query-spill` in the system's temporary
    /// directory.
    #[arg(long)]
    pub spill_dir: Option<PathBuf>,
    /// Disk all queries together may hold in the spill directory, GiB: past it, the query
    /// that needed more ends with memory_limit. 0: no spilling (a query past its memory
    /// limit ends then).
    #[arg(long, default_value_t = Spill::DEFAULT_GIB)]
    pub spill_gib: u64,
}

impl EngineArgs {
    /// The engine these options describe.
    pub fn engine(&self) -> anyhow::Result<Engine> {
        let source = self.policy.source();
        if source.is_none() {
            tracing::warn!(
                "no policy given (--policy-file or --policy-postgres): the policies table is empty and reports show ids, not names"
            );
        }
        let limits = Limits {
            memory_bytes: self.memory_mib.max(1) << 20,
            timeout: Duration::from_secs(self.timeout_s.max(1)),
            json_rows: self.json_rows.max(1),
            json_bytes: self.json_mib.max(1) << 20,
            budget_bytes: self.budget_mib.max(1) << 20,
            queue_timeout: Duration::from_secs(self.queue_timeout_s),
            answer_cache_bytes: self.answer_cache_mib << 20,
            part_cache_bytes: self.part_cache_mib << 20,
            part_block_bytes: verdict_query::limits::PART_BLOCK_BYTES,
            connections: self.max_connections.max(1),
            idle: Duration::from_secs(self.idle_timeout_s.max(1)),
            spill_bytes: 0,
        };
        let spill = Spill {
            dir: self.spill_dir.clone().unwrap_or_else(Spill::default_dir),
            max_bytes: self.spill_gib << 30,
        };
        engine_over(&self.store, source, self.threads, limits, &spill)
    }

    /// [`Self::engine`], with every table of the lake checked readable first (its
    /// protocol, and its schema column by column): a table another engine changed is named
    /// before any query runs.
    pub async fn open(&self) -> anyhow::Result<Engine> {
        let engine = self.engine()?;
        engine
            .check_tables()
            .await
            .with_context(|| format!("reading the lake at {}", self.store.store))?;
        Ok(engine)
    }
}

/// An engine over the lake `store` names, under the policy `source` and `limits`, on
/// `threads` (default: the machine's cores), spilling to `spill`.
fn engine_over(
    store: &StoreArgs,
    source: Option<Arc<dyn verdict_limiter::PolicySource>>,
    threads: Option<usize>,
    limits: Limits,
    spill: &Spill,
) -> anyhow::Result<Engine> {
    let threads =
        threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    // A folder's ranges are read in place (see `ReaderView::folder`).
    let lake = if verdict_lake::folder_of(&store.store).is_some() {
        ReaderView::folder(verdict_lake::open_folder(&store.store)?)
    } else {
        ReaderView::new(store.open()?)
    };
    Engine::new(lake, PoliciesTable::new(source), threads, limits)?
        .with_spill(spill)
        .with_context(|| format!("the spill directory {}", spill.dir.display()))
}

/// An engine that only stores the reports' levels (`verdict jobs run --levels`): the
/// policy the query services read is required, since the stored parts are kept for it;
/// each day's part may take `memory_mib` and `timeout`; the default spill directory.
pub async fn levels_engine(
    store: &StoreArgs,
    policy: &PolicyArgs,
    memory_mib: usize,
    timeout: Duration,
    threads: Option<usize>,
) -> anyhow::Result<Engine> {
    let source = policy.source().context(
        "--levels needs the policy the query services read (--policy-file or --policy-postgres): the stored levels are kept for it",
    )?;
    let limits = Limits {
        memory_bytes: memory_mib.max(1) << 20,
        timeout,
        ..Limits::default()
    };
    let spill = Spill {
        dir: Spill::default_dir(),
        max_bytes: Spill::DEFAULT_GIB << 30,
    };
    let engine = engine_over(store, Some(source), threads, limits, &spill)?;
    engine
        .check_tables()
        .await
        .with_context(|| format!("reading the lake at {}", store.store))?;
    Ok(engine)
}

/// Stores the reports' levels of the closed days of `store`'s lake (`lake`) that are
/// missing or stale, removes those of days the raw table no longer holds, and logs what
/// it did: `verdict query levels` and `verdict jobs run --levels`.
pub async fn store_levels(
    engine: &Engine,
    lake: Arc<dyn object_store::ObjectStore>,
    store: &str,
) -> anyhow::Result<verdict_query::parts::LevelsWritten> {
    let started = std::time::Instant::now();
    let done = engine
        .write_levels(lake)
        .await
        .with_context(|| format!("storing the reports' levels in {store}"))?;
    tracing::info!(
        written = done.written,
        unchanged = done.unchanged,
        removed = done.removed,
        deleted = done.deleted,
        ms = started.elapsed().as_millis() as u64,
        "the reports' levels of the closed days are stored"
    );
    Ok(done)
}

/// `verdict query …`.
#[derive(Debug, Subcommand)]
pub enum QueryCommand {
    /// Serve the tables and named reports over HTTP (and, with --pg-listen, over the
    /// PostgreSQL wire protocol) until SIGTERM or Ctrl-C.
    Serve(ServeArgs),
    /// Store the reports' first levels of every closed day in the lake (`levels/`), so that
    /// every query service reads a day's part instead of computing it from the day's
    /// decisions: writes the parts missing or stale (the day's raw files or the policy
    /// changed since), removes those of days the raw table no longer holds, and exits; or,
    /// with --every-secs, again at that interval until SIGTERM or Ctrl-C.
    Levels(LevelsArgs),
}

/// `verdict query levels`.
#[derive(Debug, Args)]
pub struct LevelsArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Run again at this interval, seconds (0: once, for cron). An hour suits the rollup's
    /// pace: a closed day changes only by late data and compaction.
    #[arg(long, default_value_t = 0)]
    pub every_secs: u64,
}

/// `verdict query serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// HTTP address. Without tokens, only a loopback address is accepted.
    #[arg(long, default_value = "127.0.0.1:8089")]
    pub listen: SocketAddr,
    /// PostgreSQL wire protocol address (psql, BI tools); off when not given.
    #[arg(long)]
    pub pg_listen: Option<SocketAddr>,
    /// Bearer tokens, one per line (`#` comments allowed). Over PostgreSQL a token is the
    /// password. Without tokens the service listens on loopback only.
    #[arg(long, env = "VERDICT_QUERY_TOKENS_FILE")]
    pub tokens_file: Option<PathBuf>,
    /// How often the reports' parts of each closed day the raw table holds are made sure of,
    /// reading those `verdict query levels` stored in the lake and computing the others (at
    /// start, then at this interval), seconds; 0: never beforehand, each report reads or
    /// computes the parts it needs. After the parts, the answers the analysts' page asks
    /// for when it opens on its default range (the 7 whole days up to the newest closed
    /// one) are computed and kept, so the page opens without waiting for the review. See
    /// --part-cache-mib.
    #[arg(long, default_value_t = 300)]
    pub warm_parts_every_s: u64,
}

/// Runs `verdict query …`.
pub async fn run(cmd: QueryCommand) -> anyhow::Result<()> {
    match cmd {
        QueryCommand::Serve(args) => serve(args).await,
        QueryCommand::Levels(args) => levels(args).await,
    }
}

/// `verdict query levels`: stores the first levels of the closed days, once or on an
/// interval.
async fn levels(args: LevelsArgs) -> anyhow::Result<()> {
    let engine = args.engine.open().await?;
    let lake = args.engine.store.open()?;
    let mut shutdown = std::pin::pin!(crate::signals::shutdown_signal()?);
    loop {
        let done = store_levels(&engine, Arc::clone(&lake), &args.engine.store.store).await?;
        if args.every_secs == 0 {
            println!(
                "levels: {} part(s) written, {} unchanged, {} removed (days the raw table no longer holds), {} old file(s) deleted",
                done.written, done.unchanged, done.removed, done.deleted
            );
            return Ok(());
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(args.every_secs)) => {}
            () = &mut shutdown => return Ok(()),
        }
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let shutdown = crate::signals::shutdown_signal()?;
    let tokens = match &args.tokens_file {
        Some(path) => load_tokens(path)?,
        None => Vec::new(),
    };
    let engine = args.engine.open().await?;
    let _pg = match args.pg_listen {
        Some(addr) => Some(verdict_query::pg::serve(&engine, tokens.clone(), addr).await?),
        None => None,
    };
    let warming =
        (args.warm_parts_every_s > 0 && engine.limits().part_cache_bytes > 0).then(|| {
            tokio::spawn(warm_parts(
                engine.clone(),
                Duration::from_secs(args.warm_parts_every_s),
            ))
        });
    let state = Arc::new(AppState {
        engine,
        tokens,
        metrics: QueryMetrics::new(),
    });
    verdict_query::http::serve(state, args.listen, shutdown).await?;
    if let Some(task) = warming {
        task.abort();
    }
    tracing::info!("query service stopped");
    Ok(())
}

/// Keeps the reports' parts of the closed days warm (see `verdict_query::parts`), and then
/// the answers of the analysts' page's first load: at start, then every `every`.
async fn warm_parts(engine: verdict_query::Engine, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let started = std::time::Instant::now();
        let warmed = engine.warm_parts().await;
        match &warmed {
            Ok(w) if w.computed + w.read > 0 => tracing::info!(
                computed = w.computed,
                read = w.read,
                kept = w.kept,
                ms = started.elapsed().as_millis() as u64,
                "the reports' parts of the closed days are kept"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(
                error = %e,
                "computing the reports' parts of the closed days failed; each report computes the parts it needs"
            ),
        }
        if let Some(last_day) = warmed.ok().and_then(|w| w.newest) {
            warm_first_load(&engine, last_day).await;
        }
    }
}

/// Keeps the answers the analysts' page asks for when it opens on its default range, the
/// whole days up to `last_day` (see `verdict_query::http::page::warm_first_load`).
async fn warm_first_load(engine: &verdict_query::Engine, last_day: chrono::NaiveDate) {
    let started = std::time::Instant::now();
    match verdict_query::http::page::warm_first_load(engine, last_day).await {
        Ok(w) if w.computed > 0 => tracing::info!(
            from = %w.days.0,
            to = %w.days.1,
            computed = w.computed,
            kept = w.kept,
            ms = started.elapsed().as_millis() as u64,
            "the page's first load is answered from kept answers"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(
            error = %e,
            "answering the page's first load beforehand failed; the page computes its answers when opened"
        ),
    }
}

/// How `verdict sql` prints rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// An aligned table.
    Table,
    /// CSV with a header line.
    Csv,
    /// One JSON object per line.
    Json,
}

/// `verdict sql`.
#[derive(Debug, Args)]
pub struct SqlArgs {
    /// The query (SELECT only). Leave it out with --report.
    pub sql: Option<String>,
    /// Run a named report instead: wrong-limits, limit-outliers, demand-history,
    /// shadow-impact, top-denied, overage, denial-rate, policy-changes, degraded.
    #[arg(long, conflicts_with = "sql")]
    pub report: Option<String>,
    /// A report parameter, name=value (repeatable), e.g. -p from=2026-11-30 -p tier=free.
    #[arg(short = 'p', long = "param", value_parser = parse_param)]
    pub params: Vec<(String, String)>,
    /// How to print.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Print the report's SQL instead of running it.
    #[arg(long, requires = "report")]
    pub show_sql: bool,
    /// The report's portable statement: it reads the decisions all the way instead of the
    /// query service's kept parts (`review_parts(…)` and the like), and runs in other engines
    /// (DuckDB, Spark SQL) on the lake's tables; same rows, slower.
    #[arg(long, requires = "report")]
    pub portable: bool,
    /// Time travel: `decisions` reads this version of the raw table's Delta log (the other
    /// tables as they are now), to reproduce an answer given earlier.
    #[arg(long, conflicts_with = "as_of")]
    pub raw_version: Option<u64>,
    /// Time travel: `decisions` reads the newest version committed at or before this time
    /// (RFC 3339, e.g. 2026-11-30T12:00:00Z).
    #[arg(long, value_parser = parse_time)]
    pub as_of: Option<chrono::DateTime<chrono::Utc>>,
    #[command(flatten)]
    pub engine: EngineArgs,
}

fn parse_time(text: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&chrono::Utc))
        .map_err(|e| format!("{text:?} is not an RFC 3339 time such as 2026-11-30T12:00:00Z: {e}"))
}

fn parse_param(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .ok_or_else(|| format!("{text:?} is not name=value"))
}

/// Runs `verdict sql`.
pub async fn sql(args: SqlArgs) -> anyhow::Result<()> {
    let engine = args.engine.open().await?;
    let text = match (&args.sql, &args.report) {
        (Some(sql), _) => sql.clone(),
        (None, Some(report)) => {
            let params: BTreeMap<String, String> = args.params.iter().cloned().collect();
            let form = if args.portable {
                Form::Portable
            } else {
                Form::Served
            };
            engine.report_sql(report, &params, form).await?
        }
        (None, None) => anyhow::bail!("give a query, or --report NAME (see --help)"),
    };
    if args.show_sql {
        println!("{text}");
        return Ok(());
    }
    let at = match (args.raw_version, args.as_of) {
        (Some(v), _) => Some(verdict_query::AsOf::Version(i64::try_from(v)?)),
        (None, Some(t)) => Some(verdict_query::AsOf::Time(t)),
        (None, None) => None,
    };
    let mut stream = engine.run(&text, &RunOptions::default().at(at)).await?;
    // An empty answer still prints its columns.
    let mut batches = vec![verdict_query::format::hex_keys(
        &arrow::array::RecordBatch::new_empty(stream.schema()),
    )?];
    let mut csv_header = true;
    while let Some(batch) = stream.next().await {
        let batch = verdict_query::format::hex_keys(&batch?)?;
        match args.output {
            Output::Table => batches.push(batch),
            Output::Csv => {
                let mut out = Vec::new();
                arrow::csv::WriterBuilder::new()
                    .with_header(csv_header)
                    .build(&mut out)
                    .write(&batch)?;
                csv_header = false;
                print!("{}", String::from_utf8_lossy(&out));
            }
            Output::Json => {
                let mut w = arrow::json::LineDelimitedWriter::new(Vec::new());
                w.write(&batch)?;
                w.finish()?;
                print!("{}", String::from_utf8_lossy(&w.into_inner()));
            }
        }
    }
    if args.output == Output::Csv && csv_header {
        // An empty answer: the header alone.
        let mut out = Vec::new();
        arrow::csv::WriterBuilder::new()
            .with_header(true)
            .build(&mut out)
            .write(&batches[0])?;
        print!("{}", String::from_utf8_lossy(&out));
    }
    if args.output == Output::Table {
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        println!(
            "{}",
            arrow::util::pretty::pretty_format_batches(&batches).context("formatting the rows")?
        );
        println!("({rows} rows)");
    }
    Ok(())
}

/// `verdict what-if`.
#[derive(Debug, Args)]
pub struct WhatIfArgs {
    /// The candidate policy (the limiter's TOML). It is validated as the limiter validates a
    /// policy: an invalid row is refused with its field named.
    #[arg(
        long = "policy",
        value_name = "CANDIDATE.toml",
        required_unless_present = "recommended"
    )]
    pub candidate: Option<PathBuf>,
    /// Replay the limit review's own recommendation instead: run `wrong-limits` over the
    /// range, put every recommended quota, capacity and refill into the policy in force
    /// (--policy-file or --policy-pg), and say what share of keys and of requests it would
    /// have refused.
    #[arg(long, conflicts_with = "candidate")]
    pub recommended: bool,
    /// With --recommended: write the policy in force with every proven recommendation put
    /// in to this file (the limiter's TOML, which `verdict gateway --policy-file` and
    /// `verdict what-if --policy` take), and print the `verdict policy set-limit` commands
    /// that would put the same into the PostgreSQL policy.
    #[arg(long, value_name = "CANDIDATE.toml", requires = "recommended")]
    pub write_policy: Option<PathBuf>,
    /// A parameter of the review, with --recommended: name=value (repeatable), e.g.
    /// -p headroom=1.2 -p tier=free.
    #[arg(short = 'p', long = "param", value_parser = parse_param, requires = "recommended")]
    pub params: Vec<(String, String)>,
    /// Start of the range, inclusive (RFC 3339, 2026-11-30T14:00 or a date; UTC). Default:
    /// `--to` minus 7 days.
    #[arg(long)]
    pub from: Option<String>,
    /// End of the range, exclusive. Default: the next full hour.
    #[arg(long)]
    pub to: Option<String>,
    /// How many keys whose refusals change most to list.
    #[arg(long, default_value_t = 10)]
    pub keys: usize,
    /// Keys replayed whole: past this many in the range, a sample of about this many keys
    /// (chosen by key hash) is replayed, each whole, and the counts are estimates for every
    /// key with their bounds (three standard errors). Memory and time grow with it.
    #[arg(long, default_value_t = verdict_query::whatif::SAMPLE_KEYS, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub sample_keys: u64,
    /// Print the answer as one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Runs `verdict what-if`.
pub async fn what_if(args: WhatIfArgs) -> anyhow::Result<()> {
    let now = chrono::Utc::now();
    let range =
        verdict_query::range::Range::parse(args.from.as_deref(), args.to.as_deref(), now, 7)?;
    let engine = args.engine.open().await?;
    let started = std::time::Instant::now();
    let (text, json, decisions) = match &args.candidate {
        None => {
            let mut params: BTreeMap<String, String> = args.params.iter().cloned().collect();
            params.insert("from".into(), range.from.to_rfc3339());
            params.insert("to".into(), range.to.to_rfc3339());
            let answer = verdict_query::recommend::replay(&engine, &params, now, args.keys).await?;
            let mut text = verdict_query::recommend::render(&answer);
            if let Some(path) = &args.write_policy {
                let toml = verdict_limiter::policy::to_toml(&answer.candidate)
                    .context("writing the recommended policy as TOML")?;
                std::fs::write(
                    path,
                    format!(
                        "# The policy in force with the limit review's proven recommendations, \
                         from {} to {}.\n{toml}",
                        range.from.to_rfc3339(),
                        range.to.to_rfc3339()
                    ),
                )
                .with_context(|| format!("writing {}", path.display()))?;
                let commands = answer.set_limit_commands();
                text += &format!("Wrote the recommended policy to {}.\n", path.display());
                if commands.is_empty() {
                    text += "No limit changes: nothing to set in the PostgreSQL policy.\n";
                } else {
                    text += "To put it into the PostgreSQL policy:\n";
                    for c in commands {
                        text += &format!("  {c}\n");
                    }
                }
                if let Some(w) = answer.weights.as_ref().filter(|w| w.recommended) {
                    text += "The file has the recommended weights (the limits were proven with \
                             them); in the PostgreSQL policy, set them in verdict_policy.regions:\n";
                    for r in &w.regions {
                        text += &format!(
                            "  UPDATE verdict_policy.regions SET weight = {} WHERE id = {};\n",
                            r.recommended_weight, r.region
                        );
                    }
                }
            }
            (
                text,
                serde_json::to_string_pretty(&answer)?,
                answer.what_if.decisions,
            )
        }
        Some(path) => {
            let toml = std::fs::read_to_string(path)
                .with_context(|| format!("reading the candidate policy {}", path.display()))?;
            let candidate = verdict_query::whatif::candidate(&toml)
                .with_context(|| format!("in {}", path.display()))?;
            let answer = verdict_query::whatif::what_if(
                &engine,
                candidate,
                range,
                args.keys,
                args.sample_keys,
            )
            .await?;
            (
                verdict_query::whatif::render(&answer),
                serde_json::to_string_pretty(&answer)?,
                answer.decisions,
            )
        }
    };
    tracing::info!(
        decisions,
        seconds = started.elapsed().as_secs_f64(),
        recommended = args.recommended,
        "replayed"
    );
    if args.json {
        println!("{json}");
    } else {
        print!("{text}");
    }
    Ok(())
}
