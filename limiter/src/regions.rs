//! Regions. Counters are regional: a globally exact count would cost a cross-region round
//! trip (~80 ms) per request. The policy states a key's *global* limits and each region
//! enforces its share of them: its static weight (policy `[[regions]]`), or what the
//! reconcile job (`verdict_jobs::reconcile`) last computed from every region's usage.
//!
//! - [`Share`], [`ShareEntry`], [`ShareHandle`]: the shares in force in one region, swapped
//!   atomically like the policy. A share that grows takes effect only at its
//!   `effective_ms`, after every region has had time to apply the shares that shrank, so
//!   the sum in force never exceeds the whole limit.
//! - [`NearLimit`] and [`spawn_near_limit_reporter`]: how the job finds the keys that need
//!   attention without scanning every key. A gateway notes each request of a key that is
//!   near its regional limit (refused, or less than half of the bucket or of the quota
//!   left) and, every report interval (a second), adds the counts to a hash of
//!   quarter-second buckets in its region's Redis (`rl:near:<bucket>`, field `<key id hex>.<route class>.<tier>`). The job reads
//!   the last interval's buckets: only those keys, and the requests each region saw of
//!   them (its demand).
//! - [`RegionCounters`]: the job's reads of one region's Redis.
//! - [`PgShares`]: the shares in the policy store (`migrations/0002_regions.sql`), read by
//!   the gateways of one region ([`spawn_share_refresher`]) and written by the job.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use fred::prelude::*;
use verdict_schemas::{KeyId, RegionId, RouteClassId, TierId};

use crate::algo::{CounterState, PPM};
use crate::clock::Clock;
use crate::key::LimitKey;
use crate::metrics::LimiterMetrics;
use crate::sources::{PgConn, SourceError, closed, snapshot};

/// One limit key's identity across regions: who, on what, at which tier (sub-keys of a
/// split key share one share).
pub type ShareKey = (KeyId, RouteClassId, TierId);

/// A region's part of one key's global limits, in parts per million.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Share {
    /// Of the bucket's capacity and refill.
    pub bucket_ppm: u32,
    /// Of the hourly quota.
    pub window_ppm: u32,
}

impl Share {
    /// The whole limit.
    pub const WHOLE: Share = Share::uniform(PPM);

    /// The same part of both.
    pub const fn uniform(ppm: u32) -> Self {
        Self {
            bucket_ppm: ppm,
            window_ppm: ppm,
        }
    }

    /// The smaller part of each.
    pub fn min(self, other: Share) -> Self {
        Self {
            bucket_ppm: self.bucket_ppm.min(other.bucket_ppm),
            window_ppm: self.window_ppm.min(other.window_ppm),
        }
    }
}

/// One key's share in one region, as the reconcile job wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareEntry {
    /// The share in force before this round.
    pub before: Share,
    /// The share this round computed.
    pub after: Share,
    /// From when `after` applies in full; until then the smaller of the two.
    pub effective_ms: i64,
    /// When the round read the counters.
    pub computed_ms: i64,
}

impl ShareEntry {
    /// The share in force at `now_ms`: `after` once effective, before that the smaller of
    /// `before` and `after` (a shrinking share applies at once, a growing one waits).
    pub fn in_force(&self, now_ms: i64) -> Share {
        if now_ms >= self.effective_ms {
            self.after
        } else {
            self.before.min(self.after)
        }
    }
}

/// The shares in force in one region.
#[derive(Debug, Clone, Default)]
pub struct ShareSnapshot {
    /// Rises with every round that wrote this region's shares (0: none yet).
    pub version: u64,
    /// One entry per key the job found near its limit.
    pub entries: HashMap<ShareKey, ShareEntry>,
}

/// The shares in force, swapped atomically when the refresher reads a new round. An entry
/// older than `ttl` is ignored (the static weight applies): if the job stops, no region is
/// held at a stale small share for good.
#[derive(Debug, Clone)]
pub struct ShareHandle {
    current: Arc<arc_swap::ArcSwap<ShareSnapshot>>,
    ttl_ms: i64,
}

