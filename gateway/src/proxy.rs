//! The reverse proxy: key → tier, path → route class, the limiter's decision, then either
//! the upstream's answer with the rate-limit fields added, or the gateway's own 429. It is
//! [`verdict_limiter::RateLimitLayer`] around a forwarding service, the layer's closure
//! being the key directory and the route table.
//!
//! | what happens | status | who answers |
//! | --- | --- | --- |
//! | no API key header, or a key the directory does not know | 401 | gateway; the limiter never runs |
//! | a path no route class covers | 404 | gateway; the limiter never runs |
//! | refused by the limiter | 429 + `Retry-After` + rate-limit fields | gateway |
//! | allowed (or would-deny in shadow mode) | the upstream's, + rate-limit fields | upstream |
//! | upstream refused the connection or failed | 502 | gateway (the request was allowed and counted) |
//! | upstream sent no response head within the timeout | 504 | gateway (likewise) |
//!
//! `/metrics` (the limiter's metrics and the gateway's) and `/healthz` are the gateway's own
//! paths and never go upstream.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, Uri, header};
use axum::routing::any;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use prometheus::{
    Encoder as _, Histogram, HistogramOpts, IntCounterVec, Opts, Registry, TextEncoder,
};
use verdict_limiter::{CounterStore, Identity, Limiter, PolicySnapshot, RateLimitLayer, Refusal};
use verdict_schemas::{RouteClassId, TierId};

use crate::check;
use crate::keys::KeyDirectory;
use crate::routes::Routes;

/// What a caller is told when the upstream failed (the reason goes to the gateway's log).
const UPSTREAM_FAILED: &str =
    "the upstream failed to answer; the request was allowed and counted, retry later";

/// What a gateway without an upstream answers a path of its own it does not serve.
const NO_UPSTREAM: &str = "this gateway has no upstream: it answers /v1/check, \
     /v1/check/nginx and Envoy's rate limit service";

/// How the gateway runs.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// The upstream's base URL, e.g. `http://127.0.0.1:8080` (a path prefix is kept); none
    /// for a gateway that only decides (`/v1/check`, the rate limit service).
    pub upstream: Option<Uri>,
    /// The header carrying the API key.
    pub key_header: HeaderName,
    /// How long the upstream has to send its response head.
    pub upstream_timeout: Duration,
}

impl GatewayConfig {
    /// The defaults for `upstream`: header `x-api-key`, 30 s timeout.
    pub fn new(upstream: Uri) -> Self {
        Self::deciding_for(Some(upstream))
    }

    /// The defaults, with `upstream` or none (a gateway that only decides).
    pub fn deciding_for(upstream: Option<Uri>) -> Self {
        Self {
            upstream,
            key_header: HeaderName::from_static("x-api-key"),
            upstream_timeout: Duration::from_secs(30),
        }
    }
}

/// The gateway's own metrics (the limiter's are rendered beside them).
#[derive(Debug, Clone)]
pub struct GatewayMetrics {
    registry: Registry,
    /// `verdict_gateway_requests_total{outcome}`: proxied, checked (allowed by `/v1/check`),
    /// limited, unauthorized, no_route, upstream_error, upstream_timeout.
    pub requests: IntCounterVec,
    /// `verdict_gateway_upstream_seconds`: from sending upstream to its response head.
    pub upstream_seconds: Histogram,
    /// `verdict_gateway_decision_seconds`: the limiter's part of a request.
    pub decision_seconds: Histogram,
}

