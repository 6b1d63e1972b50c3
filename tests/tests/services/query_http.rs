//! The query service's HTTP API on the known lake (on the real S3 server): every endpoint
//! and format, the read-only guard, the memory, time and row limits, and the tokens.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use reqwest::StatusCode;
use serde_json::Value;
use verdict_query::Limits;
use verdict_query::http::check_exposure;
use verdict_query::spill::Spill;
use verdict_tests::query_fixture::{known_engine, long_or, long_sum, long_union, serve};

const TOKEN: &str = "analyst-token-1";

async fn service(name: &str, limits: Limits, tokens: &[&str]) -> (String, tempfile::TempDir) {
    let (engine, _store, dir) = known_engine(name, limits).await;
    (serve(engine, tokens).await.1, dir)
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

async fn post_sql(base: &str, sql: &str, query: &str) -> (StatusCode, String, Bytes) {
    let r = client()
        .post(format!("{base}/v1/sql{query}"))
        .header("content-type", "text/plain")
        .body(sql.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status();
    let ct = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, ct, r.bytes().await.unwrap())
}

fn json(body: &Bytes) -> Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(body)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_answers_in_every_format() {
    let (base, _dir) = service("http-endpoints", Limits::default(), &[]).await;
    let get = |path: &str| {
        let url = format!("{base}{path}");
        async move { client().get(url).send().await.unwrap() }
    };

    assert_eq!(get("/healthz").await.text().await.unwrap(), "ok\n");

    let tables = json(&get("/v1/tables").await.bytes().await.unwrap());
    let names: Vec<&str> = tables["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    // Every table the service registers, in its order.
    assert_eq!(names, verdict_query::tables::TABLES);
    let decisions: Vec<&str> = tables["tables"][0]["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert!(
        decisions.contains(&"key_id") && decisions.ends_with(&["date", "hour"]),
        "{decisions:?}"
    );

    let reports = json(&get("/v1/reports").await.bytes().await.unwrap());
    let names: Vec<&str> = reports["reports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "wrong-limits",
            "limit-outliers",
            "demand-history",
            "shadow-impact",
            "top-denied",
            "overage",
            "denial-rate",
            "policy-changes",
            "degraded"
        ]
    );
    let params: Vec<&str> = reports["reports"][0]["params"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        params,
        [
            "from",
            "to",
            "tier",
            "route_class",
            "percentile",
            "too_low_share",
            "too_high_use",
            "constrained_share",
            "engaged_use",
            "min_keys",
            "headroom",
            "sample_keys"
        ]
    );

    let r = get(
        "/v1/reports/wrong-limits?from=2026-11-30T10:00:00Z&to=2026-11-30T11:00:00Z&min_keys=5",
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let body = json(&r.bytes().await.unwrap());
    assert_eq!(body["row_count"], 5);
    assert_eq!(body["rows"][0]["tier"], "tight");
    assert_eq!(body["rows"][0]["verdict"], "too low");
    assert!(
        body["columns"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == "recommended_quota")
    );

    // What-if over HTTP: the known policy with tight's bucket doubled refuses fewer of its
    // requests; a candidate that does not validate is refused with its row and field.
    let candidate = verdict_tests::query_fixture::POLICY_TOML.replacen(
        "capacity = 10\nrefill_per_s = 0.01",
        "capacity = 20\nrefill_per_s = 0.01",
        1,
    );
    let what_if = |body: String, query: &'static str| {
        let url = format!("{base}/v1/what-if{query}");
        async move { client().post(url).body(body).send().await.unwrap() }
    };
    let r = what_if(
        candidate,
        "?from=2026-11-30T10:00:00Z&to=2026-11-30T12:00:00Z&keys=3",
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let w = json(&r.bytes().await.unwrap());
    let tight = w["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["tier"] == "tight")
        .unwrap()
        .clone();
    assert_eq!(tight["recorded"]["refused"], 200, "{tight}");
    assert!(tight["refused_change"].as_i64().unwrap() < 0, "{tight}");
    assert_eq!(w["keys"].as_array().unwrap().len(), 3, "{w}");
    assert_eq!(
        w["sample"],
        serde_json::Value::Null,
        "every key replayed: {w}"
    );
    assert_eq!(
        tight["bound"],
        serde_json::Value::Null,
        "exact counts: {tight}"
    );
    // A sample of the keys is said, and each limit's estimates carry their bounds; a
    // sample size that is not a whole number from 1 is refused by name.
    let r = what_if(
        verdict_tests::query_fixture::POLICY_TOML.to_string(),
        "?from=2026-11-30T10:00:00Z&to=2026-11-30T12:00:00Z&sample_keys=2",
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let sampled = json(&r.bytes().await.unwrap());
    assert!(
        sampled["sample"]["rate"].as_f64().unwrap() < 1.0,
        "{sampled}"
    );
    assert!(
        sampled["limits"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["bound"]["candidate_refused"].is_u64()),
        "{sampled}"
    );
    let r = what_if(
        verdict_tests::query_fixture::POLICY_TOML.to_string(),
        "?sample_keys=0",
    )
    .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(
        json(&r.bytes().await.unwrap())["error"]["message"]
            .as_str()
            .unwrap()
            .contains("parameter sample_keys"),
    );
    // The widest range a client can name replays the hours the table holds, no others: the
    // same answer as a month around them (it ran past 240 s against the 60 s limit when it
    // stepped through 70 million empty hours).
    let whole = verdict_tests::query_fixture::POLICY_TOML.to_string();
    let r = what_if(whole.clone(), "?from=1970-01-01&to=9999-12-31").await;
    let status = r.status();
    let widest = json(&r.bytes().await.unwrap());
    assert_eq!(status, StatusCode::OK, "{widest}");
    let r = what_if(whole, "?from=2026-11-15&to=2026-12-15").await;
    assert_eq!(r.status(), StatusCode::OK);
    let month = json(&r.bytes().await.unwrap());
    assert_eq!(widest["limits"], month["limits"]);
    assert!(!month["limits"].as_array().unwrap().is_empty(), "{month}");
    let r = what_if(
        verdict_tests::query_fixture::POLICY_TOML.replacen("capacity = 10", "capacity = 0", 1),
        "",
    )
    .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let e = json(&r.bytes().await.unwrap());
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("(tier=tight, route_class=*): capacity"),
        "{e}"
    );
    let r = what_if(
        verdict_tests::query_fixture::POLICY_TOML.to_string(),
        "?from=2026-01-01&to=2026-01-02",
    )
    .await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);

    // The review's recommendations over HTTP, each proven by a replay of the range: tight
    // (too low by its bucket: every key refused by it) gets a bigger bucket the replay shows
    // refusing less than the one in force and its quota kept, the answer's policy is one the
    // limiter accepts and carries it, and the commands apply it.
    let r = get("/v1/recommendations?from=2026-11-30&to=2026-12-01&min_keys=5&keys=0").await;
    assert_eq!(r.status(), StatusCode::OK);
    let rec = json(&r.bytes().await.unwrap());
    let tight = rec["proven"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["verdict"] == "too low" && p["override_key"].is_null())
        .unwrap_or_else(|| panic!("no too-low limit proven in {rec}"))
        .clone();
    assert_eq!(tight["met"], true, "{tight}");
    assert!(
        tight["recommended"]["share_of_requests"].as_f64().unwrap()
            < tight["in_force"]["share_of_requests"].as_f64().unwrap(),
        "{tight}"
    );
    assert_eq!(tight["wrong"], "bucket", "{tight}");
    assert_eq!(tight["recommended_quota"], tight["hourly_quota"], "{tight}");
    let capacity = tight["recommended_capacity"].as_i64().unwrap();
    assert!(capacity > tight["capacity"].as_i64().unwrap(), "{tight}");
    let policy = verdict_query::whatif::candidate(rec["policy"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("the recommended policy: {e}\n{}", rec["policy"]));
    let in_policy = policy
        .rule(
            verdict_schemas::TierId(tight["tier_id"].as_u64().unwrap() as u8),
            verdict_schemas::RouteClassId(tight["route_class_id"].as_u64().unwrap() as u8),
        )
        .map(|r| i64::from(r.limits.capacity));
    assert_eq!(in_policy, Some(capacity), "{}", rec["policy"]);
    assert!(
        rec["commands"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c.as_str().unwrap().starts_with("verdict policy set-limit")),
        "{rec}"
    );
    // Every key of the limit proven (fewer than the proof's sample), and with a sample of
    // one key: the proof says its share of the keys, and the answer the keys it held.
    assert_eq!(tight["sample_rate"], 1.0, "{tight}");
    let keys = tight["keys"].as_i64().unwrap();
    let r = get(
        "/v1/recommendations?from=2026-11-30&to=2026-12-01&min_keys=5&keys=0&proof_sample_keys=1",
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let one = json(&r.bytes().await.unwrap());
    let one = one["proven"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| {
            p["tier_id"] == tight["tier_id"]
                && p["route_class_id"] == tight["route_class_id"]
                && p["override_key"].is_null()
        })
        .unwrap_or_else(|| panic!("the limit not proven on one key: {one}"))
        .clone();
    assert!(keys > 1, "{tight}");
    assert!(
        (one["sample_rate"].as_f64().unwrap() - 1.0 / keys as f64).abs() < 1e-6,
        "{one}"
    );
    assert!(
        one["in_force"]["keys"].as_u64().unwrap() < tight["in_force"]["keys"].as_u64().unwrap(),
        "{one}"
    );
    let r = get("/v1/recommendations?from=2026-11-30&to=2026-12-01&proof_sample_keys=0").await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let e = json(&r.bytes().await.unwrap());
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("parameter proof_sample_keys"),
        "{e}"
    );
    // A parameter the review does not take is refused by name.
    let r = get("/v1/recommendations?from=2026-11-30&to=2026-12-01&colour=red").await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let e = json(&r.bytes().await.unwrap());
    assert!(
        e["error"]["message"].as_str().unwrap().contains("colour"),
        "{e}"
    );

    // The overage export in each streamed format.
    let csv = get("/v1/reports/overage?from=2026-11-30&to=2026-12-01&format=csv").await;
    assert_eq!(csv.headers()["content-type"], "text/csv; charset=utf-8");
    let text = csv.text().await.unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].starts_with("date,key_id,tier_id,tier,"), "{text}");
    assert!(
        lines[1].contains(",steady,") && lines[1].contains(",5,0,100,"),
        "{text}"
    );

    let r = client()
        .get(format!(
            "{base}/v1/reports/overage?from=2026-11-30&to=2026-12-01"
        ))
        .header("accept", "application/vnd.apache.parquet")
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.headers()["content-type"],
        "application/vnd.apache.parquet"
    );
    let parquet_rows: usize =
        parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
            r.bytes().await.unwrap(),
        )
        .unwrap()
        .build()
        .unwrap()
        .map(|b| b.unwrap().num_rows())
        .sum();
    assert_eq!(parquet_rows, 1);

    let (status, ct, body) = post_sql(
        &base,
        "SELECT tier, COUNT(*) AS n FROM decisions GROUP BY tier ORDER BY tier",
        "?format=arrow",
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ct, "application/vnd.apache.arrow.stream");
    let batches: Vec<_> = arrow::ipc::reader::StreamReader::try_new(&body[..], None)
        .unwrap()
        .map(|b| b.unwrap())
        .collect();
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 4);

    // Accept picks CSV; a JSON body works as well as text.
    let r = client()
        .post(format!("{base}/v1/sql"))
        .header("accept", "text/csv")
        .header("content-type", "application/json")
        .body(r#"{"sql": "SELECT 1 AS one"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.text().await.unwrap(), "one\n1\n");

    // An empty answer still has its header.
    let (_, _, body) = post_sql(
        &base,
        "SELECT key_id FROM overage WHERE quota_denied > 1000",
        "?format=csv",
    )
    .await;
    assert_eq!(&body[..], b"key_id\n");

    let openapi = json(&get("/v1/openapi.json").await.bytes().await.unwrap());
    assert_eq!(openapi["openapi"], "3.1.0");
    for path in [
        "/v1/sql",
        "/v1/reports",
        "/v1/reports/{name}",
        "/v1/tables",
        "/healthz",
        "/metrics",
    ] {
        assert!(openapi["paths"].get(path).is_some(), "{path} missing");
    }

    // Errors: unknown report, bad parameter, bad format, bad SQL, no route.
    let r = get("/v1/reports/nope").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert!(r.text().await.unwrap().contains("wrong-limits"));
    let r = get("/v1/reports/top-denied?tier=gold").await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("parameter tier: \\\"gold\\\" is not in the policy in force")
    );
    let r = get("/v1/reports/overage?format=xml").await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let (status, _, body) = post_sql(&base, "SELECT nope FROM decisions", "").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(json(&body)["error"]["kind"], "invalid_query");
    assert_eq!(get("/v2/whatever").await.status(), StatusCode::NOT_FOUND);

    let metrics = get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.contains("verdict_query_requests_total{endpoint=\"report\",outcome=\"ok\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("outcome=\"invalid_query\""), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_statement_that_writes_defines_or_reads_files_is_refused() {
    let (base, _dir) = service("http-refusals", Limits::default(), &[]).await;
    let refused = [
        "INSERT INTO decisions SELECT * FROM decisions",
        "UPDATE overage SET quota_denied = 0",
        "DELETE FROM overage",
        "TRUNCATE overage",
        "CREATE TABLE t AS SELECT 1",
        "CREATE VIEW v AS SELECT 1",
        "CREATE SCHEMA s",
        "DROP TABLE decisions",
        "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION '/etc/'",
        "COPY (SELECT 1) TO '/tmp/verdict-out.parquet'",
        "COPY decisions TO '/tmp/verdict-out.csv' STORED AS CSV",
        "EXPLAIN COPY (SELECT 1) TO '/tmp/verdict-out.parquet'",
        "SET datafusion.execution.target_partitions = 1",
        "SELECT 1; DROP TABLE decisions",
        "SELECT * INTO t FROM overage",
    ];
    for sql in refused {
        let (status, _, body) = post_sql(&base, sql, "").await;
        let v = json(&body);
        assert_eq!(status, StatusCode::BAD_REQUEST, "{sql}: {v}");
        assert_eq!(v["error"]["kind"], "refused", "{sql}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("read-only")
                || v["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("one statement"),
            "{sql}: {v}"
        );
    }
    assert!(!std::path::Path::new("/tmp/verdict-out.parquet").exists());
    // A path as a table name is not a file read: no such table.
    let (status, _, body) = post_sql(&base, "SELECT * FROM '/etc/passwd'", "").await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert!(
        !String::from_utf8_lossy(&body).contains("root:"),
        "no file content"
    );
    // The tables are still whole.
    let (status, _, body) = post_sql(&base, "SELECT COUNT(*) AS n FROM overage", "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json(&body)["rows"][0]["n"], 1);
}

/// The service on the known lake with `limits`, spilling to `spill`.
async fn spilling_service(
    name: &str,
    limits: Limits,
    spill: &Spill,
) -> (String, tempfile::TempDir) {
    let (engine, _store, dir) = known_engine(name, limits).await;
    let engine = engine.with_spill(spill).expect("the spill directory");
    (serve(engine, &[]).await.1, dir)
}

/// A metric's value in the service's `/metrics`.
async fn metric(base: &str, name: &str) -> f64 {
    let text = client()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    verdict_tests::metric_in(&text, name).unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

/// The files under `dir`, at any depth.
fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().map(Result::unwrap) {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sort_past_its_memory_spills_to_the_services_directory_and_answers_whole() {
    // The sort that `memory_time_and_row_limits_…` sees refused at 16 MiB without spilling.
    let sql = "SELECT value FROM generate_series(1, 5000000) ORDER BY value DESC";
    let limits = Limits {
        memory_bytes: 16 << 20,
        ..Limits::default()
    };
    let root = tempfile::tempdir().unwrap();
    let spill = Spill {
        dir: root.path().join("spill"),
        max_bytes: 512 << 20,
    };
    let (base, _dir) = spilling_service("http-spill", limits, &spill).await;
    let (status, _, body) = post_sql(&base, sql, "?format=csv").await;
    let text = String::from_utf8_lossy(&body);
    assert_eq!(status, StatusCode::OK, "{}", &text[..text.len().min(500)]);
    let values: Vec<&str> = text.lines().collect();
    assert_eq!(values.len(), 5_000_001, "the header and every row");
    assert_eq!(values[..3], ["value", "5000000", "4999999"]);
    assert_eq!(values[5_000_000], "1");
    assert!(
        values[1..]
            .windows(2)
            .all(|w| w[0].parse::<i64>().unwrap() == w[1].parse::<i64>().unwrap() + 1),
        "every value once, in order"
    );
    // It spilled, the metrics say so, and its files are gone once it answered; the
    // directory the service made for itself stays inside the operator's.
    assert_eq!(
        metric(&base, "verdict_query_spilled_queries_total").await,
        1.0
    );
    assert!(metric(&base, "verdict_query_spills_total").await >= 2.0);
    // At least 16 MB of the 40 MB of values: the operators hold 12 MiB of the query's 16.
    let bytes = metric(&base, "verdict_query_spilled_bytes_total").await;
    assert!(bytes >= 4.0e6 * 8.0 / 2.0, "{bytes}");
    let own: Vec<_> = std::fs::read_dir(&spill.dir).unwrap().collect();
    assert_eq!(own.len(), 1, "the service's own directory: {own:?}");
    assert_eq!(files_under(&spill.dir), Vec::<std::path::PathBuf>::new());

    // Past the directory's limit: memory_limit, naming the spill directory's limit.
    let small = Spill {
        dir: root.path().join("small"),
        max_bytes: 1 << 20,
    };
    let (base, _dir) = spilling_service("http-spill-small", limits, &small).await;
    let (status, _, body) = post_sql(&base, sql, "?format=csv").await;
    let v = json(&body);
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(v["error"]["kind"], "memory_limit");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("the spill directory's 1 MiB"), "{v}");
    assert_eq!(files_under(&small.dir), Vec::<std::path::PathBuf>::new());
    // The service keeps serving.
    let (status, _, body) = post_sql(&base, "SELECT 1 AS n", "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json(&body)["rows"][0]["n"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_time_and_row_limits_fail_one_query_and_the_service_keeps_serving() {
    let limits = Limits {
        memory_bytes: 16 << 20,
        timeout: Duration::from_secs(2),
        json_rows: 10,
        json_bytes: 4 << 20,
        ..Limits::default()
    };
    let (base, _dir) = service("http-limits", limits, &[]).await;

    let (status, _, body) = post_sql(
        &base,
        "SELECT value FROM generate_series(1, 5000000) ORDER BY value DESC",
        "?format=csv",
    )
    .await;
    let v = json(&body);
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(v["error"]["kind"], "memory_limit");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("16 MiB"),
        "{v}"
    );

    let (status, _, body) = post_sql(
        &base,
        "SELECT COUNT(*) FROM generate_series(1, 100000000000)",
        "",
    )
    .await;
    let v = json(&body);
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT, "{v}");
    assert_eq!(v["error"]["kind"], "time_limit");

    let (status, _, body) = post_sql(&base, "SELECT value FROM generate_series(1, 11)", "").await;
    let v = json(&body);
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(v["error"]["kind"], "row_limit");
    // Ten rows fit; CSV streams past the JSON limit.
    let (status, _, body) = post_sql(&base, "SELECT value FROM generate_series(1, 10)", "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json(&body)["row_count"], 10);
    let (status, _, body) = post_sql(
        &base,
        "SELECT value FROM generate_series(1, 1000)",
        "?format=csv",
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(String::from_utf8_lossy(&body).lines().count(), 1001);

    // Few rows of huge strings: bounded by the JSON answer's bytes, not only its rows.
    let (status, _, body) = post_sql(
        &base,
        "SELECT repeat('x', 1000000 + value % 2) AS s FROM generate_series(1, 8)",
        "",
    )
    .await;
    let v = json(&body);
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(v["error"]["kind"], "answer_too_large");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("4 MiB"),
        "{v}"
    );

    // Generated statements past the size limits: a 400 that names the limit, before any
    // planning (a sum of 5,000 terms, 5,000 ORs, 5,000 UNION ALL branches).
    for (sql, limit) in [
        (long_sum(5_000), "the limit is 8192"),
        (long_or(5_000), "the limit is 8192"),
        (long_union(5_000), "bytes; the limit is 65536"),
        (
            long_union(100),
            "100 branches of UNION, INTERSECT or EXCEPT; the limit is 64",
        ),
    ] {
        let (status, _, body) = post_sql(&base, &sql, "").await;
        let v = json(&body);
        assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
        assert_eq!(v["error"]["kind"], "query_too_large");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(limit),
            "{v}"
        );
    }
    // A flat sum of 2,000 terms (about 8 KB of SQL) is a tree 2,000 deep: refused by its
    // chain of operators; one of 120 terms is planned and answered (on the test's 2 MiB
    // worker stacks, in a debug build).
    let (status, _, body) = post_sql(&base, &long_sum(2_000), "").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        json(&body)["error"]["message"]
            .as_str()
            .unwrap()
            .contains("chains 1999 operators; the limit is 128")
    );
    let (status, _, body) = post_sql(&base, &long_sum(120), "").await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert_eq!(json(&body)["rows"][0]["s"], 120);

    // Still serving after each failure.
    let (status, _, body) = post_sql(&base, "SELECT COUNT(*) AS n FROM decisions", "").await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert!(!String::from_utf8_lossy(&body).contains("backtrace"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_guard_every_v1_route_and_no_token_means_loopback_only() {
    let (base, _dir) = service("http-auth", Limits::default(), &[TOKEN, "second-token"]).await;
    let c = client();
    for path in [
        "/v1/tables",
        "/v1/reports",
        "/v1/reports/overage",
        "/v1/openapi.json",
    ] {
        let r = c.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(r.headers()["www-authenticate"], "Bearer");
        let r = c
            .get(format!("{base}{path}"))
            .bearer_auth("wrong")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{path}");
        let r = c
            .get(format!("{base}{path}"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{path}");
    }
    let r = c
        .post(format!("{base}/v1/sql"))
        .body("SELECT 1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = c
        .post(format!("{base}/v1/sql"))
        .bearer_auth("second-token")
        .body("SELECT 1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        c.get(format!("{base}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );

    let open = SocketAddr::from(([0, 0, 0, 0], 0));
    let e = check_exposure(&[], open).unwrap_err();
    assert!(e.to_string().contains("loopback only"), "{e}");
    assert!(check_exposure(&[TOKEN.to_string()], open).is_ok());
    assert!(check_exposure(&[], SocketAddr::from(([127, 0, 0, 1], 0))).is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_shared_budget_a_query_is_refused_as_busy_and_errors_are_json() {
    // One place (the budget holds one query's memory), a short line.
    let limits = Limits {
        memory_bytes: 64 << 20,
        budget_bytes: 64 << 20,
        queue_timeout: Duration::from_millis(200),
        timeout: Duration::from_secs(3),
        ..Limits::default()
    };
    let (base, _dir) = service("http-busy", limits, &[]).await;
    let slow = {
        let base = base.clone();
        tokio::spawn(async move {
            post_sql(
                &base,
                "SELECT COUNT(*) FROM generate_series(1, 100000000000)",
                "",
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = client()
        .post(format!("{base}/v1/sql"))
        .body("SELECT 1 AS one")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers()["retry-after"], "5");
    let v = json(&r.bytes().await.unwrap());
    assert_eq!(v["error"]["kind"], "busy", "{v}");
    let (status, _, _) = slow.await.unwrap();
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT);
    // The place is free again.
    let (status, _, body) = post_sql(&base, "SELECT 1 AS one", "").await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));

    // The framework's rejections answer the documented JSON, without echoing the request.
    let c = client();
    let r = c.get(format!("{base}/v1/sql")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert!(r.headers().contains_key("allow"));
    assert_eq!(
        json(&r.bytes().await.unwrap())["error"]["kind"],
        "method_not_allowed"
    );
    let r = c
        .post(format!("{base}/v1/sql"))
        .body(vec![0xffu8, 0xfe, b'S'])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        json(&r.bytes().await.unwrap())["error"]["kind"],
        "bad_request"
    );
    let r = c
        .post(format!("{base}/v1/sql"))
        .body(format!("SELECT '{}'", "x".repeat(3 << 20)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        json(&r.bytes().await.unwrap())["error"]["kind"],
        "body_too_large"
    );
    // A request head past the service's limits: 414 and 431, in the same JSON.
    let r = c
        .get(format!(
            "{base}/v1/reports/top-denied?x={}",
            "a".repeat(10_000)
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::URI_TOO_LONG);
    let v = json(&r.bytes().await.unwrap());
    assert_eq!(v["error"]["kind"], "uri_too_long", "{v}");
    assert!(v["error"]["message"].as_str().unwrap().len() < 200, "{v}");
    let mut many = c.get(format!("{base}/healthz"));
    for i in 0..100 {
        many = many.header(format!("x-field-{i}"), "v");
    }
    let r = many.send().await.unwrap();
    assert_eq!(r.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    assert_eq!(
        json(&r.bytes().await.unwrap())["error"]["kind"],
        "headers_too_large"
    );
    let r = c
        .get(format!("{base}/healthz"))
        .header("x-big", "b".repeat(40 << 10))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    // A bad parameter is named, and only the start of what was given is shown.
    let r = c
        .get(format!(
            "{base}/v1/reports/top-denied?limit={}",
            "9".repeat(500)
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let body = r.text().await.unwrap();
    assert!(body.contains("parameter limit"), "{body}");
    assert!(body.len() < 300, "{body}");
}

/// A report asked again over unchanged files is answered from the kept answer; a commit
/// into its range (another hour of decisions) makes it computed again, with the new hour,
/// while a range the commit does not touch stays kept; ad-hoc SQL is never kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_asked_again_is_answered_from_the_kept_answer_until_its_files_change() {
    use verdict_query::http::ANSWER_CACHE_HEADER;
    use verdict_schemas::layout::HourPartition;
    use verdict_tests::query_fixture::{HOUR_10_MS, hour_11};

    let (engine, store, _dir) = known_engine("http-answers", Limits::default()).await;
    let (state, base) = serve(engine, &[]).await;
    let ask = |range: &'static str| {
        let url = format!("{base}/v1/reports/denial-rate?{range}&source=raw");
        async move {
            let r = client().get(&url).send().await.unwrap();
            assert_eq!(r.status(), StatusCode::OK);
            let kept = r
                .headers()
                .get(ANSWER_CACHE_HEADER)
                .map(|v| v.to_str().unwrap().to_string());
            (kept, json(&r.bytes().await.unwrap()))
        }
    };
    const DAY: &str = "from=2026-11-30&to=2026-12-01";
    const HOUR_10: &str = "from=2026-11-30T10:00:00Z&to=2026-11-30T11:00:00Z";
    let (first, a) = ask(DAY).await;
    let (second, b) = ask(DAY).await;
    assert_eq!(first.as_deref(), Some("miss"));
    assert_eq!(second.as_deref(), Some("hit"));
    assert_eq!(a, b, "the kept answer is the answer");
    assert_eq!(a["row_count"], 8, "two hours of four tiers");
    assert_eq!(ask(HOUR_10).await.0.as_deref(), Some("miss"));

    // Hour 12 committed to the raw table: the day's files change, hour 10's do not.
    let events: Vec<_> = hour_11()
        .into_iter()
        .map(|mut e| {
            e.event_time_ms += 3_600_000;
            e
        })
        .collect();
    let hour = HourPartition::from_event_time_ms(HOUR_10_MS + 2 * 3_600_000).unwrap();
    verdict_tests::rollup_check::write_raw_hour(
        &store,
        "verdict.decisions.v1",
        hour,
        &events,
        1,
        1000,
    )
    .await;
    let (third, c) = ask(DAY).await;
    assert_eq!(third.as_deref(), Some("miss"));
    assert_eq!(c["row_count"], 12, "hour 12 is in the answer");
    assert_eq!(ask(DAY).await.0.as_deref(), Some("hit"));
    let (hour_10, h) = ask(HOUR_10).await;
    assert_eq!(
        hour_10.as_deref(),
        Some("hit"),
        "the commit is outside hour 10"
    );
    assert_eq!(h["row_count"], 4);

    // Ad-hoc SQL is never kept (it may read the clock).
    let sql = client()
        .post(format!("{base}/v1/sql"))
        .body("SELECT COUNT(*) AS n FROM decisions")
        .send()
        .await
        .unwrap();
    assert!(sql.headers().get(ANSWER_CACHE_HEADER).is_none());
    let metrics = state.metrics.render();
    assert!(
        metrics.contains("verdict_query_answer_cache_total{outcome=\"hit\"} 3")
            && metrics.contains("verdict_query_answer_cache_total{outcome=\"miss\"} 3"),
        "{metrics}"
    );
}
