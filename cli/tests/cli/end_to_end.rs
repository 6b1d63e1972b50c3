//! The whole flow on the real services: three `verdict gateway` processes sharing one Redis
//! and the PostgreSQL policy in front of one upstream, their events on the real Kafka, two
//! `verdict ingest` workers writing the raw table on the S3 server, `verdict rollup`, and
//! `verdict query serve` answering over HTTP. Known traffic from the load generator: the
//! limit holds across the three gateways, every 429 carries Retry-After and the rate-limit
//! fields; the raw table holds one event per decision (less the drops the gateways counted),
//! the rollup's denials are the 429s the client saw, and `wrong-limits` names the tier set
//! too low. `verdict policy` changes a limit and then puts the tier in shadow: every gateway
//! follows within 30 s, the 429s stop and the would-deny events go on. And the same flow
//! from a gateway that only decides, behind the real Envoy, nginx and Caddy.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use verdict_load::proxies::{caddy, envoy, example, nginx};
use verdict_load::{self as load, LoadReport, LoadSpec, MakeRequest};
use verdict_schemas::KeyId;
use verdict_tests::private::spare_port;
use verdict_tests::{
    Service, eventually, fresh_database, kafka_brokers, metric, redis_url, require, s3_endpoint,
    s3_store, unique_name,
};

/// Kills the child processes when the test ends, however it ends.
struct Children(Vec<Child>);

