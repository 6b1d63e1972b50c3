//! The limiter on a Redis Cluster of its own (3 masters, a replica each) under paced
//! concurrent load, while one master is killed (its replica is promoted) or made slow
//! (`CLIENT PAUSE`): no decision waits past the deadline plus twice the scheduling slack
//! measured in the same run, the failing shard's keys go to the local fallback while the other
//! shards' keys keep deciding on Redis (a breaker per shard), decisions return to Redis
//! after the promotion or the pause without a restart, and a failed shard's key is allowed
//! no more than the bound the README documents. Two groups of instances decide two halves of
//! the keys in the same run: one's fallback starts from Redis's last answer (the default),
//! the other's from a full part, so the run measures what the seeding saves.

use std::sync::Arc;
use std::time::{Duration, Instant};

use verdict_counters_redis::{RedisStore, RedisStoreConfig};
use verdict_limiter::breaker::{BreakerConfig, BreakerState};
use verdict_limiter::policy::parse_toml;
use verdict_limiter::{
    CounterStore, LimitKey, Limiter, LimiterConfig, PolicyHandle, PolicySnapshot, Request,
};
use verdict_schemas::{DecisionSource, KeyId, RouteClassId, TierId};
use verdict_tests::discarded_events;
use verdict_tests::private::{PrivateCluster, redis_cli};

/// The decision deadline of production.
const DEADLINE: Duration = Duration::from_millis(5);
/// Gateway instances per group, each its own limiter and connections; a group shares its
/// half of the keys.
const INSTANCES: u32 = 2;
/// Instance groups: the fallback seeded from Redis's answers (group 0, even keys) or
/// started full (group 1, odd keys).
const GROUPS: u8 = 2;
/// Concurrent callers per instance.
const CALLERS: u32 = 4;
/// Decisions per second, all instances together: the design's rate of one gateway, built
/// optimised (the README's figures). Half that in a debug build, which spends several times
/// the CPU on a decision: at the full rate its four limiters, the six Redis servers of the
/// cluster and the suite's own services overload the two cores, and the run would measure
/// this process's overload (`limiter_overload`'s subject), not one shard's fault.
const RATE: u32 = if cfg!(debug_assertions) { 1_000 } else { 2_000 };
const KEYS: u8 = 48;
/// The limit of every key: a burst of C, refilled at ρ a second (the quota is far away).
const C: f64 = 5.0;
const RHO: f64 = 2.0;
/// Redis's cluster-node-timeout here: how long until a dead master is failed over.
const NODE_TIMEOUT_MS: u32 = 2_000;

/// One load test at a time in this binary: two on two cores would measure each other.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn snapshot() -> PolicySnapshot {
    let mut doc = parse_toml(include_str!("../../fixtures/policies/one_limit.toml")).unwrap();
    doc.limits[0].capacity = C as i64;
    doc.limits[0].refill_per_s = RHO;
    doc.limits[0].hourly_quota = 1_000_000;
    PolicySnapshot::build(doc).unwrap()
}

fn key(i: u8) -> KeyId {
    let mut id = [0x3c; 16];
    id[15] = i;
    KeyId(id)
}

/// The instances of both groups: group 0's first, then group 1's.
async fn limiters(url: &str) -> Vec<Arc<Limiter<RedisStore>>> {
    let mut out = Vec::new();
    for (g, i) in (0..GROUPS).flat_map(|g| (0..INSTANCES).map(move |i| (g, i))) {
        let store = RedisStore::connect(&RedisStoreConfig {
            url: url.to_owned(),
            timeout: DEADLINE,
            connections: 2,
            ..RedisStoreConfig::default()
        })
        .await
        .expect("connect to the private cluster");
        assert_eq!(store.shards(), 3);
        let (queue, metrics) = discarded_events(1 << 16);
        let cfg = LimiterConfig {
            instance: i,
            instance_count: INSTANCES,
            // The production breaker: 5 failures over at least 25 ms open it for 1 s.
            breaker: BreakerConfig::default(),
            fallback_from_store: g == 0,
            ..LimiterConfig::default()
        };
        out.push(Arc::new(Limiter::new(
            store,
            PolicyHandle::new(snapshot(), 0),
            queue,
            metrics,
            cfg,
        )));
    }
    out
}