impl Default for GatewayMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl GatewayMetrics {
    /// Creates and registers them.
    pub fn new() -> Self {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "verdict_gateway_requests_total",
                "Requests by outcome: proxied, checked, limited, unauthorized, no_route, upstream_error, upstream_timeout.",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        // Bounds at 6, 7.5 and 15 ms as well as the 5 ms deadline: a reader counts decisions
        // within the deadline plus a scheduling slack (`verdict-bench soak` does).
        let hist = |name: &str, help: &str| {
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(vec![
                0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.003, 0.005, 0.006, 0.007_5, 0.01,
                0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]))
            .expect("valid metric")
        };
        let upstream_seconds = hist(
            "verdict_gateway_upstream_seconds",
            "From sending a request upstream to its response head.",
        );
        let decision_seconds = hist(
            "verdict_gateway_decision_seconds",
            "The limiter's part of a request (key, route, decision).",
        );
        for c in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(upstream_seconds.clone()),
            Box::new(decision_seconds.clone()),
        ] {
            registry.register(c).expect("unique metric");
        }
        Self {
            registry,
            requests,
            upstream_seconds,
            decision_seconds,
        }
    }

    fn render(&self) -> String {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

/// Everything a request needs.
pub struct Gateway<S> {
    limiter: Arc<Limiter<S>>,
    keys: KeyDirectory,
    routes: Routes,
    client: Client<HttpConnector, Body>,
    cfg: GatewayConfig,
    metrics: GatewayMetrics,
}

impl<S> std::fmt::Debug for Gateway<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").field("cfg", &self.cfg).finish()
    }
}

impl<S: CounterStore> Gateway<S> {
    /// A gateway deciding with `limiter` for the keys in `keys`.
    pub fn new(limiter: Limiter<S>, keys: KeyDirectory, cfg: GatewayConfig) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(cfg.upstream_timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Self {
            limiter: Arc::new(limiter),
            keys,
            routes: Routes::default(),
            client,
            cfg,
            metrics: GatewayMetrics::new(),
        }
    }

    /// The limiter.
    pub fn limiter(&self) -> &Limiter<S> {
        &self.limiter
    }

    /// The limiter, shared (the rate limit service decides with the gateway's).
    pub fn shared_limiter(&self) -> Arc<Limiter<S>> {
        Arc::clone(&self.limiter)
    }

    /// The key directory.
    pub fn keys(&self) -> &KeyDirectory {
        &self.keys
    }

    /// The route class of `path` under `policy`, by its prefixes.
    pub fn route(&self, policy: &PolicySnapshot, path: &str) -> Option<RouteClassId> {
        self.routes.route(policy, path)
    }

    /// The gateway's metrics.
    pub fn metrics(&self) -> &GatewayMetrics {
        &self.metrics
    }

    /// The router: `/metrics` and `/healthz`, and every other path and method through the
    /// limiter's layer to the upstream.
    pub fn router(self: Arc<Self>) -> Router {
        let (gw, hooked) = (Arc::clone(&self), Arc::clone(&self));
        let layer = RateLimitLayer::new(Arc::clone(&self.limiter), move |req: &Request<Body>| {
            gw.identify(req)
        })
        .on_decision(move |decision, took| {
            hooked.observe_decision(took);
            if !decision.is_allowed() {
                hooked.count("limited");
            }
        });
        let gw = Arc::clone(&self);
        let forward = tower::service_fn(move |req: Request<Body>| {
            let gw = Arc::clone(&gw);
            async move { Ok::<_, Infallible>(gw.forward(req).await) }
        });
        // `/v1/check` (`nginx`: `/v1/check/nginx`), on this gateway's limiter, keys, routes.
        let check = |nginx: bool| {
            let (gw, hooked) = (Arc::clone(&self), Arc::clone(&self));
            let identify = move |req: &Request<Body>| gw.identify_forwarded(req);
            let hook = move |decision: &verdict_limiter::Decision, took: Duration| {
                hooked.observe_decision(took);
                let allowed = decision.is_allowed();
                hooked.count(if allowed { "checked" } else { "limited" });
            };
            check::service(Arc::clone(&self.limiter), identify, hook, nginx)
        };
        let router = Router::new()
            .route("/metrics", any(metrics::<S>))
            .route(
                "/healthz",
                any(|| async { plain(StatusCode::OK, "text/plain", "ok\n".into()) }),
            )
            .route_service("/v1/check", check(false))
            .route_service("/v1/check/nginx", check(true));
        let router = if self.cfg.upstream.is_some() {
            router.fallback_service(tower::Layer::layer(&layer, forward))
        } else {
            router.fallback(|| async { problem(StatusCode::NOT_FOUND, NO_UPSTREAM) })
        };
        router.with_state(self)
    }

