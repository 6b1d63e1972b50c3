//! Three regions on one machine: one Redis each (`scripts/services.sh up regions`), one
//! policy store, a limiter per region with its shares and near-limit reports, and the
//! reconcile job between them, all on short intervals so a test sees several rounds in
//! seconds.
//!
//! Events: one Kafka topic shared by the three regions. The ingest worker's exactly-once
//! identity is (topic partition, offset), so one topic keeps it unique across regions; the
//! event's `region` field says where it was decided. (In production each region produces
//! to its own Kafka and the topics are mirrored into the one the ingest reads; here one
//! broker stands for all three.)

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fred::interfaces::ClientLike as _;
use rdkafka::message::Message;
use verdict_counters_redis::{RedisStore, RedisStoreConfig};
use verdict_limiter::regions::{Share, ShareHandle};
use verdict_limiter::{
    Decision, Limiter, LimiterConfig, LimiterMetrics, PolicyHandle, PolicySource, RegionalTimings,
    Request, SystemClock, event_queue,
};
use verdict_policy_store::{PgShares, PgSource};
use verdict_reconcile::region_counters::RegionCounters;
use verdict_reconcile::share_rounds::ShareRounds;
use verdict_reconcile::{ReconcileConfig, Reconciler, RegionEndpoint, RoundOutcome};
use verdict_schemas::{DecisionEvent, KeyId, RegionId, RouteClassId, TierId};

use crate::{
    Service, drain_to_kafka, fresh_database, kafka_consumer, region_redis_urls, require,
    require_regions, unique_name,
};

/// The regions, in order.
pub const REGIONS: [&str; 3] = ["us-east-1", "eu-central-1", "ap-southeast-1"];
/// The key's global bucket: capacity …
pub const CAPACITY: u32 = 40;
/// … and refill, tokens per second.
pub const REFILL_PER_S: u32 = 40;
/// The key's global hourly quota.
pub const QUOTA: u32 = 300;
/// How often gateways poll their shares, and report near-limit keys.
pub const POLL: Duration = Duration::from_millis(100);
/// The reconcile interval (30 s in production).
pub const INTERVAL: Duration = Duration::from_secs(1);

/// The reconcile configuration of the tests: production's, scaled from 30 s to 1 s.
pub fn reconcile_config() -> ReconcileConfig {
    ReconcileConfig {
        interval: INTERVAL,
        increase_delay: POLL * 4,
        stale_after: Duration::from_secs(2),
        decay: Duration::from_secs(2),
        share_ttl: Duration::from_secs(60),
        floor: 0.1,
        redis_timeout: Duration::from_millis(200),
    }
}

/// One region's gateway.
pub struct Gateway {
    /// The limiter.
    pub limiter: Limiter<RedisStore>,
    /// Its shares in force.
    pub shares: ShareHandle,
    /// The task sending its events to Kafka (ends when the limiter is dropped).
    pub drain: tokio::task::JoinHandle<()>,
    /// Its Redis.
    pub redis_url: String,
}

/// Three regions sharing one policy store.
pub struct World {
    /// The policy store's URL (a database of this test's own).
    pub pg_url: String,
    /// One gateway per region.
    pub gateways: Vec<Gateway>,
    /// The key under test.
    pub key: KeyId,
    /// The one Kafka topic every region's events go to.
    pub topic: String,
    /// Every round the job ran: when it started (ms), how long it took, what it did.
    pub rounds: Arc<Mutex<Vec<(i64, Duration, RoundOutcome)>>>,
}

/// One request and its answer.
#[derive(Debug, Clone, Copy)]
pub struct Sent {
    /// The region that decided.
    pub region: usize,
    /// The decision time (the region's Redis clock, or the gateway's for a local decision).
    pub at_ms: i64,
    /// Allowed.
    pub allowed: bool,
    /// Decided by the local fallback.
    pub local: bool,
}

