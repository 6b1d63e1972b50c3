//! The reconcile's reads and writes of the regional shares in the policy store
//! (`verdict_policy.shares` and `share_rounds`); the gateways read what it writes through
//! `verdict_policy_store::PgShares`.

use std::collections::HashMap;
use std::time::Duration;

use verdict_limiter::algo::PPM;
use verdict_limiter::regions::{ShareKey, ShareRow};
use verdict_policy_store::PgConn;
use verdict_policy_store::PolicyStoreError;
use verdict_policy_store::shares::share_row;
use verdict_schemas::RegionId;

/// The shares, as the reconcile job reads and writes them.
#[derive(Debug, Clone)]
pub struct ShareRounds {
    conn: PgConn,
}

impl ShareRounds {
    /// The shares in the database at `url` (the policy store's).
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            conn: PgConn::new(url),
        }
    }

    /// The shares of every region for `keys`, and each region's last successful read
    /// (`share_rounds.last_seen_ms`).
    pub async fn read_for(
        &self,
        keys: &[ShareKey],
    ) -> Result<(Vec<ShareRow>, HashMap<RegionId, i64>), PolicyStoreError> {
        let guard = self.conn.get().await?;
        let client = &*guard;
        let ids: Vec<String> = keys.iter().map(|k| k.0.to_string()).collect();
        let mut rows = Vec::new();
        for row in client
            .query(
                "select key_id, route_class, tier, bucket_ppm, window_ppm, before_bucket_ppm, \
                 before_window_ppm, effective_ms, computed_ms, region from verdict_policy.shares \
                 where key_id = any($1)",
                &[&ids],
            )
            .await?
        {
            let region: i32 = row.get(9);
            let Ok(region) = u16::try_from(region) else {
                continue;
            };
            if let Some(r) = share_row(RegionId(region), &row) {
                rows.push(r);
            }
        }
        let mut seen = HashMap::new();
        for row in client
            .query(
                "select region, last_seen_ms from verdict_policy.share_rounds where last_seen_ms is not null",
                &[],
            )
            .await?
        {
            if let Ok(r) = u16::try_from(row.get::<_, i32>(0)) {
                seen.insert(RegionId(r), row.get::<_, i64>(1));
            }
        }
        Ok((rows, seen))
    }

    /// Writes one round in one transaction: `rows` replace the regions' rows of the same
    /// keys, rows not rewritten for `ttl` are deleted, `regions`' versions rise, and the
    /// regions in `seen` record `now_ms` as their last successful read.
    pub async fn write_round(
        &self,
        rows: &[ShareRow],
        regions: &[RegionId],
        seen: &[RegionId],
        now_ms: i64,
        ttl: Duration,
    ) -> Result<(), PolicyStoreError> {
        let mut guard = self.conn.get().await?;
        let client = &mut *guard;
        let tx = client.transaction().await?;
        let upsert = tx
            .prepare(
                "insert into verdict_policy.shares (region, key_id, route_class, tier, bucket_ppm, \
                 window_ppm, before_bucket_ppm, before_window_ppm, effective_ms, computed_ms) \
                 values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
                 on conflict (region, key_id, route_class, tier) do update set \
                 bucket_ppm = excluded.bucket_ppm, window_ppm = excluded.window_ppm, \
                 before_bucket_ppm = excluded.before_bucket_ppm, before_window_ppm = excluded.before_window_ppm, \
                 effective_ms = excluded.effective_ms, computed_ms = excluded.computed_ms",
            )
            .await?;
        for r in rows {
            let e = &r.entry;
            let ppm = |v: u32| v.min(PPM) as i32;
            tx.execute(
                &upsert,
                &[
                    &i32::from(r.region.0),
                    &r.key.0.to_string(),
                    &i32::from(r.key.1.0),
                    &i32::from(r.key.2.0),
                    &ppm(e.after.bucket_ppm),
                    &ppm(e.after.window_ppm),
                    &ppm(e.before.bucket_ppm),
                    &ppm(e.before.window_ppm),
                    &e.effective_ms,
                    &e.computed_ms,
                ],
            )
            .await?;
        }
        tx.execute(
            "delete from verdict_policy.shares where computed_ms < $1",
            &[&(now_ms - ttl.as_millis() as i64)],
        )
        .await?;
        for region in regions {
            let r = i32::from(region.0);
            let last_seen = seen.contains(region).then_some(now_ms);
            tx.execute(
                "insert into verdict_policy.share_rounds (region, version, last_seen_ms, updated_ms) \
                 values ($1, 1, $2, $3) on conflict (region) do update set \
                 version = verdict_policy.share_rounds.version + 1, \
                 last_seen_ms = coalesce(excluded.last_seen_ms, verdict_policy.share_rounds.last_seen_ms), \
                 updated_ms = excluded.updated_ms",
                &[&r, &last_seen, &now_ms],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}