/// One decision as the load saw it.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// Since the load started.
    at: Duration,
    key: u8,
    source: DecisionSource,
    allowed: bool,
    took: Duration,
}

/// Paced load: `CALLERS` tasks per limiter, `RATE` decisions a second in all, each over its
/// group's keys in turn, for `run`. Also a probe sleeping 1 ms at a time on the same runtime, whose
/// worst overshoot is the run's scheduling slack.
/// What a load run saw.
struct Run {
    samples: Vec<Sample>,
    /// The worst overshoot of a 1 ms sleep during the run.
    slack: Duration,
    /// By shard, whether any instance's breaker for it was seen open.
    opened: Vec<bool>,
}

async fn load(
    limiters: &[Arc<Limiter<RedisStore>>],
    run: Duration,
) -> tokio::task::JoinHandle<Run> {
    let started = Instant::now();
    let tasks = limiters.len() as u32 * CALLERS;
    let every = Duration::from_secs(1) * tasks / RATE;
    let mut set = tokio::task::JoinSet::new();
    for (li, l) in limiters.iter().enumerate() {
        for c in 0..CALLERS {
            let l = Arc::clone(l);
            let group = (li as u32 / INSTANCES) as u8;
            // Each task walks all of its group's keys from its own offset, so every key is
            // decided by both of the group's instances.
            let offset = (li as u32 % INSTANCES) * CALLERS + c;
            set.spawn(async move {
                let mut samples = Vec::new();
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut n = 3 * offset as usize;
                while started.elapsed() < run {
                    tick.tick().await;
                    n += 1;
                    let k = (n % usize::from(KEYS / GROUPS)) as u8 * GROUPS + group;
                    let caller = (n as u64).to_le_bytes();
                    let t = Instant::now();
                    let d = l
                        .check(&Request {
                            key_id: key(k),
                            route_class: RouteClassId(0),
                            tier: TierId(0),
                            caller: &caller,
                        })
                        .await;
                    samples.push(Sample {
                        at: t - started,
                        key: k,
                        source: d.source,
                        allowed: d.is_allowed(),
                        took: t.elapsed(),
                    });
                }
                samples
            });
        }
    }
    let watched: Vec<Arc<Limiter<RedisStore>>> = limiters.to_vec();
    let probe = tokio::spawn(async move {
        let mut worst = Duration::ZERO;
        let mut opened = vec![false; 3];
        while started.elapsed() < run {
            let t = Instant::now();
            tokio::time::sleep(Duration::from_millis(1)).await;
            worst = worst.max(t.elapsed().saturating_sub(Duration::from_millis(1)));
            for l in &watched {
                for (shard, state) in l.shard_breaker_states().into_iter().enumerate() {
                    opened[shard] |= state == BreakerState::Open;
                }
            }
        }
        (worst, opened)
    });
    tokio::spawn(async move {
        let samples: Vec<Sample> = set.join_all().await.into_iter().flatten().collect();
        let (slack, opened) = probe.await.unwrap();
        Run {
            samples,
            slack,
            opened,
        }
    })
}