/// Default life of a share the job no longer rewrites: ten 30-second rounds.
pub const DEFAULT_SHARE_TTL: Duration = Duration::from_secs(300);

impl ShareHandle {
    /// No shares yet (static weights), entries living `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self {
            current: Arc::new(arc_swap::ArcSwap::from_pointee(ShareSnapshot::default())),
            ttl_ms: ttl.as_millis() as i64,
        }
    }

    /// The shares in force.
    pub fn load(&self) -> Arc<ShareSnapshot> {
        self.current.load_full()
    }

    /// Puts new shares in force.
    pub fn store(&self, snapshot: ShareSnapshot) {
        self.current.store(Arc::new(snapshot));
    }

    /// This region's share of `key` at `now_ms`, or `static_ppm` when the job has none (or
    /// only an expired one).
    pub fn share(&self, key: &ShareKey, now_ms: i64, static_ppm: u32) -> Share {
        match self.current.load().entries.get(key) {
            Some(e) if now_ms - e.computed_ms < self.ttl_ms => e.in_force(now_ms),
            _ => Share::uniform(static_ppm),
        }
    }
}

/// Width of one near-limit bucket in Redis.
pub const NEAR_BUCKET_MS: i64 = 250;
/// How long a near-limit bucket lives in Redis.
pub const NEAR_BUCKET_TTL_MS: i64 = 300_000;
/// Most distinct keys one gateway notes between two reports (the rest are counted as
/// dropped).
pub const NEAR_MAX_KEYS: usize = 100_000;

/// The Redis hash of near-limit counts for the bucket holding `ms`.
pub fn near_bucket_key(ms: i64) -> String {
    format!("rl:near:{}", ms.div_euclid(NEAR_BUCKET_MS))
}

/// The field of a key in a near-limit hash: `<key id hex>.<route class>.<tier>`.
pub fn near_field(key: &ShareKey) -> String {
    format!("{}.{}.{}", key.0, key.1.0, key.2.0)
}

/// Reads a near-limit field back (None if it is not one).
pub fn parse_near_field(field: &str) -> Option<ShareKey> {
    let mut parts = field.split('.');
    let key: KeyId = parts.next()?.parse().ok()?;
    let route: u8 = parts.next()?.parse().ok()?;
    let tier: u8 = parts.next()?.parse().ok()?;
    parts
        .next()
        .is_none()
        .then_some((key, RouteClassId(route), TierId(tier)))
}

/// The gateway's notes of near-limit requests since the last report.
#[derive(Debug)]
pub struct NearLimit {
    shards: Vec<Mutex<HashMap<ShareKey, u64>>>,
    max_keys_per_shard: usize,
}

impl Default for NearLimit {
    fn default() -> Self {
        Self::new(NEAR_MAX_KEYS)
    }
}

impl NearLimit {
    /// Notes at most `max_keys` distinct keys between reports.
    pub fn new(max_keys: usize) -> Self {
        const SHARDS: usize = 16;
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            max_keys_per_shard: max_keys.div_ceil(SHARDS).max(1),
        }
    }

    /// Notes one request of `key`; false if the notes are full.
    pub fn record(&self, key: ShareKey) -> bool {
        let shard = &self.shards[usize::from(key.0.0[0]) % self.shards.len()];
        let mut map = shard.lock().unwrap_or_else(|p| p.into_inner());
        let full = map.len() >= self.max_keys_per_shard;
        match map.get_mut(&key) {
            Some(n) => *n += 1,
            None if full => return false,
            None => {
                map.insert(key, 1);
            }
        }
        true
    }

    /// Takes every note.
    pub fn drain(&self) -> Vec<(ShareKey, u64)> {
        let mut out = Vec::new();
        for shard in &self.shards {
            let mut map = shard.lock().unwrap_or_else(|p| p.into_inner());
            out.extend(map.drain());
        }
        out
    }
}