/// The wall clock in Unix ms.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl World {
    /// Starts everything: empties the regions' Redis servers, seeds a policy with the three
    /// regions (equal weights) and one tier whose key gets [`CAPACITY`], [`REFILL_PER_S`]
    /// and [`QUOTA`], starts a gateway per region and the reconcile job.
    ///
    /// # Panics
    /// When a region's Redis or PostgreSQL is not running.
    pub async fn start(name: &str) -> World {
        Self::start_with_deadline(name, Duration::from_millis(100)).await
    }

    /// [`Self::start`] with each gateway's decision deadline `deadline`: a world whose
    /// Redis servers all stay up takes a long one, so that no decision is left to the local
    /// fallback by a stall of this process (a debug build on two cores the suite's services
    /// share) and every one is counted where the test counts.
    pub async fn start_with_deadline(name: &str, deadline: Duration) -> World {
        require_regions();
        require(Service::Kafka);
        let topic = unique_name(&format!("{name}-decisions"));
        let pg_url = fresh_database(name).await;
        let source = PgSource::new(&pg_url);
        source.migrate().await.expect("migrate the policy store");
        let (client, conn) = tokio_postgres::connect(&pg_url, tokio_postgres::NoTls)
            .await
            .expect("connect to PostgreSQL");
        tokio::spawn(conn);
        client
            .batch_execute(&format!(
                "insert into verdict_policy.tiers (id, name) values (0, 'metered');
                 insert into verdict_policy.route_classes (id, name) values (0, 'api');
                 insert into verdict_policy.limits values ('metered', '*', {CAPACITY}, {REFILL_PER_S}, {QUOTA}, 'enforce');
                 insert into verdict_policy.regions (id, name) values (0, '{}'), (1, '{}'), (2, '{}');",
                REGIONS[0], REGIONS[1], REGIONS[2]
            ))
            .await
            .expect("seed the policy");
        let policy: Arc<dyn PolicySource> = Arc::new(source);
        let snapshot = policy.load().await.expect("load the policy");

        let urls = region_redis_urls();
        assert!(
            urls.len() >= 3,
            "three region Redis ports are needed, got {urls:?}"
        );
        let mut gateways = Vec::new();
        let mut endpoints = Vec::new();
        for (i, url) in urls.iter().take(3).enumerate() {
            let store = RedisStore::connect(&RedisStoreConfig {
                url: url.clone(),
                // Loopback, but debug builds on two busy cores: a decision that times out
                // would be decided locally and blur what the test counts.
                timeout: deadline,
                ..RedisStoreConfig::default()
            })
            .await
            .unwrap_or_else(|e| panic!("region {i} Redis at {url}: {e}"));
            let _: () = store.client().flushall(false).await.expect("FLUSHALL");
            let metrics = Arc::new(LimiterMetrics::new());
            let (queue, events) = event_queue(1 << 20, Arc::clone(&metrics));
            let drain = drain_to_kafka(events, &topic, &metrics);
            let region = RegionId(i as u16);
            let regional = verdict_gateway::regional::start(
                PgShares::new(&pg_url),
                region,
                store.client().clone(),
                Arc::clone(&metrics),
                Arc::new(SystemClock),
                RegionalTimings {
                    share_poll: POLL,
                    report_every: POLL,
                    share_ttl: Duration::from_secs(60),
                },
            );
            let shares = regional.shares.clone();
            let limiter = Limiter::new(
                store,
                PolicyHandle::new(snapshot.clone(), now_ms()),
                queue,
                metrics,
                LimiterConfig {
                    region,
                    instance: i as u32,
                    ..LimiterConfig::default()
                },
            )
            .with_regional(regional);
            endpoints.push(RegionEndpoint {
                id: region,
                counters: RegionCounters::new(url, reconcile_config().redis_timeout)
                    .expect("region counters"),
            });
            gateways.push(Gateway {
                limiter,
                shares,
                drain,
                redis_url: url.clone(),
            });
        }

        let rounds = Arc::new(Mutex::new(Vec::new()));
        let mut job = Reconciler::new(
            endpoints,
            policy,
            ShareRounds::new(&pg_url),
            reconcile_config(),
        );
        let log = Arc::clone(&rounds);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(INTERVAL);
            loop {
                ticker.tick().await;
                let (at, started) = (now_ms(), Instant::now());
                let outcome = job.run_once(at).await.expect("a reconcile round");
                log.lock().unwrap_or_else(|p| p.into_inner()).push((
                    at,
                    started.elapsed(),
                    outcome,
                ));
            }
        });

        let mut key = [0u8; 16];
        key[..8].copy_from_slice(&now_ms().to_be_bytes());
        World {
            pg_url,
            gateways,
            key: KeyId(key),
            topic,
            rounds,
        }
    }

    /// Stops the gateways, waits until their events are in Kafka, and reads `expected`
    /// events back from the topic.
    pub async fn events(self, expected: usize) -> Vec<DecisionEvent> {
        for g in self.gateways {
            drop(g.limiter);
            tokio::time::timeout(Duration::from_secs(60), g.drain)
                .await
                .expect("events delivered within 60 s")
                .expect("the drain task");
        }
        let consumer = kafka_consumer(&self.topic);
        let mut got = Vec::with_capacity(expected);
        while got.len() < expected {
            let m = tokio::time::timeout(Duration::from_secs(60), consumer.recv())
                .await
                .unwrap_or_else(|_| panic!("{} of {expected} events within 60 s", got.len()))
                .expect("a record");
            got.push(DecisionEvent::decode(m.payload().unwrap_or_default()).expect("a v1 event"));
        }
        got
    }

    /// One request of the key in `region`.
    pub async fn send(&self, region: usize) -> (Sent, Decision) {
        let d = self.gateways[region]
            .limiter
            .check(&Request {
                key_id: self.key,
                route_class: RouteClassId(0),
                tier: TierId(0),
                caller: b"client",
            })
            .await;
        let sent = Sent {
            region,
            at_ms: d.now_ms,
            allowed: d.is_allowed(),
            local: d.source == verdict_schemas::DecisionSource::LocalFallback,
        };
        (sent, d)
    }

    /// Sends to `region` every `gap` for `length`, and returns every answer.
    pub async fn drive(&self, region: usize, gap: Duration, length: Duration) -> Vec<Sent> {
        let end = Instant::now() + length;
        let mut out = Vec::new();
        let mut ticker = tokio::time::interval(gap);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        while Instant::now() < end {
            ticker.tick().await;
            out.push(self.send(region).await.0);
        }
        out
    }

    /// The share `region` enforces now for the key.
    pub fn share(&self, region: usize) -> Share {
        let static_ppm = verdict_limiter::algo::PPM / 3;
        self.gateways[region].shares.share(
            &(self.key, RouteClassId(0), TierId(0)),
            now_ms(),
            static_ppm,
        )
    }

    /// The longest round so far.
    pub fn longest_round(&self) -> Duration {
        self.rounds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(_, d, _)| *d)
            .max()
            .unwrap_or_default()
    }
}

/// The most allowed requests in any window of `length_ms` (by decision time).
pub fn max_in_window(sent: &[Sent], length_ms: i64) -> usize {
    let mut times: Vec<i64> = sent.iter().filter(|s| s.allowed).map(|s| s.at_ms).collect();
    times.sort_unstable();
    let mut best = 0;
    let mut lo = 0;
    for hi in 0..times.len() {
        while times[hi] - times[lo] >= length_ms {
            lo += 1;
        }
        best = best.max(hi - lo + 1);
    }
    best
}

/// The documented worst case of a key's excess over its global quota: what its bucket
/// admits while a shrunk share is not yet applied, C + ρ × (P + ε), for a gateway poll of
/// `poll` and a round lasting `round`.
pub fn quota_excess_bound(poll: Duration, round: Duration) -> f64 {
    f64::from(CAPACITY) + f64::from(REFILL_PER_S) * (poll + round).as_secs_f64()
}
