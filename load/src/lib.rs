//! An HTTP load generator: `concurrency` workers send the requests a closure makes, paced to
//! a rate or as fast as the answers come back, for a count or a duration. It records each
//! answer's status and latency, and whether the rate-limit fields were there: a 429 without
//! `Retry-After`, an answer of the limiter without `RateLimit`.
//!
//! `verdict demo` drives its traffic with it, `verdict-bench gateway` measures with it, and
//! the end-to-end test drives the gateways with it. It is not part of the gateway a
//! platform team deploys.
//!
//! Two latencies per answer: from when it was sent (the service time), and, in paced runs,
//! from when it was due, so that a server that stalls is charged for the requests it held
//! up (no coordinated omission). The second includes the timer's lateness in waking a
//! worker for a request (up to a millisecond with tokio's timer).
//!
//! [`browser`] drives a headless Chromium, the load of the analysts' page; [`proxy`] is a
//! TCP proxy that delays or cuts a connection, for fault tests and the soak.

pub mod browser;
pub mod proxies;
pub mod proxy;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Makes request number `i` (from 0).
pub type MakeRequest = Arc<dyn Fn(u64) -> Request<Body> + Send + Sync>;

/// How much load, and how fast.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// Requests in flight at most (one connection each).
    pub concurrency: usize,
    /// Requests per second to aim at; `None`: each worker sends its next request as soon
    /// as the last is answered.
    pub rate_per_s: Option<f64>,
    /// Stop after this many requests…
    pub requests: Option<u64>,
    /// …or after this long, whichever comes first (at least one of the two is needed).
    pub duration: Option<Duration>,
    /// An answer slower than this counts as failed.
    pub timeout: Duration,
}

impl LoadSpec {
    /// `requests` requests, `concurrency` at a time, as fast as they are answered.
    pub fn count(requests: u64, concurrency: usize) -> Self {
        Self {
            concurrency,
            rate_per_s: None,
            requests: Some(requests),
            duration: None,
            timeout: Duration::from_secs(10),
        }
    }

    /// `concurrency` workers for `duration`, as fast as they are answered.
    pub fn closed(duration: Duration, concurrency: usize) -> Self {
        Self {
            concurrency,
            rate_per_s: None,
            requests: None,
            duration: Some(duration),
            timeout: Duration::from_secs(10),
        }
    }
}

/// Counts while a run goes, for progress lines.
#[derive(Debug, Default)]
pub struct LoadProgress {
    /// Requests answered or failed.
    pub done: AtomicU64,
    /// Answers with 429.
    pub limited: AtomicU64,
    /// Requests without an answer.
    pub failed: AtomicU64,
}

/// What a run saw.
#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    /// Requests sent.
    pub sent: u64,
    /// Answers by status code.
    pub statuses: BTreeMap<u16, u64>,
    /// Requests without an answer (connection refused or reset, timeout).
    pub failed: u64,
    /// 429 answers without a `Retry-After` of at least one second.
    pub limited_without_retry_after: u64,
    /// 200 and 429 answers without `RateLimit` and `RateLimit-Policy`.
    pub without_ratelimit_fields: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Latencies of the answered requests from when they were due, µs, sorted once the
    /// run ends.
    latencies_us: Vec<u32>,
    /// The same from when they were sent.
    service_us: Vec<u32>,
}

impl LoadReport {
    /// Answers with `status`.
    pub fn count(&self, status: StatusCode) -> u64 {
        self.statuses
            .get(&status.as_u16())
            .copied()
            .unwrap_or_default()
    }

    /// Answered requests per second.
    pub fn rate(&self) -> f64 {
        self.latencies_us.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The `q` quantile (0..=1) of the latency from when each request was due, ms; 0 when
    /// nothing was answered.
    pub fn latency_ms(&self, q: f64) -> f64 {
        quantile_ms(&self.latencies_us, q)
    }

    /// The `q` quantile of the latency from when each request was sent, ms.
    pub fn service_ms(&self, q: f64) -> f64 {
        quantile_ms(&self.service_us, q)
    }

    /// Adds `other`'s answers to these: the runs of several targets as one.
    pub fn merge(&mut self, other: Self) {
        let elapsed = other.elapsed;
        self.merge_unsorted(other);
        self.latencies_us.sort_unstable();
        self.service_us.sort_unstable();
        self.elapsed = self.elapsed.max(elapsed);
    }

    fn merge_unsorted(&mut self, other: Self) {
        self.sent += other.sent;
        for (s, n) in other.statuses {
            *self.statuses.entry(s).or_default() += n;
        }
        self.failed += other.failed;
        self.limited_without_retry_after += other.limited_without_retry_after;
        self.without_ratelimit_fields += other.without_ratelimit_fields;
        self.latencies_us.extend(other.latencies_us);
        self.service_us.extend(other.service_us);
    }
}

fn quantile_ms(sorted_us: &[u32], q: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let rank = (q.clamp(0.0, 1.0) * (sorted_us.len() - 1) as f64).round() as usize;
    f64::from(sorted_us[rank]) / 1000.0
}

fn micros(d: Duration) -> u32 {
    d.as_micros().min(u128::from(u32::MAX)) as u32
}

/// An HTTP/1.1 client with a connection pool, no Nagle delay.
pub fn client() -> Client<HttpConnector, Body> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(connector)
}

