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
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fred::prelude::*;
use fred::types::scripts::Script;
use tokio::sync::{mpsc, oneshot};

use crate::layout::{FIELD_LEN, Layout};
use crate::shards::{self, NodeSettings, ShardClients, Shards};

use verdict_limiter::algo::MAX_LIMIT;
use verdict_limiter::{
    Charge, Checked, CounterCheck, CounterStore, LimitKey, Limits, Located, StoreError,
};

/// The decision script (see the file for its arguments and reply).
pub const DECISION_SCRIPT: &str = include_str!("redis.lua");

/// Requests that may wait for one lane; past this the store answers [`StoreError::Busy`]
/// at once (the limiter's fallback then decides) rather than queue what the deadline would
/// refuse anyway.
const LANE_QUEUE: usize = 8_192;

/// How many times `max_batch` a lane takes into one call while more requests wait behind
/// it: an overloaded lane decides more per call (the script's fixed cost is most of a small
/// call) before any request waits past its deadline.
const BACKLOG_BATCH_FACTOR: usize = 4;

/// Charges a lane keeps through failed calls, to send with the next one; past this, or
/// older than their key's window, they are dropped (and counted).
const CARRY_MAX: usize = 65_536;

/// Connections per master by default: one. Each connection has one lane by default, so
/// the requests that arrive while a call is on the wire all go in the next call; more
/// lanes make more, smaller calls, and the script's fixed cost per call is most of
/// Redis's work. In `verdict-bench gateway --nginx --redis …` (closed loop, 32 in flight,
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
    /// Each lane's recent call time, µs (averaged): with what waits in its queue, how long
    /// a request queued now would wait.
    lane_rtt_us: Vec<Arc<AtomicU64>>,
    /// Most requests a lane takes into one call while more wait behind it.
    lane_call_max: usize,
    lanes_per_shard: usize,
    next_lane: AtomicUsize,
    clustered: bool,
    layout: Layout,
    shards: Arc<Shards>,
    /// Charges the lanes dropped ([`RedisStore::charges_dropped`]).
    charges_dropped: Arc<AtomicU64>,
    /// How late this process wakes its tasks now, µs ([`spawn_lag_meter`]).
    lag_us: Arc<AtomicU64>,
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

/// One item waiting in a lane: a request to decide, or a charge to count.
struct Pending {
    hash: String,
    field: [u8; FIELD_LEN],
    limits: Limits,
    slot: u16,
    op: Op,
}

enum Op {
    /// Decide one request of `hits` and send the answer.
    Decide {
        hits: u32,
        reply: oneshot::Sender<Result<CounterCheck, StoreError>>,
        /// Who has the request: [`WAITING`] in the lane's queue, then [`SENT`] by the lane
        /// or [`ABANDONED`] by its caller at the deadline, whichever comes first. So a
        /// caller knows whether its deadline passed in this process (overload) or at Redis
        /// (failure), and an abandoned request is never sent.
        claim: Arc<AtomicU8>,
        /// When it was queued: its deadline is `since` + the store's timeout.
        since: Instant,
    },
    /// Count `count` requests admitted elsewhere; kept through failed calls until `until`.
    Charge { count: u32, until: Instant },
}

const WAITING: u8 = 0;
const SENT: u8 = 1;
const ABANDONED: u8 = 2;

impl Pending {
    fn is_charge(&self) -> bool {
        matches!(self.op, Op::Charge { .. })
    }

    /// What a request counts as (a charge decides nothing).
    fn hits(&self) -> u32 {
        match self.op {
            Op::Decide { hits, .. } => hits,
            Op::Charge { .. } => 0,
        }
    }

    /// For a request: whether the lane may still send it (its caller has not given up),
    /// claiming it as sent. A charge is always sent.
    fn take_for_call(&self) -> bool {
        match &self.op {
            Op::Decide { claim, .. } => claim
                .compare_exchange(WAITING, SENT, Ordering::AcqRel, Ordering::Acquire)
                .is_ok(),
            Op::Charge { .. } => true,
        }
    }

    /// Whether this is a request whose deadline comes before `cutoff`.
    fn due_before(&self, cutoff: Instant, timeout: Duration) -> bool {
        matches!(self.op, Op::Decide { since, .. } if since + timeout <= cutoff)
    }

