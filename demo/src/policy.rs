//! The policy the synthetic world is decided under, in the limiter's TOML: what `verdict
//! demo` and `verdict-bench query` write next to their lake so that the `policies` table and
//! the reports have names and limits to show.

use verdict_schemas::synth::SynthConfig;

/// Names of the synthetic route classes, by id.
pub const ROUTES: [&str; 5] = ["read", "write", "search", "export", "admin"];

/// `cfg`'s tiers and route classes as a policy document of `version`.
pub fn policy_toml(cfg: &SynthConfig, version: u64) -> String {
    let mut t = format!("version = {version}\nkill_switch = false\n");
    for (id, tier) in cfg.tiers.iter().enumerate() {
        t += &format!("\n[[tiers]]\nid = {id}\nname = \"{}\"\n", tier.name);
    }
    for (id, name) in ROUTES.iter().enumerate().take(cfg.route_weights.len()) {
        t += &format!(
            "\n[[route_classes]]\nid = {id}\nname = \"{name}\"\nprefixes = [\"/v1/{name}\"]\n"
        );
    }
    for tier in &cfg.tiers {
        t += &format!(
            "\n[[limits]]\ntier = \"{}\"\nroute_class = \"*\"\ncapacity = {}\nrefill_per_s = {}\n\
             hourly_quota = {}\nmode = \"{}\"\n",
            tier.name,
            tier.capacity.max(1),
            tier.refill_per_s.max(0.001),
            tier.hourly_quota.min(1_000_000_000),
            if tier.shadow { "shadow" } else { "enforce" }
        );
    }
    t
}

/// `cfg`'s policy with limits per route class: each class's limits are the tier's scaled by
/// the class's share of the traffic against the busiest class (`route_weights`), so a key
/// whose requests split across the classes as the world sends them meets each class's
/// limit in the same proportion. With one limit for every class (`policy_toml`), the
/// rarely used classes would look generous and the busiest one tight, whatever the tier.
pub fn per_route_policy_toml(cfg: &SynthConfig, version: u64) -> String {
    let whole = policy_toml(cfg, version);
    let head = whole
        .split("\n[[limits]]")
        .next()
        .unwrap_or_default()
        .to_owned();
    let busiest = f64::from(cfg.route_weights.iter().copied().max().unwrap_or(1).max(1));
    let mut t = head;
    for tier in &cfg.tiers {
        for (route, weight) in ROUTES.iter().zip(&cfg.route_weights) {
            let share = f64::from(*weight) / busiest;
            let scaled = |v: f64| (v * share).round().max(1.0);
            t += &format!(
                "\n[[limits]]\ntier = \"{}\"\nroute_class = \"{route}\"\ncapacity = {}\nrefill_per_s = {}\n\
                 hourly_quota = {}\nmode = \"{}\"\n",
                tier.name,
                scaled(f64::from(tier.capacity.max(1))),
                (tier.refill_per_s * share).max(0.001),
                scaled(f64::from(tier.hourly_quota.min(1_000_000_000))),
                if tier.shadow { "shadow" } else { "enforce" }
            );
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_synthetic_policy_is_valid_for_the_limiter() {
        for events in [1_000, 2_000_000, 62_500_000] {
            let cfg = SynthConfig::hour(events, 5_000);
            for text in [policy_toml(&cfg, 3), per_route_policy_toml(&cfg, 3)] {
                let doc = verdict_limiter::policy::parse_toml(&text).unwrap();
                verdict_limiter::PolicySnapshot::build(doc).unwrap();
            }
            let doc = verdict_limiter::policy::parse_toml(&per_route_policy_toml(&cfg, 3)).unwrap();
            let snapshot = verdict_limiter::PolicySnapshot::build(doc).unwrap();
            assert_eq!(snapshot.document().tiers.len(), cfg.tiers.len());
            assert_eq!(
                snapshot.document().route_classes.len(),
                cfg.route_weights.len()
            );
            assert_eq!(
                snapshot
                    .tier_id("starter")
                    .and_then(|t| snapshot.rule(t, verdict_schemas::RouteClassId(0)))
                    .map(|r| r.mode),
                Some(verdict_limiter::Mode::Shadow)
            );
        }
    }
}
