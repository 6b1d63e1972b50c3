//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, decided by the gateway's
//! limiter.
//!
//! Each descriptor of a request is placed ([`crate::mapping`]) and decided on its own, as
//! one request of its key: both algorithms in one round trip, the breaker and the local
//! fallback, shadow mode, the kill switch, hot-key splitting and the region's share are the
//! limiter's, and each decision emits its decision event (one per descriptor decided; a
//! request with one descriptor that maps is one event, as through the gateway).
//!
//! The answer:
//!
//! | | |
//! | --- | --- |
//! | `overall_code` | `OVER_LIMIT` when any descriptor is refused (a would-deny in shadow mode is `OK`), else `OK` |
//! | `statuses[i]` | descriptor i's code; the limit that binds it (`current_limit`: the hourly quota as requests per `HOUR` when the window refused or has less left than the bucket, else the bucket's refill as requests per `SECOND`, or per `MINUTE` below one a second), what is left of it (`limit_remaining`) and when it is whole again or, refused, when a request would pass (`duration_until_reset`) |
//! | `response_headers_to_add` | the rate-limit fields (`RateLimit-Policy`, `RateLimit`) of the most constrained descriptor decided, and on a refusal `Retry-After` and `Content-Type: application/problem+json` |
//! | `raw_body` | on a refusal, the problem document the gateway sends with its 429 |
//!
//! A descriptor the mapping cannot place is answered by its [`crate::Unmapped`] rule and
//! counted (`verdict_rls_descriptors_total{outcome="unmapped_…"}`); one whose rule another
//! matched rule `replaces` is `OK` and not decided. `hits_addend` is honoured: a
//! descriptor's own when set, else the request's (unset, 0, meaning 1); a descriptor of n
//! hits passes only if its limits have room for all n and then takes them all, and one of 0
//! hits is checked without being counted (`OK` unless its key is already past a limit).
//! Its decision event is one event whatever the hits (the raw table counts requests).
//!
//! The service is as available as the limiter: at most `max_in_flight` requests decide at
//! once, a request that waits longer than the deadline for its turn is answered
//! `UNAVAILABLE` (Envoy's `failure_mode_deny` then decides, allowing by default), and no
//! call to the counters waits longer than the limiter's own deadline.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use prometheus::{Histogram, HistogramOpts, IntCounterVec, Opts};
use tokio::sync::Semaphore;
use verdict_gateway::Gateway;
use verdict_limiter::algo::TOKEN_UNITS;
use verdict_limiter::http::{PROBLEM_JSON, http_answer};
use verdict_limiter::{CounterStore, Decision, Request};
use verdict_schemas::Verdict;

use crate::mapping::{DescriptorMap, Miss, Placed, Unmapped};

/// How the service runs.
#[derive(Debug, Clone)]
pub struct RlsConfig {
    /// How descriptors map.
    pub descriptors: DescriptorMap,
    /// Requests deciding at once; more wait their turn.
    pub max_in_flight: usize,
    /// How long a request may wait for its turn before it is answered `UNAVAILABLE`.
    pub queue_deadline: Duration,
}

impl Default for RlsConfig {
    fn default() -> Self {
        Self {
            descriptors: DescriptorMap::default(),
            max_in_flight: 1024,
            queue_deadline: Duration::from_millis(5),
        }
    }
}

/// The service's metrics, registered beside the limiter's (the gateway's `/metrics`).
#[derive(Debug, Clone)]
pub struct RlsMetrics {
    /// `verdict_rls_requests_total{code}`: ok, over_limit, unavailable.
    pub requests: IntCounterVec,
    /// `verdict_rls_descriptors_total{outcome}`: decided, replaced, and `unmapped_<why>`.
    pub descriptors: IntCounterVec,
    /// `verdict_rls_request_seconds`: a request, from its turn to its answer.
    pub request_seconds: Histogram,
}

impl RlsMetrics {
    /// Creates them and registers them in `registry`.
    ///
    /// # Panics
    /// When the registry already holds them.
    pub fn register(registry: &prometheus::Registry) -> Self {
        let counter = |name: &str, help: &str, label: &str| {
            IntCounterVec::new(Opts::new(name, help), &[label]).expect("a valid metric")
        };
        let requests = counter(
            "verdict_rls_requests_total",
            "Rate limit service requests by overall code: ok, over_limit, unavailable.",
            "code",
        );
        let descriptors = counter(
            "verdict_rls_descriptors_total",
            "Descriptors by outcome: decided, replaced, unmapped_<why>.",
            "outcome",
        );
        let request_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "verdict_rls_request_seconds",
                "A rate limit service request, from its turn to its answer.",
            )
            .buckets(vec![
                0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.1, 1.0,
            ]),
        )
        .expect("a valid metric");
        for m in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(descriptors.clone()),
            Box::new(request_seconds.clone()),
        ] {
            registry.register(m).expect("metrics registered once");
        }
        Self {
            requests,
            descriptors,
            request_seconds,
        }
    }
}