    /// Answers a request as overloaded at once, unless its caller already gave up.
    fn shed(self, timeout: Duration) {
        if let Op::Decide { reply, claim, .. } = self.op
            && claim
                .compare_exchange(WAITING, ABANDONED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            let _ = reply.send(Err(StoreError::overloaded(timeout)));
        }
    }
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
    /// When the URL is malformed, Redis does not answer within [`shards::SETUP_TIMEOUT`], or it
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
        let charges_dropped = Arc::new(AtomicU64::new(0));
        let lag_us = Arc::new(AtomicU64::new(0));
        spawn_lag_meter(Arc::downgrade(&lag_us));
        let (lanes, lane_rtt_us): (Vec<_>, Vec<_>) = (0..shards.count * lanes_per_shard)
            .map(|i| {
                let (tx, rx) = mpsc::channel(LANE_QUEUE);
                let rtt = Arc::new(AtomicU64::new(0));
                let at = LaneAt {
                    masters: Arc::clone(&masters),
                    shard: i / lanes_per_shard,
                    index: i % lanes_per_shard,
                    dropped: Arc::clone(&charges_dropped),
                    rtt_us: Arc::clone(&rtt),
                };
                tokio::spawn(lane(rx, at, caller.clone(), max_batch));
                (tx, rtt)
            })
            .unzip();
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                caller,
                lanes,
                lane_rtt_us,
                lane_call_max: max_batch * BACKLOG_BATCH_FACTOR,
                lanes_per_shard,
                next_lane: AtomicUsize::new(0),
                clustered,
                layout: cfg.layout,
                shards,
                charges_dropped,
                lag_us,
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

    /// Decides a request of `hits` at a given time instead of the server's (the script's
    /// test hook), without the deadline and without a lane: for comparing the script with
    /// the Rust core.
    pub async fn check_at(
        &self,
        key: &LimitKey,
        limits: &Limits,
        hits: u32,
        now_ms: i64,
    ) -> Result<CounterCheck, StoreError> {
        let mut answers = self.check_many_at(&[(*key, *limits, hits)], now_ms).await?;
        answers
            .pop()
            .ok_or_else(|| StoreError::bad_reply("no answer"))
    }

    /// Decides several requests (key, limits, hits) in one script call at a given time, in
    /// order (the test hook of a batch). The keys must share a slot in Redis Cluster.
    pub async fn check_many_at(
        &self,
        requests: &[(LimitKey, Limits, u32)],
        now_ms: i64,
    ) -> Result<Vec<CounterCheck>, StoreError> {
        let layout = &self.inner.layout;
        let items: Vec<(String, [u8; FIELD_LEN], Limits, u32)> = requests
            .iter()
            .map(|(k, l, hits)| (layout.hash(k), layout.field(k), *l, *hits))
            .collect();
        self.inner
            .caller
            .call(
                self.inner.pool.next(),
                std::iter::empty(),
                items
                    .iter()
                    .map(|(h, f, l, hits)| (h.as_str(), &f[..], l, *hits)),
                Some(now_ms),
            )
            .await
    }

    /// Counts `count` requests of `key` admitted elsewhere, at a given time, in a call of its
    /// own (the test hook of a charge).
    pub async fn charge_at(
        &self,
        key: &LimitKey,
        limits: &Limits,
        count: u32,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let layout = &self.inner.layout;
        let (hash, field) = (layout.hash(key), layout.field(key));
        self.inner
            .caller
            .call(
                self.inner.pool.next(),
                std::iter::once((hash.as_str(), &field[..], limits, count)),
                std::iter::empty(),
                Some(now_ms),
            )
            .await
            .map(drop)
    }

    /// Charges dropped by the lanes: carried through failed calls until they were older
    /// than their key's window, or more than a lane keeps.
    pub fn charges_dropped(&self) -> u64 {
        self.inner.charges_dropped.load(Ordering::Relaxed)
    }

    /// How late this process has recently woken a task that slept (a decaying maximum).
    pub fn lag(&self) -> Duration {
        Duration::from_micros(self.inner.lag_us.load(Ordering::Relaxed))
    }

    /// The lane of a key at `slot`: its shard's lanes, spread by slot in a cluster; in turn
    /// outside one.
    fn lane_of(&self, slot: u16) -> usize {
        let inner = &*self.inner;
        if inner.clustered {
            inner.shards.of_slot(slot) * inner.lanes_per_shard
                + usize::from(slot) % inner.lanes_per_shard
        } else {
            inner.next_lane.fetch_add(1, Ordering::Relaxed) % inner.lanes.len()
        }
    }