impl Children {
    /// SIGTERM to each, and waits: each stops cleanly (a gateway stops listening and
    /// flushes its events; an ingest worker flushes and commits).
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

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A `verdict` command with the S3 server's credentials, logging warnings only.
fn verdict(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_verdict"));
    c.args(args)
        .env("AWS_ACCESS_KEY_ID", "verdict")
        .env("AWS_SECRET_ACCESS_KEY", "verdict")
        .env("AWS_REGION", "us-east-1")
        .env("RUST_LOG", "warn");
    c
}

/// Runs a `verdict` command to its end.
fn verdict_ok(args: &[&str]) -> String {
    let out = verdict(args).output().expect("run verdict");
    assert!(
        out.status.success(),
        "verdict {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Sends `n` requests of `keys[i % keys.len()]` spread over the gateways, `concurrency` at
/// a time, with the load generator; every answer is checked for the rate-limit fields and
/// every 429 for Retry-After.
async fn drive(ports: &[u16], keys: &[&str], n: u64, concurrency: usize) -> LoadReport {
    let (ports, keys): (Vec<u16>, Vec<String>) =
        (ports.to_vec(), keys.iter().map(|k| k.to_string()).collect());
    let make: MakeRequest = Arc::new(move |i| {
        let port = ports[i as usize % ports.len()];
        let key = &keys[i as usize % keys.len()];
        axum::http::Request::get(format!("http://127.0.0.1:{port}/v1/items/{i}"))
            .header("x-api-key", key)
            .body(axum::body::Body::empty())
            .unwrap()
    });
    let r = load::run(&LoadSpec::count(n, concurrency), make, Arc::default()).await;
    assert_eq!(r.failed, 0, "{r:?}");
    assert_eq!(
        r.count(StatusCode::OK) + r.count(StatusCode::TOO_MANY_REQUESTS),
        n,
        "{r:?}"
    );
    assert_eq!(
        r.limited_without_retry_after, 0,
        "every 429 carries Retry-After"
    );
    assert_eq!(
        r.without_ratelimit_fields, 0,
        "every answer carries the fields"
    );
    r
}

/// `free` keys of the free tier and `pro` of pro, unique to this run (the shared Redis keeps
/// counters between runs), written as the key directory `keys.csv` in `dir`: their API
/// keys, free first, and the file.
fn keys_of_this_run(dir: &std::path::Path, free: u8, pro: u8) -> (Vec<String>, std::path::PathBuf) {
    let run = std::process::id();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let mut csv = String::from("api_key,key_id,tier\n");
    let mut keys = Vec::new();
    for i in 0..free + pro {
        let mut id = [0u8; 16];
        id[..4].copy_from_slice(&run.to_be_bytes());
        id[4..12].copy_from_slice(&nanos.to_le_bytes()[..8]);
        id[15] = i;
        let tier = if i < free { "free" } else { "pro" };
        let key = format!("{tier}-{i}");
        csv.push_str(&format!("{key},{},{tier}\n", KeyId(id)));
        keys.push(key);
    }
    let file = dir.join("keys.csv");
    std::fs::write(&file, csv).unwrap();
    (keys, file)
}

/// That a stopped gateway logged delivering every decision's event to Kafka.
fn assert_every_event_delivered(log: &Lines) {
    let lines = log.lock().unwrap();
    let stopped = lines
        .iter()
        .find(|l| l.contains("gateway stopped"))
        .unwrap_or_else(|| panic!("the gateway did not log its stop: {lines:?}"));
    assert!(
        stopped.contains("events_failed=0") && stopped.contains("events_dropped=0"),
        "the gateway did not deliver every event to Kafka: {stopped}"
    );
}

/// The limit review (`wrong-limits`, judging tiers of 5 keys or more) over the hours from
/// `started_at` to `now`.
async fn review(
    http: &reqwest::Client,
    base: &str,
    started_at: chrono::DateTime<chrono::Utc>,
    now: chrono::DateTime<chrono::Utc>,
) -> serde_json::Value {
    let at =
        |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let (from, to) = (
        at(started_at - chrono::Duration::hours(1)),
        at(now + chrono::Duration::hours(1)),
    );
    let r = http
        .get(format!(
            "{base}/v1/reports/wrong-limits?from={from}&to={to}&min_keys=5"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    serde_json::from_slice(&r.bytes().await.unwrap()).unwrap()
}

/// The review's verdict on `tier`.
fn verdict_on<'a>(report: &'a serde_json::Value, tier: &str) -> &'a str {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["tier"] == tier)
        .and_then(|row| row["verdict"].as_str())
        .unwrap_or_else(|| panic!("no verdict on {tier}: {report}"))
}

/// Waits (at most 30 s) until the service on `port` answers `/healthz`.
async fn listening(http: &reqwest::Client, port: u16) {
    eventually(Duration::from_secs(30), "the service listening", || async {
        http.get(format!("http://127.0.0.1:{port}/healthz"))
            .send()
            .await
            .is_ok()
    })
    .await;
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

/// `verdict gateway`, `verdict ingest`, `verdict query serve`: a child process logging at
/// `log` (a `RUST_LOG`), each line of its log in the test's output after `[name]` (shown
/// when the test fails) and kept in the returned lines.
fn verdict_child(name: &str, log: &str, args: &[&str]) -> (Child, Lines) {
    let mut child = verdict(args)
        .env("RUST_LOG", log)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start verdict");
    let lines = Lines::default();
    let stderr = child.stderr.take().expect("piped stderr");
    let (name, sink) = (name.to_owned(), Arc::clone(&lines));
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[{name}] {line}");
            sink.lock().unwrap_or_else(|e| e.into_inner()).push(line);
        }
    });
    (child, lines)
}

/// `verdict ingest` of consumer group `group` from `topic` into the lake `store` names (its
/// `--store`, and `--s3-endpoint` on S3), flushing each second, as `instance`.
fn ingest_child(name: &str, store: &[&str], topic: &str, group: &str, instance: &str) -> Child {
    let brokers = kafka_brokers();
    let mut args = vec!["ingest"];
    args.extend_from_slice(store);
    args.extend(["--brokers", &brokers, "--topic", topic]);
    args.extend(["--group", group, "--instance-id", instance]);
    args.extend(["--flush-max-age-secs", "1"]);
    verdict_child(name, "warn,verdict_ingest=info", &args).0
}

/// `verdict query serve` over the lake `store` names with the policy `policy` names (a
/// `--policy-file` or `--policy-postgres`), listening on `port`.
fn query_child(store: &[&str], policy: &[&str], port: u16) -> Child {
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec!["query", "serve"];
    args.extend_from_slice(store);
    args.extend_from_slice(policy);
    args.extend(["--listen", &listen]);
    verdict_child("query", "warn", &args).0
}

/// `verdict gateway` in front of the upstream on port `up`, with the keys of `keys_file`,
/// its events on `topic` of the real Kafka, listening on `port`; the caller adds the policy.
fn gateway_args(up: u16, keys_file: &std::path::Path, topic: &str, port: u16) -> Vec<String> {
    [
        "gateway",
        "--upstream",
        &format!("http://127.0.0.1:{up}"),
        "--keys-file",
        &keys_file.display().to_string(),
        "--kafka-brokers",
        &kafka_brokers(),
        "--kafka-topic",
        topic,
        "--listen",
        &format!("127.0.0.1:{port}"),
    ]
    .map(String::from)
    .to_vec()
}

/// The lines a child logged.
type Lines = Arc<Mutex<Vec<String>>>;

/// The first row of an answer of the query service, as JSON.
async fn query(http: &reqwest::Client, base: &str, sql: &str) -> serde_json::Value {
    let r = http
        .post(format!("{base}/v1/sql"))
        .header("content-type", "text/plain")
        .body(sql.to_owned())
        .send()
        .await
        .expect("the query service answers");
    let status = r.status();
    let body: serde_json::Value =
        serde_json::from_slice(&r.bytes().await.unwrap()).expect("a JSON answer");
    assert!(status.is_success(), "{sql}: {status} {body}");
    body["rows"][0].clone()
}

fn hour(t: chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%dT%H").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_flow_on_the_real_services() {
    require(Service::Redis);
    require(Service::Kafka);
    let started_at = chrono::Utc::now();
    let pg = fresh_database("endtoend").await;
    let dir = tempfile::tempdir().unwrap();
    let topic = unique_name("e2e-decisions");
    let bucket = "verdict-e2e";
    s3_store(bucket).await;
    let lake = format!("s3://{bucket}/{}", unique_name("run"));

    // 12 keys of the free tier, whose limit is set too low, and 6 of pro.
    let (keys, keys_file) = keys_of_this_run(dir.path(), 12, 6);
    let name = |i: usize| keys[i].as_str();

    let pg_source = verdict_policy_store::PgSource::new(&pg);
    pg_source.migrate().await.unwrap();
    let (client, conn) = tokio_postgres::connect(&pg, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .batch_execute(
            "insert into verdict_policy.tiers (id, name) values (0, 'free'), (1, 'pro');
             insert into verdict_policy.route_classes (id, name, prefixes) values (0, 'api', '{/v1}');
             insert into verdict_policy.limits values ('free', '*', 5, 0.001, 1000, 'enforce');
             insert into verdict_policy.limits values ('pro', '*', 1000, 100, 100000, 'enforce');",
        )
        .await
        .unwrap();

    // The query service over the lake and the policy, from the start.
    let http = reqwest::Client::new();
    let query_port = spare_port();
    let mut services = Children(vec![query_child(
        &["--store", &lake, "--s3-endpoint", &s3_endpoint()],
        &["--policy-postgres", &pg],
        query_port,
    )]);
    let base = format!("http://127.0.0.1:{query_port}");

    let up = verdict_demo::spawn_upstream().await.unwrap().port();
    let ports: Vec<u16> = (0..3).map(|_| spare_port()).collect();
    let mut gateways = Children(Vec::new());
    let mut gateway_logs = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let mut args = gateway_args(up, &keys_file, &topic, *port);
        args.extend(
            [
                "--policy-postgres",
                &pg,
                "--policy-refresh-secs",
                "1",
                "--redis",
                &redis_url(),
                "--redis-timeout-ms",
                "250",
                "--instance",
                &i.to_string(),
                "--instance-count",
                "3",
            ]
            .map(String::from),
        );
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (child, lines) =
            verdict_child(&format!("gateway {i}"), "warn,verdict::gateway=info", &args);
        gateways.0.push(child);
        gateway_logs.push(lines);
    }
    for port in ports.iter().chain([&query_port]) {
        listening(&http, *port).await;
    }

    // Known traffic: 10 requests of each of 6 free and 6 pro keys, 6 at a time over the
    // three gateways. The limit is global across them: 5 of each free key's 10 are
    // allowed, whichever gateway they reach; pro is far from its limit.
    let first: Vec<&str> = (0..6).chain(12..18).map(name).collect();
    let r = drive(&ports, &first, 120, 6).await;
    assert_eq!(r.count(StatusCode::TOO_MANY_REQUESTS), 30, "{r:?}");
    let mut sent = 120;
    let mut seen_429 = 30;

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
    let r = drive(&ports, &[name(6)], 12, 3).await;
    assert_eq!(
        r.count(StatusCode::TOO_MANY_REQUESTS),
        4,
        "capacity 8: 8 of 12 allowed"
    );
    sent += 12;
    seen_429 += 4;

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
    let r = drive(&ports, &[name(7)], 12, 3).await;
    assert_eq!(r.count(StatusCode::TOO_MANY_REQUESTS), 0);
    sent += 12;

    let mut dropped = 0u64;
    for port in &ports {
        dropped += metric::<u64>(&http, *port, "verdict_events_dropped_total")
            .await
            .expect("the dropped-events counter");
    }
    // SIGTERM: each gateway stops listening and flushes its events to Kafka, and says what
    // became of every decision's event: none may be lost on the way out.
    gateways.stop();
    for lines in &gateway_logs {
        assert_every_event_delivered(lines);
    }

    // Two ingest workers of one group share the topic's partitions and write the raw
    // table on the S3 server.
    let group = unique_name("e2e-ingest");
    let mut workers = Children(
        (0..2)
            .map(|i| {
                ingest_child(
                    &format!("ingest {i}"),
                    &["--store", &lake, "--s3-endpoint", &s3_endpoint()],
                    &topic,
                    &group,
                    &format!("worker-{i}"),
                )
            })
            .collect(),
    );
    // Every decision is one event in the raw table, less the drops the gateways counted.
    let expected = sent - dropped;
    let count = "SELECT COUNT(*) AS n FROM decisions";
    // Each count seen is printed when it changes, so a run that times out shows whether
    // the workers wrote nothing, stopped short, or wrote too much.
    let seen = std::sync::Mutex::new(None::<u64>);
    eventually(
        Duration::from_secs(120),
        "every event in the raw table",
        || async {
            let n = query(&http, &base, count).await["n"].as_u64();
            let mut last = seen.lock().unwrap_or_else(|e| e.into_inner());
            if *last != n {
                eprintln!("raw table: {n:?} of {expected} events");
                *last = n;
            }
            n == Some(expected)
        },
    )
    .await;
    workers.stop();
    let totals = query(
        &http,
        &base,
        "SELECT COUNT(*) AS n, SUM(CASE WHEN verdict = 1 THEN 1 ELSE 0 END) AS denied, \
         SUM(CASE WHEN verdict = 2 THEN 1 ELSE 0 END) AS would FROM decisions",
    )
    .await;
    eprintln!(
        "{sent} requests, {dropped} events dropped, raw table {totals}, {seen_429} 429s seen"
    );
    assert_eq!(dropped, 0);
    assert_eq!(
        totals["n"].as_u64(),
        Some(expected),
        "exactly once: {totals}"
    );
    assert_eq!(totals["denied"].as_u64(), Some(seen_429));
    assert_eq!(totals["would"].as_u64(), Some(4), "shadow: 4 of 12 over 8");

    // The hourly rollup of the hours the run touched: its denials are the 429s the client
    // saw, its would-denies the shadow tier's.
    let now = chrono::Utc::now();
    let out = verdict_ok(&[
        "rollup",
        "--store",
        &lake,
        "--s3-endpoint",
        &s3_endpoint(),
        "--from",
        &hour(started_at),
        "--to",
        &hour(now),
    ]);
    assert!(out.contains(&format!("{expected} raw events")), "{out}");
    let rolled = query(
        &http,
        &base,
        "SELECT SUM(denied) AS denied, SUM(would_deny) AS would FROM denied_hourly",
    )
    .await;
    assert_eq!(rolled["denied"].as_u64(), Some(seen_429), "{rolled}");
    assert_eq!(rolled["would"].as_u64(), Some(4), "{rolled}");

    // Which limits were wrong? The free tier's: every one of its six keys needed twice its
    // bucket and was refused (six keys a tier: min_keys=5 lets the review judge them).
    let report = review(&http, &base, started_at, now).await;
    assert_eq!(verdict_on(&report, "free"), "too low", "{report}");
    assert_eq!(verdict_on(&report, "pro"), "too high", "{report}");
    services.stop();
}

/// The policy behind the proxies: free's bucket of 5 too low, pro's far too high.
const BEHIND_PROXIES_POLICY: &str = include_str!("../../fixtures/policies/behind_proxies.toml");

/// Envoy's descriptors: the API key and the path, verdict's identity.
const ENVOY_RATE_LIMITS: &str = r#"              - actions:
                - request_headers: {header_name: x-api-key, descriptor_key: api_key}
                - request_headers: {header_name: ":path", descriptor_key: path}"#;

/// One `verdict gateway` that only decides, asked by the real Envoy (its rate limit
/// service), nginx (`auth_request`) and Caddy (`forward_auth`) with their example
/// configurations, its events on the real Kafka; `verdict ingest` writes them to the raw
/// table, `verdict rollup` rolls the hour up, and `verdict query serve`'s review names the
/// free tier's limit too low and pro's too high: what the proxies' users get from verdict
/// beyond the decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_envoy_nginx_and_caddy_every_decision_reaches_the_raw_table_and_the_review() {
    require(Service::Redis);
    require(Service::Kafka);
    let started_at = chrono::Utc::now();
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    std::fs::create_dir(&lake).unwrap();
    let lake = lake.display().to_string();
    let topic = unique_name("proxies-decisions");
    let policy = dir.path().join("policy.toml");
    std::fs::write(&policy, BEHIND_PROXIES_POLICY).unwrap();
    let policy = policy.display().to_string();

