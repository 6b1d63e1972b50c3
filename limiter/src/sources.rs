//! Where the policy comes from, and the background task that keeps it fresh: a TOML file
//! (the embedded default, re-read when it changes) or the PostgreSQL tables of
//! `migrations/` (their version rises on every change; one row is polled). A source that is
//! down or a document that is invalid leaves the last snapshot in force, counts a reload
//! error and shows in the policy's age; a valid change is in force at the next poll.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio_postgres::{Client, NoTls};
use verdict_schemas::KeyId;

use crate::clock::Clock;
use crate::metrics::LimiterMetrics;
use crate::policy::{
    HotKeyRow, LimitRow, OverrideRow, PolicyDocument, PolicyError, PolicyHandle, PolicySnapshot,
    RegionRow, RouteClassRow, TierRow, parse_toml,
};

/// The schema of the PostgreSQL policy store.
pub const MIGRATION_0001: &str = include_str!("../migrations/0001_policy.sql");

/// Why a source could not deliver a policy.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The file could not be read.
    #[error("reading policy file {path}: {source}")]
    File {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// PostgreSQL could not be reached or refused a query.
    #[error("policy store (PostgreSQL): {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// The document or a row is invalid.
    #[error(transparent)]
    Invalid(#[from] PolicyError),
}

/// A policy file.
#[derive(Debug, Clone)]
pub struct FileSource {
    path: PathBuf,
}

impl FileSource {
    /// The file at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// Reads and parses the file.
    pub async fn read(&self) -> Result<(String, PolicyDocument), SourceError> {
        let text = tokio::fs::read_to_string(&self.path)
            .await
            .map_err(|source| SourceError::File {
                path: self.path.display().to_string(),
                source,
            })?;
        let doc = parse_toml(&text).map_err(|e| PolicyError {
            row: format!("file {}", self.path.display()),
            ..e
        })?;
        Ok((text, doc))
    }
}

/// The schema of the regional shares (the regions' static weights, the shares the
/// reconcile job writes).
pub const MIGRATION_0002: &str = include_str!("../migrations/0002_regions.sql");

/// One lazily opened connection to the policy store, opened again after it is lost.
#[derive(Debug, Clone)]
pub(crate) struct PgConn {
    url: String,
    client: Arc<Mutex<Option<Client>>>,
}

impl PgConn {
    pub(crate) fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            client: Arc::new(Mutex::new(None)),
        }
    }

    /// The connection, opened if it is not.
    pub(crate) async fn get(
        &self,
    ) -> Result<tokio::sync::MutexGuard<'_, Option<Client>>, SourceError> {
        let mut guard = self.client.lock().await;
        if guard.as_ref().is_none_or(Client::is_closed) {
            let (client, connection) = tokio_postgres::connect(&self.url, NoTls).await?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::warn!(error = %e, "policy store connection closed");
                }
            });
            *guard = Some(client);
        }
        Ok(guard)
    }
}

/// The PostgreSQL policy store.
#[derive(Debug, Clone)]
pub struct PgSource {
    conn: PgConn,
}

fn row_err(row: String, field: &'static str, problem: impl std::fmt::Display) -> PolicyError {
    PolicyError {
        row,
        field,
        problem: problem.to_string(),
    }
}

fn id_u8(row: &str, v: i32) -> Result<u8, PolicyError> {
    u8::try_from(v).map_err(|_| row_err(row.into(), "id", format!("must be 0 to 255, got {v}")))
}

fn key_id(row: &str, v: &str) -> Result<KeyId, PolicyError> {
    v.parse().map_err(|e| row_err(row.into(), "key_id", e))
}

