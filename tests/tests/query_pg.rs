//! The query service over the PostgreSQL wire protocol, driven by Debian's `psql`: a named
//! report's SQL runs over the wire, writes are refused, and the token is the password.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Command, Output};

use verdict_query::Limits;
use verdict_tests::query_fixture::known_engine;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_runs_a_report_over_the_wire_protocol_read_only_and_behind_the_token() {
    let (engine, _store, _dir) = known_engine("pg", Limits::default()).await;
    let params: BTreeMap<String, String> = [
        ("from".to_string(), "2026-11-30T10:00:00Z".to_string()),
        ("to".to_string(), "2026-11-30T11:00:00Z".to_string()),
    ]
    .into();
    let sql = engine.report_sql("wrong-limits", &params).await.unwrap();
    let sql = format!(
        "SELECT tier, route_class, keys, keys_refused, verdict FROM ({sql}) AS r ORDER BY tier_id"
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
            "tight,read,10,10,too low",
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
