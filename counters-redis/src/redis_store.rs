//! The shared counter store: Redis (or Redis Cluster). Both algorithms run in one Lua script
//! (`redis.lua`), loaded once and called by SHA (reloaded on `NOSCRIPT`), so a decision is
//! one round trip on the store's own clock.
//!
//! Requests from many tasks share a small pool of multiplexed connections, never a
//! connection per request. Each connection has a lane: a task that sends the requests
//! waiting for it as one script call, and while that call is on the wire, the next
//! requests gather behind it. When traffic is light a request goes alone, at once; when it
//! is heavy, one call decides many, which is what lets one Redis core keep up (the
//! script's fixed cost, not the decision, is most of a lone call). In Redis Cluster, the
//! requests of one call share a slot.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fred::prelude::*;
use fred::types::scripts::Script;
use tokio::sync::{mpsc, oneshot};

use crate::layout::{FIELD_LEN, Layout};
use crate::shards::{self, NodeSettings, ShardClients, Shards};

use verdict_limiter::{CounterCheck, CounterStore, LimitKey, Limits, Located, StoreError};

/// The decision script (see the file for its arguments and reply).
pub const DECISION_SCRIPT: &str = include_str!("redis.lua");

/// Requests that may wait for one lane; past this the store answers [`StoreError::Busy`]
/// at once (the limiter's fallback then decides) rather than queue what the deadline would
/// refuse anyway.
const LANE_QUEUE: usize = 8_192;

/// The deadline of each command while connecting: the handshakes and `SCRIPT LOAD`.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(1);

/// Connections per master by default: one. Each connection has one lane by default, so
/// the requests that arrive while a call is on the wire all go in the next call; more
/// lanes make more, smaller calls, and the script's fixed cost per call is most of
/// Redis's work. In `verdict bench gateway --nginx --redis …` (closed loop, 32 in flight,
/// the two alternating in one session) the gateway made 0.63 to 0.65× nginx `limit_req`'s
/// requests per second with one connection and 0.53 to 0.55× with four.
pub const DEFAULT_CONNECTIONS: usize = 1;

/// How to reach Redis.
#[derive(Debug, Clone)]
pub struct RedisStoreConfig {
    /// `redis://host:port[/db]`, or `redis-cluster://host:port?node=host:port…`.
    pub url: String,
    /// Multiplexed connections in the pool.
    pub connections: usize,
    /// Script calls that may be on the wire at once on one connection (pipelined), each
    /// from a lane of its own.
    pub calls_per_connection: usize,
    /// Hard deadline of one decision; no retry after it.
    pub timeout: Duration,
    /// How long a key's counters live after its last allowed request, in windows.
    pub ttl_windows: u32,
    /// Most requests one script call decides (1: every request is a call of its own).
    pub max_batch: usize,
    /// How the limit keys are laid out in hashes (see [`crate::layout`]); every store on
    /// one Redis must use the same.
    pub layout: Layout,
}

impl Default for RedisStoreConfig {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379".into(),
            connections: DEFAULT_CONNECTIONS,
            calls_per_connection: 1,
            timeout: Duration::from_millis(5),
            ttl_windows: 2,
            max_batch: 64,
            layout: Layout::default(),
        }
    }
}

/// Counters in Redis.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// Connected as the URL says (cluster-aware for a cluster): for tools, tests and the
    /// test hooks; the lanes call `masters`.
    pool: Pool,
    caller: Caller,
    /// `shards.count × lanes_per_shard` lanes, the lanes of shard `s` from `s × lanes_per_shard`.
    lanes: Vec<mpsc::Sender<Pending>>,
    lanes_per_shard: usize,
    next_lane: AtomicUsize,
    clustered: bool,
    layout: Layout,
    shards: Arc<Shards>,
    /// Kept for the lanes' and the watcher's sake: they hold it weakly or by clone.
    _masters: Arc<ShardClients>,
}

/// What a lane needs to call the script.
#[derive(Clone)]
struct Caller {
    script: Script,
    ttl_windows: i64,
    timeout: Duration,
}

/// One request waiting in a lane.
struct Pending {
    hash: String,
    field: [u8; FIELD_LEN],
    limits: Limits,
    slot: u16,
    reply: oneshot::Sender<Result<CounterCheck, StoreError>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("connections", &self.inner.pool.size())
            .field("clustered", &self.inner.clustered)
            .field("layout", &self.inner.layout)
            .field("timeout", &self.inner.caller.timeout)
            .finish()
    }
}

