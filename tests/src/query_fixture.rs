//! A lake with known answers for the query service's tests: four tiers whose limits are
//! wrong in known ways, written as raw files, rolled up and turned into overage the way
//! the pipeline does it.
//!
//! Hour 10:00 (policy version 1) and hour 11:00 (version 2) of 2026-11-30, route class
//! `read`:
//! - `tight` (enforce): 10 keys, each 10 allowed and 10 refused by the bucket: every key
//!   refused, so its limit is **too low**. One of its keys has an override.
//! - `roomy` (enforce): 5 keys, each 10 allowed out of a quota of 1000: nobody comes near,
//!   so its limit is **too high**. Its first key's decisions in region 1 are 5 made by the
//!   local fallback, and 3 by the kill switch in region 2: the only degraded decisions.
//! - `trial` (shadow): 20 keys, each 15 allowed (quota 20); one key is refused 10 times by
//!   the bucket, as would-deny: the only **shadow** impact.
//! - `steady` (enforce): 20 keys, each 60 allowed (quota 100); one key spends its quota
//!   and is refused 5 times by the window: the only key **over quota** (overage). In hour
//!   11, under version 2, every key is refused half the time: the **policy change** that
//!   jumped.

use std::path::PathBuf;
use std::sync::Arc;

use object_store::ObjectStore;
use verdict_jobs::overage;
use verdict_query::reports::Form;
use verdict_rollup::Rollup;
use verdict_schemas::layout::HourPartition;
use verdict_schemas::{
    DecisionEvent, DecisionSource, DeniedBy, KeyId, RegionId, RouteClassId, TierId, Verdict,
};

use crate::rollup_check::write_raw_hour;

/// 2026-11-30T10:00:00Z.
pub const HOUR_10_MS: i64 = 1_796_032_800_000;
/// The known tiers' ids.
pub const TIGHT: u8 = 0;
/// See the module documentation.
pub const ROOMY: u8 = 1;
/// See the module documentation.
pub const TRIAL: u8 = 2;
/// See the module documentation.
pub const STEADY: u8 = 3;

/// The policy the lake was decided under (version 2; `tight`'s first key has an override).
pub const POLICY_TOML: &str = include_str!("../fixtures/policies/query_lake.toml");

/// The key id of key `n` of tier `tier`: `a0`, 13 zero bytes, the tier, then `n`.
pub fn key(tier: u8, n: u8) -> KeyId {
    let mut k = [0u8; 16];
    k[0] = 0xa0;
    k[14] = tier;
    k[15] = n;
    KeyId(k)
}

/// `key` as the 32 hex digits the API takes and prints.
pub fn key_hex(tier: u8, n: u8) -> String {
    hex::encode(key(tier, n).0)
}

/// The steady key that goes over its quota.
pub const STEADY_OVER: u8 = 7;
/// The trial key that shadow mode would refuse.
pub const TRIAL_REFUSED: u8 = 3;

/// How one decision went.
#[derive(Debug, Clone, Copy)]
struct Shape {
    verdict: Verdict,
    denied_by: DeniedBy,
    source: DecisionSource,
    region: u16,
    remaining_window: u32,
    quota: u32,
}

impl Shape {
    fn allowed(remaining_window: u32, quota: u32) -> Self {
        Self {
            verdict: Verdict::Allowed,
            denied_by: DeniedBy::NONE,
            source: DecisionSource::CounterStore,
            region: 0,
            remaining_window,
            quota,
        }
    }

    fn refused(verdict: Verdict, denied_by: DeniedBy, remaining_window: u32, quota: u32) -> Self {
        Self {
            verdict,
            denied_by,
            ..Self::allowed(remaining_window, quota)
        }
    }
}

struct Gen {
    events: Vec<DecisionEvent>,
    hour_ms: i64,
    version: u64,
}

impl Gen {
    fn new(hour_ms: i64, version: u64) -> Self {
        Self {
            events: Vec::new(),
            hour_ms,
            version,
        }
    }