/// Runs the load and returns what it saw. `progress` counts as it goes.
///
/// # Panics
/// If the spec has neither a request count nor a duration (it would never end).
pub async fn run(spec: &LoadSpec, make: MakeRequest, progress: Arc<LoadProgress>) -> LoadReport {
    assert!(
        spec.requests.is_some() || spec.duration.is_some(),
        "a load needs a request count or a duration"
    );
    let client = client();
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..spec.concurrency.max(1) {
        let (client, next, make, progress, spec) = (
            client.clone(),
            Arc::clone(&next),
            Arc::clone(&make),
            Arc::clone(&progress),
            spec.clone(),
        );
        workers.spawn(async move {
            let mut report = LoadReport::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if spec.requests.is_some_and(|n| i >= n)
                    || spec.duration.is_some_and(|d| started.elapsed() >= d)
                {
                    break;
                }
                let due = match spec.rate_per_s {
                    Some(rate) if rate > 0.0 => {
                        let due = started + Duration::from_secs_f64(i as f64 / rate);
                        if spec.duration.is_some_and(|d| due >= started + d) {
                            break;
                        }
                        tokio::time::sleep_until(due.into()).await;
                        due
                    }
                    _ => Instant::now(),
                };
                report.sent += 1;
                let sent_at = Instant::now();
                let answer = tokio::time::timeout(spec.timeout, async {
                    let resp = client.request(make(i)).await?;
                    let (parts, body) = resp.into_parts();
                    // Read the body: the connection goes back to the pool only once it is.
                    let _ = axum::body::to_bytes(Body::new(body), usize::MAX).await;
                    Ok::<_, hyper_util::client::legacy::Error>(parts)
                })
                .await;
                progress.done.fetch_add(1, Ordering::Relaxed);
                let Ok(Ok(parts)) = answer else {
                    report.failed += 1;
                    progress.failed.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                // One reading of the clock for both, so that the service time is never
                // longer than the time from due.
                let answered = Instant::now();
                report.latencies_us.push(micros(answered - due));
                report.service_us.push(micros(answered - sent_at));
                *report.statuses.entry(parts.status.as_u16()).or_default() += 1;
                let has = |name: &str| parts.headers.contains_key(name);
                if parts.status == StatusCode::TOO_MANY_REQUESTS {
                    progress.limited.fetch_add(1, Ordering::Relaxed);
                    let retry = parts
                        .headers
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<u64>().ok());
                    if retry.is_none_or(|s| s < 1) {
                        report.limited_without_retry_after += 1;
                    }
                }
                if matches!(parts.status, StatusCode::OK | StatusCode::TOO_MANY_REQUESTS)
                    && !(has("ratelimit") && has("ratelimit-policy"))
                {
                    report.without_ratelimit_fields += 1;
                }
            }
            report
        });
    }
    let mut total = LoadReport::default();
    while let Some(done) = workers.join_next().await {
        if let Ok(report) = done {
            total.merge_unsorted(report);
        }
    }
    total.elapsed = started.elapsed();
    total.latencies_us.sort_unstable();
    total.service_us.sort_unstable();
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_come_from_the_sorted_latencies() {
        let r = LoadReport {
            latencies_us: (1..=100).map(|ms| ms * 1000).collect(),
            service_us: (1..=100).map(|ms| ms * 100).collect(),
            elapsed: Duration::from_secs(2),
            ..LoadReport::default()
        };
        assert_eq!(r.latency_ms(0.5), 51.0);
        assert_eq!(r.service_ms(0.5), 5.1);
        assert_eq!(r.latency_ms(0.99), 99.0);
        assert_eq!(r.latency_ms(1.0), 100.0);
        assert_eq!(r.rate(), 50.0);
        assert_eq!(LoadReport::default().latency_ms(0.99), 0.0);
    }
}
