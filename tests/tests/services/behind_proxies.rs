//! verdict behind the proxies people already run, each started here with a private Redis
//! behind a loopback proxy that can cut it:
//!
//! - Envoy 1.40's `ratelimit` filter asking verdict's rate limit service (`verdict_rls`, on
//!   a gateway without an upstream);
//! - nginx's `auth_request` and Caddy's `forward_auth`, each with its example
//!   configuration in `gateway/examples/`, asking `/v1/check` of such a gateway.
//!
//! Through each: a key over its limit gets a 429 with verdict's Retry-After, rate-limit
//! fields and problem body; what does not map (a descriptor; an unknown key) is allowed and
//! counted (Envoy) or 401 (forward auth); with Redis cut the local fallback decides and the
//! proxy keeps answering with verdict's decisions.

use std::net::SocketAddr;
use std::sync::Arc;

use verdict_counters_redis::RedisStoreConfig;
use verdict_gateway::{Gateway, GatewayBuilder, GatewayStore, KeyDirectory};
use verdict_limiter::policy::parse_toml;
use verdict_limiter::{EventReceiver, LimiterMetrics, PolicyHandle, PolicySnapshot};
use verdict_load::proxies::{Proxy, caddy, envoy, example, nginx};
use verdict_rls::RlsConfig;
use verdict_schemas::{DecisionSource, Verdict};
use verdict_tests::private::{PrivateRedis, TcpProxy, redis_behind_a_proxy, spare_port};

/// Three requests of burst per key, next to no refill.
const POLICY: &str = include_str!("../../fixtures/policies/behind_proxies.toml");

const KEYS: &str = "api_key,key_id,tier\n\
    k-one,000000000000000000000000000000f1,free\n\
    k-two,000000000000000000000000000000f2,free\n";

/// Envoy's descriptors: the API key with the path (verdict's identity), and a
/// `generic_key` verdict does not map.
const RATE_LIMITS: &str = r#"              - actions:
                - request_headers: {header_name: x-api-key, descriptor_key: api_key}
                - request_headers: {header_name: ":path", descriptor_key: path}
              - actions:
                - generic_key: {descriptor_value: checkout}"#;

/// A gateway without an upstream over counters in a private Redis behind a cuttable proxy.
struct Deciding {
    gateway: Arc<Gateway<GatewayStore>>,
    metrics: Arc<LimiterMetrics>,
    events: EventReceiver,
    cut: TcpProxy,
    _redis: PrivateRedis,
}

impl Deciding {
    async fn start() -> Self {
        let config = RedisStoreConfig {
            timeout: std::time::Duration::from_millis(20),
            ..RedisStoreConfig::default()
        };
        let (redis, cut, store) = redis_behind_a_proxy(config).await;
        let metrics = Arc::new(LimiterMetrics::new());
        let policy = PolicySnapshot::build(parse_toml(POLICY).unwrap()).unwrap();
        let keys = verdict_gateway::keys::parse("keys.csv", KEYS).unwrap();
        let built = GatewayBuilder::deciding_for(None).build(
            GatewayStore::Redis(store),
            PolicyHandle::new(policy, 0),
            Arc::clone(&metrics),
            KeyDirectory::new(keys),
        );
        Self {
            gateway: Arc::new(built.gateway),
            metrics,
            events: built.events,
            cut,
            _redis: redis,
        }
    }

    /// Serves its HTTP listener (`/v1/check`): the address.
    async fn http(&self) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let gateway = Arc::clone(&self.gateway);
        tokio::spawn(verdict_gateway::serve(
            listener,
            gateway,
            std::future::pending(),
        ));
        addr
    }

    /// Serves the rate limit service on it: the gRPC port.
    async fn rls(&self) -> u16 {
        let rls = verdict_rls::Rls::new(Arc::clone(&self.gateway), RlsConfig::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(verdict_rls::serve(
            listener,
            Arc::new(rls),
            std::future::pending(),
        ));
        port
    }

    /// The decisions so far: verdict and source of each.
    fn decided(&mut self) -> Vec<(Verdict, DecisionSource)> {
        let events = self.events.waiting();
        events.iter().map(|e| (e.verdict, e.source)).collect()
    }

    fn metric(&self, series: &str) -> u64 {
        verdict_tests::metric_in(&self.metrics.render(), series).unwrap_or(0)
    }
}