fn backend(e: Error) -> StoreError {
    StoreError::backend(e)
}

fn lane_stopped() -> StoreError {
    StoreError::backend("the store's lane has stopped")
}

impl RedisStore {
    /// Connects, loads the script and starts the lanes, `calls_per_connection` per
    /// connection (on the current tokio runtime; the lanes end when the last clone of the
    /// store is dropped).
    ///
    /// # Errors
    /// When the URL is malformed, Redis does not answer within [`SETUP_TIMEOUT`], or it
    /// holds counters of another layout (see [`Layout::claim`]).
    pub async fn connect(cfg: &RedisStoreConfig) -> Result<Self, StoreError> {
        let config = Config::from_url(&cfg.url).map_err(backend)?;
        let clustered = config.server.is_clustered();
        // Setting up (the connections' handshakes, SCRIPT LOAD on every node) may take
        // longer than one decision, on a cold machine or a cluster; its commands get
        // SETUP_TIMEOUT, and the decision deadline applies from when the lanes start.
        let pool = shards::build(config, cfg.connections)?;
        let script = Script::from_lua(DECISION_SCRIPT);
        shards::ready(&pool, &script, cfg.timeout).await?;
        cfg.layout.claim(pool.next()).await.map_err(backend)?;
        let caller = Caller {
            script: script.clone(),
            ttl_windows: i64::from(cfg.ttl_windows.max(1)),
            timeout: cfg.timeout,
        };
        let max_batch = cfg.max_batch.max(1);
        let (shards, masters) = if clustered {
            let (shards, addresses) = Shards::of(pool.next())?;
            let settings = NodeSettings {
                connections: cfg.connections,
                timeout: cfg.timeout,
                script,
            };
            let masters = Arc::new(shards::cluster_clients(&addresses, &settings).await?);
            let shards = Arc::new(shards);
            shards::spawn_watcher(Arc::downgrade(&masters), Arc::clone(&shards), settings);
            (shards, masters)
        } else {
            (
                Arc::new(Shards::one()),
                Arc::new(ShardClients::single(pool.clone())),
            )
        };
        // Each shard has lanes of its own, so a shard that stalls holds up only its keys.
        let lanes_per_shard = cfg.connections.max(1) * cfg.calls_per_connection.max(1);
        let lanes = (0..shards.count * lanes_per_shard)
            .map(|i| {
                let (tx, rx) = mpsc::channel(LANE_QUEUE);
                let at = LaneAt {
                    masters: Arc::clone(&masters),
                    shard: i / lanes_per_shard,
                    index: i % lanes_per_shard,
                };
                tokio::spawn(lane(rx, at, caller.clone(), max_batch));
                tx
            })
            .collect();
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                caller,
                lanes,
                lanes_per_shard,
                next_lane: AtomicUsize::new(0),
                clustered,
                layout: cfg.layout,
                shards,
                _masters: masters,
            }),
        })
    }

    /// The script's SHA-1, as `SCRIPT LOAD` answers it.
    pub fn script_sha(&self) -> &str {
        self.inner.caller.script.sha1()
    }

    /// How this store lays out limit keys.
    pub fn layout(&self) -> &Layout {
        &self.inner.layout
    }

    /// A client of the pool, for tests and tools (`INFO`, `FLUSHDB`).
    pub fn client(&self) -> &Client {
        self.inner.pool.next()
    }

    /// Decides at a given time instead of the server's (the script's test hook), without the
    /// deadline and without a lane: for comparing the script with the Rust core.
    pub async fn check_at(
        &self,
        key: &LimitKey,
        limits: &Limits,
        now_ms: i64,
    ) -> Result<CounterCheck, StoreError> {
        let mut answers = self.check_many_at(&[(*key, *limits)], now_ms).await?;
        answers
            .pop()
            .ok_or_else(|| StoreError::bad_reply("no answer"))
    }

    /// Decides several requests in one script call at a given time, in order (the test hook
    /// of a batch). The keys must share a slot in Redis Cluster.
    pub async fn check_many_at(
        &self,
        requests: &[(LimitKey, Limits)],
        now_ms: i64,
    ) -> Result<Vec<CounterCheck>, StoreError> {
        let layout = &self.inner.layout;
        let items: Vec<(String, [u8; FIELD_LEN], Limits)> = requests
            .iter()
            .map(|(k, l)| (layout.hash(k), layout.field(k), *l))
            .collect();
        self.inner
            .caller
            .call(
                self.inner.pool.next(),
                items.iter().map(|(h, f, l)| (h.as_str(), &f[..], l)),
                Some(now_ms),
            )
            .await
    }
}

