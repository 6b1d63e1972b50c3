//! The shared counter store: Redis (or Redis Cluster). Both algorithms run in one Lua script
//! (`redis.lua`), loaded once and called by SHA (reloaded on `NOSCRIPT`), so a decision is
//! one round trip on the store's own clock. Requests from many tasks share a small pool of
//! multiplexed connections: commands are pipelined, never a connection per request.

use std::time::Duration;

use fred::prelude::*;
use fred::types::scripts::Script;

use crate::algo::{Limits, Outcome};
use crate::key::LimitKey;
use crate::store::{CounterStore, StoreError};

/// The decision script (see the file for its arguments and reply).
pub const DECISION_SCRIPT: &str = include_str!("redis.lua");

/// How to reach Redis.
#[derive(Debug, Clone)]
pub struct RedisStoreConfig {
    /// `redis://host:port[/db]`, or `redis-cluster://host:port?node=host:port…`.
    pub url: String,
    /// Multiplexed connections in the pool.
    pub connections: usize,
    /// Hard deadline of one decision; no retry after it.
    pub timeout: Duration,
    /// How long a key's counters live after its last allowed request, in windows.
    pub ttl_windows: u32,
}

impl Default for RedisStoreConfig {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379".into(),
            connections: 4,
            timeout: Duration::from_millis(5),
            ttl_windows: 2,
        }
    }
}

/// Counters in Redis.
#[derive(Clone)]
pub struct RedisStore {
    pool: Pool,
    script: Script,
    timeout: Duration,
    ttl_windows: i64,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("connections", &self.pool.size())
            .field("timeout", &self.timeout)
            .finish()
    }
}

fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

impl RedisStore {
    /// Connects and loads the script.
    ///
    /// # Errors
    /// When the URL is malformed or Redis does not answer within a second.
    pub async fn connect(cfg: &RedisStoreConfig) -> Result<Self, StoreError> {
        let config = Config::from_url(&cfg.url).map_err(backend)?;
        let pool = Builder::from_config(config)
            .with_performance_config(|p| {
                // fred's own deadline matches ours, so a command abandoned at the deadline
                // is dropped from its queue rather than sent late.
                p.default_command_timeout = cfg.timeout;
            })
            .with_connection_config(|c| {
                c.connection_timeout = Duration::from_millis(500);
                c.max_command_attempts = 1;
            })
            .set_policy(ReconnectPolicy::new_constant(0, 100))
            .build_pool(cfg.connections.max(1))
            .map_err(backend)?;
        pool.init().await.map_err(backend)?;
        let script = Script::from_lua(DECISION_SCRIPT);
        let load = tokio::time::timeout(Duration::from_secs(1), script.load(pool.next()));
        load.await
            .map_err(|_| StoreError::Timeout(Duration::from_secs(1)))?
            .map_err(backend)?;
        Ok(Self {
            pool,
            script,
            timeout: cfg.timeout,
            ttl_windows: i64::from(cfg.ttl_windows.max(1)),
        })
    }

    /// The script's SHA-1, as `SCRIPT LOAD` answers it.
    pub fn script_sha(&self) -> &str {
        self.script.sha1()
    }

    /// A client of the pool, for tests and tools (`INFO`, `FLUSHDB`).
    pub fn client(&self) -> &Client {
        self.pool.next()
    }

    /// Decides at a given time instead of the server's (the script's test hook), without the
    /// deadline: for comparing the script with the Rust core.
    pub async fn check_at(
        &self,
        key: &LimitKey,
        limits: &Limits,
        now_ms: i64,
    ) -> Result<Outcome, StoreError> {
        self.call(key, limits, Some(now_ms)).await
    }

    async fn call(
        &self,
        key: &LimitKey,
        limits: &Limits,
        now_ms: Option<i64>,
    ) -> Result<Outcome, StoreError> {
        let mut args: Vec<Value> = vec![
            key.redis_field().into(),
            i64::from(limits.capacity).into(),
            limits.refill_units_per_ms.into(),
            i64::from(limits.quota).into(),
            limits.window_ms.into(),
            (limits.window_ms * self.ttl_windows).into(),
        ];
        if let Some(now) = now_ms {
            args.push(now.into());
        }
        let reply: Vec<i64> = self
            .script
            .evalsha_with_reload(self.pool.next(), key.redis_key(), args)
            .await
            .map_err(|e| match e.kind() {
                ErrorKind::Timeout => StoreError::Timeout(self.timeout),
                _ => backend(e),
            })?;
        outcome_from_reply(&reply)
    }
}

/// Reads the script's reply `{allowed, bits, remaining tokens, remaining window, retry, now}`.
fn outcome_from_reply(r: &[i64]) -> Result<Outcome, StoreError> {
    let [allowed, bits, tokens, window, retry, now] = r else {
        return Err(StoreError::BadReply(format!("{r:?}, not 6 integers")));
    };
    let u32_of = |v: i64, what: &str| {
        u32::try_from(v).map_err(|_| StoreError::BadReply(format!("{what} = {v}")))
    };
    Ok(Outcome {
        allowed: *allowed == 1,
        denied_by_bucket: bits & 1 != 0,
        denied_by_window: bits & 2 != 0,
        remaining_tokens: u32_of(*tokens, "remaining tokens")?,
        remaining_window: u32_of(*window, "remaining window")?,
        retry_after_ms: u32_of(*retry, "retry-after")?,
        now_ms: *now,
    })
}

impl CounterStore for RedisStore {
    async fn check(&self, key: &LimitKey, limits: &Limits) -> Result<Outcome, StoreError> {
        match tokio::time::timeout(self.timeout, self.call(key, limits, None)).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_read_and_nonsense_is_refused() {
        let o = outcome_from_reply(&[0, 3, 1, 2, 1500, 99]).unwrap();
        assert!(!o.allowed && o.denied_by_bucket && o.denied_by_window);
        assert_eq!(
            (
                o.remaining_tokens,
                o.remaining_window,
                o.retry_after_ms,
                o.now_ms
            ),
            (1, 2, 1500, 99)
        );
        assert!(outcome_from_reply(&[1, 0]).is_err());
        assert!(outcome_from_reply(&[1, 0, -1, 0, 0, 0]).is_err());
    }
}