    // 6 free keys and 6 pro, two of each behind each proxy.
    let (keys, keys_file) = keys_of_this_run(dir.path(), 6, 6);

    let (check, rls) = (spare_port(), spare_port());
    let (gateway, gateway_log) = verdict_child(
        "gateway",
        "warn,verdict::gateway=info",
        &[
            "gateway",
            "--listen",
            &format!("127.0.0.1:{check}"),
            "--rls-listen",
            &format!("127.0.0.1:{rls}"),
            "--keys-file",
            &keys_file.display().to_string(),
            "--policy-file",
            &policy,
            "--kafka-brokers",
            &kafka_brokers(),
            "--kafka-topic",
            &topic,
            // The counters in the real Redis, with the end-to-end test's deadline: a debug
            // build under this load misses production's 5 ms now and then, and the local
            // fallback would decide those requests.
            "--redis",
            &redis_url(),
            "--redis-timeout-ms",
            "250",
        ],
    );
    let mut gateway = Children(vec![gateway]);
    let http = reqwest::Client::new();
    listening(&http, check).await;

    let api = verdict_demo::spawn_upstream().await.unwrap().port();
    let (to_envoy, admin, to_nginx, to_caddy) =
        (spare_port(), spare_port(), spare_port(), spare_port());
    // nginx's and Caddy's example configurations, asking the gateway, proxying to the API and
    // listening on `port`.
    let forward_auth = |file: &str, port: u16| {
        let (listen, on) = if file == "Caddyfile" {
            (":8000", format!(":{port}"))
        } else {
            ("127.0.0.1:8000", format!("127.0.0.1:{port}"))
        };
        example(
            file,
            &[
                ("127.0.0.1:8088", format!("127.0.0.1:{check}")),
                ("127.0.0.1:8080", format!("127.0.0.1:{api}")),
                (listen, on),
            ],
        )
    };
    let proxies = [
        envoy(to_envoy, admin, api, rls, "edge", ENVOY_RATE_LIMITS),
        nginx(&forward_auth("nginx-auth-request.conf", to_nginx), to_nginx),
        caddy(&forward_auth("Caddyfile", to_caddy), to_caddy),
    ];

