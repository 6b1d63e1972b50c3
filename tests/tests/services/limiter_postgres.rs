//! The PostgreSQL policy source against the real PostgreSQL: the schema and its version
//! trigger, a change in force within 30 s, invalid rows refused with row and field named,
//! and a stopped database leaving the last policy in force.

use std::sync::Arc;
use std::time::{Duration, Instant};

use verdict_limiter::{
    Clock, LimiterMetrics, PolicyHandle, PolicySource, SystemClock, spawn_refresher,
};
use verdict_policy_store::PgSource;
use verdict_tests::private::PrivatePostgres;
use verdict_tests::{eventually, fresh_database};

const SEED: &str = "
insert into verdict_policy.tiers (id, name) values (0, 'free'), (1, 'pro');
insert into verdict_policy.route_classes (id, name, prefixes) values (0, 'read', '{/v1/items}'), (1, 'write', '{}');
insert into verdict_policy.limits values ('free', '*', 10, 1.0, 100, 'enforce'), ('pro', '*', 100, 10.0, 10000, 'shadow');
insert into verdict_policy.overrides values ('0000000000000000000000000000000a', 'write', 50, 5.0, 500, null);
insert into verdict_policy.hot_keys values ('0000000000000000000000000000000b', 8);
";

async fn seeded(url: &str) -> (PgSource, tokio_postgres::Client) {
    let source = PgSource::new(url);
    source.migrate().await.expect("migrate");
    source
        .migrate()
        .await
        .expect("a second migrate is harmless");
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    client.batch_execute(SEED).await.expect("seed");
    (source, client)
}

/// Runs one statement without parameters.
async fn run(c: &tokio_postgres::Client, sql: &str) {
    c.execute(sql, &[]).await.unwrap();
}