    /// What both hours share first: every `tight` key 10 allowed and 10 refused by the
    /// bucket, every `roomy` key 10 allowed out of 1000.
    fn tight_and_roomy(&mut self) {
        for n in 0..10 {
            self.allowed(TIGHT, n, 10, 1000);
            self.repeat(
                TIGHT,
                n,
                10,
                Shape::refused(Verdict::Denied, BUCKET, 990, 1000),
            );
        }
        for n in 0..5 {
            self.allowed(ROOMY, n, 10, 1000);
        }
    }

    fn push(&mut self, tier: u8, n: u8, s: Shape) {
        let i = self.events.len() as i64;
        self.events.push(DecisionEvent {
            event_time_ms: self.hour_ms + (i * 997) % 3_600_000,
            key_id: key(tier, n),
            route_class: RouteClassId(0),
            tier: TierId(tier),
            region: RegionId(s.region),
            gateway_instance: 1,
            verdict: s.verdict,
            denied_by: s.denied_by,
            source: s.source,
            remaining_tokens: 0,
            remaining_window: s.remaining_window,
            retry_after_ms: if s.verdict == Verdict::Allowed {
                0
            } else {
                1000
            },
            window_quota: s.quota,
            policy_version: self.version,
            sub_key: 0,
            sub_keys: 1,
        });
    }

    /// `count` allowed decisions of a key, the window going down from `quota - 1`.
    fn allowed(&mut self, tier: u8, n: u8, count: u32, quota: u32) {
        for i in 0..count {
            self.push(tier, n, Shape::allowed(quota - 1 - i, quota));
        }
    }

    fn repeat(&mut self, tier: u8, n: u8, count: u32, shape: Shape) {
        for _ in 0..count {
            self.push(tier, n, shape);
        }
    }
}

const BUCKET: DeniedBy = DeniedBy {
    bucket: true,
    window: false,
};
const WINDOW: DeniedBy = DeniedBy {
    bucket: false,
    window: true,
};

/// The decisions of hour 10 (version 1).
pub fn hour_10() -> Vec<DecisionEvent> {
    let mut g = Gen::new(HOUR_10_MS, 1);
    g.tight_and_roomy();
    let fallback = Shape {
        source: DecisionSource::LocalFallback,
        region: 1,
        ..Shape::allowed(995, 1000)
    };
    g.repeat(ROOMY, 0, 5, fallback);
    let killed = Shape {
        source: DecisionSource::KillSwitch,
        region: 2,
        ..Shape::allowed(0, 1000)
    };
    g.repeat(ROOMY, 0, 3, killed);
    for n in 0..20 {
        g.allowed(TRIAL, n, 15, 20);
    }
    g.repeat(
        TRIAL,
        TRIAL_REFUSED,
        10,
        Shape::refused(Verdict::WouldDeny, BUCKET, 5, 20),
    );
    for n in 0..20 {
        if n == STEADY_OVER {
            g.allowed(STEADY, n, 100, 100);
            g.repeat(
                STEADY,
                n,
                5,
                Shape::refused(Verdict::Denied, WINDOW, 0, 100),
            );
        } else {
            g.allowed(STEADY, n, 60, 100);
        }
    }
    g.events
}

/// The decisions of hour 11 (version 2): `tight`, `roomy` and `trial` as in hour 10 but
/// without the degraded decisions and the would-deny key, and `steady` refused half the
/// time.
pub fn hour_11() -> Vec<DecisionEvent> {
    let mut g = Gen::new(HOUR_10_MS + 3_600_000, 2);
    g.tight_and_roomy();
    for n in 0..20 {
        g.allowed(TRIAL, n, 15, 20);
    }
    for n in 0..20 {
        g.allowed(STEADY, n, 5, 100);
        g.repeat(
            STEADY,
            n,
            5,
            Shape::refused(Verdict::Denied, BUCKET, 95, 100),
        );
    }
    g.events
}