    /// How long a request queued now on `lane` would take to be answered: the calls for what
    /// waits ahead of it and its own, at the lane's recent call time. Zero when nothing
    /// waits: the request goes at once, and its call tells the lane how long calls take now
    /// (a lane never stays shut on an old estimate).
    fn expected_wait(&self, lane: usize) -> Duration {
        let inner = &*self.inner;
        let queued = LANE_QUEUE - inner.lanes[lane].capacity();
        if queued == 0 {
            return Duration::ZERO;
        }
        let calls = (queued.div_ceil(inner.lane_call_max) + 1) as u64;
        Duration::from_micros(inner.lane_rtt_us[lane].load(Ordering::Relaxed) * calls)
    }
}

/// A charge as the script takes it: hash, field, limits, count.
type ChargeItem<'a> = (&'a str, &'a [u8], &'a Limits, u32);
/// A request as the script takes it: hash, field, limits, hits.
type DecideItem<'a> = (&'a str, &'a [u8], &'a Limits, u32);

impl Caller {
    /// One script call counting `charges`, then deciding `decisions` in order.
    async fn call<'a, C, D>(
        &self,
        client: &Client,
        charges: C,
        decisions: D,
        now_ms: Option<i64>,
    ) -> Result<Vec<CounterCheck>, StoreError>
    where
        C: Iterator<Item = ChargeItem<'a>> + Clone,
        D: Iterator<Item = DecideItem<'a>> + Clone,
    {
        let (keys, args, wanted) = self.arguments(charges.clone(), decisions.clone(), now_ms);
        let reply = match client.evalsha(self.script.sha1().clone(), keys, args).await {
            Err(e) if e.details().starts_with("NOSCRIPT") => {
                // Redis restarted or its scripts were flushed: load it and try once more.
                self.script.load(client).await.map_err(|e| self.error(&e))?;
                let (keys, args, _) = self.arguments(charges, decisions, now_ms);
                client.evalsha(self.script.sha1().clone(), keys, args).await
            }
            other => other,
        };
        let reply: Vec<i64> = reply.map_err(|e| self.error(&e))?;
        outcomes_from_reply(&reply, wanted)
    }

    /// The script's keys and arguments (see `redis.lua`), and how many requests it decides.
    fn arguments<'a>(
        &self,
        charges: impl Iterator<Item = ChargeItem<'a>>,
        decisions: impl Iterator<Item = DecideItem<'a>>,
        now_ms: Option<i64>,
    ) -> (Vec<Key>, Vec<Value>, usize) {
        let (lower, _) = decisions.size_hint();
        let mut keys = Vec::with_capacity(lower);
        let mut args: Vec<Value> = Vec::with_capacity(3 + 6 * lower);
        args.push(now_ms.map_or_else(|| Value::from(""), Value::from));
        args.push(self.ttl_windows.into());
        args.push(0.into());
        let limit_args = |args: &mut Vec<Value>, field: &[u8], limits: &Limits| {
            args.push(field.into());
            args.push(i64::from(limits.capacity).into());
            args.push(limits.refill_units_per_ms.into());
            args.push(i64::from(limits.quota).into());
            args.push(limits.window_ms.into());
        };
        let mut charged = 0i64;
        for (hash, field, limits, count) in charges {
            keys.push(Key::from(hash));
            limit_args(&mut args, field, limits);
            args.push(i64::from(count).into());
            charged += 1;
        }
        args[2] = charged.into();
        let mut wanted = 0;
        for (hash, field, limits, hits) in decisions {
            keys.push(Key::from(hash));
            limit_args(&mut args, field, limits);
            args.push(i64::from(hits.min(MAX_LIMIT + 1)).into());
            wanted += 1;
        }
        (keys, args, wanted)
    }

    fn error(&self, e: &Error) -> StoreError {
        match e.kind() {
            ErrorKind::Timeout => StoreError::timeout(self.timeout),
            _ => backend(e.clone()),
        }
    }
}

/// Measures how late the runtime wakes a task: a task that sleeps 1 ms at a time and keeps
/// the worst overshoot, decaying by an eighth a tick (a stall is forgotten within tens of
/// milliseconds of its end). Ends when the store is dropped.
fn spawn_lag_meter(lag_us: std::sync::Weak<AtomicU64>) {
    const TICK: Duration = Duration::from_millis(1);
    tokio::spawn(async move {
        loop {
            let slept = Instant::now();
            tokio::time::sleep(TICK).await;
            let Some(lag) = lag_us.upgrade() else { return };
            let over =
                u64::try_from(slept.elapsed().saturating_sub(TICK).as_micros()).unwrap_or(u64::MAX);
            let kept = lag.load(Ordering::Relaxed);
            lag.store(over.max(kept - kept / 8), Ordering::Relaxed);
        }
    });
}

