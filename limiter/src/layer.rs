//! The limiter as a [`tower::Layer`](tower_layer::Layer), for any Rust HTTP stack built on
//! tower (axum, tonic, hyper with tower adapters): wrap a service and every request is
//! decided before it reaches it.
//!
//! ```
//! # use std::sync::Arc;
//! # use verdict_limiter::{Identity, Limiter, MemoryStore, RateLimitLayer, Refusal};
//! # use verdict_schemas::{KeyId, RouteClassId, TierId};
//! # fn app(limiter: Arc<Limiter<MemoryStore>>, inner: impl Clone) {
//! use tower_layer::Layer;
//! // Who is asking: here a 32-hex-digit key in `x-api-key`, one route class and tier.
//! let layer = RateLimitLayer::new(limiter, |req: &http::Request<String>| -> Result<_, Refusal> {
//!     let key = req
//!         .headers()
//!         .get("x-api-key")
//!         .and_then(|v| v.to_str().ok()?.parse::<KeyId>().ok())
//!         .ok_or_else(|| Refusal::unauthorized("send your API key in x-api-key"))?;
//!     Ok(Identity::new(key, RouteClassId(0), TierId(0)))
//! });
//! let limited = layer.layer(inner);
//! # }
//! ```
//!
//! `examples/axum_layer.rs` is an axum app built this way (`cargo run -p verdict-limiter
//! --example axum_layer`).
//!
//! The caller's closure says who is asking ([`Identity`]: key, route class, tier, and the
//! attribute that places a split key's caller on a sub-key), or refuses the request itself
//! ([`Refusal`], e.g. 401 for a missing key: the limiter never runs). Then:
//!
//! | the limiter says | the response |
//! | --- | --- |
//! | denied | 429 from the layer, `Retry-After`, the rate-limit fields, an RFC 9457 problem body; the inner service is not called |
//! | allowed, or would-deny (shadow mode) | the inner service's, with the rate-limit fields added |
//!
//! The fields are those of [`crate::http`] (`RateLimit-Policy` and `RateLimit`,
//! draft-ietf-httpapi-ratelimit-headers).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use tower_layer::Layer;
use tower_service::Service;
use verdict_schemas::{KeyId, RouteClassId, TierId};

use crate::counter_store::CounterStore;
use crate::http::{HttpAnswer, PROBLEM_JSON, http_answer, problem_body};
use crate::limiter::{Decision, Limiter, Request};
use crate::policy::PolicySnapshot;

/// Who is asking: what the limiter decides on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The caller's key id.
    pub key_id: KeyId,
    /// The route class of the request's path.
    pub route_class: RouteClassId,
    /// The caller's tier.
    pub tier: TierId,
    /// A stable attribute of the caller (client id, address) that places it on a sub-key
    /// when its key is split; empty when there is none.
    pub caller: Vec<u8>,
    /// The policy the route class and tier were resolved against, if the closure read
    /// one: the limiter decides under the same snapshot.
    pub policy: Option<Resolved>,
}

/// The policy snapshot a request was resolved against (equal when it is the same one).
#[derive(Clone)]
pub struct Resolved(pub Arc<PolicySnapshot>);

impl PartialEq for Resolved {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Resolved {}

impl std::fmt::Debug for Resolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "policy version {}", self.0.version())
    }
}

impl Identity {
    /// `key_id` on `route_class` in `tier`, with no caller attribute.
    pub fn new(key_id: KeyId, route_class: RouteClassId, tier: TierId) -> Self {
        Self {
            key_id,
            route_class,
            tier,
            caller: Vec::new(),
            policy: None,
        }
    }

    /// The same, with the caller attribute `caller`.
    pub fn with_caller(mut self, caller: impl Into<Vec<u8>>) -> Self {
        self.caller = caller.into();
        self
    }

    /// The same, resolved against `policy`: the limiter decides under it rather than
    /// loading the policy in force again.
    pub fn under(mut self, policy: Arc<PolicySnapshot>) -> Self {
        self.policy = Some(Resolved(policy));
        self
    }

    fn request(&self) -> Request<'_> {
        Request {
            key_id: self.key_id,
            route_class: self.route_class,
            tier: self.tier,
            caller: &self.caller,
        }
    }
}

/// A request the caller's closure answers itself, before the limiter: a problem response
/// with `status` and `detail`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The status (401, 403, 404, …).
    pub status: StatusCode,
    /// What the caller is told.
    pub detail: String,
}

impl Refusal {
    /// A refusal with `status`.
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Self {
            status,
            detail: detail.into(),
        }
    }

    /// 401: no credentials, or credentials nobody knows.
    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, detail)
    }

    /// 404: a path no route class covers.
    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, detail)
    }

    /// The problem response: this status, `application/problem+json`, and an
    /// `about:blank` problem body carrying the detail.
    pub fn response<B: From<String>>(&self) -> Response<B> {
        let title = self.status.canonical_reason().unwrap_or("Refused");
        let body = problem_body(self.status.as_u16(), title, &self.detail);
        let mut resp = Response::new(B::from(body));
        *resp.status_mut() = self.status;
        resp.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        resp
    }
}