async fn version(c: &tokio_postgres::Client) -> i64 {
    c.query_one("select version from verdict_policy.meta", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn every_change_raises_the_version_and_the_rows_load_as_a_policy() {
    let url = fresh_database("policy_rows").await;
    let (source, client) = seeded(&url).await;
    let v0 = version(&client).await;
    run(
        &client,
        "update verdict_policy.limits set capacity = 20 where tier = 'free'",
    )
    .await;
    let v1 = version(&client).await;
    run(&client, "update verdict_policy.meta set kill_switch = true").await;
    let v2 = version(&client).await;
    run(&client, "delete from verdict_policy.hot_keys").await;
    let v3 = version(&client).await;
    assert!(v0 < v1 && v1 < v2 && v2 < v3, "{v0} {v1} {v2} {v3}");

    let snapshot = source.load().await.expect("load");
    assert_eq!(snapshot.version(), v3 as u64);
    assert!(snapshot.kill_switch());
    let doc = snapshot.document();
    assert_eq!(
        (
            doc.tiers.len(),
            doc.route_classes.len(),
            doc.limits.len(),
            doc.overrides.len()
        ),
        (2, 2, 2, 1)
    );
    assert_eq!(doc.route_classes[0].prefixes, vec!["/v1/items".to_string()]);
    assert_eq!(
        doc.limits
            .iter()
            .find(|l| l.tier == "free")
            .unwrap()
            .capacity,
        20
    );
}

#[tokio::test]
async fn a_change_is_in_force_within_30_s_and_a_bad_row_keeps_the_last_policy() {
    let url = fresh_database("policy_refresh").await;
    let Polling {
        client,
        handle,
        metrics,
        task,
    } = polling(&url, Duration::from_secs(1)).await;

    let before = handle.load().version();
    let changed = Instant::now();
    let want = change_in_force_within_30_s(&client, &handle, 200).await;
    assert!(want > before);
    println!("policy change in force after {:?}", changed.elapsed());

    // A row that does not validate: refused, counted, the last policy stays.
    run(
        &client,
        "update verdict_policy.limits set mode = 'enforced' where tier = 'pro'",
    )
    .await;
    eventually(Duration::from_secs(30), "the bad row reported", || async {
        metrics
            .render()
            .contains("verdict_policy_reload_errors_total 1")
    })
    .await;
    assert_eq!(handle.load().version(), want);
    task.abort();
}

#[tokio::test]
async fn invalid_rows_are_named_with_their_field() {
    let url = fresh_database("policy_invalid").await;
    let (source, client) = seeded(&url).await;
    run(
        &client,
        "update verdict_policy.limits set mode = 'enforced' where tier = 'pro'",
    )
    .await;
    let e = source.load().await.unwrap_err().to_string();
    assert_eq!(
        e,
        "policy limits row (tier=pro, route_class=*): mode: unknown mode \"enforced\" (expected enforce, shadow or off)"
    );
    run(
        &client,
        "update verdict_policy.limits set mode = 'shadow', refill_per_s = 0 where tier = 'pro'",
    )
    .await;
    let e = source.load().await.unwrap_err().to_string();
    assert!(
        e.starts_with("policy limits[1] (tier=pro, route_class=*): refill_per_s:"),
        "{e}"
    );
    client.batch_execute("update verdict_policy.limits set refill_per_s = 1; update verdict_policy.overrides set key_id = 'xyz'").await.unwrap();
    let e = source.load().await.unwrap_err().to_string();
    assert!(
        e.contains("overrides row (key_id=xyz, route_class=write): key_id"),
        "{e}"
    );
}

/// Sets the free tier's hourly quota, and waits (30 s at most) until the version it made
/// is the one in force; returns that version.
async fn change_in_force_within_30_s(
    client: &tokio_postgres::Client,
    handle: &PolicyHandle,
    hourly_quota: i64,
) -> u64 {
    client
        .execute(
            "update verdict_policy.limits set hourly_quota = $1 where tier = 'free'",
            &[&hourly_quota],
        )
        .await
        .unwrap();
    let want = version(client).await as u64;
    eventually(Duration::from_secs(30), "the change in force", || async {
        handle.load().version() == want
    })
    .await;
    want
}

/// A seeded policy store polled every 200 ms.
struct Polling {
    client: tokio_postgres::Client,
    handle: PolicyHandle,
    metrics: Arc<LimiterMetrics>,
    task: tokio::task::JoinHandle<()>,
}

/// A seeded database and a gateway's policy polling it `every` interval.
async fn polling(url: &str, every: Duration) -> Polling {
    let (source, client) = seeded(url).await;
    let source: Arc<dyn PolicySource> = Arc::new(source);
    let handle = PolicyHandle::new(source.load().await.unwrap(), SystemClock.now_ms());
    let metrics = Arc::new(LimiterMetrics::new());
    let task = spawn_refresher(
        source,
        handle.clone(),
        Arc::clone(&metrics),
        Arc::new(SystemClock),
        every,
    );
    Polling {
        client,
        handle,
        metrics,
        task,
    }
}

#[tokio::test]
async fn a_stopped_database_leaves_the_last_policy_in_force_and_ages_it() {
    let mut pg = PrivatePostgres::start();
    let Polling {
        client: _client,
        handle,
        metrics,
        task,
    } = polling(&pg.url(), Duration::from_millis(200)).await;
    let version = handle.load().version();
    pg.stop();
    eventually(
        Duration::from_secs(30),
        "a reload error counted and the policy ageing",
        || async {
            let m = metrics.render();
            !m.contains("verdict_policy_reload_errors_total 0")
                && !m.contains("verdict_policy_age_seconds 0")
        },
    )
    .await;
    assert_eq!(
        handle.load().version(),
        version,
        "the last policy stays in force"
    );
    assert_eq!(handle.load().document().tiers.len(), 2);
    task.abort();
}

/// A database that hangs (SIGSTOP: connections open, nothing answers) rather than stops:
/// each refresh is given up on at its deadline and counted, the age grows, the last policy
/// stays; after it resumes, a change is in force within 30 s.
#[tokio::test]
async fn a_hung_database_is_timed_out_and_a_change_after_it_resumes_is_taken() {
    let pg = PrivatePostgres::start();
    let Polling {
        client,
        handle,
        metrics,
        task,
    } = polling(&pg.url(), Duration::from_millis(200)).await;
    let before = handle.load().version();
    pg.hang();
    let metric = |name: &str| -> i64 {
        let m = metrics.render();
        m.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(0)
    };
    eventually(
        Duration::from_secs(30),
        "refreshes timed out and the policy 3 s old",
        || async {
            metric("verdict_policy_reload_errors_total ") >= 2
                && metric("verdict_policy_age_seconds ") >= 3
        },
    )
    .await;
    assert_eq!(handle.load().version(), before, "the last policy stays");

    pg.resume();
    let resumed = Instant::now();
    let want = change_in_force_within_30_s(&client, &handle, 300).await;
    assert!(want > before);
    println!(
        "after the database resumed, the change was in force in {:?}",
        resumed.elapsed()
    );
    task.abort();
}
