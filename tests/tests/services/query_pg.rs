//! The query service over the PostgreSQL wire protocol, driven by Debian's `psql`: a named
//! report's SQL runs over the wire, writes are refused, and the token is the password.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Command, Output};

use verdict_query::Limits;
use verdict_tests::query_fixture::{known_engine, pg_driver};

const TOKEN: &str = "pg-token-7";

fn psql(addr: SocketAddr, password: &str, sql: &str) -> Output {
    Command::new("psql")
        .env("PGPASSWORD", password)
        .env("PGCONNECT_TIMEOUT", "10")
        .args(["-h", "127.0.0.1", "-p", &addr.port().to_string(), "-U", "analyst", "-d", "verdict"])
        .args(["-X", "-A", "-t", "-F", ",", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()
        .unwrap_or_else(|e| {
            panic!("running psql: {e}. It comes with Debian's postgresql-client: start the services with `scripts/services.sh up`, which installs it")
        })
}

/// Runs `sql` through psql on a blocking thread and fails the test if psql fails.
async fn psql_ok(addr: SocketAddr, sql: &'static str) {
    let out = tokio::task::spawn_blocking(move || psql(addr, TOKEN, sql))
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_runs_a_report_over_the_wire_protocol_read_only_and_behind_the_token() {
    let (engine, _store, _dir) = known_engine("pg", Limits::default()).await;
    let params: BTreeMap<String, String> = [
        ("from".to_string(), "2026-11-30T10:00:00Z".to_string()),
        ("to".to_string(), "2026-11-30T11:00:00Z".to_string()),
        ("min_keys".to_string(), "5".to_string()),
    ]
    .into();
    let sql = engine
        .report_sql(
            "wrong-limits",
            &params,
            verdict_query::reports::Form::Served,
        )
        .await
        .unwrap();
    let sql = format!(
        "SELECT tier, route_class, keys, constrained_keys, verdict FROM ({sql}) AS r \
         ORDER BY tier_id, override_key NULLS FIRST"
    );
    let (addr, _task) = verdict_query::pg::serve(
        &engine,
        vec![TOKEN.to_string()],
        SocketAddr::from(([127, 0, 0, 1], 0)),
    )
    .await
    .expect("the PostgreSQL listener binds");

    let out = tokio::task::spawn_blocking(move || psql(addr, TOKEN, &sql))
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "psql failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [
            "tight,read,9,9,too low",
            "tight,read,1,1,too low",
            "roomy,read,5,0,too high",
            "trial,read,20,1,fine",
            "steady,read,20,1,fine",
        ],
        "{stdout}"
    );

    let out = tokio::task::spawn_blocking(move || psql(addr, TOKEN, "DROP TABLE decisions"))
        .await
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(stderr.contains("read-only"), "{stderr}");
    let out =
        tokio::task::spawn_blocking(move || psql(addr, TOKEN, "SELECT COUNT(*) FROM overage"))
            .await
            .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "1",
        "the table is still whole"
    );

    let out = tokio::task::spawn_blocking(move || {
        psql(
            addr,
            TOKEN,
            "SELECT * FROM decisions ORDER BY key_id, event_time LIMIT 1",
        )
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "SELECT * FROM decisions: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(",\\xa0000000000000000000000000"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // pg_catalog, which tools browse, answers (pg_roles once overflowed the stack and took
    // the whole process down), and the service answers after it.
    for sql in [
        "SELECT * FROM pg_catalog.pg_roles",
        "SELECT COUNT(*) FROM pg_catalog.pg_class",
        "SELECT COUNT(*) FROM pg_catalog.pg_namespace",
    ] {
        psql_ok(addr, sql).await;
    }

    // Read-only and isolated: SELECT … INTO, CREATE and a SET of the engine's options are
    // refused; a SET a client sends by itself is answered and changes nothing.
    for (sql, what) in [
        ("SELECT tier INTO t FROM decisions", "SELECT … INTO"),
        (
            "WITH x AS (SELECT 1 AS one) SELECT one INTO t2 FROM x",
            "SELECT … INTO",
        ),
        ("CREATE TABLE t3 AS SELECT 1", "read-only"),
        (
            "SET datafusion.execution.batch_size = 1",
            "SET \"datafusion.execution.batch_size\" is refused",
        ),
        ("SET datafusion.runtime.memory_limit = '2M'", "is refused"),
    ] {
        let out = tokio::task::spawn_blocking(move || psql(addr, TOKEN, sql))
            .await
            .unwrap();
        assert!(!out.status.success(), "{sql} was not refused");
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(stderr.contains(what), "{sql}: {stderr}");
    }
    for sql in ["SET client_encoding = 'UTF8'", "SET DateStyle = 'ISO'"] {
        psql_ok(addr, sql).await;
    }
    // No table was made by any of them, for this connection or another.
    let out = tokio::task::spawn_blocking(move || psql(addr, TOKEN, "SELECT COUNT(*) FROM t"))
        .await
        .unwrap();
    assert!(!out.status.success());

    // The extended protocol (a driver's prepared statements), read-only the same way.
    let (client, _connection) = pg_driver(addr, TOKEN).await;
    let rows = client
        .query("SELECT COUNT(*) AS n FROM overage", &[])
        .await
        .expect("a query over the extended protocol");
    assert_eq!(rows.len(), 1);
    // Key ids are bytea on the wire: the main table shows in a driver as in psql.
    let rows = client
        .query(
            "SELECT key_id, tier FROM decisions ORDER BY key_id LIMIT 2",
            &[],
        )
        .await
        .expect("key ids over the extended protocol");
    let key: Vec<u8> = rows[0].get(0);
    assert_eq!(key.len(), 16);
    // A self join's two key ids are two bytea columns.
    let rows = client
        .query(
            "SELECT a.key_id, b.key_id, a.tier FROM decisions a JOIN decisions b \
             ON a.key_id = b.key_id AND a.event_time = b.event_time ORDER BY a.key_id LIMIT 1",
            &[],
        )
        .await
        .expect("a self join of the decisions over the extended protocol");
    let (left, right): (Vec<u8>, Vec<u8>) = (rows[0].get(0), rows[0].get(1));
    assert_eq!((left.len(), &left), (16, &right));
    let err = client
        .query("SELECT tier INTO t4 FROM decisions", &[])
        .await
        .unwrap_err();
    assert!(format!("{err:?}").contains("SELECT … INTO"), "{err:?}");

    let out = tokio::task::spawn_blocking(move || psql(addr, "wrong", "SELECT 1"))
        .await
        .unwrap();
    assert!(!out.status.success(), "a wrong token is refused");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        stderr
            .to_lowercase()
            .contains("password authentication failed"),
        "{stderr}"
    );
}