    // 10 requests of each key through its proxy, 4 at a time: each free key gets 5 of them
    // (its bucket), each pro key all 10. Every answer carries verdict's fields, every 429
    // its Retry-After.
    let name = |i: usize| keys[i].as_str();
    for (p, port) in [to_envoy, to_nginx, to_caddy].into_iter().enumerate() {
        let behind = [
            name(2 * p),
            name(2 * p + 1),
            name(6 + 2 * p),
            name(7 + 2 * p),
        ];
        let r = drive(&[port], &behind, 40, 4).await;
        assert_eq!(
            r.count(StatusCode::TOO_MANY_REQUESTS),
            10,
            "{r:?}\n{}",
            proxies[p].log()
        );
    }

    // SIGTERM: the gateway flushes every decision's event to Kafka.
    gateway.stop();
    assert_every_event_delivered(&gateway_log);

    let query_port = spare_port();
    let base = format!("http://127.0.0.1:{query_port}");
    let mut services = Children(vec![
        ingest_child(
            "ingest",
            &["--store", &lake],
            &topic,
            &unique_name("proxies-ingest"),
            "worker-0",
        ),
        query_child(&["--store", &lake], &["--policy-file", &policy], query_port),
    ]);
    // One event per request, from all three proxies: 120, of which 30 refused.
    let totals = "SELECT COUNT(*) AS n, SUM(CASE WHEN verdict = 1 THEN 1 ELSE 0 END) AS denied \
                  FROM decisions";
    let seen = Mutex::new(serde_json::Value::Null);
    eventually(
        Duration::from_secs(120),
        "every event in the raw table",
        || async {
            let Ok(r) = http
                .post(format!("{base}/v1/sql"))
                .body(totals)
                .send()
                .await
            else {
                return false;
            };
            let body: serde_json::Value = r.json().await.unwrap_or_default();
            let row = body["rows"][0].clone();
            let done = row["n"].as_u64() == Some(120);
            *seen.lock().unwrap() = row;
            done
        },
    )
    .await;
    assert_eq!(seen.lock().unwrap()["denied"].as_u64(), Some(30));