/// True when a decision shows its key near the regional limit: refused, or less than half
/// of the bucket or of the quota left.
pub fn is_near_limit(
    allowed: bool,
    remaining_tokens: u32,
    remaining_window: u32,
    limits: &crate::algo::Limits,
) -> bool {
    !allowed
        || u64::from(remaining_tokens) * 2 < u64::from(limits.capacity)
        || u64::from(remaining_window) * 2 < u64::from(limits.quota)
}

/// Every `every`, adds the gateway's near-limit notes to its region's Redis. Off the
/// decision path: a failed report is logged and counted, never retried (the next one
/// carries the next notes).
pub fn spawn_near_limit_reporter(
    near: Arc<NearLimit>,
    redis: Client,
    metrics: Arc<LimiterMetrics>,
    clock: Arc<dyn Clock>,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let notes = near.drain();
            if notes.is_empty() {
                continue;
            }
            let total: u64 = notes.iter().map(|(_, n)| n).sum();
            match report(&redis, &notes, clock.now_ms()).await {
                Ok(()) => metrics.near_limit_reported.inc_by(total),
                Err(e) => {
                    metrics.near_limit_dropped.inc_by(total);
                    tracing::warn!(error = %e, keys = notes.len(), "near-limit report failed; the reconcile job will not see these requests");
                }
            }
        }
    })
}

async fn report(redis: &Client, notes: &[(ShareKey, u64)], now_ms: i64) -> Result<(), Error> {
    let bucket = near_bucket_key(now_ms);
    let pipe = redis.pipeline();
    for (key, n) in notes {
        let _: () = pipe
            .hincrby(bucket.as_str(), near_field(key), *n as i64)
            .await?;
    }
    let _: () = pipe
        .pexpire(bucket.as_str(), NEAR_BUCKET_TTL_MS, None)
        .await?;
    let _: Vec<Value> = pipe.all().await?;
    Ok(())
}

/// The reconcile job's reads of one region's Redis.
#[derive(Clone)]
pub struct RegionCounters {
    client: Client,
    timeout: Duration,
}

impl std::fmt::Debug for RegionCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionCounters")
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Why a region's counters could not be read.
#[derive(Debug, thiserror::Error)]
#[error("region counters at {url}: {message}")]
pub struct CountersError {
    /// The Redis URL.
    pub url: String,
    /// What failed.
    pub message: String,
}