/// What the layer calls with each decision and the time from the request's arrival (the
/// caller's closure included) to the decision: metrics, logs.
pub type OnDecision = Arc<dyn Fn(&Decision, Duration) + Send + Sync>;

/// The layer: see the [module](self).
pub struct RateLimitLayer<S, F> {
    limiter: Arc<Limiter<S>>,
    identify: Arc<F>,
    on_decision: Option<OnDecision>,
}

impl<S, F> RateLimitLayer<S, F> {
    /// Decides every request with `limiter`, as `identify` names its caller.
    pub fn new(limiter: Arc<Limiter<S>>, identify: F) -> Self {
        Self {
            limiter,
            identify: Arc::new(identify),
            on_decision: None,
        }
    }

    /// The same, calling `hook` with every decision (not for the closure's refusals).
    pub fn on_decision(
        mut self,
        hook: impl Fn(&Decision, Duration) + Send + Sync + 'static,
    ) -> Self {
        self.on_decision = Some(Arc::new(hook));
        self
    }
}

impl<S, F> Clone for RateLimitLayer<S, F> {
    fn clone(&self) -> Self {
        Self {
            limiter: Arc::clone(&self.limiter),
            identify: Arc::clone(&self.identify),
            on_decision: self.on_decision.clone(),
        }
    }
}

impl<S, F> std::fmt::Debug for RateLimitLayer<S, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limiter", &self.limiter)
            .finish_non_exhaustive()
    }
}

impl<S, F, Inner> Layer<Inner> for RateLimitLayer<S, F> {
    type Service = RateLimit<S, F, Inner>;

    fn layer(&self, inner: Inner) -> Self::Service {
        RateLimit {
            inner,
            layer: self.clone(),
        }
    }
}

/// A service with the limiter in front: made by [`RateLimitLayer`].
pub struct RateLimit<S, F, Inner> {
    inner: Inner,
    layer: RateLimitLayer<S, F>,
}

impl<S, F, Inner: Clone> Clone for RateLimit<S, F, Inner> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S, F, Inner: std::fmt::Debug> std::fmt::Debug for RateLimit<S, F, Inner> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("limiter", &self.layer.limiter)
            .finish_non_exhaustive()
    }
}

/// The future of [`RateLimit::call`].
pub type RateLimitFuture<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

impl<S, F, Inner, B, ResBody> Service<http::Request<B>> for RateLimit<S, F, Inner>
where
    S: CounterStore + 'static,
    F: Fn(&http::Request<B>) -> Result<Identity, Refusal> + Send + Sync + 'static,
    Inner: Service<http::Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    Inner::Future: Send,
    B: Send + 'static,
    ResBody: From<String> + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = Inner::Error;
    type Future = RateLimitFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // The service that was polled ready goes into the future; a clone stays for the
        // next request (tower's usual swap).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let arrived = Instant::now();
        let identity = (self.layer.identify)(&req);
        let limiter = Arc::clone(&self.layer.limiter);
        let hook = self.layer.on_decision.clone();
        Box::pin(async move {
            let identity = match identity {
                Ok(identity) => identity,
                Err(refusal) => return Ok(refusal.response()),
            };
            let decision = match &identity.policy {
                Some(Resolved(policy)) => limiter.check_under(policy, &identity.request()).await,
                None => limiter.check(&identity.request()).await,
            };
            if let Some(hook) = hook {
                hook(&decision, arrived.elapsed());
            }
            let mut answer = http_answer(&decision);
            if let Some(status) = answer.status {
                let mut resp = Response::new(ResBody::from(answer.body.take().unwrap_or_default()));
                *resp.status_mut() =
                    StatusCode::from_u16(status).unwrap_or(StatusCode::TOO_MANY_REQUESTS);
                resp.headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
                add_fields(&mut resp, &answer);
                return Ok(resp);
            }
            let mut resp = inner.call(req).await?;
            add_fields(&mut resp, &answer);
            Ok(resp)
        })
    }
}

