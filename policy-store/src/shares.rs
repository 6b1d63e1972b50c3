//! The regional shares in the policy store (`migrations/0002_regions.sql`), as the gateways
//! of one region read them; the reconcile job writes them (`verdict_reconcile::share_rounds`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use verdict_limiter::LimiterMetrics;
use verdict_limiter::algo::PPM;
use verdict_limiter::periodic::spawn_every;
use verdict_limiter::regions::{Share, ShareEntry, ShareHandle, ShareRow, ShareSnapshot};
use verdict_schemas::{RegionId, RouteClassId, TierId};

use crate::error::PolicyStoreError;
use crate::pg::{PgConn, snapshot};

/// The shares in the policy store.
#[derive(Debug, Clone)]
pub struct PgShares {
    conn: PgConn,
}

fn ppm_of(v: i32) -> u32 {
    v.clamp(0, PPM as i32) as u32
}

impl PgShares {
    /// The shares in the database at `url` (the policy store's).
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            conn: PgConn::new(url),
        }
    }

    /// The version of `region`'s shares (0: none written yet).
    pub async fn version(&self, region: RegionId) -> Result<u64, PolicyStoreError> {
        let guard = self.conn.get().await?;
        let client = &*guard;
        Ok(round_version(client, region).await?)
    }

    /// `region`'s shares, in one consistent read.
    pub async fn read(&self, region: RegionId) -> Result<ShareSnapshot, PolicyStoreError> {
        let mut guard = self.conn.get().await?;
        let client = &mut *guard;
        let tx = snapshot(client).await?;
        let version = round_version(&tx, region).await?;
        let r = i32::from(region.0);
        let mut entries = HashMap::new();
        for row in tx
            .query(
                "select key_id, route_class, tier, bucket_ppm, window_ppm, before_bucket_ppm, \
                 before_window_ppm, effective_ms, computed_ms from verdict_policy.shares where region = $1",
                &[&r],
            )
            .await?
        {
            if let Some(entry) = share_row(region, &row) {
                entries.insert(entry.key, entry.entry);
            }
        }
        tx.commit().await?;
        Ok(ShareSnapshot { version, entries })
    }
}

/// The version of `region`'s shares in `client` (0: none written yet).
pub async fn round_version(
    client: &impl tokio_postgres::GenericClient,
    region: RegionId,
) -> Result<u64, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "select version from verdict_policy.share_rounds where region = $1",
            &[&i32::from(region.0)],
        )
        .await?;
    Ok(row.map_or(0, |r| r.get::<_, i64>(0).max(0) as u64))
}

/// A row of `verdict_policy.shares` selected as `key_id, route_class, tier, bucket_ppm,
/// window_ppm, before_bucket_ppm, before_window_ppm, effective_ms, computed_ms`; `None` if
/// its ids are out of range.
pub fn share_row(region: RegionId, row: &tokio_postgres::Row) -> Option<ShareRow> {
    let key: String = row.get(0);
    let route = u8::try_from(row.get::<_, i32>(1)).ok()?;
    let tier = u8::try_from(row.get::<_, i32>(2)).ok()?;
    Some(ShareRow {
        region,
        key: (key.parse().ok()?, RouteClassId(route), TierId(tier)),
        entry: ShareEntry {
            after: Share {
                bucket_ppm: ppm_of(row.get(3)),
                window_ppm: ppm_of(row.get(4)),
            },
            before: Share {
                bucket_ppm: ppm_of(row.get(5)),
                window_ppm: ppm_of(row.get(6)),
            },
            effective_ms: row.get(7),
            computed_ms: row.get(8),
        },
    })
}

/// Keeps `handle` fresh with `region`'s shares, polling one row every `every`. A store that
/// is down, or hung past the refresh deadline, leaves the last shares in force (counted in
/// `verdict_share_reload_errors_total`).
pub fn spawn_share_refresher(
    shares: PgShares,
    region: RegionId,
    handle: ShareHandle,
    metrics: Arc<LimiterMetrics>,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    spawn_every(every, move || {
        let (shares, handle, metrics) = (shares.clone(), handle.clone(), Arc::clone(&metrics));
        async move {
            let result = async {
                let version = shares.version(region).await?;
                if version == handle.load().version {
                    return Ok(None);
                }
                let snapshot = shares.read(region).await?;
                let (v, n) = (snapshot.version, snapshot.entries.len());
                handle.store(snapshot);
                Ok::<_, PolicyStoreError>(Some((v, n)))
            };
            let deadline = verdict_limiter::sources::refresh_deadline(every);
            match tokio::time::timeout(deadline, result).await {
                Ok(Ok(Some((version, keys)))) => {
                    metrics.share_version.set(version as i64);
                    tracing::debug!(version, keys, "regional shares updated");
                }
                Ok(Ok(None)) => {}
                Ok(Err(e)) => {
                    metrics.share_reload_errors.inc();
                    tracing::warn!(error = %e, "regional shares not refreshed; the last stay in force");
                }
                Err(_) => {
                    metrics.share_reload_errors.inc();
                    tracing::warn!(
                        ?deadline,
                        "the policy store did not answer in time; the last regional shares stay in force"
                    );
                }
            }
        }
    })
}
