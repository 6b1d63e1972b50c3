//! `verdict policy` against the real PostgreSQL, with two limiters ("gateways") polling the
//! same store: a limit lowered, a tier put back to shadow (rollback level one) and the kill
//! switch (level three) are each in force on both within the poll interval; bad input
//! exits non-zero naming the field, and writes nothing.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use verdict_limiter::{
    Limiter, LimiterConfig, LimiterMetrics, MemoryStore, PolicyHandle, PolicySource, Request,
    SystemClock, event_queue, spawn_refresher,
};
use verdict_policy_store::PgSource;
use verdict_schemas::{DecisionSource, KeyId, RouteClassId, TierId, Verdict};
use verdict_tests::{eventually, fresh_database};

const SEED: &str = "
insert into verdict_policy.tiers (id, name) values (0, 'free'), (1, 'pro');
insert into verdict_policy.route_classes (id, name, prefixes) values (0, 'read', '{/v1}');
insert into verdict_policy.limits values ('free', '*', 5, 0.001, 1000, 'enforce'), ('pro', '*', 100, 10.0, 10000, 'enforce');
";

fn verdict(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_verdict"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run verdict");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn gateway(url: &str) -> Limiter<MemoryStore> {
    let source: Arc<dyn PolicySource> = Arc::new(PgSource::new(url));
    let handle = PolicyHandle::new(source.load().await.unwrap(), 0);
    let metrics = Arc::new(LimiterMetrics::new());
    spawn_refresher(
        source,
        handle.clone(),
        Arc::clone(&metrics),
        Arc::new(SystemClock),
        Duration::from_millis(200),
    );
    let (queue, _events) = event_queue(10_000, Arc::clone(&metrics));
    Limiter::new(
        MemoryStore::new(10_000),
        handle,
        queue,
        metrics,
        LimiterConfig::default(),
    )
}

/// How many of `n` requests of a fresh key are refused, and the last decision's source and
/// verdict.
async fn probe(l: &Limiter<MemoryStore>, n: usize) -> (usize, DecisionSource, Verdict) {
    let mut key = [0u8; 16];
    key[0] = rand_byte();
    let key_id = KeyId(key);
    let mut refused = 0;
    let mut last = None;
    for _ in 0..n {
        let d = l
            .check(&Request {
                key_id,
                route_class: RouteClassId(0),
                tier: TierId(0),
                caller: b"",
            })
            .await;
        refused += usize::from(d.verdict == Verdict::Denied);
        last = Some((d.source, d.verdict));
    }
    let (s, v) = last.unwrap();
    (refused, s, v)
}

fn rand_byte() -> u8 {
    use std::sync::atomic::{AtomicU8, Ordering};
    static N: AtomicU8 = AtomicU8::new(1);
    N.fetch_add(1, Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_level_of_rollback_is_in_force_on_every_gateway_within_the_poll() {
    let url = fresh_database("policy_cmds").await;
    // `verdict policy <command> --policy-postgres <url> <more>`.
    let policy = |command: &str, more: &[&str]| {
        verdict(&[&["policy", command, "--policy-postgres", &url], more].concat())
    };
    let pg = PgSource::new(&url);
    pg.migrate().await.unwrap();
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client.batch_execute(SEED).await.unwrap();
    let gateways = [gateway(&url).await, gateway(&url).await];
    for g in &gateways {
        assert_eq!(probe(g, 8).await.0, 3, "capacity 5 of 8");
    }

    // Bad input: exit status non-zero, the field named, nothing written.
    let (ok, _, err) = policy("set-limit", &["--tier", "free", "--refill-per-s=-1"]);
    assert!(!ok);
    assert!(err.contains("refill_per_s: must be 0.001"), "{err}");
    let (ok, _, err) = policy("set-mode", &["--tier", "gold", "--mode", "shadow"]);
    assert!(!ok);
    assert!(err.contains("no such tier"), "{err}");
    let (ok, out, _) = policy("show", &[]);
    assert!(ok);
    assert!(
        out.contains("free           *                       5"),
        "{out}"
    );

    // Level two: free's capacity lowered to 2.
    let (ok, out, err) = policy("set-limit", &["--tier", "free", "--capacity", "2"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("tier free, route class *: capacity 2"),
        "{out}"
    );
    let started = Instant::now();
    for g in &gateways {
        eventually(
            Duration::from_secs(30),
            "the lower limit in force",
            || async { probe(g, 8).await.0 == 6 },
        )
        .await;
    }
    eprintln!(
        "limit change in force on both gateways after {:?}",
        started.elapsed()
    );

    // Level one: free back to shadow: nothing refused, would-deny recorded.
    let (ok, out, err) = policy("set-mode", &["--tier", "free", "--mode", "shadow"]);
    assert!(ok, "{err}");
    assert!(out.contains("is now shadow"), "{out}");
    for g in &gateways {
        eventually(Duration::from_secs(30), "shadow mode in force", || async {
            probe(g, 8).await == (0, DecisionSource::CounterStore, Verdict::WouldDeny)
        })
        .await;
    }

    // Level three: the kill switch, then off again.
    let (ok, _, err) = verdict(&["policy", "kill-switch", "on", "--policy-postgres", &url]);
    assert!(ok, "{err}");
    for g in &gateways {
        eventually(
            Duration::from_secs(30),
            "the kill switch in force",
            || async { probe(g, 8).await == (0, DecisionSource::KillSwitch, Verdict::Allowed) },
        )
        .await;
    }
    let (ok, _, err) = verdict(&["policy", "kill-switch", "off", "--policy-postgres", &url]);
    assert!(ok, "{err}");
    for g in &gateways {
        eventually(Duration::from_secs(30), "the kill switch off", || async {
            probe(g, 8).await.1 == DecisionSource::CounterStore
        })
        .await;
    }
}
