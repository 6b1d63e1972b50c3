//! What several benches share: the median of timings, and the options of the benches that
//! compare DataFusion with DuckDB on the same files.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use anyhow::{Context, bail};
use clap::Args;
use serde::Serialize;

/// The middle of `values` (of an even count, the upper of the two middle ones); timings,
/// never NaN.
pub fn median<T: Copy + PartialOrd>(values: &[T]) -> T {
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    sorted[sorted.len() / 2]
}

/// Options of the benches that compare DataFusion with DuckDB on the same files.
#[derive(Debug, Clone, Args)]
pub struct DuckDbArgs {
    /// Threads for both engines [default: the machine's cores].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Folder for the lake [default: a temporary folder, removed afterwards].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The script that runs DuckDB (installed from PyPI on first use).
    #[arg(long, default_value = "scripts/duckdb.sh")]
    pub duckdb_script: PathBuf,
    /// Skip the DuckDB comparison.
    #[arg(long)]
    pub no_duckdb: bool,
}

impl DuckDbArgs {
    /// The threads to use.
    pub fn threads(&self) -> usize {
        self.threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, usize::from))
    }

    /// The lake's folder (absolute), and the temporary folder to keep alive when `--out`
    /// is not given.
    pub fn lake(&self) -> anyhow::Result<(PathBuf, Option<tempfile::TempDir>)> {
        match &self.out {
            Some(p) => {
                std::fs::create_dir_all(p).with_context(|| format!("creating {}", p.display()))?;
                Ok((p.canonicalize()?, None))
            }
            None => {
                let tmp = tempfile::tempdir()?;
                Ok((tmp.path().to_path_buf(), Some(tmp)))
            }
        }
    }

    /// Starts the DuckDB script with `args`, its standard input and output piped (its errors
    /// go to ours).
    pub fn duckdb_session(&self, args: &[&OsStr]) -> anyhow::Result<std::process::Child> {
        let script = &self.duckdb_script;
        Command::new(script)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .with_context(|| format!("running {}", script.display()))
    }

    /// Runs the DuckDB script with `args` and returns what it printed.
    pub fn duckdb(&self, args: &[&OsStr]) -> anyhow::Result<String> {
        let script = &self.duckdb_script;
        let out = Command::new(script)
            .args(args)
            .output()
            .with_context(|| format!("running {}", script.display()))?;
        anyhow::ensure!(
            out.status.success(),
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// The program `name` (`verdict`) beside this one, as `cargo build` leaves them.
pub fn sibling(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("finding this program")?;
    let path = exe.with_file_name(name);
    anyhow::ensure!(
        path.is_file(),
        "{} is missing: build it beside verdict-bench (cargo build --release -p verdict)",
        path.display()
    );
    Ok(path)
}

/// Child processes, killed and waited for when dropped (however the bench ends).
pub struct Children(pub Vec<std::process::Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits until something accepts connections on loopback `port`, at most `within`.
pub async fn wait_listening(port: u16, within: std::time::Duration) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + within;
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "nothing listens on port {port} after {within:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Ok(())
}

/// One gateway process's own account of its events, from its last log line.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Account {
    pub decisions: u64,
    pub events_sent: u64,
    pub events_failed: u64,
    pub events_dropped: u64,
}

/// A gateway's last account line (`gateway stopped decisions=… events_sent=…`).
pub fn account(log: &Path) -> anyhow::Result<Account> {
    let text = std::fs::read_to_string(log)?;
    let line = text
        .lines()
        .rfind(|l| l.contains("gateway stopped"))
        .with_context(|| format!("{} has no final account", log.display()))?;
    let field = |name: &str| -> anyhow::Result<u64> {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.trim_end_matches(',').parse().ok())
            .with_context(|| format!("no {name} in {line:?}"))
    };
    Ok(Account {
        decisions: field("decisions")?,
        events_sent: field("events_sent")?,
        events_failed: field("events_failed")?,
        events_dropped: field("events_dropped")?,
    })
}

/// Sends `signal` (`-TERM`, `-KILL`…) to `child`.
pub fn signal(child: &Child, signal: &str) -> anyhow::Result<()> {
    run_ok(Command::new("kill").args([signal, &child.id().to_string()]))
}

/// Runs `cmd` to its end (off the runtime's other tasks: starting a broker takes seconds).
pub fn run_ok(cmd: &mut Command) -> anyhow::Result<()> {
    let out =
        tokio::task::block_in_place(|| cmd.output()).with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