/// The other shards' keys kept deciding on Redis while the failed shard did not answer
/// (`failing`): their breakers never opened, and at most 5 % of their decisions in that
/// stretch fell back. Without a breaker and a lane per shard every one of them would have:
/// the ones that did were decided locally because this process could not ask in time (a
/// debug build on two cores it shares with six Redis servers), as they are before the fault.
fn assert_others_on_redis(
    run: &Run,
    shard_of: &[usize],
    failed: usize,
    failing: std::ops::Range<Duration>,
) {
    let others: Vec<&Sample> = run
        .samples
        .iter()
        .filter(|s| shard_of[s.key as usize] != failed)
        .collect();
    let during: Vec<&Sample> = others
        .iter()
        .copied()
        .filter(|s| failing.contains(&s.at))
        .collect();
    let during_fell_back = fell_back(&during);
    println!(
        "other shards' keys: {} decisions, {} not by Redis; from {:?} to {:?}: {} decisions, {during_fell_back} not by Redis; breakers seen open by shard: {:?}",
        others.len(),
        others
            .iter()
            .filter(|s| s.source != DecisionSource::CounterStore)
            .count(),
        failing.start,
        failing.end,
        during.len(),
        run.opened
    );
    for (shard, opened) in run.opened.iter().enumerate() {
        assert_eq!(
            *opened,
            shard == failed,
            "shard {shard}'s breaker opened: {opened}"
        );
    }
    assert!(
        !during.is_empty() && during_fell_back * 20 <= during.len(),
        "{during_fell_back} of the other shards' {} decisions while shard {failed} failed fell back",
        during.len()
    );
}

/// How many of `samples` Redis did not decide.
fn fell_back(samples: &[&Sample]) -> usize {
    samples
        .iter()
        .filter(|s| s.source != DecisionSource::CounterStore)
        .count()
}

/// Back on Redis after `what`: in the run's `last` stretch at most 5 % of the failed
/// shard's decisions (`mine`) fell back, where a shard that had not come back would have
/// all of them (the ones that did were decided locally while this process could not ask in
/// time, as the healthy shards' are).
fn assert_back_on_redis(mine: &[&Sample], run: Duration, last: Duration, what: &str) {
    let tail: Vec<&Sample> = mine.iter().copied().filter(|s| s.at > run - last).collect();
    let tail_fallback = fell_back(&tail);
    assert!(
        !tail.is_empty() && tail_fallback * 20 <= tail.len(),
        "decisions returned to Redis after {what}: {tail_fallback} of the last {last:?}'s {} fell back",
        tail.len()
    );
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// Asserts every decision took at most the deadline plus twice the measured slack (and a
/// millisecond of timer granularity), and prints the percentiles: the process can be off
/// the cores both when the call starts waiting and when its deadline wakes it.
fn assert_latency(samples: &[Sample], slack: Duration) {
    let mut took: Vec<Duration> = samples.iter().map(|s| s.took).collect();
    took.sort_unstable();
    let max = *took.last().unwrap();
    println!(
        "{} decisions: p50 {:?}, p99 {:?}, p99.9 {:?}, max {:?}; scheduling slack (1 ms sleep's worst overshoot) {slack:?}",
        took.len(),
        percentile(&took, 0.5),
        percentile(&took, 0.99),
        percentile(&took, 0.999),
        max
    );
    let bound = DEADLINE + 2 * slack + Duration::from_millis(1);
    assert!(
        max <= bound,
        "a decision took {max:?}, over the deadline plus the slack ({bound:?})"
    );
}

/// The shard of each key, as the store sees it.
fn shards(l: &Limiter<RedisStore>) -> Vec<usize> {
    let store_of = |k: u8| {
        let key = LimitKey::new(key(k), RouteClassId(0), TierId(0));
        l.store().locate(&key).shard
    };
    (0..KEYS).map(store_of).collect()
}

/// A private cluster, the instances' limiters on it, each key's shard, and key 0's slot
/// and the master serving it (the one each test kills or pauses).
struct Rig {
    cluster: PrivateCluster,
    limiters: Vec<Arc<Limiter<RedisStore>>>,
    shard_of: Vec<usize>,
    slot: u16,
    master: u16,
}

/// Waits (a minute at most) until the machine is quiet: a 1 ms sleep overshoots by less
/// than 3 ms for half a second. The suite restarts Kafka just before these tests, and a
/// JVM warming up on two cores delays every task by tens of milliseconds, which would
/// measure the JVM, not the limiter. Returns the overshoot it last saw.
async fn quiet_machine() -> Duration {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let window = Instant::now();
        let mut worst = Duration::ZERO;
        while window.elapsed() < Duration::from_millis(500) {
            let t = Instant::now();
            tokio::time::sleep(Duration::from_millis(1)).await;
            worst = worst.max(t.elapsed().saturating_sub(Duration::from_millis(1)));
        }
        if worst < Duration::from_millis(3) || Instant::now() > deadline {
            println!("before the run, a 1 ms sleep overshot by at most {worst:?}");
            return worst;
        }
    }
}

