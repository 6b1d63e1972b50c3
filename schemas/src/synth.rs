//! Realistic synthetic decision traffic, seeded and deterministic, for the demo, benchmarks
//! and tests: Zipf-distributed keys across tiers, one tenant carrying a fixed share of all
//! traffic, per-key token buckets and hourly quotas so that denials fall where a real
//! limiter would put them (busy keys, tight tiers), a shadow tier that would-denies instead,
//! a trickle of degraded decisions and of late events.
//!
//! The limits applied here are a model of the limiter, good enough to shape realistic data;
//! the limiter itself lives in `verdict-limiter`.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};

use crate::event::{
    DecisionEvent, DecisionSource, DeniedBy, KeyId, RegionId, RouteClassId, TierId, Verdict,
};

/// The limits of one tier in the synthetic world.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthTier {
    /// Name, for printing.
    pub name: &'static str,
    /// Share of keys in this tier (the shares are normalised).
    pub key_share: f64,
    /// Token bucket capacity.
    pub capacity: u32,
    /// Token bucket refill per second.
    pub refill_per_s: f64,
    /// Hourly quota.
    pub hourly_quota: u32,
    /// Shadow mode: would-deny instead of deny.
    pub shadow: bool,
}

/// What traffic to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthConfig {
    /// Seed of every random choice.
    pub seed: u64,
    /// Number of distinct API keys.
    pub keys: u32,
    /// Zipf exponent of key popularity.
    pub zipf_exponent: f64,
    /// Share of all requests made by the single largest tenant (the design's hot key: 8 %).
    pub hot_key_share: f64,
    /// Chance, per request, that its key starts a burst (a human clicking, a retry loop).
    pub burst_start: f64,
    /// Largest burst, in back-to-back requests of one key.
    pub burst_max: u32,
    /// Decisions per hour, fleet-wide (sets the event-time spacing).
    pub events_per_hour: u64,
    /// Event time of the first decision, Unix ms.
    pub start_ms: i64,
    /// Tiers (ids are their positions), from the lowest to the highest; the busiest keys
    /// are given the highest.
    pub tiers: Vec<SynthTier>,
    /// Relative weights of the route classes (ids are positions).
    pub route_weights: Vec<u32>,
    /// Number of regions.
    pub regions: u16,
    /// Number of gateway instances.
    pub instances: u32,
    /// Share of decisions made by the local fallback.
    pub fallback_share: f64,
    /// Share of events that arrive late, their event time up to `late_max_ms` in the past.
    pub late_share: f64,
    /// Largest lateness.
    pub late_max_ms: i64,
    /// Policy version stamped on the events.
    pub policy_version: u64,
}

impl Default for SynthConfig {
    /// One hour of 2,000,000 decisions over 5,000 keys.
    fn default() -> Self {
        Self::hour(2_000_000, 5_000)
    }
}

impl SynthConfig {
    /// One hour of `events` decisions over `keys` keys, starting 2026-11-30T14:00Z.
    ///
    /// The tier limits (per key and route class) are set for 2,000,000 decisions over 5,000 keys and scaled with the
    /// traffic of a key of a given rank, so the world keeps its shape at any size: the
    /// busiest keys belong to the higher tiers (the tiers are filled from the top);
    /// enterprise is generous (too high), pro is about right (a few of its busiest keys
    /// reach the quota), starter runs in shadow mode and would refuse its busier keys, and
    /// free is set too low (most of its keys spend the hourly quota).
    pub fn hour(events: u64, keys: u32) -> Self {
        let keys = keys.max(1);
        let harmonic = |n: f64| n.ln() + 0.577;
        let scale = (events as f64 / 2_000_000.0) * harmonic(5_000.0) / harmonic(f64::from(keys));
        let quota = |q: f64| (q * scale).round().max(1.0) as u32;
        let tier = |name, key_share, capacity, refill: f64, hourly: f64, shadow| SynthTier {
            name,
            key_share,
            capacity,
            refill_per_s: refill * scale,
            hourly_quota: quota(hourly),
            shadow,
        };
        Self {
            seed: 42,
            keys,
            zipf_exponent: 1.0,
            hot_key_share: 0.08,
            burst_start: 0.000_2,
            burst_max: 100,
            events_per_hour: events.max(1),
            // 2026-11-30T14:00:00Z
            start_ms: 1_796_047_200_000,
            tiers: vec![
                tier("free", 0.718, 10, 0.05, 20.0, false),
                tier("starter", 0.25, 30, 0.5, 300.0, true),
                tier("pro", 0.03, 200, 10.0, 6_000.0, false),
                tier("enterprise", 0.002, 5_000, 2_000.0, 7_200_000.0, false),
            ],
            route_weights: vec![50, 20, 15, 10, 5],
            regions: 3,
            instances: 18,
            fallback_share: 0.001,
            late_share: 0.001,
            late_max_ms: 2 * 3_600_000,
            policy_version: 1,
        }
    }
}