/// The rate limit service over a gateway's limiter, key directory and routes.
pub struct Rls<S> {
    gateway: Arc<Gateway<S>>,
    /// How descriptors map now ([`Rls::set_descriptors`] replaces it; a request keeps the
    /// map it started with).
    descriptors: ArcSwap<DescriptorMap>,
    queue_deadline: Duration,
    turns: Semaphore,
    metrics: RlsMetrics,
}

impl<S> std::fmt::Debug for Rls<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rls")
            .field("descriptors", &self.descriptors.load())
            .field("queue_deadline", &self.queue_deadline)
            .finish()
    }
}

/// One descriptor's part of an answer.
enum Part {
    /// Not placed, answered by the unmapped rule.
    Unmapped(Miss),
    /// Placed, and replaced by another matched rule.
    Replaced,
    /// Decided by the limiter.
    Decided(Box<Decision>),
}

impl<S: CounterStore> Rls<S> {
    /// The service deciding with `gateway`'s limiter; its metrics join the limiter's.
    pub fn new(gateway: Arc<Gateway<S>>, cfg: RlsConfig) -> Self {
        let metrics = RlsMetrics::register(&gateway.limiter().metrics().registry);
        Self {
            turns: Semaphore::new(cfg.max_in_flight.max(1)),
            gateway,
            descriptors: ArcSwap::from_pointee(cfg.descriptors),
            queue_deadline: cfg.queue_deadline,
            metrics,
        }
    }

    /// How descriptors map now.
    pub fn descriptors(&self) -> Arc<DescriptorMap> {
        self.descriptors.load_full()
    }

    /// Maps descriptors by `map` from the next request on.
    pub fn set_descriptors(&self, map: DescriptorMap) {
        self.descriptors.store(Arc::new(map));
    }

    /// Its metrics.
    pub fn metrics(&self) -> &RlsMetrics {
        &self.metrics
    }

    /// Re-reads the descriptors file at `path` every `every`, and maps by it from the next
    /// request on once it has changed and reads whole (`unmapped`, when given, overriding
    /// the file's rule as `--rls-unmapped` does). A file that does not read leaves the map
    /// in force, and the log says why.
    pub fn spawn_descriptor_refresher(
        self: Arc<Self>,
        path: PathBuf,
        unmapped: Option<Unmapped>,
        every: Duration,
    ) -> tokio::task::JoinHandle<()>
    where
        S: Send + Sync + 'static,
    {
        let name = path.display().to_string();
        verdict_gateway::keys::watch_file(path, every, move |text| {
            match DescriptorMap::from_toml(&name, text) {
                Ok(mut map) => {
                    if let Some(u) = unmapped {
                        map.unmapped = u;
                    }
                    tracing::info!(file = %name, rules = map.rules.len(), "descriptors updated");
                    self.set_descriptors(map);
                }
                Err(e) => tracing::warn!(error = %e, "descriptors not refreshed; the last stay"),
            }
        })
    }

    /// Answers one request (the gRPC method without its transport).
    pub async fn decide(&self, req: &RateLimitRequest) -> Result<RateLimitResponse, Unavailable> {
        let Ok(Ok(_turn)) = tokio::time::timeout(self.queue_deadline, self.turns.acquire()).await
        else {
            self.metrics
                .requests
                .with_label_values(&["unavailable"])
                .inc();
            return Err(Unavailable);
        };
        let started = Instant::now();
        let limiter = self.gateway.limiter();
        let policy = limiter.policy().load();
        let map = self.descriptors.load();
        let placed: Vec<Result<Placed, Miss>> = req
            .descriptors
            .iter()
            .map(|d| {
                let entries: Vec<(&str, &str)> = d
                    .entries
                    .iter()
                    .map(|e| (e.key.as_str(), e.value.as_str()))
                    .collect();
                map.place(
                    &req.domain,
                    &entries,
                    &policy,
                    self.gateway.keys(),
                    |path| self.gateway.route(&policy, path),
                )
            })
            .collect();
        let replaced = map.replaced(placed.iter().filter_map(|p| p.as_ref().ok()));
        // The descriptors are decided together: their calls to the counters go out at once
        // (in one script call when they share a lane), not one round trip after another.
        let parts =
            futures::future::join_all(req.descriptors.iter().zip(placed).map(|(d, p)| async {
                match p {
                    Err(miss) => Part::Unmapped(miss),
                    Ok(p) if p.rule.is_some_and(|r| replaced.contains(&r)) => Part::Replaced,
                    Ok(p) => {
                        // The request's hits_addend of 0 is unset, meaning 1; a descriptor's is
                        // set when present, 0 included (a check that counts nothing).
                        let hits = d
                            .hits_addend
                            .map_or(u64::from(req.hits_addend.max(1)), |h| h.value);
                        let hits = u32::try_from(hits).unwrap_or(u32::MAX);
                        let caller = d
                            .entries
                            .iter()
                            .find(|e| e.key == "remote_address")
                            .map_or(&[][..], |e| e.value.as_bytes());
                        let request = Request {
                            key_id: p.key_id,
                            route_class: p.route_class,
                            tier: p.tier,
                            caller,
                        };
                        Part::Decided(Box::new(
                            limiter.check_hits_under(&policy, &request, hits).await,
                        ))
                    }
                }
            }))
            .await;
        for part in &parts {
            let outcome = match part {
                Part::Unmapped(miss) => format!("unmapped_{}", miss.label()),
                Part::Replaced => "replaced".to_owned(),
                Part::Decided(_) => "decided".to_owned(),
            };
            self.metrics
                .descriptors
                .with_label_values(&[outcome.as_str()])
                .inc();
        }
        let response = self.answer(&parts, map.unmapped);
        let code = if response.overall_code == Code::OverLimit as i32 {
            "over_limit"
        } else {
            "ok"
        };
        self.metrics.requests.with_label_values(&[code]).inc();
        self.metrics
            .request_seconds
            .observe(started.elapsed().as_secs_f64());
        Ok(response)
    }