async fn rig() -> Rig {
    quiet_machine().await;
    let cluster = PrivateCluster::start(NODE_TIMEOUT_MS);
    let limiters = limiters(&cluster.url()).await;
    let shard_of = shards(&limiters[0]);
    let slot = fred::util::redis_keyslot(
        verdict_counters_redis::Layout::default()
            .hash(&LimitKey::new(key(0), RouteClassId(0), TierId(0)))
            .as_bytes(),
    );
    let master = cluster.master_of_slot(slot).expect("a master for the slot");
    Rig {
        cluster,
        limiters,
        shard_of,
        slot,
        master,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_under_load_fails_over_and_only_its_keys_fall_back() {
    let _serial = SERIAL.lock().await;
    let Rig {
        mut cluster,
        limiters,
        shard_of,
        slot,
        master: victim,
    } = rig().await;
    let dead = shard_of[0];

    let run = Duration::from_secs(14);
    let started = Instant::now();
    let load = load(&limiters, run).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.kill(victim);
    let killed_at = started.elapsed();
    // The promotion: another node serves the slot.
    let promoted_at = loop {
        let now = started.elapsed();
        let master = tokio::task::block_in_place(|| cluster.master_of_slot(slot));
        if master.is_some_and(|m| m != victim) {
            break now;
        }
        assert!(
            now < run - Duration::from_secs(4),
            "no promotion by {now:?}:\n{}\n{}",
            cluster.cluster_nodes(),
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let run_seen = load.await.unwrap();
    let samples = &run_seen.samples;
    println!("killed {victim} at {killed_at:?}; its replica promoted by {promoted_at:?}");

    assert_latency(samples, run_seen.slack);
    assert_others_on_redis(&run_seen, &shard_of, dead, killed_at..promoted_at);

    let mine: Vec<&Sample> = samples
        .iter()
        .filter(|s| shard_of[s.key as usize] == dead)
        .collect();
    let fallback: Vec<&Sample> = mine
        .iter()
        .copied()
        .filter(|s| s.source == DecisionSource::LocalFallback && s.at >= killed_at)
        .collect();
    let first = fallback.iter().map(|s| s.at).min();
    let last = fallback.iter().map(|s| s.at).max();
    println!(
        "dead shard's keys: {} decisions, {} by the fallback, from {first:?} to {last:?}",
        mine.len(),
        fallback.len()
    );
    assert!(!fallback.is_empty(), "the dead shard's keys fell back");
    let mut per_s = [0usize; 14];
    for s in &fallback {
        per_s[(s.at.as_secs() as usize).min(13)] += 1;
    }
    println!("the dead shard's fallbacks by second: {per_s:?}");
    assert_back_on_redis(&mine, run, Duration::from_secs(3), "the promotion");
    for l in &limiters {
        assert_eq!(l.breaker_state(), BreakerState::Closed);
    }

    // Over-admission of the dead shard's keys, against the README's bound: what Redis
    // allows over the run (C + ρ·T) plus what the instances' fallbacks allow together
    // while the breaker is open (C + ρ·F), plus writes the replica had not received (at
    // most a burst). By group: group 0's fallbacks started from Redis's last answers,
    // group 1's from a full part.
    let secs = run.as_secs_f64();
    let f = last.unwrap().saturating_sub(first.unwrap()).as_secs_f64();
    let redis_limit = C + RHO * secs;
    let bound = redis_limit + C + RHO * f + C;
    let mut excess = [0.0f64; GROUPS as usize];
    for g in 0..GROUPS {
        let keys: Vec<u8> = (0..KEYS)
            .filter(|&k| k % GROUPS == g && shard_of[k as usize] == dead)
            .collect();
        assert!(!keys.is_empty(), "group {g} has keys on the dead shard");
        let mut worst: f64 = 0.0;
        for &k in &keys {
            let allowed = mine.iter().filter(|s| s.key == k && s.allowed).count() as f64;
            worst = worst.max(allowed / redis_limit);
            excess[g as usize] += (allowed - redis_limit).max(0.0) / keys.len() as f64;
            assert!(
                allowed <= bound,
                "group {g}, key {k}: {allowed} allowed, over the bound {bound:.0}"
            );
        }
        println!(
            "over-admission, fallback {}: the dead shard's {} keys got on average {:.1} over what Redis alone allows ({redis_limit:.0}), the worst {worst:.2}x; bound {bound:.0} with F = {f:.2} s",
            if g == 0 {
                "from Redis's last answer"
            } else {
                "started full"
            },
            keys.len(),
            excess[g as usize],
        );
    }
    // What the fallbacks admitted is charged back to Redis when the promoted replica
    // answers, so Redis refuses it afterwards: neither group need end over what Redis
    // alone allows, and the one started from Redis's last answer never ends over the other.
    assert!(
        excess[0] <= excess[1],
        "a fallback started from Redis's last answer admits no more than one started full: {excess:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_master_opens_only_its_shards_breaker_and_recovery_closes_it() {
    let _serial = SERIAL.lock().await;
    // The cluster lives to the end of the test (bound, not dropped).
    let Rig {
        cluster: _cluster,
        limiters,
        shard_of,
        master: slow,
        ..
    } = rig().await;
    let paused = shard_of[0];

    let run = Duration::from_secs(6);
    let started = Instant::now();
    let load = load(&limiters, run).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Shorter than the node timeout: a slow master, not a dead one.
    let pause_ms = NODE_TIMEOUT_MS / 2;
    let out = tokio::task::block_in_place(|| {
        redis_cli(slow, &["client", "pause", &pause_ms.to_string(), "all"])
    });
    assert_eq!(out.trim(), "OK");
    let paused_at = started.elapsed();
    tokio::time::sleep(Duration::from_millis(u64::from(pause_ms / 2))).await;
    let during: Vec<Vec<BreakerState>> =
        limiters.iter().map(|l| l.shard_breaker_states()).collect();
    let run_seen = load.await.unwrap();
    let samples = &run_seen.samples;
    println!(
        "paused {slow} for {pause_ms} ms at {paused_at:?}; breakers during the pause: {during:?}"
    );
    for states in &during {
        assert_ne!(
            states[paused],
            BreakerState::Closed,
            "the paused shard's breaker is open during the pause"
        );
    }
    assert_latency(samples, run_seen.slack);
    assert_others_on_redis(
        &run_seen,
        &shard_of,
        paused,
        paused_at..paused_at + Duration::from_millis(u64::from(pause_ms)),
    );
    let mine: Vec<&Sample> = samples
        .iter()
        .filter(|s| shard_of[s.key as usize] == paused)
        .collect();
    let fallback = mine
        .iter()
        .filter(|s| s.source == DecisionSource::LocalFallback)
        .count();
    println!(
        "paused shard's keys: {} decisions, {fallback} by the fallback",
        mine.len()
    );
    assert!(fallback > 0);
    assert_back_on_redis(&mine, run, Duration::from_secs(2), "the pause");
    for l in &limiters {
        assert_eq!(l.shard_breaker_states(), vec![BreakerState::Closed; 3]);
    }
}