/// An upstream answering 200 `ok` on every path.
async fn upstream() -> SocketAddr {
    let app = axum::Router::new().fallback(|| async { "ok" });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

async fn get(port: u16, key: Option<&str>) -> reqwest::Response {
    let url = format!("http://127.0.0.1:{port}/v1/items/1?page=2");
    let mut r = reqwest::Client::new().get(url);
    if let Some(k) = key {
        r = r.header("x-api-key", k);
    }
    r.send().await.expect("the proxy answers")
}

/// Three requests of `key` through the proxy on `port`: allowed, with what verdict says is
/// left of the burst (2, 1, 0); then the fourth, refused with verdict's 429, Retry-After and
/// fields. Returns the refusal's body.
async fn spend_the_burst(port: u16, key: &str) -> String {
    for left in [2, 1, 0] {
        let r = get(port, Some(key)).await;
        assert_eq!(r.status(), 200);
        let fields = r.headers().get("ratelimit").map(|v| v.to_str().unwrap());
        let want = format!("\"burst\";r={left}");
        assert!(fields.is_some_and(|f| f.contains(&want)), "{fields:?}");
        assert_eq!(r.text().await.unwrap(), "ok");
    }
    let r = get(port, Some(key)).await;
    assert_eq!(r.status(), 429);
    let field = |name: &str| r.headers()[name].to_str().unwrap().to_owned();
    let retry: u64 = field("retry-after").parse().unwrap();
    assert!(
        (999..=1000).contains(&retry),
        "a token every 1,000 s: {retry}"
    );
    assert!(field("ratelimit-policy").contains("\"burst\";q=3"));
    assert!(field("ratelimit").contains("\"burst\";r=0"));
    r.text().await.unwrap()
}

/// With the counters' Redis cut: five requests of `key` through the proxy on `port`, decided
/// by the local fallback, which enforces the whole limit (one instance).
async fn with_redis_cut(port: u16, verdict: &mut Deciding) {
    verdict.cut.cut();
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(get(port, Some("k-two")).await.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
}

/// The decisions of [`spend_the_burst`] then [`with_redis_cut`].
fn burst_then_fallback() -> Vec<(Verdict, DecisionSource)> {
    let (store, fallback) = (DecisionSource::CounterStore, DecisionSource::LocalFallback);
    let (allowed, denied) = (Verdict::Allowed, Verdict::Denied);
    let mut want = vec![(allowed, store); 3];
    want.push((denied, store));
    want.extend([(allowed, fallback); 3]);
    want.extend([(denied, fallback); 2]);
    want
}

/// Envoy's own count of its rate limit calls that failed (an error, or its 250 ms timeout
/// after which it allows the request).
async fn envoy_rls_errors(admin: u16) -> u64 {
    let url = format!("http://127.0.0.1:{admin}/stats?filter=ratelimit");
    let stats = reqwest::get(url).await.expect("Envoy's admin answers");
    let text = stats.text().await.unwrap();
    text.lines()
        .filter(|l| l.contains("ratelimit.error") || l.contains("ratelimit.failure_mode_allowed"))
        .filter_map(|l| l.rsplit_once(": ")?.1.trim().parse::<u64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_envoy_a_key_over_its_limit_gets_429_with_verdicts_fields_and_redis_cut_changes_no_answer()
 {
    let mut verdict = Deciding::start().await;
    let rls = verdict.rls().await;
    let (listen, admin) = (spare_port(), spare_port());
    let api = upstream().await;
    let envoy = envoy(listen, admin, api.port(), rls, "edge", RATE_LIMITS);

    let body = spend_the_burst(listen, "k-one").await;
    assert!(
        body.contains("the burst allowance of 3 requests is spent"),
        "{body}"
    );
    println!("Envoy's 429: {body}");
    // Without a key Envoy sends only the descriptor verdict does not map: allowed, counted.
    assert_eq!(get(listen, None).await.status(), 200);
    let unmapped = "verdict_rls_descriptors_total{outcome=\"unmapped_no_key\"}";
    assert_eq!(
        verdict.metric(unmapped),
        5,
        "one generic_key descriptor per request"
    );

    // The 429s below are verdict's answers: had one come after Envoy's 250 ms timeout, Envoy
    // would have allowed the request (failure_mode_deny: false) and counted an error.
    with_redis_cut(listen, &mut verdict).await;
    assert_eq!(envoy_rls_errors(admin).await, 0, "{}", envoy.log());
    assert_eq!(verdict.decided(), burst_then_fallback());
}

/// The forward-auth flow through the proxy `start` runs with the example `file`, which
/// listens on `listen` (made to listen on a free port as `to`): the 429's body says `says`.
async fn behind_forward_auth(
    file: &str,
    listen: &str,
    to: impl Fn(u16) -> String,
    start: impl Fn(&str, u16) -> Proxy,
    says: &str,
) {
    let mut verdict = Deciding::start().await;
    let (check, api, port) = (verdict.http().await, upstream().await, spare_port());
    let config = example(
        file,
        &[
            ("127.0.0.1:8088", check.to_string()),
            ("127.0.0.1:8080", api.to_string()),
            (listen, to(port)),
        ],
    );
    let proxy = start(&config, port);
    let body = spend_the_burst(port, "k-one").await;
    assert!(body.contains(says), "{body}\n{}", proxy.log());
    assert_eq!(get(port, Some("k-nobody")).await.status(), 401);
    with_redis_cut(port, &mut verdict).await;
    assert_eq!(verdict.decided(), burst_then_fallback());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_nginx_auth_request_a_key_over_its_limit_gets_429_with_verdicts_fields() {
    let to = |port| format!("127.0.0.1:{port}");
    let says = "\"retry_after_seconds\":";
    behind_forward_auth("nginx-auth-request.conf", "127.0.0.1:8000", to, nginx, says).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_caddy_forward_auth_a_key_over_its_limit_gets_429_with_verdicts_fields() {
    let says = "the burst allowance of 3 requests is spent";
    behind_forward_auth("Caddyfile", ":8000", |port| format!(":{port}"), caddy, says).await;
}

/// Envoy's descriptor of the window-edge comparison: the API key alone.
const KEY_ONLY: &str = r#"              - actions:
                - request_headers: {header_name: x-api-key, descriptor_key: api_key}"#;

/// The same trace through one Envoy to envoyproxy/ratelimit and to verdict, both reading
/// one configuration of 5 a minute per key: 5 requests in the last 2 seconds of a minute and
/// 5 just after the next begins. The fixed window starts again at the minute and admits all 10,
/// twice the limit in about two seconds; verdict's bucket of 5 refilling 5 a minute admits 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn across_a_window_edge_fixed_windows_admit_twice_the_limit_and_verdict_does_not() {
    let config = include_str!("../../fixtures/envoy/per_minute.yaml");
    // envoyproxy/ratelimit, its counters in a Redis of its own.
    let peer_redis = PrivateRedis::start();
    let peer_port = spare_port();
    let peer = verdict_load::proxies::envoy_ratelimit(
        config,
        &format!("127.0.0.1:{}", peer_redis.port()),
        peer_port,
    );
    // verdict, deciding under the same file imported.
    let imported = verdict_rls::import::import("per_minute.yaml", config).unwrap();
    // The comparison is of the algorithms, so every decision is Redis's: a deadline no
    // scheduling delay on a loaded machine passes (below Envoy's 250 ms). Under the 5 ms
    // default, with three busy loops on the two cores, one run in three had the fallback
    // decide and verdict admit 4: a request Redis counts but answers late is admitted by
    // the fallback and charged back, counted twice (the limiter errs short of the limit).
    let config = RedisStoreConfig {
        timeout: std::time::Duration::from_millis(200),
        ..RedisStoreConfig::default()
    };
    let (_redis, _cut, store) = redis_behind_a_proxy(config).await;
    let metrics = Arc::new(LimiterMetrics::new());
    let built = GatewayBuilder::deciding_for(None).build(
        GatewayStore::Redis(store),
        PolicyHandle::new(PolicySnapshot::build(imported.policy).unwrap(), 0),
        Arc::clone(&metrics),
        KeyDirectory::default(),
    );
    let rls = verdict_rls::Rls::new(
        Arc::new(built.gateway),
        RlsConfig {
            descriptors: imported.descriptors,
            ..RlsConfig::default()
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ours = listener.local_addr().unwrap().port();
    tokio::spawn(verdict_rls::serve(
        listener,
        Arc::new(rls),
        std::future::pending(),
    ));
    let (to_peer, to_verdict, admin) = (spare_port(), spare_port(), spare_port());
    let api = upstream().await;
    let envoy = verdict_load::proxies::envoy_beside(
        &[(to_peer, Some(peer_port)), (to_verdict, Some(ours))],
        1,
        admin,
        api.port(),
        "edge",
        KEY_ONLY,
    );

    // Envoy's connections to both services made before the trace (another key), so no
    // call of the trace waits for one.
    for port in [to_peer, to_verdict] {
        assert_eq!(
            get(port, Some("k-warm")).await.status(),
            200,
            "{}",
            envoy.log()
        );
    }
    // 2 s before a minute starts (envoyproxy/ratelimit's windows are the clock's minutes):
    // the first 5 requests each, all answered before the minute ends; then 5 each once the
    // next minute has begun.
    let now = chrono::Utc::now().timestamp_millis();
    let mut wait = 60_000 - now.rem_euclid(60_000) - 2_000;
    if wait < 500 {
        wait += 60_000;
    }
    tokio::time::sleep(std::time::Duration::from_millis(wait as u64)).await;
    let edge = (chrono::Utc::now().timestamp_millis() / 60_000 + 1) * 60_000;
    let mut admitted = [0u32; 2];
    let mut statuses: [Vec<u16>; 2] = Default::default();
    let mut trace = Vec::new();
    for phase in ["before", "after"] {
        if phase == "after" {
            let until = edge + 200 - chrono::Utc::now().timestamp_millis();
            tokio::time::sleep(std::time::Duration::from_millis(until.max(0) as u64)).await;
        }
        let at = chrono::Utc::now();
        for _ in 0..5 {
            for (i, port) in [to_peer, to_verdict].into_iter().enumerate() {
                let status = get(port, Some("k-edge")).await.status();
                admitted[i] += u32::from(status == 200);
                statuses[i].push(status.as_u16());
            }
        }
        let done = chrono::Utc::now();
        if phase == "before" {
            assert!(
                done.timestamp_millis() < edge,
                "the first requests ran past the minute"
            );
        }
        trace.push(format!(
            "5 requests from {} to {}",
            at.format("%H:%M:%S%.3f"),
            done.format("%H:%M:%S%.3f")
        ));
    }
    println!(
        "window edge, 5 a minute per key, {}: envoyproxy/ratelimit admitted {} {:?}, verdict {} {:?}",
        trace.join(" and "),
        admitted[0],
        statuses[0],
        admitted[1],
        statuses[1]
    );
    assert_eq!(
        metrics.fallback_decisions.get(),
        0,
        "verdict decided without Redis: {statuses:?}"
    );
    assert_eq!(admitted, [10, 5], "{}\n{}", peer.log(), envoy.log());
    assert_eq!(envoy_rls_errors(admin).await, 0, "{}", envoy.log());
}
