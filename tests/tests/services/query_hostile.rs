//! Hostile and heavy queries against one query service (HTTP and PostgreSQL wire together,
//! on the known lake in the real S3 server), each class as a hostile client with a valid
//! token would send it: every answer is the documented refusal, the service answers a
//! normal query afterwards on both front ends, a stopped query gives its memory and its
//! place back at once, and the process's peak memory over the whole suite stays under the
//! shared budget (`VmHWM` in `/proc/self/status`, over what the process held before).
//!
//! One test, so that nothing else runs in the process while its peak is measured.

use std::net::SocketAddr;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use reqwest::StatusCode;
use serde_json::Value;
use verdict_query::{Engine, Limits};
use verdict_tests::query_fixture::{
    known_engine, long_or, long_sum, long_union, pg_driver, serve_both,
};

const TOKEN: &str = "hostile-token-3";
/// Each query's pool, and the budget they share (four places).
const PER_QUERY: usize = 64 << 20;
const BUDGET: usize = 256 << 20;
/// A query that runs until stopped, and whose join makes output for seconds without reading
/// its input again (it never yielded, so it ran on after its 408 until the process was
/// killed).
const ENDLESS: &str = "SELECT COUNT(*) AS n FROM generate_series(1, 1000000) AS a, \
    generate_series(1, 1000000) AS b WHERE a.value <> b.value";

/// One of `/proc/self/status`'s sizes, bytes.
fn status_bytes(field: &str) -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        .map(|kb| kb << 10)
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"))
}

fn psql(addr: SocketAddr, commands: &[&str]) -> Output {
    let mut c = Command::new("psql");
    c.env("PGPASSWORD", TOKEN)
        .env("PGCONNECT_TIMEOUT", "10")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &addr.port().to_string(),
            "-U",
            "analyst",
            "-d",
            "verdict",
        ])
        .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1"]);
    for sql in commands {
        c.args(["-c", sql]);
    }
    c.output().unwrap_or_else(|e| {
        panic!("running psql: {e}. It comes with Debian's postgresql-client: start the services with `scripts/services.sh up`, which installs it")
    })
}

/// psql's answer to `commands` (one session, counted as a case): its stdout when it
/// succeeded, else its stderr.
async fn psql_says(addr: SocketAddr, commands: &[&str]) -> Result<String, String> {
    let said = psql_run(addr, commands).await;
    tally(said.is_ok());
    said
}

async fn psql_run(addr: SocketAddr, commands: &[&str]) -> Result<String, String> {
    let commands: Vec<String> = commands.iter().map(|c| c.to_string()).collect();
    let out = tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = commands.iter().map(String::as_str).collect();
        psql(addr, &refs)
    })
    .await
    .unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

async fn driver(addr: SocketAddr) -> (tokio_postgres::Client, tokio::task::JoinHandle<()>) {
    pg_driver(addr, TOKEN).await
}

fn http(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder().timeout(timeout).build().unwrap()
}

/// The suite's cases as the front ends took them: answered, or refused (an error in words,
/// a time limit, a stopped statement). What `still_serving` asks between them is not counted.
static ANSWERED: AtomicUsize = AtomicUsize::new(0);
static REFUSED: AtomicUsize = AtomicUsize::new(0);

fn tally(answered: bool) {
    let count = if answered { &ANSWERED } else { &REFUSED };
    count.fetch_add(1, Ordering::Relaxed);
}

/// `sql` over HTTP, counted as a case.
async fn post_sql(base: &str, sql: &str) -> (StatusCode, Value) {
    let (status, v) = send_sql(base, sql).await;
    tally(status.is_success());
    (status, v)
}