    let now = chrono::Utc::now();
    let out = verdict_ok(&[
        "rollup",
        "--store",
        &lake,
        "--from",
        &hour(started_at),
        "--to",
        &hour(now),
    ]);
    assert!(out.contains("120 raw events"), "{out}");
    let report = review(&http, &base, started_at, now).await;
    for row in report["rows"].as_array().unwrap() {
        println!(
            "the review of the proxies' traffic: {} {}: {} ({})",
            row["tier"], row["requests"], row["verdict"], row["reason"]
        );
    }
    assert_eq!(verdict_on(&report, "free"), "too low", "{report}");
    assert_eq!(verdict_on(&report, "pro"), "too high", "{report}");
    services.stop();
}

/// The policy of the SIGTERM test: one tier far from its limits, one route class.
const ROOMY_POLICY: &str = include_str!("../../fixtures/policies/roomy.toml");

/// The value of `field=` in a log line.
fn log_field(line: &str, field: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{field}=")))
        .and_then(|v| v.trim_end_matches(',').parse().ok())
        .unwrap_or_else(|| panic!("no {field}= in {line:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_stopped_under_load_answers_what_it_accepted_and_flushes_every_event() {
    require(Service::Redis);
    require(Service::Kafka);
    let dir = tempfile::tempdir().unwrap();
    let topic = unique_name("sigterm-decisions");
    let keys_file = dir.path().join("keys.csv");
    std::fs::write(
        &keys_file,
        format!("api_key,key_id,tier\nk1,{},pro\n", KeyId([7; 16])),
    )
    .unwrap();
    let policy = dir.path().join("policy.toml");
    std::fs::write(&policy, ROOMY_POLICY).unwrap();
    let log = dir.path().join("gateway.log");
    let up = verdict_demo::spawn_upstream().await.unwrap().port();
    let port = spare_port();
    let mut args = gateway_args(up, &keys_file, &topic, port);
    args.extend(["--policy-file".to_owned(), policy.display().to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut gateway = verdict(&args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start verdict gateway");
    let http = reqwest::Client::new();
    listening(&http, port).await;

    // 16 clients in a closed loop; SIGTERM once the gateway has answered 500 of them, under
    // load whatever the machine's speed (the requests after it find no listener and fail at
    // the client).
    let make: MakeRequest = Arc::new(move |i| {
        axum::http::Request::get(format!("http://127.0.0.1:{port}/v1/items/{i}"))
            .header("x-api-key", "k1")
            .body(axum::body::Body::empty())
            .unwrap()
    });
    let progress = Arc::new(load::LoadProgress::default());
    let load = tokio::spawn({
        let progress = Arc::clone(&progress);
        async move {
            load::run(
                &LoadSpec::closed(Duration::from_secs(8), 16),
                make,
                progress,
            )
            .await
        }
    });
    let answered_so_far = || {
        progress.done.load(std::sync::atomic::Ordering::Relaxed)
            - progress.failed.load(std::sync::atomic::Ordering::Relaxed)
    };
    eventually(Duration::from_secs(6), "500 requests answered", || async {
        answered_so_far() >= 500
    })
    .await;
    let pid = gateway.id().to_string();
    let signalled = std::time::Instant::now();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = tokio::task::spawn_blocking(move || gateway.wait())
        .await
        .unwrap()
        .unwrap();
    let stopped_in = signalled.elapsed();
    let report = load.await.unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    let last = text
        .lines()
        .rfind(|l| l.contains("gateway stopped"))
        .unwrap_or_else(|| panic!("no final account in the log:\n{text}"));
    let decisions = log_field(last, "decisions");
    let sent = log_field(last, "events_sent");
    let (failed, dropped) = (
        log_field(last, "events_failed"),
        log_field(last, "events_dropped"),
    );
    let answered = report.count(StatusCode::OK) + report.count(StatusCode::TOO_MANY_REQUESTS);
    eprintln!(
        "stopped {stopped_in:?} after SIGTERM ({status}); {answered} answered, {} failed at the client; {decisions} decisions: {sent} events sent, {failed} failed, {dropped} dropped",
        report.failed
    );
    assert!(status.success(), "{status}\n{text}");
    assert!(
        stopped_in < Duration::from_secs(10),
        "the grace period is 10 s and nothing was slow: {stopped_in:?}"
    );
    assert!(
        answered >= 500 && report.failed > 0,
        "the load ran through the stop: {report:?}"
    );
    assert!(
        decisions >= answered,
        "{answered} answered, {decisions} decided"
    );
    assert_eq!(decisions, sent + failed + dropped, "{last}");
    assert_eq!((failed, dropped), (0, 0), "{last}");

    // What the gateway counted as sent is what the topic holds.
    let consumer = verdict_tests::kafka_consumer(&topic);
    let mut records = 0u64;
    let mut wait = Duration::from_secs(60);
    while let Ok(m) = tokio::time::timeout(wait, consumer.recv()).await {
        m.expect("a record");
        records += 1;
        if records >= sent {
            wait = Duration::from_secs(3);
        }
    }
    assert_eq!(records, sent, "the topic holds every event sent, once");
}