impl Caller {
    /// One script call deciding `items` (hash, field, limits) in order.
    async fn call<'a, I>(
        &self,
        client: &Client,
        items: I,
        now_ms: Option<i64>,
    ) -> Result<Vec<CounterCheck>, StoreError>
    where
        I: Iterator<Item = (&'a str, &'a [u8], &'a Limits)> + Clone,
    {
        let (keys, args) = self.arguments(items.clone(), now_ms);
        let wanted = keys.len();
        let reply = match client.evalsha(self.script.sha1().clone(), keys, args).await {
            Err(e) if e.details().starts_with("NOSCRIPT") => {
                // Redis restarted or its scripts were flushed: load it and try once more.
                self.script.load(client).await.map_err(|e| self.error(&e))?;
                let (keys, args) = self.arguments(items, now_ms);
                client.evalsha(self.script.sha1().clone(), keys, args).await
            }
            other => other,
        };
        let reply: Vec<i64> = reply.map_err(|e| self.error(&e))?;
        outcomes_from_reply(&reply, wanted)
    }

    fn arguments<'a>(
        &self,
        items: impl Iterator<Item = (&'a str, &'a [u8], &'a Limits)>,
        now_ms: Option<i64>,
    ) -> (Vec<Key>, Vec<Value>) {
        let (lower, _) = items.size_hint();
        let mut keys = Vec::with_capacity(lower);
        let mut args: Vec<Value> = Vec::with_capacity(2 + 5 * lower);
        args.push(now_ms.map_or_else(|| Value::from(""), Value::from));
        args.push(self.ttl_windows.into());
        for (hash, field, limits) in items {
            keys.push(Key::from(hash));
            args.push(field.into());
            args.push(i64::from(limits.capacity).into());
            args.push(limits.refill_units_per_ms.into());
            args.push(i64::from(limits.quota).into());
            args.push(limits.window_ms.into());
        }
        (keys, args)
    }

    fn error(&self, e: &Error) -> StoreError {
        match e.kind() {
            ErrorKind::Timeout => StoreError::timeout(self.timeout),
            _ => backend(e.clone()),
        }
    }
}

/// Where a lane sends its calls: the `index`-th connection of `shard`'s current master.
struct LaneAt {
    masters: Arc<ShardClients>,
    shard: usize,
    index: usize,
}

/// A lane: takes what waits (up to `max_batch`), decides it in one call per slot, answers,
/// and takes again. Requests whose caller has given up (the deadline passed) are not sent.
/// A failed call rings the watcher, which looks whether the shard's master has changed.
async fn lane(mut rx: mpsc::Receiver<Pending>, at: LaneAt, caller: Caller, max_batch: usize) {
    let mut batch: Vec<Pending> = Vec::with_capacity(max_batch);
    while rx.recv_many(&mut batch, max_batch).await > 0 {
        batch.retain(|p| !p.reply.is_closed());
        let Some(first) = batch.first().map(|p| p.slot) else {
            continue;
        };
        let client = at.masters.client(at.shard, at.index);
        let ok = if batch.iter().all(|p| p.slot == first) {
            // One slot (always, outside a cluster): one call, made here.
            answer(&caller, &client, &mut batch).await
        } else {
            batch.sort_by_key(|p| p.slot);
            let mut calls = tokio::task::JoinSet::new();
            while !batch.is_empty() {
                let slot = batch[0].slot;
                let same = batch.iter().take_while(|p| p.slot == slot).count();
                let mut group: Vec<Pending> = batch.drain(..same).collect();
                let (caller, client) = (caller.clone(), client.clone());
                calls.spawn(async move { answer(&caller, &client, &mut group).await });
            }
            calls.join_all().await.into_iter().all(|ok| ok)
        };
        if !ok {
            at.masters.look.notify_one();
        }
    }
}

