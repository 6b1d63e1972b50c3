//! The HTTP answer to a decision, independent of any HTTP library: the status, the
//! rate-limit fields of draft-ietf-httpapi-ratelimit-headers-11 on every response
//! (`RateLimit-Policy`, `RateLimit`), and on a refusal `Retry-After` (delay-seconds, rounded
//! up) with a small RFC 9457 problem body naming the violated policy.
//!
//! Two quota policies describe a limit key: `"burst"` (the token bucket: `q` tokens,
//! refilled over `w` seconds) and `"hourly"` (the sliding window: `q` requests per `w` =
//! 3600 seconds).

use serde::Serialize;
use verdict_schemas::Verdict;

use crate::algo::{Limits, TOKEN_UNITS};
use crate::limiter::Decision;

/// The content type of the problem body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// What the gateway sends (or adds to the upstream's response).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpAnswer {
    /// 429 when refused; otherwise `None`: the request goes upstream.
    pub status: Option<u16>,
    /// Fields to set on the response.
    pub headers: Vec<(&'static str, String)>,
    /// The problem document of a refusal.
    pub body: Option<String>,
}

#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    title: &'a str,
    status: u16,
    detail: String,
    violated_policies: Vec<&'a str>,
    retry_after_seconds: u64,
    remaining: Remaining,
}

#[derive(Serialize)]
struct Remaining {
    burst: u32,
    hourly: u32,
}

/// An RFC 9457 problem document of no particular type (`about:blank`): for the answers a
/// gateway gives itself besides 429 (401, 404, 502, …).
pub fn problem_body(status: u16, title: &str, detail: &str) -> String {
    serde_json::json!({
        "type": "about:blank",
        "title": title,
        "status": status,
        "detail": detail,
    })
    .to_string()
}

/// ⌈a / b⌉ for a ≥ 0, b > 0.
fn ceil_div(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

fn ceil_seconds(ms: i64) -> i64 {
    ceil_div(ms.max(0), 1000)
}

/// The answer to `d`.
pub fn http_answer(d: &Decision) -> HttpAnswer {
    let mut headers = Vec::with_capacity(3);
    if let Some(l) = d.limits {
        headers.push(("ratelimit-policy", policy_field(&l)));
        headers.push(("ratelimit", ratelimit_field(d, &l)));
    }
    if d.verdict != Verdict::Denied {
        return HttpAnswer {
            status: None,
            headers,
            body: None,
        };
    }
    let retry_s = ceil_seconds(i64::from(d.retry_after_ms)).max(1) as u64;
    headers.push(("retry-after", retry_s.to_string()));
    let mut violated = Vec::new();
    if d.denied_by.bucket {
        violated.push("burst");
    }
    if d.denied_by.window {
        violated.push("hourly");
    }
    let detail = match (d.denied_by.bucket, d.denied_by.window, d.limits) {
        (_, true, Some(l)) => format!(
            "the hourly quota of {} requests is spent; retry in {retry_s} s",
            l.quota
        ),
        (true, _, Some(l)) => format!(
            "the burst allowance of {} requests is spent; retry in {retry_s} s",
            l.capacity
        ),
        _ => format!("rate limited; retry in {retry_s} s"),
    };
    let problem = Problem {
        kind: "urn:verdict:problem:rate-limited",
        title: "Too Many Requests",
        status: 429,
        detail,
        violated_policies: violated,
        retry_after_seconds: retry_s,
        remaining: Remaining {
            burst: d.remaining_tokens,
            hourly: d.remaining_window,
        },
    };
    HttpAnswer {
        status: Some(429),
        headers,
        body: serde_json::to_string(&problem).ok(),
    }
}

/// `"burst";q=<capacity>;w=<seconds to refill it>, "hourly";q=<quota>;w=<window seconds>`
fn policy_field(l: &Limits) -> String {
    let refill_ms = if l.refill_units_per_ms == 0 {
        l.window_ms
    } else {
        ceil_div(i64::from(l.capacity) * TOKEN_UNITS, l.refill_units_per_ms)
    };
    format!(
        "\"burst\";q={};w={}, \"hourly\";q={};w={}",
        l.capacity,
        ceil_seconds(refill_ms).max(1),
        l.quota,
        ceil_seconds(l.window_ms)
    )
}

/// `"burst";r=<tokens>;t=<s>, "hourly";r=<requests>;t=<s>`: remaining, and the seconds
/// until the bucket is full again / until the current window ends (or until a refused
/// request would pass).
fn ratelimit_field(d: &Decision, l: &Limits) -> String {
    let missing = i64::from(l.capacity.saturating_sub(d.remaining_tokens)) * TOKEN_UNITS;
    let mut burst_t = if l.refill_units_per_ms == 0 || missing == 0 {
        0
    } else {
        ceil_seconds(ceil_div(missing, l.refill_units_per_ms))
    };
    let mut hourly_t = ceil_seconds(l.window_ms - d.now_ms.rem_euclid(l.window_ms.max(1)));
    let retry = ceil_seconds(i64::from(d.retry_after_ms));
    if d.denied_by.bucket {
        burst_t = retry;
    }
    if d.denied_by.window {
        hourly_t = retry;
    }
    format!(
        "\"burst\";r={};t={burst_t}, \"hourly\";r={};t={hourly_t}",
        d.remaining_tokens, d.remaining_window
    )
}