/// Sets the answer's fields on `resp` (replacing any the inner service set).
pub fn add_fields<B>(resp: &mut Response<B>, answer: &HttpAnswer) {
    for (name, value) in &answer.headers {
        if let Ok(value) = HeaderValue::try_from(value.as_str()) {
            resp.headers_mut()
                .insert(HeaderName::from_static(name), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tower::{ServiceBuilder, ServiceExt};

    use super::*;
    use crate::events::event_queue;
    use crate::limiter::LimiterConfig;
    use crate::memory::MemoryStore;
    use crate::metrics::LimiterMetrics;
    use crate::policy::tests::EXAMPLE;
    use crate::policy::{PolicyHandle, PolicySnapshot, parse_toml};
    use verdict_schemas::clock::FakeClock;

    fn limiter(clock: &FakeClock) -> Arc<Limiter<MemoryStore>> {
        // The free tier's read class: a burst of 10, refilled at 1 a second, 100 an hour.
        let snapshot = PolicySnapshot::build(parse_toml(EXAMPLE).unwrap()).unwrap();
        let metrics = Arc::new(LimiterMetrics::new());
        let (events, _rx) = event_queue(1024, Arc::clone(&metrics));
        let clock: Arc<dyn crate::Clock> = Arc::new(clock.clone());
        Arc::new(Limiter::with_clock(
            MemoryStore::with_clock(1024, Arc::clone(&clock)),
            PolicyHandle::new(snapshot, 0),
            events,
            metrics,
            LimiterConfig::default(),
            clock,
        ))
    }

    /// The caller's key is the `x-api-key` header's bytes, zero-padded; no header is 401.
    fn identify(req: &http::Request<String>) -> Result<Identity, Refusal> {
        let key = req
            .headers()
            .get("x-api-key")
            .ok_or_else(|| Refusal::unauthorized("send your API key in x-api-key"))?;
        let mut id = [0u8; 16];
        for (d, s) in id.iter_mut().zip(key.as_bytes()) {
            *d = *s;
        }
        Ok(Identity::new(KeyId(id), RouteClassId(0), TierId(0)))
    }

    fn request(key: Option<&str>) -> http::Request<String> {
        let mut b = http::Request::builder().uri("/v1/items");
        if let Some(key) = key {
            b = b.header("x-api-key", key);
        }
        b.body(String::new()).unwrap()
    }

    /// An inner service that answers "hello" and counts its calls.
    fn upstream(
        calls: &Arc<AtomicUsize>,
    ) -> impl Service<
        http::Request<String>,
        Response = Response<String>,
        Error = Infallible,
        Future = impl Future<Output = Result<Response<String>, Infallible>> + Send,
    > + Clone
    + Send
    + 'static {
        let calls = Arc::clone(calls);
        tower::service_fn(move |_req: http::Request<String>| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, Infallible>(Response::new(String::from("hello"))) }
        })
    }

    #[tokio::test]
    async fn allowed_requests_reach_the_service_with_the_fields_and_a_refusal_does_not() {
        let clock = FakeClock::at(1_796_047_200_000);
        let calls = Arc::new(AtomicUsize::new(0));
        let (decided, refused) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (d, r) = (Arc::clone(&decided), Arc::clone(&refused));
        let layer = RateLimitLayer::new(limiter(&clock), identify).on_decision(move |dec, _| {
            d.fetch_add(1, Ordering::SeqCst);
            r.fetch_add(usize::from(!dec.is_allowed()), Ordering::SeqCst);
        });
        let svc = ServiceBuilder::new().layer(layer).service(upstream(&calls));

        for remaining in (0..10).rev() {
            let resp = svc.clone().oneshot(request(Some("alice"))).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
            assert_eq!(resp.body(), "hello");
            assert_eq!(
                resp.headers()["ratelimit-policy"],
                "\"burst\";q=10;w=10, \"hourly\";q=100;w=3600"
            );
            let field = resp.headers()["ratelimit"].to_str().unwrap().to_owned();
            assert!(
                field.starts_with(&format!("\"burst\";r={remaining};")),
                "{field}"
            );
        }
        assert_eq!(calls.load(Ordering::SeqCst), 10);

        // The burst is spent: the layer answers, the service is not called.
        let resp = svc.clone().oneshot(request(Some("alice"))).await.unwrap();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(resp.headers()["retry-after"], "1");
        assert_eq!(resp.headers()[CONTENT_TYPE], PROBLEM_JSON);
        assert!(resp.headers().contains_key("ratelimit"));
        let body: serde_json::Value = serde_json::from_str(resp.body()).unwrap();
        assert_eq!(body["status"], 429);
        assert_eq!(body["violated_policies"], serde_json::json!(["burst"]));
        assert_eq!(calls.load(Ordering::SeqCst), 10);

        // Another key has its own bucket.
        let resp = svc.clone().oneshot(request(Some("bob"))).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);

        // A second later one token is back.
        clock.advance(1_000);
        let resp = svc.clone().oneshot(request(Some("alice"))).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(calls.load(Ordering::SeqCst), 12);
        assert_eq!(decided.load(Ordering::SeqCst), 13);
        assert_eq!(refused.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn the_closures_refusal_is_a_problem_response_and_the_limiter_never_runs() {
        let clock = FakeClock::at(1_796_047_200_000);
        let calls = Arc::new(AtomicUsize::new(0));
        let limiter = limiter(&clock);
        let svc = RateLimitLayer::new(Arc::clone(&limiter), identify).layer(upstream(&calls));

        let resp = svc.oneshot(request(None)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(resp.headers()[CONTENT_TYPE], PROBLEM_JSON);
        assert!(!resp.headers().contains_key("ratelimit"));
        let body: serde_json::Value = serde_json::from_str(resp.body()).unwrap();
        assert_eq!(body["status"], 401);
        assert_eq!(body["title"], "Unauthorized");
        assert_eq!(body["detail"], "send your API key in x-api-key");
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        let decided =
            |l: &Limiter<MemoryStore>| l.metrics().render().contains("verdict_decisions_total{");
        assert!(!decided(&limiter), "the limiter decided a refused request");

        let svc = RateLimitLayer::new(Arc::clone(&limiter), identify).layer(upstream(&calls));
        let resp = svc.oneshot(request(Some("alice"))).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(decided(&limiter));
    }
}