    /// Who a checked request is, from the headers the proxy forwards (see [`check`]).
    fn identify_forwarded(&self, req: &Request<Body>) -> Result<Identity, Refusal> {
        let Some(path) = check::forwarded_path(req.headers()) else {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                "no X-Forwarded-Uri or X-Original-URI header: the proxy must send the path \
                 of the request it asks about",
            ));
        };
        let caller = check::forwarded_caller(req.headers())
            .or_else(|| peer(req).map(|p| p.ip().to_string()));
        self.identify_as(req.headers(), path, caller)
    }

    /// Records the limiter's part of a request.
    pub(crate) fn observe_decision(&self, took: Duration) {
        self.metrics.decision_seconds.observe(took.as_secs_f64());
    }

    /// Counts a request's outcome.
    pub(crate) fn count(&self, outcome: &str) {
        self.metrics.requests.with_label_values(&[outcome]).inc();
    }

    /// Who is asking: the key directory's entry for the API key, the route class of the
    /// path, and the peer's address (which places a split key's caller on a sub-key). No
    /// key or an unknown one is 401, a path no route class covers 404: the limiter never
    /// runs for them.
    fn identify(&self, req: &Request<Body>) -> Result<Identity, Refusal> {
        let caller = peer(req).map(|p| p.ip().to_string());
        self.identify_as(req.headers(), req.uri().path(), caller)
    }

    /// The same for a request known by its headers, its path and its caller's address.
    pub(crate) fn identify_as(
        &self,
        headers: &HeaderMap,
        path: &str,
        caller: Option<String>,
    ) -> Result<Identity, Refusal> {
        let Some(api_key) = headers
            .get(&self.cfg.key_header)
            .and_then(|v| v.to_str().ok())
        else {
            self.count("unauthorized");
            return Err(Refusal::unauthorized(format!(
                "no API key: send it in the {} header",
                self.cfg.key_header
            )));
        };
        let Some(entry) = self.keys.get(api_key) else {
            self.count("unauthorized");
            return Err(Refusal::unauthorized("unknown API key"));
        };
        let policy = self.limiter.policy().load();
        let Some(route_class) = self.routes.route(&policy, path) else {
            self.count("no_route");
            return Err(Refusal::not_found(format!("no route class covers {path}")));
        };
        // A tier the policy does not know is the limiter's to report (allowed, counted as
        // unconfigured), not a reason to refuse a known key.
        let tier = policy.tier_id(&entry.tier).unwrap_or(TierId(u8::MAX));
        let identity = Identity::new(entry.key_id, route_class, tier).under(policy);
        Ok(match caller {
            Some(caller) => identity.with_caller(caller),
            None => identity,
        })
    }

    async fn forward(&self, req: Request<Body>) -> Response<Body> {
        let peer = peer(&req);
        let (mut parts, body) = req.into_parts();
        let Some(upstream) = &self.cfg.upstream else {
            return problem(StatusCode::NOT_FOUND, NO_UPSTREAM);
        };
        let uri = match upstream_uri(upstream, &parts.uri) {
            Ok(u) => u,
            Err(e) => {
                self.count("upstream_error");
                tracing::warn!(error = %e, path = %parts.uri, "the upstream URL could not be made");
                return problem(StatusCode::BAD_GATEWAY, UPSTREAM_FAILED);
            }
        };
        parts.uri = uri;
        strip_hop_by_hop(&mut parts.headers);
        parts.headers.remove(header::HOST);
        if let Some(peer) = peer {
            let forwarded = match parts
                .headers
                .get("x-forwarded-for")
                .and_then(|v| v.to_str().ok())
            {
                Some(prior) => format!("{prior}, {}", peer.ip()),
                None => peer.ip().to_string(),
            };
            if let Ok(v) = HeaderValue::from_str(&forwarded) {
                parts.headers.insert("x-forwarded-for", v);
            }
        }
        let sent = Instant::now();
        let result = tokio::time::timeout(
            self.cfg.upstream_timeout,
            self.client.request(Request::from_parts(parts, body)),
        )
        .await;
        self.metrics
            .upstream_seconds
            .observe(sent.elapsed().as_secs_f64());
        match result {
            Ok(Ok(resp)) => {
                self.count("proxied");
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                Response::from_parts(parts, Body::new(body))
            }
            Ok(Err(e)) => {
                self.count("upstream_error");
                // The reason (the upstream's address, the socket's error) is the operator's,
                // in the log; the caller is told only that the upstream failed.
                tracing::warn!(error = %e, cause = ?std::error::Error::source(&e), "upstream failed");
                problem(StatusCode::BAD_GATEWAY, UPSTREAM_FAILED)
            }
            Err(_) => {
                self.count("upstream_timeout");
                problem(
                    StatusCode::GATEWAY_TIMEOUT,
                    &format!(
                        "the upstream did not answer within {:?}",
                        self.cfg.upstream_timeout
                    ),
                )
            }
        }
    }
}