/// Where a lane sends its calls: the `index`-th connection of `shard`'s current master;
/// and where it counts the charges it drops.
struct LaneAt {
    masters: Arc<ShardClients>,
    shard: usize,
    index: usize,
    dropped: Arc<AtomicU64>,
    /// Where it says how long its calls take.
    rtt_us: Arc<AtomicU64>,
}

/// A lane: takes what waits (up to `max_batch`, or `BACKLOG_BATCH_FACTOR` times that while
/// more wait behind it), decides it in one call per slot, answers, and takes again.
/// Requests whose caller has given up (the deadline passed while they waited here) are not
/// sent. Charges ride with the requests; those of a failed call are carried to the next
/// one. A failed call rings the watcher, which looks whether the shard's master has changed.
async fn lane(mut rx: mpsc::Receiver<Pending>, at: LaneAt, caller: Caller, max_batch: usize) {
    let mut batch: Vec<Pending> = Vec::with_capacity(max_batch * BACKLOG_BATCH_FACTOR);
    let mut carry: Vec<Pending> = Vec::new();
    // How long this lane's calls take, averaged: a request is sent only if it has that
    // much of its deadline left.
    let mut rtt = Duration::ZERO;
    while rx.recv_many(&mut batch, max_batch).await > 0 {
        if !rx.is_empty() {
            rx.recv_many(&mut batch, max_batch * (BACKLOG_BATCH_FACTOR - 1))
                .await;
        }
        // What cannot be answered in time by a call made now is shed: answered as
        // overloaded at once, rather than sent to miss its deadline and count against
        // Redis. A call is taken to need the lane's recent call time, at most half the
        // deadline: that time includes this process's own delays, which overload inflates.
        let cutoff = Instant::now() + rtt.min(caller.timeout / 2);
        for late in batch.extract_if(.., |p| p.due_before(cutoff, caller.timeout)) {
            late.shed(caller.timeout);
        }
        batch.retain(Pending::take_for_call);
        if !carry.is_empty() {
            let now = Instant::now();
            let before = carry.len();
            carry.retain(|p| matches!(p.op, Op::Charge { until, .. } if until > now));
            at.dropped
                .fetch_add((before - carry.len()) as u64, Ordering::Relaxed);
            batch.append(&mut carry);
        }
        let Some(first) = batch.first().map(|p| p.slot) else {
            continue;
        };
        let client = at.masters.client(at.shard, at.index);
        let call_started = Instant::now();
        let ok = if batch.iter().all(|p| p.slot == first) {
            // One slot (always, outside a cluster): one call, made here.
            answer(&caller, &client, &mut batch, &mut carry).await
        } else {
            batch.sort_by_key(|p| p.slot);
            let mut calls = tokio::task::JoinSet::new();
            while !batch.is_empty() {
                let slot = batch[0].slot;
                let same = batch.iter().take_while(|p| p.slot == slot).count();
                let mut group: Vec<Pending> = batch.drain(..same).collect();
                let (caller, client) = (caller.clone(), client.clone());
                calls.spawn(async move {
                    let mut failed = Vec::new();
                    let ok = answer(&caller, &client, &mut group, &mut failed).await;
                    (ok, failed)
                });
            }
            let mut ok = true;
            for (group_ok, mut failed) in calls.join_all().await {
                ok &= group_ok;
                carry.append(&mut failed);
            }
            ok
        };
        // A failed call's time says nothing of how long an answer takes.
        if ok {
            rtt = (rtt * 7 + call_started.elapsed()) / 8;
            at.rtt_us.store(
                u64::try_from(rtt.as_micros()).unwrap_or(u64::MAX),
                Ordering::Relaxed,
            );
        }
        if carry.len() > CARRY_MAX {
            let over = carry.len() - CARRY_MAX;
            carry.drain(..over);
            at.dropped.fetch_add(over as u64, Ordering::Relaxed);
        }
        if !ok {
            at.masters.look.notify_one();
        }
    }
}