/// Decides `group` in one call, sends each request its answer, and leaves `group` empty;
/// whether the call succeeded.
async fn answer(caller: &Caller, client: &Client, group: &mut Vec<Pending>) -> bool {
    let items = group
        .iter()
        .map(|p| (p.hash.as_str(), &p.field[..], &p.limits));
    match caller.call(client, items, None).await {
        Ok(outcomes) => {
            for (p, o) in group.drain(..).zip(outcomes) {
                let _ = p.reply.send(Ok(o));
            }
            true
        }
        Err(e) => {
            for p in group.drain(..) {
                let _ = p.reply.send(Err(e.clone()));
            }
            false
        }
    }
}

/// Reads the script's reply, six integers per request: `{allowed, bits, remaining tokens,
/// remaining window, retry, now}`.
fn outcomes_from_reply(r: &[i64], wanted: usize) -> Result<Vec<CounterCheck>, StoreError> {
    if r.len() != 6 * wanted {
        return Err(StoreError::bad_reply(format!(
            "{} integers for {wanted} requests, not {}",
            r.len(),
            6 * wanted
        )));
    }
    let u32_of = |v: i64, what: &str| {
        u32::try_from(v).map_err(|_| StoreError::bad_reply(format!("{what} = {v}")))
    };
    r.chunks_exact(6)
        .map(|a| {
            Ok(CounterCheck {
                allowed: a[0] == 1,
                denied_by_bucket: a[1] & 1 != 0,
                denied_by_window: a[1] & 2 != 0,
                remaining_tokens: u32_of(a[2], "remaining tokens")?,
                remaining_window: u32_of(a[3], "remaining window")?,
                retry_after_ms: u32_of(a[4], "retry-after")?,
                now_ms: a[5],
            })
        })
        .collect()
}

/// A key's place is its hash's slot in Redis Cluster (0 outside one): it picks the shard's
/// breaker, the lane, and the batch of one script call.
impl CounterStore for RedisStore {
    type Place = u16;

    async fn check(&self, key: &LimitKey, limits: &Limits) -> Result<CounterCheck, StoreError> {
        self.check_located(key, self.locate(key).place, limits)
            .await
    }

    async fn check_located(
        &self,
        key: &LimitKey,
        slot: u16,
        limits: &Limits,
    ) -> Result<CounterCheck, StoreError> {
        let inner = &*self.inner;
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            hash: inner.layout.hash(key),
            field: inner.layout.field(key),
            limits: *limits,
            slot,
            reply,
        };
        let lane = if inner.clustered {
            inner.shards.of_slot(slot) * inner.lanes_per_shard
                + usize::from(slot) % inner.lanes_per_shard
        } else {
            inner.next_lane.fetch_add(1, Ordering::Relaxed) % inner.lanes.len()
        };
        match inner.lanes[lane].try_send(pending) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                return Err(StoreError::busy(LANE_QUEUE).deciding(key));
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return Err(lane_stopped().deciding(key)),
        }
        let timeout = inner.caller.timeout;
        match tokio::time::timeout(timeout, answer).await {
            Ok(Ok(result)) => result.map_err(|e| e.deciding(key)),
            Ok(Err(_)) => Err(lane_stopped().deciding(key)),
            Err(_) => Err(StoreError::timeout(timeout).deciding(key)),
        }
    }

    fn shards(&self) -> usize {
        self.inner.shards.count
    }

    fn locate(&self, key: &LimitKey) -> Located<u16> {
        if self.inner.clustered {
            let slot = self.inner.layout.slot(key);
            Located {
                shard: self.inner.shards.of_slot(slot),
                place: slot,
            }
        } else {
            Located { shard: 0, place: 0 }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_read_and_nonsense_is_refused() {
        let o = outcomes_from_reply(&[0, 3, 1, 2, 1500, 99, 1, 0, 4, 5, 0, 100], 2).unwrap();
        assert!(!o[0].allowed && o[0].denied_by_bucket && o[0].denied_by_window);
        assert_eq!(
            (
                o[0].remaining_tokens,
                o[0].remaining_window,
                o[0].retry_after_ms,
                o[0].now_ms
            ),
            (1, 2, 1500, 99)
        );
        assert!(o[1].allowed && !o[1].denied_by_bucket && !o[1].denied_by_window);
        assert_eq!((o[1].remaining_tokens, o[1].now_ms), (4, 100));
        assert!(outcomes_from_reply(&[1, 0], 1).is_err());
        assert!(outcomes_from_reply(&[1, 0, 0, 0, 0, 0], 2).is_err());
        assert!(outcomes_from_reply(&[1, 0, -1, 0, 0, 0], 1).is_err());
    }
}
