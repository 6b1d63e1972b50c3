//! `/v1/check`: forward authentication for the gateways that ask a service before they
//! proxy (Caddy's `forward_auth`, Traefik's `ForwardAuth`, nginx's `auth_request`). The
//! request is the one the proxy is about to forward, described by its headers: the API key
//! in the key header (`x-api-key` by default, forwarded as the client sent it), the path in
//! `X-Forwarded-Uri` (Caddy, Traefik) or `X-Original-URI` (the nginx convention), the
//! client's address in `X-Forwarded-For` (its first entry) or `X-Real-IP`. It is decided
//! exactly as the gateway decides a request it proxies, with its decision event.
//!
//! | | `/v1/check` (Caddy, Traefik) | `/v1/check/nginx` (`auth_request`) |
//! | --- | --- | --- |
//! | allowed (or would-deny in shadow mode) | 200, the rate-limit fields | 200, the rate-limit fields |
//! | refused | 429, `Retry-After`, the fields, the problem body | 403, the same fields and body |
//! | no API key, or an unknown one | 401 | 401 |
//! | a path no route class covers | 404 | 403 |
//! | no `X-Forwarded-Uri` or `X-Original-URI` | 400 | 403 |
//!
//! nginx's `auth_request` passes a subrequest's 2xx, 401 and 403 and turns any other status
//! into 500; so its mode refuses with 403, and the nginx configuration maps it back to 429
//! with the fields (`error_page 403 = @limited`, the fields taken with
//! `auth_request_set`): `gateway/examples/nginx-auth-request.conf`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Request, Response, StatusCode};
use verdict_limiter::{CounterStore, Decision, Identity, Limiter, RateLimitLayer, Refusal};

/// The headers a forward-auth request may carry the original path in, in this order.
pub const PATH_HEADERS: [&str; 2] = ["x-forwarded-uri", "x-original-uri"];

/// The path of the request being checked: the header's value up to its query.
pub fn forwarded_path(headers: &HeaderMap) -> Option<&str> {
    PATH_HEADERS.iter().find_map(|name| {
        let v = headers.get(*name)?.to_str().ok()?;
        Some(v.split(['?', '#']).next().unwrap_or(v))
    })
}

/// The client's address as the proxy passes it: `X-Forwarded-For`'s first entry, or
/// `X-Real-IP`.
pub fn forwarded_caller(headers: &HeaderMap) -> Option<String> {
    let first = |name: &str| {
        let v = headers.get(name)?.to_str().ok()?;
        let v = v.split(',').next()?.trim();
        (!v.is_empty()).then(|| v.to_owned())
    };
    first("x-forwarded-for").or_else(|| first("x-real-ip"))
}

/// The service answering `/v1/check` (`nginx`: `/v1/check/nginx`): `identify` names the
/// checked request's caller (or refuses it), `limiter` decides, `hook` sees each decision.
pub fn service<S, F>(
    limiter: Arc<Limiter<S>>,
    identify: F,
    hook: impl Fn(&Decision, Duration) + Send + Sync + 'static,
    nginx: bool,
) -> impl tower::Service<
    Request<Body>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Send + 'static,
> + Clone
+ Send
+ 'static
where
    S: CounterStore,
    F: Fn(&Request<Body>) -> Result<Identity, Refusal> + Send + Sync + 'static,
{
    let layer = RateLimitLayer::new(limiter, identify).on_decision(hook);
    let allowed = tower::service_fn(|_req: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::empty()))
    });
    let checked = tower::Layer::layer(&layer, allowed);
    tower::ServiceExt::map_response(checked, move |mut resp: Response<Body>| {
        let refused = matches!(
            resp.status(),
            StatusCode::TOO_MANY_REQUESTS | StatusCode::NOT_FOUND | StatusCode::BAD_REQUEST
        );
        if nginx && refused {
            *resp.status_mut() = StatusCode::FORBIDDEN;
        }
        resp
    })
}