/// Counts the charges of `group` and decides its requests in one call, sends each request
/// its answer, moves the charges of a failed call to `failed`, and leaves `group` empty;
/// whether the call succeeded.
async fn answer(
    caller: &Caller,
    client: &Client,
    group: &mut Vec<Pending>,
    failed: &mut Vec<Pending>,
) -> bool {
    // Charges first (the script's order); the requests keep their order of arrival.
    group.sort_by_key(|p| !p.is_charge());
    let charges = group.iter().take_while(|p| p.is_charge()).count();
    let result = caller
        .call(
            client,
            group[..charges].iter().map(|p| {
                let count = match p.op {
                    Op::Charge { count, .. } => count,
                    Op::Decide { .. } => 0,
                };
                (p.hash.as_str(), &p.field[..], &p.limits, count)
            }),
            group[charges..]
                .iter()
                .map(|p| (p.hash.as_str(), &p.field[..], &p.limits, p.hits())),
            None,
        )
        .await;
    let ok = result.is_ok();
    let mut answers = match result {
        Ok(outcomes) => outcomes.into_iter().map(Ok).collect::<Vec<_>>(),
        Err(e) => vec![Err(e); group.len() - charges],
    };
    for (p, a) in group.drain(charges..).zip(answers.drain(..)) {
        if let Op::Decide { reply, .. } = p.op {
            let _ = reply.send(a);
        }
    }
    if ok {
        group.clear();
    } else {
        failed.append(group);
    }
    ok
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

    async fn check(&self, key: &LimitKey, limits: &Limits, hits: u32) -> Checked {
        self.check_located(key, self.locate(key).place, limits, hits)
            .await
    }

    async fn check_located(
        &self,
        key: &LimitKey,
        slot: u16,
        limits: &Limits,
        hits: u32,
    ) -> Checked {
        let inner = &*self.inner;
        let lane = self.lane_of(slot);
        let timeout = inner.caller.timeout;
        // Overloaded already: what waits ahead and this request's own call would take the
        // whole deadline. Answered now, so the fallback decides at once instead of after
        // the deadline (and a request let in can still be answered in time).
        if self.expected_wait(lane) >= timeout {
            return Err(StoreError::overloaded(timeout).deciding(key));
        }
        let (reply, answer) = oneshot::channel();
        let claim = Arc::new(AtomicU8::new(WAITING));
        let pending = Pending {
            hash: inner.layout.hash(key),
            field: inner.layout.field(key),
            limits: *limits,
            slot,
            op: Op::Decide {
                hits,
                reply,
                claim: Arc::clone(&claim),
                since: Instant::now(),
            },
        };
        match inner.lanes[lane].try_send(pending) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                return Err(StoreError::busy(LANE_QUEUE).deciding(key));
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return Err(lane_stopped().deciding(key)),
        }
        match tokio::time::timeout(timeout, answer).await {
            Ok(Ok(result)) => result.map_err(|e| e.deciding(key)),
            Ok(Err(_)) => Err(lane_stopped().deciding(key)),
            // Still in the lane's queue: this process could not get to it in time (the
            // lane will not send it now). Sent while this process wakes its tasks late by
            // half the deadline or more: the answer may well have come, unread; overload
            // too. Otherwise Redis did not answer in time: a failure.
            Err(_) => match claim.compare_exchange(
                WAITING,
                ABANDONED,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => Err(StoreError::overloaded(timeout).deciding(key)),
                Err(_) if self.lag() * 2 >= timeout => {
                    Err(StoreError::overloaded(timeout).deciding(key))
                }
                Err(_) => Err(StoreError::timeout(timeout).deciding(key)),
            },
        }
    }

    /// Hands each charge to its key's lane, which counts it with its next call; what a full
    /// lane cannot take is handed back.
    fn charge(&self, charges: Vec<Charge<u16>>) -> Vec<Charge<u16>> {
        let layout = &self.inner.layout;
        let mut refused = Vec::new();
        for c in charges {
            let pending = Pending {
                hash: layout.hash(&c.key),
                field: layout.field(&c.key),
                limits: c.limits,
                slot: c.place,
                op: Op::Charge {
                    count: c.count,
                    until: Instant::now()
                        + Duration::from_millis(u64::try_from(c.limits.window_ms).unwrap_or(0)),
                },
            };
            if self.inner.lanes[self.lane_of(c.place)]
                .try_send(pending)
                .is_err()
            {
                refused.push(c);
            }
        }
        refused
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
