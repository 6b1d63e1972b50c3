//! Three `verdict gateway` processes sharing one Redis and the PostgreSQL policy, sending
//! their events to the real Kafka, in front of one upstream: the limit holds across the
//! three, every 429 carries Retry-After and the rate-limit fields, every decision is one
//! event and the refused ones are the 429s the client saw; `verdict policy` changes a limit
//! and then puts the tier in shadow, and every gateway follows within 30 s.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use verdict_schemas::{DecisionEvent, KeyId, Verdict};
use verdict_tests::private::spare_port;
use verdict_tests::{
    Service, eventually, fresh_database, kafka_brokers, kafka_consumer, redis_url, require,
    unique_name,
};

/// Kills the gateways when the test ends, however it ends.
struct Gateways(Vec<Child>);

impl Gateways {
    /// SIGTERM to each, and waits: the gateway stops listening and flushes its events.
    fn stop(&mut self) {
        for c in &mut self.0 {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
        }
        for c in &mut self.0 {
            let _ = c.wait();
        }
    }
}

impl Drop for Gateways {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn verdict_ok(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_verdict"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run verdict");
    assert!(
        out.status.success(),
        "verdict {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn upstream() -> u16 {
    let app = axum::Router::new().fallback(|| async { "upstream says hello" });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    port
}

/// Sends one request with `key` to gateway `port`: (status, Retry-After, has rate-limit
/// fields).
async fn send(client: &reqwest::Client, port: u16, key: &str) -> (u16, Option<String>, bool) {
    let r = client
        .get(format!("http://127.0.0.1:{port}/v1/items"))
        .header("x-api-key", key)
        .send()
        .await
        .expect("the gateway answers");
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap_or_default().to_owned());
    let fields =
        r.headers().contains_key("ratelimit") && r.headers().contains_key("ratelimit-policy");
    (r.status().as_u16(), retry, fields)
}

/// Of `n` requests of `key` spread over the gateways, how many got 429.
async fn refused(client: &reqwest::Client, ports: &[u16], key: &str, n: usize) -> usize {
    let mut refused = 0;
    for i in 0..n {
        let (status, retry, fields) = send(client, ports[i % ports.len()], key).await;
        assert!(fields, "every answer carries the rate-limit fields");
        match status {
            200 => assert!(retry.is_none()),
            429 => {
                assert!(retry.is_some_and(|r| r.parse::<u64>().is_ok_and(|s| s >= 1)));
                refused += 1;
            }
            other => panic!("unexpected status {other}"),
        }
    }
    refused
}

