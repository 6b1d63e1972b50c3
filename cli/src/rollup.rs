//! `verdict rollup`: the denied-only rollup of one hour, or a backfill of a range of hours.

use std::io::IsTerminal;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use verdict_rollup::{Rollup, RollupReport};
use verdict_schemas::HourPartition;

use crate::store_args::StoreArgs;

/// Options of `verdict rollup`.
#[derive(Debug, Clone, Args)]
#[command(group(clap::ArgGroup::new("hours").required(true).args(["hour", "from"])))]
pub struct RollupArgs {
    /// The lake holding `raw/` (read) and `rollup/` (written).
    #[command(flatten)]
    pub lake: StoreArgs,
    /// The hour to roll up, UTC: YYYY-MM-DDTHH (2026-11-30T14 is 14:00–15:00).
    #[arg(long, conflicts_with_all = ["from", "to"])]
    pub hour: Option<HourPartition>,
    /// Backfill: the first hour of the range, YYYY-MM-DDTHH.
    #[arg(long, requires = "to")]
    pub from: Option<HourPartition>,
    /// Backfill: the last hour of the range (included), YYYY-MM-DDTHH.
    #[arg(long, requires = "from")]
    pub to: Option<HourPartition>,
    /// Threads for the query [default: the machine's cores].
    #[arg(long)]
    pub threads: Option<usize>,
}

/// The hours from `from` to `to`, both included.
pub fn hour_range(from: HourPartition, to: HourPartition) -> Vec<HourPartition> {
    std::iter::successors(Some(from), HourPartition::next)
        .take_while(|h| *h <= to)
        .collect()
}

/// Runs the rollup of each hour asked for, in order, and prints a summary.
pub async fn run(args: RollupArgs) -> anyhow::Result<()> {
    let hours = match (args.hour, args.from, args.to) {
        (Some(h), _, _) => vec![h],
        (None, Some(from), Some(to)) if from <= to => hour_range(from, to),
        (None, Some(from), Some(to)) => {
            anyhow::bail!("--from {from} is after --to {to}")
        }
        _ => anyhow::bail!("give --hour, or --from and --to"),
    };
    let now = chrono::Utc::now().timestamp_millis();
    if let Some(open) = hours.iter().find(|h| h.end_ms() > now) {
        tracing::warn!(
            hour = %open,
            "this hour is not over: events still arriving will make the jobs roll it up again"
        );
    }
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, usize::from));
    let rollup = Rollup::new(args.lake.open()?, threads);

    // A bar on a terminal; plain log lines (one per hour, from the rollup) otherwise.
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = ProgressBar::new(hours.len() as u64);
        bar.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} hours  {msg}  eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    });
    let started = Instant::now();
    let mut total = Totals::default();
    for hour in &hours {
        if let Some(bar) = &bar {
            bar.set_message(hour.to_string());
        }
        let report = rollup
            .run_hour(*hour)
            .await
            .with_context(|| format!("rolling up {hour} of the lake {}", args.lake.store))?;
        total.add(&report);
        if let Some(bar) = &bar {
            bar.inc(1);
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    println!(
        "rolled up {} hour(s): {} raw events in {} files, {} rollup rows, {} bytes, in {:.1} s",
        hours.len(),
        total.events,
        total.files,
        total.rows,
        total.bytes,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[derive(Debug, Default)]
struct Totals {
    events: u64,
    files: usize,
    rows: usize,
    bytes: usize,
}

impl Totals {
    fn add(&mut self, r: &RollupReport) {
        self.events += r.events;
        self.files += r.source_files;
        self.rows += r.rows;
        self.bytes += r.bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_includes_both_ends_and_crosses_midnight() {
        let hours = hour_range(
            "2026-11-30T22".parse().unwrap(),
            "2026-12-01T01".parse().unwrap(),
        );
        let names: Vec<String> = hours.iter().map(ToString::to_string).collect();
        assert_eq!(
            names,
            [
                "2026-11-30T22",
                "2026-11-30T23",
                "2026-12-01T00",
                "2026-12-01T01"
            ]
        );
    }
}