/// Writes the two hours as raw files (3 partitions, 200 records a file), rolls them up and
/// computes the day's overage, like the pipeline; returns the policy file's path (in `dir`).
pub async fn write_known_lake(store: &Arc<dyn ObjectStore>, dir: &std::path::Path) -> PathBuf {
    let rollup = Rollup::new(Arc::clone(store), 2);
    for (start, events) in [(HOUR_10_MS, hour_10()), (HOUR_10_MS + 3_600_000, hour_11())] {
        let hour = HourPartition::from_event_time_ms(start).expect("a valid hour");
        write_raw_hour(store, "verdict.decisions.v1", hour, &events, 3, 200).await;
        rollup.run_hour(hour).await.expect("rollup");
    }
    let date = HourPartition::from_event_time_ms(HOUR_10_MS)
        .unwrap()
        .date();
    overage::run_day(&rollup, date).await.expect("overage");
    let path = dir.join("policy.toml");
    std::fs::write(&path, POLICY_TOML).expect("writing the policy file");
    path
}

/// The known lake in a local folder (no services), and an engine over it with `limits`;
/// the temporary folder holds the lake (under `lake/`) and the policy file.
pub async fn known_local_engine(
    limits: verdict_query::Limits,
) -> (verdict_query::Engine, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let root = dir.path().join("lake");
    std::fs::create_dir_all(&root).expect("the lake's folder");
    let store: Arc<dyn ObjectStore> = Arc::new(
        object_store::local::LocalFileSystem::new_with_prefix(&root).expect("a local store"),
    );
    let policy = write_known_lake(&store, dir.path()).await;
    let source: Arc<dyn verdict_limiter::PolicySource> =
        Arc::new(verdict_limiter::FileSource::new(policy));
    let engine = verdict_query::Engine::new(
        store,
        verdict_query::PoliciesTable::new(Some(source)),
        2,
        limits,
    )
    .expect("an engine");
    (engine, dir)
}

/// The known lake on the S3 server under a prefix of its own, and an engine over it with
/// `limits`; the temporary folder holds the policy file.
pub async fn known_engine(
    name: &str,
    limits: verdict_query::Limits,
) -> (
    verdict_query::Engine,
    Arc<dyn ObjectStore>,
    tempfile::TempDir,
) {
    let bucket = crate::s3_store("verdict-query").await;
    let store: Arc<dyn ObjectStore> = Arc::new(verdict_lake::Prefixed::new(
        bucket,
        &crate::unique_name(name),
    ));
    let dir = tempfile::tempdir().expect("a temporary folder");
    let policy = write_known_lake(&store, dir.path()).await;
    let source: Arc<dyn verdict_limiter::PolicySource> =
        Arc::new(verdict_limiter::FileSource::new(policy));
    let engine = verdict_query::Engine::new(
        Arc::clone(&store),
        verdict_query::PoliciesTable::new(Some(source)),
        2,
        limits,
    )
    .expect("an engine");
    (engine, store, dir)
}

/// Runs `sql` and returns the rows as JSON objects (key ids as hex), in order.
pub async fn rows(engine: &verdict_query::Engine, sql: &str) -> Vec<serde_json::Value> {
    let verdict_query::Collected {
        schema, batches, ..
    } = engine
        .collect(sql, &verdict_query::RunOptions::default().rows(1_000_000))
        .await
        .unwrap_or_else(|e| panic!("{sql}\n-> {e}"));
    let body = verdict_query::format::json(&schema, &batches).expect("JSON");
    let v: serde_json::Value = serde_json::from_slice(&body).expect("valid JSON");
    v["rows"].as_array().cloned().unwrap_or_default()
}

/// Runs report `name` with `params` over 2026-11-30 (unless they say otherwise).
pub async fn report(
    engine: &verdict_query::Engine,
    name: &str,
    params: &[(&str, &str)],
) -> Vec<serde_json::Value> {
    report_in(engine, name, "2026-11-30", "2026-12-01", params).await
}

/// Runs report `name` with `params` from `from` to `to` (unless `params` say otherwise).
pub async fn report_in(
    engine: &verdict_query::Engine,
    name: &str,
    from: &str,
    to: &str,
    params: &[(&str, &str)],
) -> Vec<serde_json::Value> {
    let given = given(from, to, params);
    let sql = engine
        .report_sql(name, &given, Form::Served)
        .await
        .unwrap_or_else(|e| panic!("report {name}: {e}"));
    rows(engine, &sql).await
}