async fn metric(http: &reqwest::Client, port: u16, name: &str) -> Option<u64> {
    let m = http
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    m.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// The version `verdict policy` says the change made ("policy version 4 -> 6: …").
fn new_version(out: &str) -> u64 {
    out.split("-> ")
        .nth(1)
        .and_then(|v| v.split(':').next())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no version in {out:?}"))
}

/// Waits (at most 30 s, the design's bound) until every gateway has policy `version`.
async fn wait_for_version(http: &reqwest::Client, ports: &[u16], version: u64) {
    for port in ports {
        eventually(
            Duration::from_secs(30),
            "the new policy on every gateway",
            || async { metric(http, *port, "verdict_policy_version").await == Some(version) },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_share_the_limit_and_follow_the_operator() {
    require(Service::Redis);
    require(Service::Kafka);
    let pg = fresh_database("gateways").await;
    let dir = tempfile::tempdir().unwrap();
    let topic = unique_name("gateway-decisions");
    // Keys unique to this run: the shared Redis keeps counters between runs.
    let run = std::process::id();
    let keys: Vec<(String, KeyId)> = (0..12u8)
        .map(|i| {
            let mut id = [0u8; 16];
            id[..4].copy_from_slice(&run.to_be_bytes());
            id[4..12].copy_from_slice(
                &std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos()
                    .to_le_bytes()[..8],
            );
            id[15] = i;
            (format!("key-{i}"), KeyId(id))
        })
        .collect();
    let mut csv = String::from("api_key,key_id,tier\n");
    for (k, id) in &keys {
        csv.push_str(&format!("{k},{id},free\n"));
    }
    let keys_file = dir.path().join("keys.csv");
    std::fs::write(&keys_file, csv).unwrap();

    let pg_source = verdict_limiter::PgSource::new(&pg);
    pg_source.migrate().await.unwrap();
    let (client, conn) = tokio_postgres::connect(&pg, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .batch_execute(
            "insert into verdict_policy.tiers (id, name) values (0, 'free');
             insert into verdict_policy.route_classes (id, name, prefixes) values (0, 'api', '{/v1}');
             insert into verdict_policy.limits values ('free', '*', 5, 0.001, 1000, 'enforce');",
        )
        .await
        .unwrap();

    let up = upstream().await;
    let ports: Vec<u16> = (0..3).map(|_| spare_port()).collect();
    let mut gateways = Gateways(Vec::new());
    for (i, port) in ports.iter().enumerate() {
        let child = Command::new(env!("CARGO_BIN_EXE_verdict"))
            .args([
                "gateway",
                "--upstream",
                &format!("http://127.0.0.1:{up}"),
                "--keys-file",
                keys_file.to_str().unwrap(),
                "--policy-postgres",
                &pg,
                "--policy-refresh-secs",
                "1",
                "--redis",
                &redis_url(),
                "--redis-timeout-ms",
                "100",
                "--kafka-brokers",
                &kafka_brokers(),
                "--kafka-topic",
                &topic,
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--instance",
                &i.to_string(),
                "--instance-count",
                "3",
            ])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("start verdict gateway");
        gateways.0.push(child);
    }
    let http = reqwest::Client::new();
    for port in &ports {
        eventually(Duration::from_secs(30), "the gateway listening", || async {
            http.get(format!("http://127.0.0.1:{port}/healthz"))
                .send()
                .await
                .is_ok()
        })
        .await;
    }

    // The limit is global across the three: 5 of 10 allowed per key, whichever gateway.
    let mut sent = 0;
    let mut seen_429 = 0;
    for (k, _) in &keys[..6] {
        let r = refused(&http, &ports, k, 10).await;
        assert_eq!(r, 5, "key {k}: 5 of 10 refused");
        sent += 10;
        seen_429 += r;
    }

    // Level two: capacity 8, in force on every gateway within 30 s (they poll every 1 s).
    let out = verdict_ok(&[
        "policy",
        "set-limit",
        "--policy-postgres",
        &pg,
        "--tier",
        "free",
        "--capacity",
        "8",
    ]);
    assert!(out.contains("capacity 8"), "{out}");
    let version = new_version(&out);
    let started = std::time::Instant::now();
    wait_for_version(&http, &ports, version).await;
    eprintln!(
        "capacity 8 in force on the three gateways after {:?}",
        started.elapsed()
    );
    let mut fresh = keys[6..].iter();
    let (k, _) = fresh.next().unwrap();
    let r = refused(&http, &ports, k, 12).await;
    assert_eq!(r, 4, "capacity 8: 8 of 12 allowed");
    sent += 12;
    seen_429 += r;

    // Level one: the tier in shadow: no 429 any more, the refusals recorded as would-deny.
    let out = verdict_ok(&[
        "policy",
        "set-mode",
        "--policy-postgres",
        &pg,
        "--tier",
        "free",
        "--mode",
        "shadow",
    ]);
    let version = new_version(&out);
    wait_for_version(&http, &ports, version).await;
    let (k, _) = fresh.next().unwrap();
    assert_eq!(refused(&http, &ports, k, 12).await, 0);
    sent += 12;

    // Every decision is one event; the refused ones are the 429s the client saw.
    let mut dropped = 0u64;
    for port in &ports {
        dropped += metric(&http, *port, "verdict_events_dropped_total")
            .await
            .expect("the dropped-events counter");
    }
    gateways.stop();
    let consumer = kafka_consumer(&topic);
    let expected = sent - dropped as usize;
    let mut events = Vec::new();
    while events.len() < expected {
        let m = tokio::time::timeout(Duration::from_secs(60), consumer.recv())
            .await
            .unwrap_or_else(|_| panic!("{} of {expected} events within 60 s", events.len()))
            .unwrap();
        events.push(DecisionEvent::decode(rdkafka::Message::payload(&m).unwrap()).unwrap());
    }
    let denied = events
        .iter()
        .filter(|e| e.verdict == Verdict::Denied)
        .count();
    let would = events
        .iter()
        .filter(|e| e.verdict == Verdict::WouldDeny)
        .count();
    eprintln!(
        "{sent} requests, {dropped} events dropped, {} events, {denied} denied ({seen_429} 429s), {would} would-deny",
        events.len()
    );
    assert_eq!(dropped, 0);
    assert_eq!(denied, seen_429);
    assert_eq!(would, 4, "shadow: 4 of 12 over the capacity of 8");
}
