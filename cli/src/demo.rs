//! `verdict demo`'s options and output; the demo itself is [`verdict_demo`].

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use verdict_demo::{DemoConfig, Progress};

/// Options of `verdict demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Folder that plays the object store; the raw table goes to <OUT>/raw/, the policy and
    /// the key directory the gateway used to <OUT>/policy.toml and <OUT>/keys.csv.
    #[arg(long, default_value = "verdict-data")]
    pub out: PathBuf,
    /// How long the traffic runs, real seconds.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub seconds: u64,
    /// How much faster than real time the limiter's clock runs: at 60, each real minute is
    /// an hour of traffic, so the hourly quota and the hourly rollup have whole hours.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u32).range(1..=3_600))]
    pub speed: u32,
    /// Requests per real second the traffic generator aims at (the limits are set for it).
    #[arg(long, default_value_t = 3_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub rate: u32,
    /// Requests in flight at most.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,
    /// Distinct API keys (popularity is Zipf-distributed; one tenant makes 8 % of requests).
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub keys: u32,
    /// Seed of the traffic generator: the same seed sends the same keys in the same order.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Partitions of the in-process queue (Kafka partitions in production).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub partitions: u16,
    /// Replace a raw table already in <OUT> (otherwise the demo refuses to touch it).
    #[arg(long)]
    pub overwrite: bool,
    /// Print the summary as one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

impl DemoArgs {
    /// The demo these options ask for.
    pub fn config(&self) -> DemoConfig {
        DemoConfig {
            out: self.out.clone(),
            seconds: self.seconds,
            speed: self.speed,
            rate: self.rate,
            concurrency: self.concurrency,
            keys: self.keys,
            seed: self.seed,
            partitions: self.partitions,
            overwrite: self.overwrite,
        }
    }
}

/// Runs the demo, with a progress line on stderr every 5 s (10 s when stderr is not a
/// terminal), and prints its report.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let cfg = args.config();
    let every = Duration::from_secs(if std::io::stderr().is_terminal() {
        5
    } else {
        10
    });
    let report = verdict_demo::demo(&cfg, every, |p| eprintln!("{}", progress_line(&p))).await?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", verdict_demo::render(&report, &cfg));
    }
    Ok(())
}

/// One progress line.
fn progress_line(p: &Progress) -> String {
    let clock = chrono::DateTime::from_timestamp_millis(p.demo_clock_ms)
        .map(|t| t.format("%H:%M").to_string())
        .unwrap_or_default();
    format!(
        "  {elapsed:>4.0} s of {seconds}: demo clock {clock} UTC, {done} requests ({rate:.0}/s), \
         {limited} answered 429, {would} would-deny in shadow mode, {failed} failed",
        elapsed = p.elapsed_s,
        seconds = p.seconds,
        done = p.requests,
        rate = p.requests as f64 / p.elapsed_s.max(1e-9),
        limited = p.limited,
        would = p.would_deny,
        failed = p.failed,
    )
}