/// A report's parameters: `from`, `to` and `params`.
fn given(
    from: &str,
    to: &str,
    params: &[(&str, &str)],
) -> std::collections::BTreeMap<String, String> {
    let mut given: std::collections::BTreeMap<String, String> =
        [("from".into(), from.into()), ("to".into(), to.into())].into();
    for (k, v) in params {
        given.insert((*k).into(), (*v).into());
    }
    given
}

/// Report `name`'s rows over `from` to `to` with `params`, from the query service's
/// statement (which reads the reports' kept parts, see `verdict_query::parts`) and from the
/// portable one (which reads the decisions all the way).
pub async fn served_and_portable(
    engine: &verdict_query::Engine,
    name: &str,
    from: &str,
    to: &str,
    params: &[(&str, &str)],
) -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
    let given = given(from, to, params);
    let served = engine.report_sql(name, &given, Form::Served).await.unwrap();
    let portable = engine
        .report_sql(name, &given, Form::Portable)
        .await
        .unwrap();
    assert!(served.contains("_parts('"), "{served}");
    assert!(!portable.contains("_parts('"), "{portable}");
    (rows(engine, &served).await, rows(engine, &portable).await)
}

/// `engine` served on both front ends on loopback behind `token`: the HTTP base URL and the
/// PostgreSQL listener's address (both served until the process ends).
pub async fn serve_both(
    engine: &verdict_query::Engine,
    token: &str,
) -> (String, std::net::SocketAddr) {
    let loopback = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let state = Arc::new(verdict_query::http::AppState {
        engine: engine.clone(),
        tokens: vec![token.to_string()],
        metrics: verdict_query::http::QueryMetrics::new(),
    });
    let (addr, _http) = verdict_query::http::spawn(state, loopback)
        .await
        .expect("the service binds");
    let (pg, _pg) = verdict_query::pg::serve(engine, vec![token.to_string()], loopback)
        .await
        .expect("the PostgreSQL listener binds");
    (format!("http://{addr}"), pg)
}

/// A sum of `n` terms: a flat expression `n` deep once parsed.
pub fn long_sum(n: usize) -> String {
    format!("SELECT {} AS s", vec!["1"; n].join(" + "))
}

/// A filter of `n` ORs on the raw table.
pub fn long_or(n: usize) -> String {
    format!(
        "SELECT COUNT(*) FROM decisions WHERE {}",
        (0..n)
            .map(|i| format!("tier = {}", i % 10))
            .collect::<Vec<_>>()
            .join(" OR ")
    )
}

/// `n` branches of UNION ALL.
pub fn long_union(n: usize) -> String {
    vec!["SELECT 1 AS one"; n].join(" UNION ALL ")
}

/// A tokio-postgres client (the extended protocol) on the query service's PostgreSQL
/// listener at `addr`, and the task driving its connection.
pub async fn pg_driver(
    addr: std::net::SocketAddr,
    password: &str,
) -> (tokio_postgres::Client, tokio::task::JoinHandle<()>) {
    let (client, connection) = tokio_postgres::connect(
        &format!(
            "host=127.0.0.1 port={} user=analyst password={password} dbname=verdict",
            addr.port()
        ),
        tokio_postgres::NoTls,
    )
    .await
    .expect("a driver connects");
    let task = tokio::spawn(async move {
        let _ = connection.await;
    });
    (client, task)
}

/// The query service's HTTP front end over `engine` on a loopback port of its own, with
/// `tokens` (none: open, on loopback only): its state (for the metrics) and its base URL.
pub async fn serve(
    engine: verdict_query::Engine,
    tokens: &[&str],
) -> (Arc<verdict_query::http::AppState>, String) {
    let state = Arc::new(verdict_query::http::AppState {
        engine,
        tokens: tokens.iter().map(|t| t.to_string()).collect(),
        metrics: verdict_query::http::QueryMetrics::new(),
    });
    let (addr, _task) = verdict_query::http::spawn(
        Arc::clone(&state),
        std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
    )
    .await
    .expect("the service binds");
    (state, format!("http://{addr}"))
}