async fn send_sql(base: &str, sql: &str) -> (StatusCode, Value) {
    let r = http(Duration::from_secs(60))
        .post(format!("{base}/v1/sql"))
        .bearer_auth(TOKEN)
        .body(sql.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body: Bytes = r.bytes().await.unwrap();
    let v = serde_json::from_slice(&body).unwrap_or_else(|e| {
        panic!(
            "{e}: {}",
            String::from_utf8_lossy(&body[..body.len().min(300)])
        )
    });
    (status, v)
}

/// The service answers a normal query on both front ends.
async fn still_serving(base: &str, pg: SocketAddr, after: &str) {
    let (status, v) = send_sql(base, "SELECT COUNT(*) AS n FROM decisions").await;
    assert_eq!(status, StatusCode::OK, "HTTP after {after}: {v}");
    let n = v["rows"][0]["n"].as_i64().unwrap();
    assert!(n > 0);
    let said = psql_run(pg, &["SELECT COUNT(*) FROM decisions"]).await;
    assert_eq!(said, Ok(n.to_string()), "psql after {after}");
}

/// Logs in over the raw protocol, declares a 1 GB Query and sends its first 64 KiB: what
/// the server answered (its ErrorResponse's fields), before the rest was sent.
async fn huge_query(pg: SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(pg).await.expect("connect");
    let mut body = vec![0, 3, 0, 0];
    for kv in ["user", "analyst", "database", "verdict"] {
        body.extend_from_slice(kv.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut startup = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    startup.extend_from_slice(&body);
    s.write_all(&startup).await.unwrap();
    // Messages until the one of `kind`; the bytes of the last.
    async fn until(s: &mut tokio::net::TcpStream, kind: u8) -> Vec<u8> {
        loop {
            let mut head = [0u8; 5];
            s.read_exact(&mut head).await.expect("a message");
            let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
            let mut body = vec![0u8; len - 4];
            s.read_exact(&mut body).await.expect("its body");
            if head[0] == kind || head[0] == b'E' {
                return [&[head[0]][..], &body].concat();
            }
        }
    }
    let auth = until(&mut s, b'R').await;
    assert_eq!(auth[0], b'R', "{:?}", String::from_utf8_lossy(&auth));
    let mut password = vec![b'p'];
    password.extend_from_slice(&((TOKEN.len() + 5) as u32).to_be_bytes());
    password.extend_from_slice(TOKEN.as_bytes());
    password.push(0);
    s.write_all(&password).await.unwrap();
    let ready = until(&mut s, b'Z').await;
    assert_eq!(ready[0], b'Z', "{:?}", String::from_utf8_lossy(&ready));
    let mut query = vec![b'Q'];
    query.extend_from_slice(&(1u32 << 30).to_be_bytes());
    query.extend(std::iter::repeat_n(b' ', 64 << 10));
    // The server may close as the bytes arrive: what it said is read either way.
    let _ = s.write_all(&query).await;
    let told = tokio::time::timeout(Duration::from_secs(10), until(&mut s, b'E'))
        .await
        .expect("an answer within 10 s");
    String::from_utf8_lossy(&told).replace('\0', " ")
}

/// Every query has given its memory and its place back within `within` of `since`: nothing
/// of a stopped query runs on.
async fn settled(engine: &Engine, places: usize, after: &str) {
    let since = tokio::time::Instant::now();
    while engine.budget().reserved() > 0 || engine.budget().slots() < places {
        assert!(
            since.elapsed() < Duration::from_secs(1),
            "1 s after {after}: {} bytes still reserved, {} of {places} places free",
            engine.budget().reserved(),
            engine.budget().slots()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_queries_cost_only_themselves_on_both_front_ends() {
    let limits = Limits {
        memory_bytes: PER_QUERY,
        budget_bytes: BUDGET,
        timeout: Duration::from_secs(6),
        json_bytes: 8 << 20,
        queue_timeout: Duration::from_secs(1),
        ..Limits::default()
    };
    let places = BUDGET / PER_QUERY;
    let (engine, _store, _dir) = known_engine("hostile", limits).await;
    let (base, pg) = serve_both(&engine, TOKEN).await;
    still_serving(&base, pg, "start").await;
    let before = status_bytes("VmRSS:");

    // 1. Statements that overflowed the stack and aborted the process: refused by the
    // limit they pass, on both front ends (a sum of 2,000 terms, 5,000 ORs, UNION ALL
    // branches); pg_roles answers.
    let (sum, ors) = (long_sum(2_000), long_or(5_000));
    // 4,000 branches: past the byte limit, and within what one argument to psql may be.
    let unions = long_union(4_000);
    for (sql, limit) in [
        (&sum, "chains 1999 operators; the limit is 128"),
        (&ors, "tokens; the limit is 8192"),
        (&unions, "bytes; the limit is 65536"),
    ] {
        let (status, v) = post_sql(&base, sql).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
        assert_eq!(v["error"]["kind"], "query_too_large");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(limit),
            "{v}"
        );
        let err = psql_says(pg, &[sql]).await.unwrap_err();
        assert!(err.contains(limit), "psql: {err}");
    }
    let roles = psql_says(pg, &["SELECT COUNT(*) FROM pg_catalog.pg_roles"]).await;
    assert!(roles.is_ok(), "{roles:?}");
    still_serving(&base, pg, "the statements past the size limits").await;

    // 2. A query past its time limit stops, and frees its memory, at once: over HTTP (408),
    // over psql (the service's limit, and a shorter statement_timeout of the session).
    let (status, v) = post_sql(&base, ENDLESS).await;
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT, "{v}");
    assert_eq!(v["error"]["kind"], "time_limit");
    settled(&engine, places, "a 408").await;
    let err = psql_says(pg, &[ENDLESS]).await.unwrap_err();
    assert!(err.contains("time limit of 6 s"), "{err}");
    settled(&engine, places, "psql's time limit").await;
    let err = psql_says(pg, &["SET statement_timeout = 500", ENDLESS])
        .await
        .unwrap_err();
    assert!(
        err.contains("canceling statement due to statement timeout"),
        "{err}"
    );
    settled(&engine, places, "psql's statement_timeout").await;

    // ... and when its client goes away: an HTTP client that gives up, a driver's cancel
    // request, a driver that closes its connection.
    let gave_up = http(Duration::from_millis(700))
        .post(format!("{base}/v1/sql"))
        .bearer_auth(TOKEN)
        .body(ENDLESS)
        .send()
        .await;
    assert!(gave_up.unwrap_err().is_timeout());
    tally(false);
    settled(&engine, places, "an HTTP client gave up").await;

    let (client, _connection) = driver(pg).await;
    let cancel = client.cancel_token();
    let running = tokio::spawn(async move { client.query(ENDLESS, &[]).await });
    tokio::time::sleep(Duration::from_millis(700)).await;
    cancel
        .cancel_query(tokio_postgres::NoTls)
        .await
        .expect("the cancel request is sent");
    let err = running.await.unwrap().unwrap_err();
    tally(false);
    let db = err.as_db_error().expect("a database error");
    assert_eq!(db.code().code(), "57014", "{db:?}");
    assert!(db.message().contains("user request"), "{db:?}");
    settled(&engine, places, "a driver's cancel").await;

    let (client, connection) = driver(pg).await;
    let running = tokio::spawn(async move { client.query(ENDLESS, &[]).await });
    tokio::time::sleep(Duration::from_millis(700)).await;
    connection.abort();
    running.abort();
    tally(false);
    settled(&engine, places, "a driver closed its connection").await;

    // ... and when nobody fetches: a portal suspended after one row holds its place while
    // its client asks for no row for half the time limit (3 s; at most 10 s), then gives it
    // back without being polled, well before the time limit.
    let (mut client, _connection) = driver(pg).await;
    let t = client.transaction().await.expect("BEGIN");
    let portal = t
        .bind("SELECT value FROM generate_series(1, 1000000000000)", &[])
        .await
        .expect("a portal");
    let first = t.query_portal(&portal, 1).await.expect("the first row");
    assert_eq!(first.len(), 1);
    assert_eq!(
        engine.budget().slots(),
        places - 1,
        "the suspended portal holds a place"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    settled(&engine, places, "a suspended portal's hold").await;
    let err = t.query_portal(&portal, 1).await.unwrap_err();
    tally(false);
    let db = err.as_db_error().expect("a database error");
    assert!(db.message().contains("asked for no row for 3 s"), "{db:?}");
    assert_eq!(db.code().code(), "57014", "{db:?}");
    drop(t);
    still_serving(&base, pg, "the stopped queries").await;

    // 3. Memory no pool sees: a huge value is refused by its function, on both front ends;
    // a JSON answer of few rows of big strings is refused by its size.
    let (status, v) = post_sql(&base, "SELECT repeat('x', 1000000000) AS s").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(v["error"]["kind"], "value_too_large");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("repeat() would make"),
        "{v}"
    );
    let err = psql_says(pg, &["SELECT length(repeat('x', 1000000000))"])
        .await
        .unwrap_err();
    assert!(err.contains("repeat() would make"), "{err}");
    let (status, v) = post_sql(
        &base,
        "SELECT repeat('x', 1000000 + value % 2) AS s FROM generate_series(1, 60)",
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(v["error"]["kind"], "answer_too_large");

    // Twenty heavy sorts at once, each within its own pool: the shared budget admits four at
    // a time; the rest wait, then are answered busy. Nobody overcommits.
    let sort = "SELECT value FROM (SELECT value, row_number() OVER (ORDER BY value DESC) AS rn \
                FROM generate_series(1, 1000000)) AS s WHERE rn = 2";
    let mut sorts = Vec::new();
    for _ in 0..20 {
        let base = base.clone();
        sorts.push(tokio::spawn(async move { post_sql(&base, sort).await }));
    }
    let (mut answered, mut busy) = (0, 0);
    for s in sorts {
        let (status, v) = s.await.unwrap();
        match status {
            StatusCode::OK => {
                assert_eq!(v["rows"][0]["value"], 999_999, "{v}");
                answered += 1;
            }
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_eq!(v["error"]["kind"], "busy", "{v}");
                busy += 1;
            }
            other => panic!("a sort answered {other}: {v}"),
        }
    }
    assert_eq!(answered + busy, 20);
    assert!(answered >= places, "{answered} sorts answered, {busy} busy");
    settled(&engine, places, "the sorts").await;

    // 4. One statement per query, in both protocols.
    let err = psql_says(pg, &["SELECT 1; SELECT 2"]).await.unwrap_err();
    assert!(
        err.contains("one statement per query: this one has 2"),
        "{err}"
    );
    let (client, _connection) = driver(pg).await;
    let err = client
        .query("SELECT 1 AS one; SELECT 2 AS two", &[])
        .await
        .unwrap_err();
    tally(false);
    let db = err.as_db_error().expect("a database error");
    assert!(db.message().contains("one statement per query"), "{db:?}");
    assert_eq!(db.code().code(), "0A000");
    let rows = client
        .query("SELECT key_id, tier FROM decisions LIMIT 3", &[])
        .await
        .expect("the main table over the extended protocol");
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0].get::<_, Vec<u8>>(0).len(), 16);
    tally(true);

    // A Query message past the statement limit is refused by its header, before its body is
    // read: a client that declares 1 GB and sends it slowly is told at once.
    let told = huge_query(pg).await;
    tally(false);
    assert!(told.contains("54000"), "{told}");
    assert!(
        told.contains("the statement is 1073741824 bytes; the limit is 65536"),
        "{told}"
    );
    still_serving(&base, pg, "a 1 GB Query message").await;

    // 5. A parameterised query (the extended protocol, every driver's) streams its rows:
    // 600,000 of them come through a driver that reads them as they come while the process
    // stays within its budget (checked at the end; gathered whole first, they took
    // hundreds of MB).
    let (client, _connection) = driver(pg).await;
    let rows = client
        .query_raw(
            "SELECT value FROM generate_series(1, 600000) g WHERE value > $1",
            [0_i64],
        )
        .await
        .expect("the parameterised query starts");
    let mut rows = std::pin::pin!(rows);
    let mut n = 0_u64;
    while let Some(row) = futures::StreamExt::next(&mut rows).await {
        row.unwrap_or_else(|e| panic!("after {n} rows: {e}"));
        n += 1;
    }
    assert_eq!(n, 600_000);
    tally(true);
    settled(&engine, places, "the streamed parameterised query").await;
    // And through psycopg: streamed, and through a named cursor (DECLARE with a parameter,
    // each FETCH described with its columns: described as nothing, psycopg crashed), 5,000
    // rows a FETCH.
    let dsn = format!(
        "postgresql://analyst:{TOKEN}@127.0.0.1:{}/verdict",
        pg.port()
    );
    for (mode, rows) in [("stream", 500_000_u64), ("named", 100_000)] {
        let dsn = dsn.clone();
        let read = tokio::task::spawn_blocking(move || {
            verdict_tests::engines::psycopg_read(&dsn, mode, rows, 5_000)
        })
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("psycopg {mode}: {e}"));
        assert_eq!(read.rows, rows, "psycopg {mode}");
        assert_eq!(read.sum, rows * (rows + 1) / 2, "psycopg {mode}");
        println!("psycopg {mode}: {rows} rows in {:.1} s", read.seconds);
        tally(true);
        settled(&engine, places, mode).await;
    }

    // 6. A user's mistake is a 4xx of its kind in few words, with its SQLSTATE over pg.
    for (sql, kind, says, sqlstate) in [
        (
            "SELECT regexp_like('a', '(')",
            "invalid_query",
            "the regular expression does not compile: unclosed group",
            "2201B",
        ),
        (
            "SELECT regexp_replace('a', '(?=a)', 'b')",
            "invalid_query",
            "the regular expression does not compile: look-around",
            "2201B",
        ),
        (
            "SELECT to_timestamp('2026/13/45')",
            "invalid_query",
            "2026/13/45",
            "22P02",
        ),
        ("SELECT * FROM nope", "invalid_query", "nope", "42P01"),
        (
            "SELECT nope FROM decisions",
            "invalid_query",
            "nope",
            "42703",
        ),
        ("SELECT (1", "invalid_query", "sql parser error", "42601"),
        (
            "SELECT value + 9223372036854775807 AS v FROM generate_series(1, 2)",
            "invalid_query",
            "Overflow",
            "22003",
        ),
        // Folded while planning, and summed.
        (
            "SELECT 9223372036854775807 + 1 AS v",
            "invalid_query",
            "integer overflow: 9223372036854775807 + 1",
            "22003",
        ),
        (
            "SELECT SUM(value + 4611686018427387904) AS v FROM generate_series(1, 2)",
            "invalid_query",
            "integer overflow: SUM",
            "22003",
        ),
        (
            "SELECT value % 2 AS g, SUM(value * 2305843009213693952) AS v \
             FROM generate_series(1, 8) GROUP BY value % 2",
            "invalid_query",
            "overflow",
            "22003",
        ),
    ] {
        let (status, v) = post_sql(&base, sql).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{sql}: {v}");
        assert_eq!(v["error"]["kind"], kind, "{sql}: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{sql}: {v}");
        assert!(
            !message.contains("Error(") && !message.contains("Syntax("),
            "{sql}: {v}"
        );
        let (client, _connection) = driver(pg).await;
        let err = client.query(sql, &[]).await.unwrap_err();
        tally(false);
        let db = err.as_db_error().expect("a database error");
        assert_eq!(db.code().code(), sqlstate, "{sql}: {db:?}");
    }
    // A 60 KB identifier is not echoed back whole.
    let long = format!("SELECT * FROM t{}", "x".repeat(60_000));
    let (status, v) = post_sql(&base, &long).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.chars().count() < 400,
        "{} characters",
        message.len()
    );
    // A parameter /v1/sql does not take is named; a media type's case does not matter.
    let post = |query: &'static str, content_type: &'static str, body: &'static str| {
        http(Duration::from_secs(10))
            .post(format!("{base}/v1/sql{query}"))
            .bearer_auth(TOKEN)
            .header("content-type", content_type)
            .body(body)
            .send()
    };
    let r = post("?VERSION=1", "text/plain", "SELECT 1 AS one")
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    tally(false);
    let v: Value = r.json().await.unwrap();
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("no parameter \"VERSION\""), "{v}");
    let r = post("", "APPLICATION/JSON", r#"{"sql": "SELECT 1 AS one"}"#)
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    tally(true);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["rows"][0]["one"], 1, "{v}");

    // 8. Memory no pool sees is counted where it is allocated: a cross join whose build
    // side grows row by row, an aggregate's state, a huge value a function would build in
    // one call, a statement whose WITH queries double themselves. Each is refused by name on
    // both front ends, with its SQLSTATE over pg.
    let doubling = |levels: usize, join: bool| {
        let mut sql = String::from("WITH c0 AS (SELECT 1 AS v)");
        for i in 1..=levels {
            let j = i - 1;
            if join {
                sql += &format!(", c{i} AS (SELECT a.v FROM c{j} a JOIN c{j} b ON a.v = b.v)");
            } else {
                sql += &format!(", c{i} AS (SELECT v FROM c{j} UNION ALL SELECT v FROM c{j})");
            }
        }
        sql + &format!(" SELECT COUNT(*) AS n FROM c{levels}")
    };
    // (A bare COUNT(*) over the cross join is answered from the tables' row counts; a
    // condition across them makes it run, each join holding the product before it.)
    let cross = format!(
        "SELECT COUNT(*) AS n FROM {} WHERE p0.capacity + p15.capacity > 0",
        (0..16)
            .map(|i| format!("policies p{i}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let counted = [
        (
            "SELECT cardinality(array_agg(concat(repeat('x', 1000), value))) AS n \
             FROM generate_series(1, 1000000)"
                .to_owned(),
            "memory_limit",
            "memory limit of 64 MiB",
            "53200",
        ),
        (
            "SELECT cardinality(array_resize(make_array(1), 1000000000)) AS n".to_owned(),
            "value_too_large",
            "array_resize() would make",
            "54000",
        ),
        (
            "SELECT COUNT(*) AS n FROM unnest(array_resize(make_array(1), 1000000000))".to_owned(),
            "value_too_large",
            "array_resize() would make",
            "54000",
        ),
        (
            "SELECT length(regexp_replace(repeat('x', 8000), 'x', repeat('y', 8000), 'g')) AS n"
                .to_owned(),
            "value_too_large",
            "regexp_replace() would make",
            "54000",
        ),
        (
            "SELECT length(replace(repeat('ab', 4000), 'a', repeat('y', 8000))) AS n".to_owned(),
            "value_too_large",
            "replace() would make",
            "54000",
        ),
        (
            doubling(24, false),
            "query_too_large",
            "table references once its WITH queries are written out",
            "54000",
        ),
        (
            format!("EXPLAIN {}", doubling(20, true)),
            "query_too_large",
            "table references once its WITH queries are written out",
            "54000",
        ),
    ];
    for (sql, kind, says, sqlstate) in &counted {
        let (status, v) = post_sql(&base, sql).await;
        assert!(status.is_client_error(), "{sql}: {status} {v}");
        assert_eq!(v["error"]["kind"], *kind, "{sql}: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{sql}: {v}");
        settled(&engine, places, kind).await;
        let (client, _connection) = driver(pg).await;
        let err = client.query(sql.as_str(), &[]).await.unwrap_err();
        tally(false);
        let db = err.as_db_error().expect("a database error");
        assert_eq!(db.code().code(), *sqlstate, "{sql}: {db:?}");
        assert!(db.message().contains(says), "{sql}: {db:?}");
        settled(&engine, places, kind).await;
    }
    // The cross join stops at whichever limit it meets first: its memory or its time.
    let (status, v) = post_sql(&base, &cross).await;
    assert!(status.is_client_error(), "{status} {v}");
    let kind = v["error"]["kind"].as_str().unwrap_or_default().to_owned();
    assert!(kind == "memory_limit" || kind == "time_limit", "{v}");
    settled(&engine, places, &kind).await;
    let (client, _connection) = driver(pg).await;
    let err = client.query(cross.as_str(), &[]).await.unwrap_err();
    tally(false);
    let code = err
        .as_db_error()
        .expect("a database error")
        .code()
        .code()
        .to_owned();
    assert!(code == "53200" || code == "57014", "{err:?}");
    settled(&engine, places, &kind).await;
    // A chain of WITH queries within the limit plans and answers.
    let (status, v) = post_sql(&base, &doubling(8, false)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["rows"][0]["n"], 256, "{v}");
    still_serving(&base, pg, "the memory no pool sees").await;

    // 7. An extreme report date is a named 400, not a dropped connection.
    let r = http(Duration::from_secs(10))
        .get(format!("{base}/v1/reports/top-denied?to=-262143-01-01"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"].as_str().unwrap().contains("to"),
        "{v}"
    );
    tally(false);
    still_serving(&base, pg, "the whole suite").await;

    let peak = status_bytes("VmHWM:");
    let (answered, refused) = (
        ANSWERED.load(Ordering::Relaxed),
        REFUSED.load(Ordering::Relaxed),
    );
    println!(
        "{} cases: {refused} refused, {answered} answered; peak memory {} MiB; before the suite {} MiB; shared budget {} MiB",
        answered + refused,
        peak >> 20,
        before >> 20,
        BUDGET >> 20
    );
    assert!(
        peak < before + BUDGET,
        "the process peaked at {} MiB, more than the {} MiB it held before plus the {} MiB budget",
        peak >> 20,
        before >> 20,
        BUDGET >> 20
    );
}
