//! The demo's synthetic world: tiers, keys and route classes at the rate it aims at, the key
//! directory the gateway reads, and the requests the traffic sends.

use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use axum::body::Body;
use axum::http::Request;
use verdict_load::MakeRequest;
use verdict_schemas::KeyId;
use verdict_schemas::synth::{SynthConfig, SynthTraffic, synth_key_id};

use crate::config::DemoConfig;
use crate::policy::ROUTES;
use crate::regions::region_of;

/// The synthetic world at the rate the demo aims at: one demo hour holds `rate × 3600 /
/// speed` requests, and the limits are scaled to that, so the tiers keep their shape at any
/// rate: free too low, starter in shadow and too low, pro about right, enterprise generous
/// (and with enough keys, 0.6 % of them, for the review to judge it). The limits are per
/// route class (see [`crate::policy::per_route_policy_toml`]).
pub fn world(cfg: &DemoConfig) -> SynthConfig {
    let per_hour = u64::from(cfg.rate) * 3_600 / u64::from(cfg.speed);
    let mut world = SynthConfig {
        seed: cfg.seed,
        ..SynthConfig::hour(per_hour.max(1), cfg.keys)
    };
    for tier in &mut world.tiers {
        match tier.name {
            "pro" => tier.hourly_quota = tier.hourly_quota.saturating_mul(5) / 2,
            "enterprise" => tier.key_share = 0.006,
            _ => {}
        }
    }
    world
}

/// The API key the demo gives synthetic key `id`.
pub fn api_key(id: &KeyId) -> String {
    format!("demo-{id}")
}

/// Writes the key directory the gateway reads: every synthetic key with its tier.
pub fn write_keys(path: &Path, traffic: &SynthTraffic) -> anyhow::Result<()> {
    let cfg = traffic.config();
    let mut csv = String::from("api_key,key_id,tier\n");
    for index in 0..cfg.keys {
        let id = synth_key_id(index);
        let tier = cfg.tiers[usize::from(traffic.tier_of(index).0)].name;
        csv += &format!("{},{id},{tier}\n", api_key(&id));
    }
    std::fs::write(path, csv).with_context(|| format!("writing {}", path.display()))
}

/// The requests: keys and route classes as the synthetic world draws them (Zipf keys, the
/// 8 % tenant, bursts of one key), plus one deliberate burst: 600 back-to-back requests of
/// a pro key at 40 % of the run. Each goes to the gateway of the region it is sent from
/// (`gateways`, in the order of [`crate::regions::REGIONS`]; see
/// [`crate::regions::region_of`]).
pub fn traffic(
    cfg: &DemoConfig,
    gateways: Vec<std::net::SocketAddr>,
    synth: SynthTraffic,
) -> MakeRequest {
    let planned = u64::from(cfg.rate) * cfg.seconds;
    let burst = planned * 2 / 5..planned * 2 / 5 + 600;
    let pro = (0..cfg.keys)
        .rev()
        .find(|i| synth.config().tiers[usize::from(synth.tier_of(*i).0)].name == "pro")
        .map(synth_key_id);
    let synth = Mutex::new(synth);
    Arc::new(move |i| {
        let (key, route) = match pro {
            Some(k) if burst.contains(&i) => (k, 0),
            _ => synth
                .lock()
                .ok()
                .and_then(|mut s| s.next())
                .map_or((synth_key_id(0), 0), |e| (e.key_id, e.route_class.0)),
        };
        let route = ROUTES[usize::from(route) % ROUTES.len()];
        let gateway = gateways[region_of(&key, i) % gateways.len()];
        Request::get(format!("http://{gateway}/v1/{route}/{i}"))
            .header("x-api-key", api_key(&key))
            .body(Body::empty())
            .unwrap_or_default()
    })
}