impl PgSource {
    /// A source reading the database at `url` (connected on first use, and again after a
    /// lost connection).
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            conn: PgConn::new(url),
        }
    }

    pub(crate) async fn client(
        &self,
    ) -> Result<tokio::sync::MutexGuard<'_, Option<Client>>, SourceError> {
        self.conn.get().await
    }

    /// The URL it reads (for the regional shares, kept in the same database).
    pub fn url(&self) -> &str {
        &self.conn.url
    }

    /// Creates the schema if it is not there (idempotent): the policy, the regions and
    /// their shares.
    pub async fn migrate(&self) -> Result<(), SourceError> {
        let guard = self.client().await?;
        let client = guard.as_ref().ok_or_else(closed)?;
        client
            .batch_execute("select pg_advisory_lock(7316)")
            .await?;
        let mut result = client.batch_execute(MIGRATION_0001).await;
        if result.is_ok() {
            result = client.batch_execute(MIGRATION_0002).await;
        }
        client
            .batch_execute("select pg_advisory_unlock(7316)")
            .await?;
        Ok(result?)
    }

    /// The version in the store (one row).
    pub async fn version(&self) -> Result<u64, SourceError> {
        let guard = self.client().await?;
        let client = guard.as_ref().ok_or_else(closed)?;
        let row = client
            .query_one("select version from verdict_policy.meta", &[])
            .await?;
        Ok(row.get::<_, i64>(0).max(0) as u64)
    }

    /// Reads the whole policy in one consistent snapshot of the database.
    pub async fn read(&self) -> Result<PolicyDocument, SourceError> {
        let mut guard = self.client().await?;
        let client = guard.as_mut().ok_or_else(closed)?;
        let tx = snapshot(client).await?;
        let meta = tx
            .query_one("select version, kill_switch from verdict_policy.meta", &[])
            .await?;
        let mut doc = PolicyDocument {
            version: meta.get::<_, i64>(0).max(0) as u64,
            kill_switch: meta.get(1),
            ..PolicyDocument::default()
        };
        for r in tx
            .query(
                "select id, name, kill_switch from verdict_policy.tiers order by id",
                &[],
            )
            .await?
        {
            let name: String = r.get(1);
            let row = format!("tiers row (name={name})");
            doc.tiers.push(TierRow {
                id: id_u8(&row, r.get(0))?,
                name,
                kill_switch: r.get(2),
            });
        }
        for r in tx
            .query(
                "select id, name, prefixes from verdict_policy.route_classes order by id",
                &[],
            )
            .await?
        {
            let name: String = r.get(1);
            let row = format!("route_classes row (name={name})");
            doc.route_classes.push(RouteClassRow {
                id: id_u8(&row, r.get(0))?,
                name,
                prefixes: r.get(2),
            });
        }
        for r in tx
            .query("select tier, route_class, capacity, refill_per_s, hourly_quota, mode from verdict_policy.limits order by tier, route_class", &[])
            .await?
        {
            let (tier, route_class): (String, String) = (r.get(0), r.get(1));
            let row = format!("limits row (tier={tier}, route_class={route_class})");
            let mode: String = r.get(5);
            doc.limits.push(LimitRow {
                mode: mode.parse().map_err(|e| row_err(row.clone(), "mode", e))?,
                tier,
                route_class,
                capacity: r.get(2),
                refill_per_s: r.get(3),
                hourly_quota: r.get(4),
            });
        }
        for r in tx
            .query("select key_id, route_class, capacity, refill_per_s, hourly_quota, mode from verdict_policy.overrides order by key_id, route_class", &[])
            .await?
        {
            let (key, route_class): (String, String) = (r.get(0), r.get(1));
            let row = format!("overrides row (key_id={key}, route_class={route_class})");
            let mode: Option<String> = r.get(5);
            doc.overrides.push(OverrideRow {
                key_id: key_id(&row, &key)?,
                mode: mode.map(|m| m.parse().map_err(|e| row_err(row.clone(), "mode", e))).transpose()?,
                route_class,
                capacity: r.get(2),
                refill_per_s: r.get(3),
                hourly_quota: r.get(4),
            });
        }
        for r in tx
            .query(
                "select key_id, sub_keys from verdict_policy.hot_keys order by key_id",
                &[],
            )
            .await?
        {
            let key: String = r.get(0);
            let row = format!("hot_keys row (key_id={key})");
            doc.hot_keys.push(HotKeyRow {
                key_id: key_id(&row, &key)?,
                sub_keys: i64::from(r.get::<_, i32>(1)),
            });
        }
        for r in tx
            .query(
                "select id, name, weight from verdict_policy.regions order by id",
                &[],
            )
            .await?
        {
            let name: String = r.get(1);
            let row = format!("regions row (name={name})");
            let id: i32 = r.get(0);
            doc.regions.push(RegionRow {
                id: u16::try_from(id).map_err(|_| {
                    row_err(row.clone(), "id", format!("must be 0 to 65535, got {id}"))
                })?,
                name,
                weight: r.get(2),
            });
        }
        tx.commit().await?;
        Ok(doc)
    }
}

/// A read-only transaction at repeatable read: one consistent snapshot of the store.
pub(crate) async fn snapshot(
    client: &mut Client,
) -> Result<tokio_postgres::Transaction<'_>, tokio_postgres::Error> {
    client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
}

pub(crate) fn closed() -> SourceError {
    SourceError::Invalid(row_err("connection".into(), "client", "not connected"))
}

/// A policy source.
#[derive(Debug, Clone)]
pub enum PolicySource {
    /// A TOML file.
    File(FileSource),
    /// PostgreSQL.
    Postgres(PgSource),
}