/// The peer's address, which the server puts in each request's extensions.
fn peer<B>(req: &Request<B>) -> Option<SocketAddr> {
    req.extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(peer)| *peer)
}

async fn metrics<S: CounterStore>(State(gw): State<Arc<Gateway<S>>>) -> Response<Body> {
    let text = format!("{}{}", gw.limiter.metrics().render(), gw.metrics.render());
    plain(StatusCode::OK, "text/plain; version=0.0.4", text)
}

/// Serves `gateway` on `listener` until `stop` resolves.
///
/// # Errors
/// When the server fails.
pub async fn serve<S: CounterStore>(
    listener: tokio::net::TcpListener,
    gateway: Arc<Gateway<S>>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = gateway.router();
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(stop)
    .await
}

/// The upstream's URI for a request to `original`: the base's scheme and authority, the
/// base's path prefix followed by the request's path and query.
fn upstream_uri(base: &Uri, original: &Uri) -> Result<Uri, axum::http::Error> {
    let prefix = base.path().trim_end_matches('/');
    let pq = original
        .path_and_query()
        .map_or("/", axum::http::uri::PathAndQuery::as_str);
    let mut b = Uri::builder().path_and_query(format!("{prefix}{pq}"));
    if let Some(s) = base.scheme() {
        b = b.scheme(s.clone());
    }
    if let Some(a) = base.authority() {
        b = b.authority(a.clone());
    }
    b.build()
}

/// Headers that describe one connection, not the message (RFC 9110 §7.6.1).
fn strip_hop_by_hop(h: &mut axum::http::HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        h.remove(n);
    }
}

fn plain(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut resp = Response::new(Body::from(body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// An RFC 9457 problem answered by the gateway itself.
fn problem(status: StatusCode, detail: &str) -> Response<Body> {
    Refusal::new(status, detail).response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_upstream_uri_keeps_the_base_prefix_and_the_query() {
        let base: Uri = "http://127.0.0.1:8080/api/".parse().unwrap();
        let u = upstream_uri(&base, &"/v1/items?x=1".parse().unwrap()).unwrap();
        assert_eq!(u.to_string(), "http://127.0.0.1:8080/api/v1/items?x=1");
        let base: Uri = "http://up:9".parse().unwrap();
        assert_eq!(
            upstream_uri(&base, &"/".parse().unwrap())
                .unwrap()
                .to_string(),
            "http://up:9/"
        );
    }

    #[test]
    fn connection_headers_are_not_forwarded() {
        let mut h = axum::http::HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("close, x-private"),
        );
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert("x-api-key", HeaderValue::from_static("k"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-api-key"));
    }
}
