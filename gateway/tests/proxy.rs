//! The gateway on loopback in front of a small upstream, with memory counters: 401 before
//! the limiter, 404 for a path no route class covers, the upstream's answer with the
//! rate-limit fields, the gateway's own 429 with Retry-After, shadow mode, 502 and 504 for
//! the upstream's failures, and `/metrics`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use verdict_gateway::{Gateway, GatewayConfig, GatewayStore, KeyDirectory, KeyEntry};
use verdict_limiter::policy::parse_toml;
use verdict_limiter::{
    Limiter, LimiterConfig, LimiterMetrics, MemoryStore, PolicyHandle, PolicySnapshot, event_queue,
};

const POLICY: &str = include_str!("../fixtures/policies/proxy.toml");

async fn upstream() -> SocketAddr {
    let app = Router::new()
        .route(
            "/v1/items/{id}",
            get(
                |axum::extract::Path(id): axum::extract::Path<String>| async move {
                    ([("x-upstream", "yes")], format!("item {id}"))
                },
            ),
        )
        .route(
            "/v1/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                "late"
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

async fn gateway(upstream: SocketAddr) -> (SocketAddr, tokio::sync::mpsc::Receiver<()>) {
    let metrics = Arc::new(LimiterMetrics::new());
    let (queue, mut events) = event_queue(1_000, Arc::clone(&metrics));
    let (seen_tx, seen) = tokio::sync::mpsc::channel(1_000);
    tokio::spawn(async move {
        while events.recv().await.is_some() {
            let _ = seen_tx.try_send(());
        }
    });
    let limiter = Limiter::new(
        GatewayStore::Memory(Arc::new(MemoryStore::new(1_000))),
        PolicyHandle::new(
            PolicySnapshot::build(parse_toml(POLICY).unwrap()).unwrap(),
            0,
        ),
        queue,
        metrics,
        LimiterConfig::default(),
    );
    let key = |id: &str, tier: &str| KeyEntry {
        key_id: id.parse().unwrap(),
        tier: tier.into(),
    };
    let keys = KeyDirectory::new(HashMap::from([
        (
            "k-free".to_owned(),
            key("0000000000000000000000000000000a", "free"),
        ),
        (
            "k-trial".to_owned(),
            key("0000000000000000000000000000000b", "trial"),
        ),
        (
            "k-ghost".to_owned(),
            key("0000000000000000000000000000000c", "platinum"),
        ),
    ]));
    let mut cfg = GatewayConfig::new(format!("http://{upstream}").parse().unwrap());
    cfg.upstream_timeout = Duration::from_millis(500);
    let gw = Arc::new(Gateway::new(limiter, keys, cfg));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(verdict_gateway::serve(listener, gw, std::future::pending()));
    (addr, seen)
}

async fn get_with(addr: SocketAddr, path: &str, key: Option<&str>) -> reqwest::Response {
    let mut r = reqwest::Client::new().get(format!("http://{addr}{path}"));
    if let Some(k) = key {
        r = r.header("x-api-key", k);
    }
    r.send().await.unwrap()
}

#[tokio::test]
async fn the_gateway_limits_proxies_and_tells_its_failures_apart() {
    let up = upstream().await;
    let (gw, mut seen) = gateway(up).await;

    // No key, an unknown key: 401, and the limiter never ran (no event).
    let r = get_with(gw, "/v1/items/1", None).await;
    assert_eq!(r.status(), 401);
    assert!(r.text().await.unwrap().contains("x-api-key"));
    assert_eq!(
        get_with(gw, "/v1/items/1", Some("nope")).await.status(),
        401
    );
    // A path no route class covers: 404, no event either.
    assert_eq!(
        get_with(gw, "/v2/other", Some("k-free")).await.status(),
        404
    );
    assert!(
        seen.try_recv().is_err(),
        "the limiter ran for a refused request"
    );

    // Within the bucket: the upstream answers, with the rate-limit fields added.
    for i in 0..3 {
        let r = get_with(gw, &format!("/v1/items/{i}?q=1"), Some("k-free")).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-upstream"], "yes");
        assert!(
            r.headers()["ratelimit-policy"]
                .to_str()
                .unwrap()
                .contains("\"burst\";q=3")
        );
        assert!(
            r.headers()["ratelimit"]
                .to_str()
                .unwrap()
                .contains(&format!("\"burst\";r={}", 2 - i))
        );
        assert_eq!(r.text().await.unwrap(), format!("item {i}"));
    }
    // Spent: the gateway answers 429 itself, with Retry-After and a problem body.
    let r = get_with(gw, "/v1/items/9", Some("k-free")).await;
    assert_eq!(r.status(), 429);
    assert!(r.headers().get("x-upstream").is_none());
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("\"violated_policies\":[\"burst\"]")
    );

    // Shadow mode: over its limit, still proxied; the event says would-deny.
    for _ in 0..3 {
        assert_eq!(
            get_with(gw, "/v1/items/1", Some("k-trial")).await.status(),
            200
        );
    }
    // A tier the policy does not know: allowed, not refused (and counted as unconfigured).
    assert_eq!(
        get_with(gw, "/v1/items/1", Some("k-ghost")).await.status(),
        200
    );

    // The upstream's own 404 passes through, with the rate-limit fields.
    let r = get_with(gw, "/v1/items", Some("k-trial")).await;
    assert_eq!(r.status(), 404);
    assert!(r.headers().contains_key("ratelimit"));
    // The upstream too slow: 504.
    let r = get_with(gw, "/v1/slow", Some("k-trial")).await;
    assert_eq!(r.status(), 504);
    assert!(r.text().await.unwrap().contains("did not answer"));

    // Metrics: the gateway's outcomes and the limiter's decisions.
    let m = get_with(gw, "/metrics", None).await.text().await.unwrap();
    for line in [
        "verdict_gateway_requests_total{outcome=\"unauthorized\"} 2",
        "verdict_gateway_requests_total{outcome=\"no_route\"} 1",
        "verdict_gateway_requests_total{outcome=\"limited\"} 1",
        "verdict_gateway_requests_total{outcome=\"upstream_timeout\"} 1",
        "verdict_gateway_requests_total{outcome=\"proxied\"} 8",
        "verdict_decisions_total{source=\"counter_store\",verdict=\"would_deny\"} 3",
        "verdict_unconfigured_decisions_total 1",
    ] {
        assert!(m.contains(line), "{line} not in\n{m}");
    }
}

#[tokio::test]
async fn an_upstream_that_is_down_is_a_502_not_a_limit() {
    // A port nobody listens on.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let (gw, _seen) = gateway(dead).await;
    let r = get_with(gw, "/v1/items/1", Some("k-free")).await;
    assert_eq!(r.status(), 502);
    // The decision was made and its fields are on the answer: it was allowed.
    assert!(r.headers().contains_key("ratelimit"));
    let body = r.text().await.unwrap();
    assert!(body.contains("the upstream failed"), "{body}");
    // hyper's words (and the upstream's address) stay in the gateway's log.
    for private in [
        "client error",
        "Connect",
        "127.0.0.1",
        &dead.port().to_string(),
    ] {
        assert!(!body.contains(private), "{private:?} in {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_load_generator_counts_what_the_gateway_answers() {
    use verdict_load::{self as load, LoadProgress, LoadSpec};
    let up = upstream().await;
    let (gw, _seen) = gateway(up).await;
    // 40 requests of one free key, 8 at a time: its bucket of 3 lets 3 through whatever
    // the order, and every refusal carries Retry-After and the fields; a few requests
    // without a key are answered 401 and carry no fields.
    let make: load::MakeRequest = Arc::new(move |i| {
        let mut r = axum::http::Request::get(format!("http://{gw}/v1/items/{i}"));
        if i % 10 != 9 {
            r = r.header("x-api-key", "k-free");
        }
        r.body(axum::body::Body::empty()).unwrap()
    });
    let progress = Arc::new(LoadProgress::default());
    let r = load::run(&LoadSpec::count(40, 8), make, Arc::clone(&progress)).await;
    assert_eq!(r.sent, 40);
    assert_eq!(r.failed, 0);
    assert_eq!(r.count(axum::http::StatusCode::OK), 3);
    assert_eq!(r.count(axum::http::StatusCode::TOO_MANY_REQUESTS), 33);
    assert_eq!(r.count(axum::http::StatusCode::UNAUTHORIZED), 4);
    assert_eq!(r.limited_without_retry_after, 0);
    assert_eq!(r.without_ratelimit_fields, 0);
    assert_eq!(progress.done.load(std::sync::atomic::Ordering::Relaxed), 40);
    assert_eq!(
        progress.limited.load(std::sync::atomic::Ordering::Relaxed),
        33
    );
    assert!(r.latency_ms(0.5) > 0.0 && r.latency_ms(0.99) >= r.latency_ms(0.5));
    // Closed loop: a request is sent as soon as it is due, so the service time is never
    // longer than the time from due.
    assert!(r.service_ms(0.5) > 0.0 && r.service_ms(0.5) <= r.latency_ms(0.5));

    // Against a server that answers without the fields, the generator says so.
    let make: load::MakeRequest = Arc::new(move |i| {
        axum::http::Request::get(format!("http://{up}/v1/items/{i}"))
            .body(axum::body::Body::empty())
            .unwrap()
    });
    let r = load::run(&LoadSpec::count(5, 2), make, Arc::default()).await;
    assert_eq!(
        (
            r.count(axum::http::StatusCode::OK),
            r.without_ratelimit_fields
        ),
        (5, 5)
    );
}
