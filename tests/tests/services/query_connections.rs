//! The query service's connections are bounded on both front ends (on the known lake in the
//! real S3 server): idle connections, however many, do not shut a working client out (the
//! one idle longest gives its place to a new one), an idle connection is closed after the
//! idle timeout (a PostgreSQL one that sends no startup message too), and when every
//! connection is busy a new one is refused in words (HTTP 503 `too_many_connections`,
//! SQLSTATE 53300).

use std::net::SocketAddr;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use verdict_query::Limits;
use verdict_tests::query_fixture::{known_engine, pg_driver, serve_both};

const TOKEN: &str = "connections-token";
/// Connections each front end keeps open.
const PLACES: usize = 8;
/// How long one may wait for its next request.
const IDLE: Duration = Duration::from_secs(2);
/// Runs until stopped (the service's time limit is a minute).
const ENDLESS: &str = "SELECT COUNT(*) AS n FROM generate_series(1, 1000000) AS a, \
    generate_series(1, 1000000) AS b WHERE a.value <> b.value";

async fn count(base: &str) -> Result<(StatusCode, Value), reqwest::Error> {
    let r = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
        .post(format!("{base}/v1/sql"))
        .bearer_auth(TOKEN)
        .body("SELECT COUNT(*) AS n FROM decisions")
        .send()
        .await?;
    let status = r.status();
    Ok((status, r.json().await?))
}

/// Waits (`within` at most) until `running` queries hold a place in the budget.
async fn until_running(
    engine: &verdict_query::Engine,
    running: usize,
    within: Duration,
    what: &str,
) {
    let started = std::time::Instant::now();
    while PLACES - engine.budget().slots() != running {
        assert!(
            started.elapsed() < within,
            "{what}: {} of the {PLACES} places taken after {within:?}, not {running}",
            PLACES - engine.budget().slots()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (half a minute at most) until a query runs in each of the budget's places: each
/// connection's request has been read and its query admitted, so every connection is
/// busy. Running on the two cores the queries keep busy, the last ones can take seconds
/// to get there.
async fn all_running(engine: &verdict_query::Engine) {
    until_running(
        engine,
        PLACES,
        Duration::from_secs(30),
        "every connection's query",
    )
    .await;
}

/// Whether the peer closed `stream` (reads end), within `within`.
async fn closed_within(stream: &mut tokio::net::TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 512];
    loop {
        match tokio::time::timeout(within, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_give_way_and_busy_ones_are_refused_in_words() {
    // A place in the budget for each connection's query: every connection can be running
    // one, and the test can tell when all of them are.
    let limits = Limits {
        connections: PLACES,
        idle: IDLE,
        memory_bytes: 64 << 20,
        budget_bytes: PLACES * (64 << 20),
        ..Limits::default()
    };
    let (engine, _store, _dir) = known_engine("connections", limits).await;
    let (base, pg) = serve_both(&engine, TOKEN).await;
    let http_addr: SocketAddr = base.trim_start_matches("http://").parse().unwrap();

    // Fifty idle connections, six times the places: each new one takes the place of the
    // one idle longest, and a working client is still answered.
    let mut idle = Vec::new();
    for _ in 0..50 {
        idle.push(tokio::net::TcpStream::connect(http_addr).await.unwrap());
    }
    let (status, v) = count(&base)
        .await
        .expect("answered past fifty idle connections");
    assert_eq!(status, StatusCode::OK, "{v}");
    // The first ones were closed to make room.
    assert!(closed_within(&mut idle[0], Duration::from_secs(1)).await);
    drop(idle);

    // An idle connection is closed after the idle timeout (hyper's header read timeout),
    // and one that sends half a head too.
    let mut quiet = tokio::net::TcpStream::connect(http_addr).await.unwrap();
    assert!(!closed_within(&mut quiet, IDLE / 2).await, "closed early");
    assert!(closed_within(&mut quiet, IDLE * 2).await, "still open");
    let mut slow = tokio::net::TcpStream::connect(http_addr).await.unwrap();
    slow.write_all(b"POST /v1/sql HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    assert!(
        closed_within(&mut slow, IDLE * 2).await,
        "a slow head kept it open"
    );

    // Every place busy with a running query: the next connection is refused in words.
    let mut running = Vec::new();
    for _ in 0..PLACES {
        let base = base.clone();
        running.push(tokio::spawn(async move {
            reqwest::Client::new()
                .post(format!("{base}/v1/sql"))
                .bearer_auth(TOKEN)
                .body(ENDLESS)
                .send()
                .await
        }));
    }
    all_running(&engine).await;
    let (status, v) = count(&base)
        .await
        .expect("a refusal, not a dropped connection");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert_eq!(v["error"]["kind"], "too_many_connections", "{v}");
    for r in running {
        r.abort();
    }
    // A client gone, its query stops and gives its place back.
    until_running(&engine, 0, Duration::from_secs(10), "their clients gone").await;

    // The PostgreSQL front end: a connection that sends no startup message is closed after
    // the idle timeout too.
    let mut quiet = tokio::net::TcpStream::connect(pg).await.unwrap();
    assert!(!closed_within(&mut quiet, IDLE / 2).await, "closed early");
    assert!(closed_within(&mut quiet, IDLE * 2).await, "still open");

    // Idle sessions give way to a new one, which answers.
    let mut sessions = Vec::new();
    for _ in 0..PLACES {
        sessions.push(pg_driver(pg, TOKEN).await);
    }
    let (client, _connection) = pg_driver(pg, TOKEN).await;
    let row = client
        .query_one("SELECT COUNT(*) FROM decisions", &[])
        .await
        .expect("a new session answers past the idle ones");
    assert!(row.get::<_, i64>(0) > 0);
    let (oldest, _) = &sessions[0];
    let err = oldest
        .query_one("SELECT 1", &[])
        .await
        .expect_err("the session idle longest was closed to make room");
    assert!(err.is_closed(), "{err:?}");
    drop(sessions);
    drop(client);

    // Every session busy: the next is told so (53300) before anything else.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut busy = Vec::new();
    for _ in 0..PLACES {
        let (client, connection) = pg_driver(pg, TOKEN).await;
        busy.push((
            tokio::spawn(async move { client.query(ENDLESS, &[]).await }),
            connection,
        ));
    }
    all_running(&engine).await;
    let refused = tokio_postgres::connect(
        &format!(
            "host=127.0.0.1 port={} user=analyst password={TOKEN} dbname=verdict",
            pg.port()
        ),
        tokio_postgres::NoTls,
    )
    .await
    .map(|_| ())
    .expect_err("every session is busy");
    let db = refused.as_db_error().expect("a database error");
    assert_eq!(db.code().code(), "53300", "{db:?}");
    assert!(db.message().contains("too many clients"), "{db:?}");
    for (query, connection) in busy {
        query.abort();
        connection.abort();
    }
}