impl RegionCounters {
    /// A client of the Redis at `url` whose every command gives up after `timeout`. The
    /// connection is made in the background and made again after a loss: a region that is
    /// down fails its reads, and the caller goes on.
    ///
    /// Must be called within a Tokio runtime.
    ///
    /// # Errors
    /// When the URL is malformed.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, CountersError> {
        let err = |e: Error| CountersError {
            url: url.to_owned(),
            message: e.to_string(),
        };
        let config = Config::from_url(url).map_err(err)?;
        let client = Builder::from_config(config)
            .with_performance_config(|p| p.default_command_timeout = timeout)
            .with_connection_config(|c| {
                c.connection_timeout = timeout;
                c.max_command_attempts = 1;
            })
            .set_policy(ReconnectPolicy::new_constant(0, 500))
            .build()
            .map_err(err)?;
        // The connection task runs (and reconnects) in the background.
        let _connection = client.connect();
        Ok(Self { client, timeout })
    }

    /// Per key, the near-limit requests the region's gateways reported with a time in
    /// `[from_ms, to_ms]` (whole quarter-second buckets).
    pub async fn near_limit(
        &self,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<HashMap<ShareKey, u64>, Error> {
        let mut out = HashMap::new();
        let (first, last) = (
            from_ms.div_euclid(NEAR_BUCKET_MS),
            to_ms.div_euclid(NEAR_BUCKET_MS),
        );
        let pipe = self.client.pipeline();
        for b in first..=last {
            let _: () = pipe.hgetall(near_bucket_key(b * NEAR_BUCKET_MS)).await?;
        }
        let replies: Vec<Value> = pipe.all().await?;
        for reply in replies {
            let counts: HashMap<String, i64> = reply.convert()?;
            for (field, n) in counts {
                if let Some(key) = parse_near_field(&field) {
                    *out.entry(key).or_default() += n.max(0) as u64;
                }
            }
        }
        Ok(out)
    }

    /// For each `(key, sub_keys, window_ms)`, the requests in view of the key's sliding
    /// window at `now_ms`, summed over its sub-keys (1: not split). Pipelined, a few
    /// thousand `HGET`s per round trip, so a region across an ocean costs round trips per
    /// thousands of keys, not per key.
    pub async fn window_used(
        &self,
        keys: &[(ShareKey, u8, i64)],
        now_ms: i64,
    ) -> Result<Vec<f64>, Error> {
        const PER_PIPELINE: usize = 4_096;
        let mut fields = Vec::new();
        for (i, (key, sub_keys, _)) in keys.iter().enumerate() {
            let base = LimitKey::new(key.0, key.1, key.2);
            for s in 0..(*sub_keys).max(1) {
                let k = if *sub_keys > 1 {
                    LimitKey {
                        sub_key: s,
                        sub_keys: *sub_keys,
                        ..base
                    }
                } else {
                    base
                };
                fields.push((i, k.redis_key(), k.redis_field()));
            }
        }
        let mut used = vec![0.0; keys.len()];
        for chunk in fields.chunks(PER_PIPELINE) {
            let pipe = self.client.pipeline();
            for (_, key, field) in chunk {
                let _: () = pipe.hget(key.as_str(), field.as_str()).await?;
            }
            let replies: Vec<Value> = pipe.all().await?;
            for ((i, ..), reply) in chunk.iter().zip(replies) {
                let packed: Option<Vec<u8>> = reply.convert()?;
                if let Some(state) = packed.as_deref().and_then(CounterState::from_packed) {
                    used[*i] += state.window_used(now_ms, keys[*i].2);
                }
            }
        }
        Ok(used)
    }
}

