//! `/v1/check` and `/v1/check/nginx` on a gateway without an upstream, with memory counters:
//! the request described by the headers a forward-auth proxy sends, decided as the gateway
//! decides one it proxies, answered 200 / 429 (Caddy, Traefik) or 200 / 403 (nginx), and
//! every other path 404 without the limiter.

use std::net::SocketAddr;
use std::sync::Arc;

use verdict_gateway::{GatewayBuilder, GatewayStore, KeyDirectory};
use verdict_limiter::policy::parse_toml;
use verdict_limiter::{EventReceiver, LimiterMetrics, MemoryStore, PolicyHandle, PolicySnapshot};
use verdict_schemas::Verdict;

const POLICY: &str = include_str!("../fixtures/policies/proxy.toml");

async fn deciding_gateway() -> (SocketAddr, EventReceiver) {
    let policy = PolicySnapshot::build(parse_toml(POLICY).unwrap()).unwrap();
    let keys = verdict_gateway::keys::parse(
        "keys.csv",
        "api_key,key_id,tier\nk-free,0000000000000000000000000000000a,free\n",
    )
    .unwrap();
    let built = GatewayBuilder::deciding_for(None).build(
        GatewayStore::Memory(Arc::new(MemoryStore::new(1_000))),
        PolicyHandle::new(policy, 0),
        Arc::new(LimiterMetrics::new()),
        KeyDirectory::new(keys),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let gateway = Arc::new(built.gateway);
    tokio::spawn(verdict_gateway::serve(
        listener,
        gateway,
        std::future::pending(),
    ));
    (addr, built.events)
}

/// A check as a proxy sends it: the client's key, the original path in `path_header`.
async fn check(
    addr: SocketAddr,
    mode: &str,
    key: Option<&str>,
    path_header: Option<(&str, &str)>,
) -> reqwest::Response {
    let mut r = reqwest::Client::new()
        .get(format!("http://{addr}/v1/check{mode}"))
        .header("x-forwarded-for", "203.0.113.9, 10.0.0.1");
    if let Some(k) = key {
        r = r.header("x-api-key", k);
    }
    if let Some((name, value)) = path_header {
        r = r.header(name, value);
    }
    r.send().await.unwrap()
}

#[tokio::test]
async fn a_check_is_decided_like_a_proxied_request_and_refused_with_429_and_its_fields() {
    let (gw, mut events) = deciding_gateway().await;
    let path = Some(("x-forwarded-uri", "/v1/items/3?page=2"));
    for left in [2, 1, 0] {
        let r = check(gw, "", Some("k-free"), path).await;
        assert_eq!(r.status(), 200);
        let fields = r.headers()["ratelimit"].to_str().unwrap().to_owned();
        assert!(fields.contains(&format!("\"burst\";r={left}")), "{fields}");
        assert!(r.text().await.unwrap().is_empty());
    }
    let r = check(gw, "", Some("k-free"), path).await;
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("the burst allowance of 3 requests is spent")
    );
    let verdicts: Vec<Verdict> = std::iter::from_fn(|| events.try_recv())
        .map(|e| e.verdict)
        .collect();
    assert_eq!(
        verdicts,
        [
            Verdict::Allowed,
            Verdict::Allowed,
            Verdict::Allowed,
            Verdict::Denied
        ]
    );
}

#[tokio::test]
async fn the_nginx_mode_refuses_with_403_and_the_same_fields() {
    let (gw, _) = deciding_gateway().await;
    let path = Some(("x-original-uri", "/v1/items/1"));
    for _ in 0..3 {
        assert_eq!(
            check(gw, "/nginx", Some("k-free"), path).await.status(),
            200
        );
    }
    let r = check(gw, "/nginx", Some("k-free"), path).await;
    assert_eq!(r.status(), 403);
    assert!(r.headers().contains_key("retry-after"));
    assert!(
        r.headers()["ratelimit"]
            .to_str()
            .unwrap()
            .contains("\"burst\";r=0")
    );
    // What nginx cannot pass through is 403 too; 401 it passes as it is.
    let no_route = check(
        gw,
        "/nginx",
        Some("k-free"),
        Some(("x-original-uri", "/v2/x")),
    )
    .await;
    assert_eq!(no_route.status(), 403);
    assert_eq!(
        check(gw, "/nginx", Some("k-free"), None).await.status(),
        403
    );
    assert_eq!(check(gw, "/nginx", None, path).await.status(), 401);
}

#[tokio::test]
async fn a_check_without_a_key_or_a_path_is_refused_before_the_limiter_and_other_paths_are_404() {
    let (gw, mut events) = deciding_gateway().await;
    let path = Some(("x-forwarded-uri", "/v1/items/1"));
    assert_eq!(check(gw, "", None, path).await.status(), 401);
    assert_eq!(check(gw, "", Some("k-nobody"), path).await.status(), 401);
    let r = check(gw, "", Some("k-free"), None).await;
    assert_eq!(r.status(), 400);
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("X-Forwarded-Uri or X-Original-URI")
    );
    let r = check(gw, "", Some("k-free"), Some(("x-forwarded-uri", "/v2/x"))).await;
    assert_eq!(r.status(), 404);
    // Without an upstream, a proxied path is not decided: 404, saying why.
    let r = reqwest::Client::new()
        .get(format!("http://{gw}/v1/items/1"))
        .header("x-api-key", "k-free")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.text().await.unwrap().contains("no upstream"));
    assert!(
        events.try_recv().is_none(),
        "the limiter ran for a refused check"
    );
}
