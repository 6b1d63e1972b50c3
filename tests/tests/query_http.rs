//! The query service's HTTP API on the known lake (on the real S3 server): every endpoint
//! and format, the read-only guard, the memory, time and row limits, and the tokens.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use reqwest::StatusCode;
use serde_json::Value;
use verdict_query::Limits;
use verdict_query::http::{AppState, QueryMetrics, check_exposure, spawn};
use verdict_tests::query_fixture::known_engine;

const TOKEN: &str = "analyst-token-1";

async fn service(name: &str, limits: Limits, tokens: &[&str]) -> (String, tempfile::TempDir) {
    let (engine, _store, dir) = known_engine(name, limits).await;
    let state = Arc::new(AppState {
        engine,
        tokens: tokens.iter().map(|t| t.to_string()).collect(),
        metrics: QueryMetrics::new(),
    });
    let (addr, _task) = spawn(state, SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("the service binds");
    (format!("http://{addr}"), dir)
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
    assert_eq!(names, ["decisions", "denied_hourly", "overage", "policies"]);
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
            "shadow-impact",
            "top-denied",
            "overage",
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
            "too_low_share",
            "too_high_use"
        ]
    );

    let r = get("/v1/reports/wrong-limits?from=2026-11-30T10:00:00Z&to=2026-11-30T11:00:00Z").await;
    assert_eq!(r.status(), StatusCode::OK);
    let body = json(&r.bytes().await.unwrap());
    assert_eq!(body["row_count"], 4);
    assert_eq!(body["rows"][0]["tier"], "tight");
    assert_eq!(body["rows"][0]["verdict"], "too low");
    assert!(
        body["columns"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == "busiest_use")
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_time_and_row_limits_fail_one_query_and_the_service_keeps_serving() {
    let limits = Limits {
        memory_bytes: 16 << 20,
        timeout: Duration::from_secs(2),
        json_rows: 10,
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