/// The 16-byte key id of synthetic key number `index` (a fixed mix, so every run and every
/// tool names the same keys the same way).
pub fn synth_key_id(index: u32) -> KeyId {
    let a = splitmix64(u64::from(index) ^ 0x005e_ed0f_ce11);
    let b = splitmix64(a);
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&a.to_le_bytes());
    id[8..].copy_from_slice(&b.to_le_bytes());
    KeyId(id)
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[derive(Debug, Clone, Copy, Default)]
struct LimitState {
    tokens: f64,
    last_ms: i64,
    hour: i64,
    used: u32,
    seen: bool,
}

/// An endless, deterministic stream of decision events (take as many as needed).
#[derive(Debug)]
pub struct SynthTraffic {
    cfg: SynthConfig,
    rng: SmallRng,
    zipf: Zipf<f64>,
    tier_of_key: Vec<u8>,
    route_cdf: Vec<u32>,
    state: Vec<LimitState>,
    routes: usize,
    n: u64,
    burst: Option<(u32, u32)>,
}

impl SynthTraffic {
    /// A generator for `cfg`.
    ///
    /// # Panics
    /// If `cfg` has no keys, no tiers or no route classes.
    pub fn new(cfg: SynthConfig) -> Self {
        assert!(cfg.keys > 0 && !cfg.tiers.is_empty() && !cfg.route_weights.is_empty());
        let rng = SmallRng::seed_from_u64(cfg.seed);
        // Fill the tiers from the top: the busiest keys (lowest index) get the last tier.
        let total_share: f64 = cfg.tiers.iter().map(|t| t.key_share).sum();
        let mut tier_of_key = Vec::with_capacity(cfg.keys as usize);
        for (i, t) in cfg.tiers.iter().enumerate().rev() {
            let n = if i == 0 {
                cfg.keys as usize - tier_of_key.len()
            } else {
                ((t.key_share / total_share) * f64::from(cfg.keys)).ceil() as usize
            };
            let n = n.min(cfg.keys as usize - tier_of_key.len());
            tier_of_key.extend(std::iter::repeat_n(i as u8, n));
        }
        let route_cdf = cfg
            .route_weights
            .iter()
            .scan(0, |acc, w| {
                *acc += w;
                Some(*acc)
            })
            .collect();
        let zipf =
            Zipf::new(f64::from(cfg.keys), cfg.zipf_exponent).expect("keys >= 1 and exponent > 0");
        let routes = cfg.route_weights.len();
        Self {
            state: vec![LimitState::default(); cfg.keys as usize * routes],
            rng,
            zipf,
            tier_of_key,
            route_cdf,
            routes,
            n: 0,
            burst: None,
            cfg,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SynthConfig {
        &self.cfg
    }

    /// The tier id of synthetic key `index`.
    pub fn tier_of(&self, index: u32) -> TierId {
        TierId(self.tier_of_key[index as usize])
    }

    fn pick_route(&mut self) -> usize {
        let total = *self.route_cdf.last().unwrap_or(&1);
        let x = self.rng.random_range(0..total.max(1));
        self.route_cdf.iter().position(|c| x < *c).unwrap_or(0)
    }
}

impl Iterator for SynthTraffic {
    type Item = DecisionEvent;

    fn next(&mut self) -> Option<DecisionEvent> {
        let cfg = &self.cfg;
        let now = cfg.start_ms
            + (i128::from(self.n) * 3_600_000 / i128::from(cfg.events_per_hour.max(1))) as i64;
        self.n += 1;
        let key = match self.burst {
            Some((key, left)) => {
                self.burst = (left > 1).then_some((key, left - 1));
                key
            }
            None if self.rng.random::<f64>() < cfg.hot_key_share => 0,
            // Zipf ranks start at 1; rank 1 is the busiest ordinary key.
            None => (self.zipf.sample(&mut self.rng) as u32).clamp(1, cfg.keys) % cfg.keys,
        };
        if self.burst.is_none() && key != 0 && self.rng.random::<f64>() < cfg.burst_start {
            self.burst = Some((key, self.rng.random_range(1..=cfg.burst_max.max(1))));
        }
        let route = self.pick_route();
        let tier_id = self.tier_of_key[key as usize];
        let tier = &self.cfg.tiers[tier_id as usize];
        let source = if self.rng.random::<f64>() < self.cfg.fallback_share {
            DecisionSource::LocalFallback
        } else {
            DecisionSource::CounterStore
        };

        let s = &mut self.state[key as usize * self.routes + route];
        if !s.seen {
            *s = LimitState {
                tokens: f64::from(tier.capacity),
                last_ms: now,
                hour: now.div_euclid(3_600_000),
                used: 0,
                seen: true,
            };
        }
        let elapsed = (now - s.last_ms).max(0) as f64 / 1000.0;
        s.tokens = (s.tokens + elapsed * tier.refill_per_s).min(f64::from(tier.capacity));
        s.last_ms = now;
        let hour = now.div_euclid(3_600_000);
        if hour != s.hour {
            s.hour = hour;
            s.used = 0;
        }
        let denied_by = DeniedBy {
            bucket: s.tokens < 1.0,
            window: s.used >= tier.hourly_quota,
        };
        let (verdict, retry_after_ms) = if denied_by.any() {
            let bucket_wait = if denied_by.bucket {
                ((1.0 - s.tokens) / tier.refill_per_s * 1000.0).ceil() as i64
            } else {
                0
            };
            let window_wait = if denied_by.window {
                (hour + 1) * 3_600_000 - now
            } else {
                0
            };
            let verdict = if tier.shadow {
                Verdict::WouldDeny
            } else {
                Verdict::Denied
            };
            (
                verdict,
                bucket_wait.max(window_wait).clamp(0, i64::from(u32::MAX)) as u32,
            )
        } else {
            s.tokens -= 1.0;
            s.used += 1;
            (Verdict::Allowed, 0)
        };
        let (remaining_tokens, remaining_window) = (
            s.tokens.max(0.0) as u32,
            tier.hourly_quota.saturating_sub(s.used),
        );

        let late = self.rng.random::<f64>() < self.cfg.late_share;
        let event_time_ms = if late {
            now - self.rng.random_range(1..=self.cfg.late_max_ms.max(1))
        } else {
            now
        };
        let hot = key == 0;
        Some(DecisionEvent {
            event_time_ms,
            key_id: synth_key_id(key),
            route_class: RouteClassId(route as u8),
            tier: TierId(tier_id),
            region: RegionId(self.rng.random_range(0..self.cfg.regions.max(1))),
            gateway_instance: self.rng.random_range(0..self.cfg.instances.max(1)),
            verdict,
            denied_by,
            source,
            remaining_tokens,
            remaining_window,
            retry_after_ms,
            window_quota: tier.hourly_quota,
            policy_version: self.cfg.policy_version,
            sub_key: if hot { self.rng.random_range(0..16) } else { 0 },
            sub_keys: if hot { 16 } else { 1 },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(cfg: SynthConfig, n: usize) -> Vec<DecisionEvent> {
        SynthTraffic::new(cfg).take(n).collect()
    }

    #[test]
    fn same_seed_same_events_other_seed_other_events() {
        let a = take(SynthConfig::default(), 5_000);
        assert_eq!(a, take(SynthConfig::default(), 5_000));
        assert_ne!(
            a,
            take(
                SynthConfig {
                    seed: 7,
                    ..SynthConfig::default()
                },
                5_000
            )
        );
    }

    #[test]
    fn an_hour_of_traffic_spans_the_hour() {
        let cfg = SynthConfig {
            late_share: 0.0,
            ..SynthConfig::hour(36_000, 100)
        };
        let events = take(cfg.clone(), 36_000);
        assert_eq!(events[0].event_time_ms, cfg.start_ms);
        let last = events.last().unwrap().event_time_ms;
        assert!(
            (cfg.start_ms + 3_599_000..cfg.start_ms + 3_600_000).contains(&last),
            "{last}"
        );
    }

    #[test]
    fn every_event_is_valid_on_the_wire() {
        for e in take(SynthConfig::default(), 20_000) {
            assert_eq!(DecisionEvent::decode(&e.encode()), Ok(e));
        }
    }

    #[test]
    fn the_hot_tenant_carries_its_share_and_shadow_tiers_never_deny() {
        let cfg = SynthConfig::hour(200_000, 2_000);
        let events = take(cfg.clone(), 200_000);
        let hot = synth_key_id(0);
        let hot_share =
            events.iter().filter(|e| e.key_id == hot).count() as f64 / events.len() as f64;
        assert!((0.07..0.09).contains(&hot_share), "hot share {hot_share}");
        let shadow: Vec<u8> = cfg
            .tiers
            .iter()
            .enumerate()
            .filter(|(_, t)| t.shadow)
            .map(|(i, _)| i as u8)
            .collect();
        let mut denied = 0;
        let mut would = 0;
        for e in &events {
            match e.verdict {
                Verdict::Denied => {
                    denied += 1;
                    assert!(!shadow.contains(&e.tier.0));
                }
                Verdict::WouldDeny => {
                    would += 1;
                    assert!(shadow.contains(&e.tier.0));
                }
                Verdict::Allowed => {}
            }
        }
        assert!(
            denied > 0 && would > 0,
            "denied {denied}, would-deny {would}"
        );
        // Denials are the exception, not the rule (even with the free tier set too low).
        let refused = (denied + would) as f64 / events.len() as f64;
        assert!(refused < 0.25, "refused share {refused}");
    }
}
