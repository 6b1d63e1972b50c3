//! The counter store's connection options, shared by `verdict gateway`,
//! `verdict-bench gateway` and `verdict-bench limiter`: connections, calls on the wire per
//! connection, decisions per script call, the decision's deadline, and the key layout.

use std::time::Duration;

use clap::Args;
use verdict_counters_redis::{DEFAULT_CONNECTIONS, Layout, RedisStoreConfig};

/// How the gateway talks to Redis.
#[derive(Debug, Clone, Args)]
pub struct RedisStoreArgs {
    /// Multiplexed connections to Redis (to each master of a cluster). One lets the most
    /// decisions share a script call, which is what costs Redis the least per decision.
    #[arg(long, default_value_t = DEFAULT_CONNECTIONS as u32, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub redis_connections: u32,
    /// Script calls on the wire at once on one connection (pipelined), each from a lane of
    /// its own.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub redis_calls_per_connection: u32,
    /// Most decisions one script call carries: the requests that arrive while a lane's call
    /// is on the wire go together in its next one (1: a call per decision).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub redis_max_batch: u32,
    /// Deadline of one decision in Redis, ms; past it the local fallback decides.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub redis_timeout_ms: u64,
    /// Hashes the limit keys are grouped into: about one per 8 to 64 active limit keys
    /// (callers × route classes), which is what keeps a key near 60 bytes of Redis. Every
    /// instance on one Redis must use the same: the first records it (`rl:layout`), and a
    /// store set otherwise refuses to start [default: 1048576, one per 48 of the design's 50
    /// million; `verdict-bench limiter`: one per 48 of its keys × route classes].
    #[arg(long, value_parser = key_groups)]
    pub redis_key_groups: Option<Layout>,
}

impl RedisStoreArgs {
    /// The store's settings for the Redis at `url`.
    pub fn config(&self, url: &str) -> RedisStoreConfig {
        RedisStoreConfig {
            url: url.to_owned(),
            connections: self.redis_connections as usize,
            calls_per_connection: self.redis_calls_per_connection as usize,
            max_batch: self.redis_max_batch as usize,
            timeout: Duration::from_millis(self.redis_timeout_ms),
            layout: self.redis_key_groups.unwrap_or_default(),
            ..RedisStoreConfig::default()
        }
    }

    /// These options as a command line, for a `verdict gateway` started with them.
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            format!("--redis-connections={}", self.redis_connections),
            format!(
                "--redis-calls-per-connection={}",
                self.redis_calls_per_connection
            ),
            format!("--redis-max-batch={}", self.redis_max_batch),
            format!("--redis-timeout-ms={}", self.redis_timeout_ms),
        ];
        if let Some(layout) = self.redis_key_groups {
            args.push(format!("--redis-key-groups={}", layout.groups()));
        }
        args
    }
}

/// `--redis-key-groups`: a number of groups, 1 to 2^24.
fn key_groups(s: &str) -> Result<Layout, String> {
    let groups: u32 = s
        .parse()
        .map_err(|e| format!("{s:?} is not a number of groups: {e}"))?;
    Layout::new(groups).map_err(|e| e.to_string())
}
