//! The policy in PostgreSQL: the tables of `migrations/` (their version rises on every
//! change, so a gateway polls one row), read in one consistent snapshot.

use std::sync::Arc;

use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard};
use tokio_postgres::{Client, NoTls};
use verdict_limiter::policy::{
    HotKeyRow, LimitRow, OverrideRow, PolicyDocument, PolicyError, PolicyHandle, PolicySnapshot,
    RegionRow, RouteClassRow, TierRow,
};
use verdict_limiter::sources::{PolicySource, SourceError, versioned};
use verdict_schemas::KeyId;

use crate::error::PolicyStoreError;

/// The schema of the PostgreSQL policy store.
pub const MIGRATION_0001: &str = include_str!("../migrations/0001_policy.sql");
/// The schema of the regional shares (the regions' static weights, the shares the
/// reconcile job writes).
pub const MIGRATION_0002: &str = include_str!("../migrations/0002_regions.sql");

/// One lazily opened connection to the policy store, opened again after it is lost.
#[derive(Debug, Clone)]
pub struct PgConn {
    pub(crate) url: String,
    client: Arc<Mutex<Option<Client>>>,
}

impl PgConn {
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            client: Arc::new(Mutex::new(None)),
        }
    }

    /// The connection, opened if it is not (or no longer is).
    pub async fn get(&self) -> Result<MappedMutexGuard<'_, Client>, PolicyStoreError> {
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
        Ok(MutexGuard::map(guard, |slot| {
            slot.as_mut().expect("the connection was opened above")
        }))
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

    pub(crate) async fn client(&self) -> Result<MappedMutexGuard<'_, Client>, PolicyStoreError> {
        self.conn.get().await
    }

    /// The URL it reads (for the regional shares, kept in the same database).
    pub fn url(&self) -> &str {
        &self.conn.url
    }

    /// Creates the schema if it is not there (idempotent): the policy, the regions and
    /// their shares.
    pub async fn migrate(&self) -> Result<(), PolicyStoreError> {
        let guard = self.client().await?;
        let client = &*guard;
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
    pub async fn version(&self) -> Result<u64, PolicyStoreError> {
        let guard = self.client().await?;
        let client = &*guard;
        let row = client
            .query_one("select version from verdict_policy.meta", &[])
            .await?;
        Ok(row.get::<_, i64>(0).max(0) as u64)
    }

    /// Reads the whole policy in one consistent snapshot of the database.
    pub async fn read(&self) -> Result<PolicyDocument, PolicyStoreError> {
        let mut guard = self.client().await?;
        let client = &mut *guard;
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

#[async_trait::async_trait]
impl PolicySource for PgSource {
    async fn load(&self) -> Result<PolicySnapshot, SourceError> {
        Ok(versioned(self.read().await?)?)
    }

    async fn refresh(
        &self,
        handle: &PolicyHandle,
        now_ms: i64,
    ) -> Result<Option<u64>, SourceError> {
        let version = self.version().await?;
        if version == handle.load().version() {
            handle.confirmed(now_ms);
            return Ok(None);
        }
        let snapshot = PolicySnapshot::build(self.read().await?)?;
        let version = snapshot.version();
        handle.store(snapshot, now_ms);
        Ok(Some(version))
    }
}
