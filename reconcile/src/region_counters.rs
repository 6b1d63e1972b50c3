//! The reconcile's reads of one region's Redis: the near-limit reports its gateways wrote
//! (`verdict_counters_redis::near_limit`) and the sliding-window count of each key.

use std::collections::HashMap;
use std::time::Duration;

use fred::prelude::*;
use fred::types::Builder;
use verdict_counters_redis::Layout;
use verdict_counters_redis::packed::unpack;
use verdict_limiter::LimitKey;
use verdict_limiter::regions::{NEAR_BUCKET_MS, ShareKey, near_bucket_key, parse_near_field};

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
    /// window at `now_ms`, summed over its sub-keys (1: not split), found where the layout
    /// the region's gateways recorded puts them. Pipelined, a few
    /// thousand `HGET`s per round trip, so a region across an ocean costs round trips per
    /// thousands of keys, not per key.
    pub async fn window_used(
        &self,
        keys: &[(ShareKey, u8, i64)],
        now_ms: i64,
    ) -> Result<Vec<f64>, Error> {
        const PER_PIPELINE: usize = 4_096;
        let layout = Layout::recorded(&self.client).await?;
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
                fields.push((i, layout.hash(&k), layout.field(&k)));
            }
        }
        let mut used = vec![0.0; keys.len()];
        for chunk in fields.chunks(PER_PIPELINE) {
            let pipe = self.client.pipeline();
            for (_, key, field) in chunk {
                let _: () = pipe.hget(key.as_str(), &field[..]).await?;
            }
            let replies: Vec<Value> = pipe.all().await?;
            for ((i, ..), reply) in chunk.iter().zip(replies) {
                let packed: Option<Vec<u8>> = reply.convert()?;
                if let Some(state) = packed.as_deref().and_then(unpack) {
                    used[*i] += state.window_used(now_ms, keys[*i].2);
                }
            }
        }
        Ok(used)
    }
}
