//! Other engines reading the lake: `tests/spark/lake.py` run with the Python that
//! `scripts/services.sh up spark` installs (pyspark with Delta Lake's jars, delta-rs,
//! Polars). Each call starts a Python process; what it prints is JSON, one object a line.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

fn cache() -> PathBuf {
    std::env::var_os("VERDICT_CACHE").map_or_else(
        || {
            let home = std::env::var_os("HOME").unwrap_or_default();
            Path::new(&home).join(".cache/verdict")
        },
        PathBuf::from,
    )
}

fn version(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

/// The Python of the Spark installation and the folder of Delta's jars.
///
/// # Panics
/// When `scripts/services.sh up spark` has not installed them, saying so.
pub fn spark_install() -> (PathBuf, PathBuf) {
    let python = venv_python("spark", "VERDICT_PYSPARK_VERSION", "4.0.1");
    let jars = cache()
        .join(format!(
            "delta-spark-{}",
            version("VERDICT_DELTA_SPARK_VERSION", "4.0.0")
        ))
        .join("jars");
    assert!(
        python.exists() && jars.join(".complete").exists(),
        "Spark is not installed ({} or {} is missing). The tests use the real engines: \
         install them with `scripts/services.sh up spark` (scripts/test.sh does), or run \
         the whole suite with scripts/test.sh.",
        python.display(),
        jars.display()
    );
    (python, jars)
}

/// The Python of the virtual environment `scripts/services.sh` installs `name` into, at the
/// version `variable` names (`default` without it).
fn venv_python(name: &str, variable: &str, default: &str) -> PathBuf {
    cache()
        .join(format!("{name}-{}", version(variable, default)))
        .join("bin/python")
}

/// What psycopg read through the query service (`tests/pg/psycopg_client.py`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DriverRead {
    /// Rows read.
    pub rows: u64,
    /// Their values' sum.
    pub sum: u64,
    /// Seconds taken.
    pub seconds: f64,
}

/// Reads `rows` rows of a parameterised query through psycopg, connected to `dsn`:
/// `stream` (the extended protocol, row by row) or `named` (a named cursor, `chunk` rows a
/// FETCH). `Err` holds what psycopg said when it failed or crashed.
///
/// # Panics
/// When `scripts/services.sh up postgres` has not installed psycopg, saying so.
pub fn psycopg_read(dsn: &str, mode: &str, rows: u64, chunk: u64) -> Result<DriverRead, String> {
    let python = venv_python("psycopg", "VERDICT_PSYCOPG_VERSION", "3.3.9");
    assert!(
        python.exists(),
        "psycopg is not installed ({} is missing). The tests use the real driver: install it \
         with `scripts/services.sh up postgres` (scripts/test.sh does).",
        python.display()
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("pg/psycopg_client.py");
    let out = Command::new(python)
        .arg(script)
        .args([dsn, mode, &rows.to_string(), &chunk.to_string()])
        .output()
        .map_err(|e| format!("starting psycopg: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "psycopg ended with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "psycopg printed {:?}: {e}",
            String::from_utf8_lossy(&out.stdout)
        )
    })?;
    Ok(DriverRead {
        rows: v["rows"].as_u64().unwrap_or(0),
        sum: v["sum"].as_u64().unwrap_or(0),
        seconds: v["seconds"].as_f64().unwrap_or(f64::NAN),
    })
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("spark/lake.py")
}

fn command(args: &[&str]) -> Command {
    let (python, jars) = spark_install();
    let mut cmd = Command::new(python);
    cmd.arg(script())
        .args(args)
        .env("VERDICT_DELTA_JARS", jars)
        .env("PYSPARK_PYTHON", spark_install().0)
        .stderr(Stdio::piped());
    cmd
}

/// Runs `lake.py args…` to its end and returns the JSON lines it printed.
///
/// # Panics
/// When it fails, with its error output.
pub fn run(args: &[&str]) -> Vec<serde_json::Value> {
    let out = command(args)
        .stdout(Stdio::piped())
        .output()
        .expect("starting lake.py");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(40).collect();
    assert!(
        out.status.success(),
        "lake.py {args:?} failed: {}\n{}",
        out.status,
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Spark counting a table again and again (`lake.py watch`), started and past its first
/// count.
pub struct Watcher {
    child: Child,
    stdin: Option<ChildStdin>,
    first: u64,
}

impl Watcher {
    /// Starts counting `table` (a Delta table's folder); returns once the first count is in.
    pub fn start(table: &Path) -> Self {
        let mut child = command(&["watch", table.to_str().expect("a UTF-8 path")])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting lake.py watch");
        let stdin = child.stdin.take();
        let mut lines = BufReader::new(child.stdout.take().expect("stdout"));
        let mut first = None;
        let mut line = String::new();
        loop {
            line.clear();
            let n = lines.read_line(&mut line).expect("reading lake.py");
            assert!(n > 0, "lake.py watch ended before it was ready");
            match serde_json::from_str::<serde_json::Value>(&line) {
                Ok(serde_json::Value::String(s)) if s == "ready" => break,
                Ok(v) => first = v["count"].as_u64(),
                Err(_) => {}
            }
        }
        child.stdout = Some(lines.into_inner());
        Self {
            child,
            stdin,
            first: first.expect("a first count"),
        }
    }

    /// Stops it and returns every count it made, the first included.
    pub fn stop(mut self) -> Vec<u64> {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.flush();
        }
        let out = self.child.wait_with_output().expect("lake.py watch");
        assert!(
            out.status.success(),
            "lake.py watch failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut counts = vec![self.first];
        counts.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter_map(|v| v["count"].as_u64()),
        );
        counts
    }
}