    fn answer(&self, parts: &[Part], unmapped: Unmapped) -> RateLimitResponse {
        let statuses: Vec<DescriptorStatus> = parts
            .iter()
            .map(|part| match part {
                Part::Unmapped(_) if unmapped == Unmapped::Deny => DescriptorStatus {
                    code: Code::OverLimit as i32,
                    ..DescriptorStatus::default()
                },
                Part::Unmapped(_) | Part::Replaced => DescriptorStatus {
                    code: Code::Ok as i32,
                    ..DescriptorStatus::default()
                },
                Part::Decided(d) => status(d),
            })
            .collect();
        let over = statuses.iter().any(|s| s.code == Code::OverLimit as i32);
        // The fields a client sees are those of the descriptor that binds it: a refusal,
        // else the least left.
        let binding = parts
            .iter()
            .filter_map(|p| match p {
                Part::Decided(d) => Some(d),
                _ => None,
            })
            .min_by_key(|d| {
                (
                    d.verdict != Verdict::Denied,
                    d.remaining_tokens.min(d.remaining_window),
                )
            });
        let mut headers = Vec::new();
        let mut raw_body = Vec::new();
        if let Some(d) = binding {
            let answer = http_answer(d);
            headers.extend(answer.headers.into_iter().map(|(k, v)| HeaderValue {
                key: k.to_owned(),
                value: v,
                ..HeaderValue::default()
            }));
            if let Some(body) = answer.body {
                headers.push(HeaderValue {
                    key: "content-type".to_owned(),
                    value: PROBLEM_JSON.to_owned(),
                    ..HeaderValue::default()
                });
                raw_body = body.into_bytes();
            }
        }
        RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            response_headers_to_add: headers,
            raw_body,
            ..RateLimitResponse::default()
        }
    }
}

/// The answer to a request that waited past the deadline for its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unavailable;

/// A decided descriptor's status: its code, the limit that binds it, what is left of it,
/// and when it is whole again (refused: when a request would pass).
fn status(d: &Decision) -> DescriptorStatus {
    let code = if d.verdict == Verdict::Denied {
        Code::OverLimit
    } else {
        Code::Ok
    };
    let Some(l) = d.limits else {
        // The kill switch, a limit turned off or not configured: nothing binds.
        return DescriptorStatus {
            code: code as i32,
            ..DescriptorStatus::default()
        };
    };
    let window_binds =
        d.denied_by.window || (!d.denied_by.bucket && d.remaining_window < d.remaining_tokens);
    let (limit, remaining, whole_ms) = if window_binds {
        let limit = RateLimit {
            name: "hourly".to_owned(),
            requests_per_unit: l.quota,
            unit: Unit::Hour as i32,
        };
        (limit, d.remaining_window, l.window_ms)
    } else {
        // Tokens per second, from units per ms.
        let per_s = l.refill_units_per_ms as f64 * 1000.0 / TOKEN_UNITS as f64;
        let (requests_per_unit, unit) = if per_s >= 1.0 {
            (per_s.round() as u32, Unit::Second)
        } else {
            ((per_s * 60.0).round().max(1.0) as u32, Unit::Minute)
        };
        let missing = i64::from(l.capacity.saturating_sub(d.remaining_tokens)) * TOKEN_UNITS;
        let refill_ms = if l.refill_units_per_ms > 0 {
            missing / l.refill_units_per_ms
        } else {
            l.window_ms
        };
        let limit = RateLimit {
            name: "burst".to_owned(),
            requests_per_unit,
            unit: unit as i32,
        };
        (limit, d.remaining_tokens, refill_ms)
    };
    let reset_ms = if code == Code::OverLimit {
        i64::from(d.retry_after_ms)
    } else {
        whole_ms
    };
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(limit),
        limit_remaining: remaining,
        duration_until_reset: Some(ProtoDuration {
            seconds: reset_ms / 1000,
            nanos: ((reset_ms % 1000) * 1_000_000) as i32,
        }),
        ..DescriptorStatus::default()
    }
}

#[tonic::async_trait]
impl<S: CounterStore> RateLimitService for Rls<S> {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        match self.decide(request.get_ref()).await {
            Ok(response) => Ok(tonic::Response::new(response)),
            Err(Unavailable) => Err(tonic::Status::unavailable(
                "verdict's rate limit service is at its concurrency limit; retry",
            )),
        }
    }
}