impl PolicySource {
    /// Reads and validates the whole policy (at start: without it there is nothing to run).
    pub async fn load(&self) -> Result<PolicySnapshot, SourceError> {
        let doc = match self {
            Self::File(f) => f.read().await?.1,
            Self::Postgres(p) => p.read().await?,
        };
        let version = doc.version.max(1);
        Ok(PolicySnapshot::build(doc)?.with_version(version))
    }
}

/// Keeps `handle` fresh from `source`, polling every `every`; updates the policy metrics.
pub fn spawn_refresher(
    source: PolicySource,
    handle: PolicyHandle,
    metrics: Arc<LimiterMetrics>,
    clock: Arc<dyn Clock>,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut last_text = None;
        let mut ticker = tokio::time::interval(every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            match refresh(&source, &handle, &mut last_text, clock.now_ms()).await {
                Ok(Some(version)) => tracing::info!(version, "policy updated"),
                Ok(None) => {}
                Err(e) => {
                    metrics.policy_reload_errors.inc();
                    tracing::warn!(error = %e, version = handle.load().version(), "policy not refreshed; the previous one stays in force");
                }
            }
            let current = handle.load();
            metrics.policy_version.set(current.version() as i64);
            metrics
                .policy_age_seconds
                .set((clock.now_ms() - handle.confirmed_ms()).max(0) / 1000);
        }
    })
}

/// True if two documents differ at most in their version.
fn same_rules(a: &PolicyDocument, b: &PolicyDocument) -> bool {
    PolicyDocument {
        version: 0,
        ..a.clone()
    } == PolicyDocument {
        version: 0,
        ..b.clone()
    }
}

/// One poll: `Some(version)` if a new snapshot was put in force.
async fn refresh(
    source: &PolicySource,
    handle: &PolicyHandle,
    last_text: &mut Option<String>,
    now_ms: i64,
) -> Result<Option<u64>, SourceError> {
    let current = handle.load().version();
    match source {
        PolicySource::File(f) => {
            let (text, doc) = f.read().await?;
            if last_text.as_deref() == Some(text.as_str()) {
                handle.confirmed(now_ms);
                return Ok(None);
            }
            let declared = doc.version;
            let snapshot = PolicySnapshot::build(doc)?;
            *last_text = Some(text);
            let in_force = handle.load();
            if same_rules(snapshot.document(), in_force.document()) {
                handle.confirmed(now_ms);
                return Ok(None);
            }
            // A changed file gets a higher version even if its author forgot to raise it.
            let version = if declared > current {
                declared
            } else {
                current + 1
            };
            handle.store(snapshot.with_version(version), now_ms);
            Ok(Some(version))
        }
        PolicySource::Postgres(p) => {
            let version = p.version().await?;
            if version == current {
                handle.confirmed(now_ms);
                return Ok(None);
            }
            let snapshot = PolicySnapshot::build(p.read().await?)?;
            let version = snapshot.version();
            handle.store(snapshot, now_ms);
            Ok(Some(version))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "version = 5\n[[tiers]]\nid = 0\nname = \"free\"\n[[route_classes]]\nid = 0\nname = \"read\"\n[[limits]]\ntier = \"free\"\nroute_class = \"*\"\ncapacity = 10\nrefill_per_s = 1.0\nhourly_quota = 100\n";

    #[tokio::test]
    async fn a_changed_file_is_taken_and_a_broken_one_leaves_the_last_in_force() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.toml");
        std::fs::write(&path, DOC).unwrap();
        let source = PolicySource::File(FileSource::new(&path));
        let handle = PolicyHandle::new(source.load().await.unwrap(), 0);
        assert_eq!(handle.load().version(), 5);
        let mut last = None;

        // The first poll finds the rules already in force.
        assert_eq!(refresh(&source, &handle, &mut last, 1).await.unwrap(), None);
        assert_eq!(handle.confirmed_ms(), 1);

        // Edited without raising the version: still a new version.
        std::fs::write(&path, DOC.replace("capacity = 10", "capacity = 20")).unwrap();
        assert_eq!(
            refresh(&source, &handle, &mut last, 2).await.unwrap(),
            Some(6)
        );
        assert_eq!(handle.load().document().limits[0].capacity, 20);

        // Broken: refused with the file and field named; version 6 stays.
        std::fs::write(&path, DOC.replace("capacity = 10", "capacity = -1")).unwrap();
        let e = refresh(&source, &handle, &mut last, 3)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("capacity"), "{e}");
        std::fs::write(&path, "not toml [").unwrap();
        let e = refresh(&source, &handle, &mut last, 4)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("policy.toml"), "{e}");
        assert_eq!((handle.load().version(), handle.confirmed_ms()), (6, 2));

        // Deleted: the read fails, the policy stays.
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(
            refresh(&source, &handle, &mut last, 5).await,
            Err(SourceError::File { .. })
        ));
        assert_eq!(handle.load().version(), 6);
    }
}