/// One row of `verdict_policy.shares`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareRow {
    /// The region.
    pub region: RegionId,
    /// The limit key.
    pub key: ShareKey,
    /// The share.
    pub entry: ShareEntry,
}

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
    pub async fn version(&self, region: RegionId) -> Result<u64, SourceError> {
        let guard = self.conn.get().await?;
        let client = guard.as_ref().ok_or_else(closed)?;
        Ok(round_version(client, region).await?)
    }

    /// `region`'s shares, in one consistent read.
    pub async fn read(&self, region: RegionId) -> Result<ShareSnapshot, SourceError> {
        let mut guard = self.conn.get().await?;
        let client = guard.as_mut().ok_or_else(closed)?;
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

    /// The shares of every region for `keys`, and each region's last successful read
    /// (`share_rounds.last_seen_ms`).
    pub async fn read_for(
        &self,
        keys: &[ShareKey],
    ) -> Result<(Vec<ShareRow>, HashMap<RegionId, i64>), SourceError> {
        let guard = self.conn.get().await?;
        let client = guard.as_ref().ok_or_else(closed)?;
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
    ) -> Result<(), SourceError> {
        let mut guard = self.conn.get().await?;
        let client = guard.as_mut().ok_or_else(closed)?;
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

/// The version of `region`'s shares in `client` (0: none written yet).
async fn round_version(
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

fn share_row(region: RegionId, row: &tokio_postgres::Row) -> Option<ShareRow> {
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
/// is down leaves the last shares in force (counted in `verdict_share_reload_errors_total`).
pub fn spawn_share_refresher(
    shares: PgShares,
    region: RegionId,
    handle: ShareHandle,
    metrics: Arc<LimiterMetrics>,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let result = async {
                let version = shares.version(region).await?;
                if version == handle.load().version {
                    return Ok(None);
                }
                let snapshot = shares.read(region).await?;
                let (v, n) = (snapshot.version, snapshot.entries.len());
                handle.store(snapshot);
                Ok::<_, SourceError>(Some((v, n)))
            }
            .await;
            match result {
                Ok(Some((version, keys))) => {
                    metrics.share_version.set(version as i64);
                    tracing::debug!(version, keys, "regional shares updated");
                }
                Ok(None) => {}
                Err(e) => {
                    metrics.share_reload_errors.inc();
                    tracing::warn!(error = %e, "regional shares not refreshed; the last stay in force");
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::Limits;

    fn key(b: u8) -> ShareKey {
        (KeyId([b; 16]), RouteClassId(2), TierId(1))
    }

    #[test]
    fn a_growing_share_waits_for_its_effective_time_and_a_shrinking_one_does_not() {
        let e = ShareEntry {
            before: Share {
                bucket_ppm: 300_000,
                window_ppm: 600_000,
            },
            after: Share {
                bucket_ppm: 900_000,
                window_ppm: 100_000,
            },
            effective_ms: 1_000,
            computed_ms: 500,
        };
        assert_eq!(
            e.in_force(999),
            Share {
                bucket_ppm: 300_000,
                window_ppm: 100_000
            }
        );
        assert_eq!(e.in_force(1_000), e.after);
    }

    #[test]
    fn the_handle_falls_back_to_the_static_weight_without_a_fresh_entry() {
        let h = ShareHandle::new(Duration::from_millis(1_000));
        assert_eq!(h.share(&key(1), 0, 333_333), Share::uniform(333_333));
        let entry = ShareEntry {
            before: Share::uniform(500_000),
            after: Share::uniform(500_000),
            effective_ms: 0,
            computed_ms: 10_000,
        };
        h.store(ShareSnapshot {
            version: 3,
            entries: [(key(1), entry)].into_iter().collect(),
        });
        assert_eq!(h.share(&key(1), 10_500, 333_333), Share::uniform(500_000));
        assert_eq!(h.share(&key(2), 10_500, 333_333), Share::uniform(333_333));
        // Not rewritten for longer than the TTL: the static weight again.
        assert_eq!(h.share(&key(1), 11_000, 333_333), Share::uniform(333_333));
    }

    #[test]
    fn near_fields_round_trip_and_nonsense_is_ignored() {
        let k = key(0xab);
        assert_eq!(
            near_field(&k),
            "abababababababababababababababab.2.1".to_string()
        );
        assert_eq!(parse_near_field(&near_field(&k)), Some(k));
        for bad in [
            "",
            "ab.1.1",
            "abababababababababababababababab.1",
            "abababababababababababababababab.1.1.1",
            "abababababababababababababababab.300.1",
        ] {
            assert_eq!(parse_near_field(bad), None, "{bad}");
        }
    }

    #[test]
    fn notes_count_per_key_and_stop_at_the_bound() {
        let near = NearLimit::new(16);
        for _ in 0..3 {
            assert!(near.record(key(1)));
        }
        assert!(near.record(key(2)));
        let mut notes = near.drain();
        notes.sort();
        assert_eq!(notes, vec![(key(1), 3), (key(2), 1)]);
        assert!(near.drain().is_empty());
        // One key per shard at most: a second key in shard 1 is refused, the first still counts.
        let near = NearLimit::new(16);
        assert!(near.record(key(1)));
        assert!(!near.record(key(17)));
        assert!(near.record(key(1)));
    }

    #[test]
    fn near_means_refused_or_under_half_left() {
        let l = Limits::per_hour(10, 1.0, 100);
        assert!(is_near_limit(false, 9, 99, &l));
        assert!(is_near_limit(true, 4, 99, &l));
        assert!(is_near_limit(true, 9, 49, &l));
        assert!(!is_near_limit(true, 5, 50, &l));
    }
}
