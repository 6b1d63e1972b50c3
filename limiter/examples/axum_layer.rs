//! An axum app with the limiter in front of its routes, the way a Rust gateway embeds it:
//! `verdict_limiter::RateLimitLayer` around the router, a closure saying who is asking.
//!
//! ```sh
//! cargo run -p verdict-limiter --example axum_layer
//! for i in $(seq 21); do curl -s -o /dev/null -w '%{http_code} ' \
//!   -H 'x-api-key: 0000000000000000000000000000000a' http://127.0.0.1:3000/v1/items; done
//! curl -i -H 'x-api-key: 0000000000000000000000000000000a' http://127.0.0.1:3000/v1/items
//! ```
//!
//! Every key is on the free tier's read class of `policy.toml`: a burst of 20 (refilled at
//! two a second) and 1,000 requests an hour. The 21st request of a burst is answered 429 by
//! the layer, with `Retry-After`, the `RateLimit-Policy` and `RateLimit` fields and a
//! problem body; allowed answers carry the two fields too. A request without a key is 401 and never reaches the limiter.
//!
//! The counters here are in memory; in production they are in Redis
//! (`verdict_counters_redis::RedisStore`), and the decision events go to Kafka
//! (`verdict_events_kafka::KafkaSink`, drained by `spawn_drain`).

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use verdict_limiter::policy::parse_toml;
use verdict_limiter::{
    Clock, Identity, Limiter, LimiterConfig, LimiterMetrics, MemoryStore, PolicyHandle,
    PolicySnapshot, RateLimitLayer, Refusal, SystemClock, event_queue,
};
use verdict_schemas::{KeyId, RouteClassId, TierId};

/// The example policy beside this file: the free tier's read class has a burst of 20,
/// refilled at 2 a second, and 1,000 requests an hour.
const POLICY: &str = include_str!("policy.toml");

/// Who is asking: a 32-hex-digit key id in `x-api-key`, on the free tier's read class (a
/// real gateway looks the key's tier up and maps the path to its route class).
fn identify(req: &http::Request<Body>) -> Result<Identity, Refusal> {
    let key = req
        .headers()
        .get("x-api-key")
        .ok_or_else(|| Refusal::unauthorized("send your API key in the x-api-key header"))?;
    let key_id = key
        .to_str()
        .ok()
        .and_then(|k| k.parse::<KeyId>().ok())
        .ok_or_else(|| Refusal::unauthorized("an API key is 32 hex digits"))?;
    Ok(Identity::new(key_id, RouteClassId(0), TierId(0)))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let policy = PolicySnapshot::build(parse_toml(POLICY)?)?;
    let metrics = Arc::new(LimiterMetrics::new());
    // The decision events' queue; nothing drains it here, so once full it drops (the
    // limiter never waits for it).
    let (events, _receiver) = event_queue(10_000, Arc::clone(&metrics));
    let now_ms = SystemClock.now_ms();
    let limiter = Arc::new(Limiter::new(
        MemoryStore::new(100_000),
        PolicyHandle::new(policy, now_ms),
        events,
        metrics,
        LimiterConfig::default(),
    ));

    let app = Router::new()
        .route("/v1/items", get(|| async { "items\n" }))
        .layer(RateLimitLayer::new(limiter, identify));

    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{addr}/v1/items (x-api-key: 32 hex digits)");
    axum::serve(listener, app).await?;
    Ok(())
}
