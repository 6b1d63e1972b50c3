//! `verdict-bench page`: the analysts' page loaded in headless Chromium (Debian's
//! `chromium`; `scripts/services.sh up chromium` installs it) from a running query service,
//! a fresh tab per run: the time from asking for the page to every view drawn, and the
//! views' own time (their queries and drawing). Prints one JSON object.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use serde::Serialize;
use serde_json::{Value, json};
use verdict_load::browser::Browser;

use super::shared::median;

/// Options of `verdict-bench page`.
#[derive(Debug, Args)]
pub struct PageBenchArgs {
    /// The page's address, with the choice in its fragment, for example
    /// `http://127.0.0.1:8089/#range=custom&from=2026-11-24T00:00&to=2026-12-01T00:00`.
    #[arg(long)]
    pub url: String,
    /// A file whose first token (one per line, `#` comments allowed) the page sends; the
    /// service's own `--tokens-file` will do. Without it the page sends none.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Page loads, each in a fresh tab; the first pays for the service's cold caches.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub runs: u32,
    /// Save a screenshot of the whole page after the last run (PNG).
    #[arg(long)]
    pub screenshot: Option<PathBuf>,
    /// The window's width and height in CSS pixels.
    #[arg(long, default_value_t = 1100)]
    pub width: u32,
    /// See `--width`.
    #[arg(long, default_value_t = 900)]
    pub height: u32,
    /// How long one load may take before the bench gives up, in seconds.
    #[arg(long, default_value_t = 60)]
    pub timeout_s: u64,
}

#[derive(Debug, Serialize)]
struct PageResult {
    bench: &'static str,
    url: String,
    runs: u32,
    /// Per run: from asking for the page to every view drawn.
    ready_ms: Vec<u64>,
    ready_p50_ms: u64,
    /// Per run: the views' queries and drawing alone.
    views_ms: Vec<u64>,
    views_p50_ms: u64,
    /// Each view's state after the last run (`ready`, or `error` with its message).
    views: Value,
    /// Per view: the median time from the start of the views' load to that view drawn.
    view_p50_ms: std::collections::BTreeMap<String, u64>,
    screenshot: Option<PathBuf>,
}

/// Runs the bench (blocking: the browser's calls wait on it).
pub fn run_blocking(args: PageBenchArgs) -> anyhow::Result<()> {
    let token = match &args.token_file {
        Some(path) => Some(
            verdict_query::http::load_tokens(path)?
                .into_iter()
                .next()
                .with_context(|| format!("{} holds no token", path.display()))?,
        ),
        None => None,
    };
    let script = token.map(|t| {
        format!(
            "sessionStorage.setItem('verdict.token', {});",
            serde_json::to_string(&t).expect("a string")
        )
    });
    let mut browser = Browser::start(args.width, args.height).map_err(anyhow::Error::msg)?;
    let timeout = Duration::from_secs(args.timeout_s);
    let (mut ready_ms, mut views_ms) = (Vec::new(), Vec::new());
    let mut views = Value::Null;
    let mut per_view: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    for run in 0..args.runs {
        browser
            .open_with(&args.url, script.as_deref())
            .map_err(anyhow::Error::msg)?;
        browser
            .wait_for(
                "['ready', 'error', 'unauthorized'].includes(document.body.dataset.state)",
                timeout,
            )
            .map_err(anyhow::Error::msg)?;
        let page = browser
            .eval(
                "({state: document.body.dataset.state, readyAt: Number(document.body.dataset.readyAt),
                  loadMs: Number(document.body.dataset.loadMs),
                  views: Object.fromEntries([...document.querySelectorAll('section.view')].map(s =>
                    [s.id, s.dataset.state === 'error'
                      ? 'error: ' + (s.querySelector('.error')?.textContent ?? '')
                      : s.dataset.state])),
                  viewMs: Object.fromEntries([...document.querySelectorAll('section.view')].map(s =>
                    [s.id, Number(s.dataset.ms)]))})",
            )
            .map_err(anyhow::Error::msg)?;
        match page["state"].as_str() {
            Some("unauthorized") => bail!(
                "the service wants a token the page did not have: give --token-file (run {run})"
            ),
            Some("error") => bail!("a view failed (run {run}): {}", page["views"]),
            _ => {}
        }
        ready_ms.push(page["readyAt"].as_u64().unwrap_or(0));
        views_ms.push(page["loadMs"].as_u64().unwrap_or(0));
        views = page["views"].clone();
        if let Some(ms) = page["viewMs"].as_object() {
            for (view, v) in ms {
                per_view
                    .entry(view.clone())
                    .or_default()
                    .push(v.as_u64().unwrap_or(0));
            }
        }
        tracing::info!(run, ready_ms = ready_ms[ready_ms.len() - 1], "page loaded");
    }
    if let Some(path) = &args.screenshot {
        browser.screenshot(path).map_err(anyhow::Error::msg)?;
    }
    let problems = browser.problems();
    if !problems.is_empty() {
        bail!("the page reported problems: {problems:?}");
    }
    let result = PageResult {
        bench: "page",
        url: args.url,
        runs: args.runs,
        ready_p50_ms: median(&ready_ms),
        ready_ms,
        views_p50_ms: median(&views_ms),
        views_ms,
        views,
        view_p50_ms: per_view
            .iter()
            .map(|(view, ms)| (view.clone(), median(ms)))
            .collect(),
        screenshot: args.screenshot,
    };
    println!("{}", json!(result));
    Ok(())
}

/// Runs the bench on a blocking thread.
pub async fn run(args: PageBenchArgs) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || run_blocking(args)).await?
}
