//! The policy: tiers × route classes with their limits and mode, per-key overrides, hot keys
//! split into sub-keys, and the kill switches. A [`PolicyDocument`] is what a source holds
//! (the TOML file, the PostgreSQL tables); it becomes an immutable [`PolicySnapshot`] only if
//! every row is valid, and the limiter swaps snapshots atomically (see [`PolicyHandle`]).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use serde::{Deserialize, Serialize};
use verdict_schemas::{KeyId, RegionId, RouteClassId, TierId};

use crate::algo::{Limits, MAX_LIMIT, PPM};

/// How a tier × route class is limited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Decide, and refuse with 429 when over a limit.
    #[default]
    Enforce,
    /// Decide and emit the event, but let every request through (a refusal becomes a
    /// would-deny). The rollout mode: a week of this before anyone is throttled.
    Shadow,
    /// Do not count at all: every request passes and its event says so.
    Off,
}

impl Mode {
    /// The name used in documents, tables and commands.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Enforce => "enforce",
            Self::Shadow => "shadow",
            Self::Off => "off",
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "enforce" => Ok(Self::Enforce),
            "shadow" => Ok(Self::Shadow),
            "off" => Ok(Self::Off),
            other => Err(format!(
                "unknown mode {other:?} (expected enforce, shadow or off)"
            )),
        }
    }
}

/// The wildcard route class in limit and override rows.
pub const ALL_ROUTES: &str = "*";

/// A policy as a source holds it. Names tie the rows together; ids go on the wire.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyDocument {
    /// Rises on every change; stamped on every decision event. A file may leave it out (the
    /// loader then counts changes itself).
    #[serde(default)]
    pub version: u64,
    /// Global kill switch: when true every request is allowed, nothing is counted, and the
    /// events say so. The last resort of an incident.
    #[serde(default)]
    pub kill_switch: bool,
    /// The tiers.
    pub tiers: Vec<TierRow>,
    /// The route classes.
    pub route_classes: Vec<RouteClassRow>,
    /// Limits per tier and route class (`route_class = "*"` covers every class without a
    /// row of its own). Every tier × route class must be covered.
    pub limits: Vec<LimitRow>,
    /// Per-key limits, replacing the tier's for one key (one route class or all).
    #[serde(default)]
    pub overrides: Vec<OverrideRow>,
    /// Keys too busy for one counter: each is split into `sub_keys` counters of limit/N.
    #[serde(default)]
    pub hot_keys: Vec<HotKeyRow>,
    /// The regions whose gateways share every limit, with their static weights. Limits are
    /// global; each region enforces its share (the static weight's, or what the reconcile
    /// job last wrote). Empty: one region enforcing the whole limit.
    #[serde(default)]
    pub regions: Vec<RegionRow>,
}

/// A tier.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierRow {
    /// Stable id, carried by events (0–255).
    pub id: u8,
    /// Name, used by the other rows and by reports.
    pub name: String,
    /// Per-tier kill switch: hard-allow this tier only.
    #[serde(default)]
    pub kill_switch: bool,
}

/// A route class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteClassRow {
    /// Stable id, carried by events (0–255).
    pub id: u8,
    /// Name, used by the other rows and by reports.
    pub name: String,
    /// Path prefixes the gateway maps to this class.
    #[serde(default)]
    pub prefixes: Vec<String>,
}

/// The limits of a tier on a route class.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitRow {
    /// Tier name.
    pub tier: String,
    /// Route class name, or `*`.
    pub route_class: String,
    /// Token bucket capacity: the largest burst (1 to 1,000,000,000).
    pub capacity: i64,
    /// Token bucket refill, tokens per second (at least 0.001).
    pub refill_per_s: f64,
    /// Requests per sliding hour (0 refuses everything; at most 1,000,000,000).
    pub hourly_quota: i64,
    /// Enforce, shadow or off.
    #[serde(default)]
    pub mode: Mode,
}

/// Limits for one key, replacing its tier's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverrideRow {
    /// The key id (32 hex digits).
    pub key_id: KeyId,
    /// Route class name, or `*` (the default) for all.
    #[serde(default = "all_routes")]
    pub route_class: String,
    /// Token bucket capacity.
    pub capacity: i64,
    /// Token bucket refill, tokens per second.
    pub refill_per_s: f64,
    /// Requests per sliding hour.
    pub hourly_quota: i64,
    /// A mode for this key; the tier's when absent.
    #[serde(default)]
    pub mode: Option<Mode>,
}

fn all_routes() -> String {
    ALL_ROUTES.to_owned()
}

/// A key split into sub-keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HotKeyRow {
    /// The key id.
    pub key_id: KeyId,
    /// Number of sub-keys (2–255); each holds limit / N.
    pub sub_keys: i64,
}

/// A region: its gateways count in their own Redis and enforce its share of each limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegionRow {
    /// Stable id, carried by events (0–65535) and given to the region's gateways.
    pub id: u16,
    /// Name, e.g. `eu-central-1`.
    pub name: String,
    /// Static weight: the region's share of every limit is weight / sum of weights until
    /// the reconcile job says otherwise (default 1: equal shares).
    #[serde(default = "one")]
    pub weight: f64,
}

fn one() -> f64 {
    1.0
}

/// An invalid row, named with its field: the snapshot is refused and the previous one stays.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("policy {row}: {field}: {problem}")]
pub struct PolicyError {
    /// Which row, e.g. `limits[3] (tier=free, route_class=read)`.
    pub row: String,
    /// Which field.
    pub field: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

/// Limits and mode in force for one tier × route class, or one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// The limits.
    pub limits: Limits,
    /// The mode.
    pub mode: Mode,
}

#[derive(Debug, Clone, Default)]
struct KeyEntry {
    all_routes: Option<(Limits, Option<Mode>)>,
    by_route: Vec<(RouteClassId, Limits, Option<Mode>)>,
    sub_keys: u8,
}

/// What the policy says about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitLookup {
    /// A kill switch (global or the tier's) is on: allow, count nothing.
    KillSwitch,
    /// Mode off for this tier × route class: allow, count nothing.
    Off,
    /// Count and decide.
    Check {
        /// The limits of one counter (already divided for a split key).
        limits: Limits,
        /// Enforce or shadow.
        mode: Mode,
        /// 1, or the split of a hot key.
        sub_keys: u8,
        /// True when a per-key override set the limits.
        overridden: bool,
    },
    /// The tier or route class is not in the policy.
    Unknown,
}

/// An immutable, validated policy.
#[derive(Debug, Clone)]
pub struct PolicySnapshot {
    version: u64,
    kill_switch: bool,
    document: PolicyDocument,
    tier_killed: [bool; 256],
    rules: HashMap<(TierId, RouteClassId), Rule>,
    keys: HashMap<KeyId, KeyEntry>,
    /// Static share of each region, parts per million (empty: one region, the whole).
    region_ppm: HashMap<RegionId, u32>,
}

struct Rows<'a> {
    tiers: HashMap<&'a str, TierId>,
    routes: HashMap<&'a str, RouteClassId>,
}

/// Step one of [`PolicySnapshot::build`]: the tiers' and route classes' names and ids, each
/// unique, at least one of each; and which tiers have their own kill switch on.
fn names(doc: &PolicyDocument) -> Result<(Rows<'_>, [bool; 256]), PolicyError> {
    let mut rows = Rows {
        tiers: HashMap::new(),
        routes: HashMap::new(),
    };
    let mut tier_killed = [false; 256];
    let mut seen_ids = [false; 256];
    for (i, t) in doc.tiers.iter().enumerate() {
        let row = format!("tiers[{i}] (name={})", t.name);
        if t.name.trim().is_empty() {
            return Err(err(row, "name", "must not be empty"));
        }
        if std::mem::replace(&mut seen_ids[usize::from(t.id)], true) {
            return Err(err(row, "id", format!("tier id {} is used twice", t.id)));
        }
        if rows.tiers.insert(&t.name, TierId(t.id)).is_some() {
            return Err(err(row, "name", "tier name is used twice"));
        }
        tier_killed[usize::from(t.id)] = t.kill_switch;
    }
    let mut seen_ids = [false; 256];
    for (i, r) in doc.route_classes.iter().enumerate() {
        let row = format!("route_classes[{i}] (name={})", r.name);
        if r.name.trim().is_empty() || r.name == ALL_ROUTES {
            return Err(err(row, "name", "must not be empty or \"*\""));
        }
        if std::mem::replace(&mut seen_ids[usize::from(r.id)], true) {
            return Err(err(
                row,
                "id",
                format!("route class id {} is used twice", r.id),
            ));
        }
        if rows.routes.insert(&r.name, RouteClassId(r.id)).is_some() {
            return Err(err(row, "name", "route class name is used twice"));
        }
    }
    if rows.tiers.is_empty() {
        return Err(err("tiers".into(), "tiers", "at least one tier is needed"));
    }
    if rows.routes.is_empty() {
        return Err(err(
            "route_classes".into(),
            "route_classes",
            "at least one route class is needed",
        ));
    }
    Ok((rows, tier_killed))
}

/// Step two: every tier × route class's limits, exact rows first and a tier's `"*"` row
/// filling the rest; a pair left without limits is refused.
fn rules(
    doc: &PolicyDocument,
    rows: &Rows<'_>,
) -> Result<HashMap<(TierId, RouteClassId), Rule>, PolicyError> {
    // Exact rows first, then wildcards fill what is left.
    let mut rules = HashMap::new();
    let mut wildcards = Vec::new();
    for (i, l) in doc.limits.iter().enumerate() {
        let row = format!(
            "limits[{i}] (tier={}, route_class={})",
            l.tier, l.route_class
        );
        let tier = *rows
            .tiers
            .get(l.tier.as_str())
            .ok_or_else(|| err(row.clone(), "tier", "no such tier"))?;
        let rule = Rule {
            limits: limits_of(&row, l.capacity, l.refill_per_s, l.hourly_quota)?,
            mode: l.mode,
        };
        if l.route_class == ALL_ROUTES {
            if wildcards.iter().any(|(t, _)| *t == tier) {
                return Err(err(row, "route_class", "a second \"*\" row for this tier"));
            }
            wildcards.push((tier, rule));
            continue;
        }
        let route = *rows
            .routes
            .get(l.route_class.as_str())
            .ok_or_else(|| err(row.clone(), "route_class", "no such route class"))?;
        if rules.insert((tier, route), rule).is_some() {
            return Err(err(
                row,
                "route_class",
                "a second row for this tier and route class",
            ));
        }
    }
    for (tier, rule) in wildcards {
        for route in rows.routes.values() {
            rules.entry((tier, *route)).or_insert(rule);
        }
    }
    for t in &doc.tiers {
        for r in &doc.route_classes {
            if !rules.contains_key(&(TierId(t.id), RouteClassId(r.id))) {
                return Err(err(
                    format!("tiers (name={})", t.name),
                    "limits",
                    format!(
                        "no limits for route class {} (add a row, or one with route_class = \"*\")",
                        r.name
                    ),
                ));
            }
        }
    }
    Ok(rules)
}

/// Step three: the per-key entries, overrides (per route class or `"*"`) and hot-key
/// splits, each key and route class at most once.
fn keys(doc: &PolicyDocument, rows: &Rows<'_>) -> Result<HashMap<KeyId, KeyEntry>, PolicyError> {
    let mut keys: HashMap<KeyId, KeyEntry> = HashMap::new();
    for (i, o) in doc.overrides.iter().enumerate() {
        let row = format!(
            "overrides[{i}] (key_id={}, route_class={})",
            o.key_id, o.route_class
        );
        let limits = limits_of(&row, o.capacity, o.refill_per_s, o.hourly_quota)?;
        let entry = keys.entry(o.key_id).or_default();
        if o.route_class == ALL_ROUTES {
            if entry.all_routes.replace((limits, o.mode)).is_some() {
                return Err(err(
                    row,
                    "route_class",
                    "a second \"*\" override for this key",
                ));
            }
        } else {
            let route = *rows
                .routes
                .get(o.route_class.as_str())
                .ok_or_else(|| err(row.clone(), "route_class", "no such route class"))?;
            if entry.by_route.iter().any(|(r, ..)| *r == route) {
                return Err(err(
                    row,
                    "route_class",
                    "a second override for this key and route class",
                ));
            }
            entry.by_route.push((route, limits, o.mode));
        }
    }
    for (i, h) in doc.hot_keys.iter().enumerate() {
        let row = format!("hot_keys[{i}] (key_id={})", h.key_id);
        if !(2..=255).contains(&h.sub_keys) {
            return Err(err(
                row,
                "sub_keys",
                format!("must be 2 to 255, got {}", h.sub_keys),
            ));
        }
        let entry = keys.entry(h.key_id).or_default();
        if entry.sub_keys != 0 {
            return Err(err(row, "key_id", "this key is listed twice"));
        }
        entry.sub_keys = h.sub_keys as u8;
    }
    Ok(keys)
}

fn err(row: String, field: &'static str, problem: impl fmt::Display) -> PolicyError {
    PolicyError {
        row,
        field,
        problem: problem.to_string(),
    }
}

fn limits_of(
    row: &str,
    capacity: i64,
    refill_per_s: f64,
    hourly_quota: i64,
) -> Result<Limits, PolicyError> {
    let max = i64::from(MAX_LIMIT);
    if !(1..=max).contains(&capacity) {
        return Err(err(
            row.into(),
            "capacity",
            format!("must be 1 to {max}, got {capacity}"),
        ));
    }
    if !refill_per_s.is_finite() || refill_per_s < 0.001 || refill_per_s > max as f64 {
        return Err(err(
            row.into(),
            "refill_per_s",
            format!("must be 0.001 to {max} tokens per second, got {refill_per_s}"),
        ));
    }
    if !(0..=max).contains(&hourly_quota) {
        return Err(err(
            row.into(),
            "hourly_quota",
            format!("must be 0 to {max}, got {hourly_quota}"),
        ));
    }
    Ok(Limits::per_hour(
        capacity as u32,
        refill_per_s,
        hourly_quota as u32,
    ))
}

impl PolicySnapshot {
    /// Validates a document. Every problem names its row and field.
    pub fn build(doc: PolicyDocument) -> Result<Self, PolicyError> {
        let (rows, tier_killed) = names(&doc)?;
        let rules = rules(&doc, &rows)?;
        let keys = keys(&doc, &rows)?;
        let region_ppm = region_weights(&doc.regions)?;
        Ok(Self {
            version: doc.version,
            kill_switch: doc.kill_switch,
            tier_killed,
            rules,
            keys,
            region_ppm,
            document: doc,
        })
    }

    /// The version that decided (stamped on events).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The same policy under another version number.
    pub fn with_version(mut self, version: u64) -> Self {
        self.version = version;
        self.document.version = version;
        self
    }

    /// The global kill switch.
    pub fn kill_switch(&self) -> bool {
        self.kill_switch
    }

    /// The document this snapshot was built from (for `verdict policy show` and the query
    /// service's `policies` table).
    pub fn document(&self) -> &PolicyDocument {
        &self.document
    }

    /// The rule of a tier × route class, without per-key overrides.
    pub fn rule(&self, tier: TierId, route: RouteClassId) -> Option<Rule> {
        self.rules.get(&(tier, route)).copied()
    }

    /// What applies to a request of `key` on `route` at `tier`.
    pub fn resolve(&self, key: &KeyId, route: RouteClassId, tier: TierId) -> LimitLookup {
        if self.kill_switch || self.tier_killed[usize::from(tier.0)] {
            return LimitLookup::KillSwitch;
        }
        let Some(base) = self.rules.get(&(tier, route)) else {
            return LimitLookup::Unknown;
        };
        let (mut limits, mut mode, mut sub_keys, mut overridden) =
            (base.limits, base.mode, 1u8, false);
        if let Some(entry) = self.keys.get(key) {
            let specific = entry
                .by_route
                .iter()
                .find(|(r, ..)| *r == route)
                .map(|(_, l, m)| (*l, *m));
            if let Some((l, m)) = specific.or(entry.all_routes) {
                limits = l;
                mode = m.unwrap_or(mode);
                overridden = true;
            }
            if entry.sub_keys > 1 {
                sub_keys = entry.sub_keys;
                limits = limits.divided(u32::from(sub_keys));
            }
        }
        match mode {
            Mode::Off => LimitLookup::Off,
            mode => LimitLookup::Check {
                limits,
                mode,
                sub_keys,
                overridden,
            },
        }
    }

    /// The static share of `region`, parts per million: its weight over the sum of the
    /// weights. The whole when the policy lists no regions; an equal share when it lists
    /// others but not this one (a gateway started with a region the policy does not know
    /// yet neither takes the whole limit nor refuses everything).
    pub fn region_static_ppm(&self, region: RegionId) -> u32 {
        if self.region_ppm.is_empty() {
            return PPM;
        }
        match self.region_ppm.get(&region) {
            Some(ppm) => *ppm,
            None => PPM / (self.region_ppm.len() as u32 + 1),
        }
    }

    /// True when the policy lists more than one region (limits are then shared).
    pub fn is_multi_region(&self) -> bool {
        self.region_ppm.len() > 1
    }

    /// The tier id of a tier name.
    pub fn tier_id(&self, name: &str) -> Option<TierId> {
        self.document
            .tiers
            .iter()
            .find(|t| t.name == name)
            .map(|t| TierId(t.id))
    }

    /// The route class id of a route class name.
    pub fn route_class_id(&self, name: &str) -> Option<RouteClassId> {
        self.document
            .route_classes
            .iter()
            .find(|r| r.name == name)
            .map(|r| RouteClassId(r.id))
    }
}

/// Each region's weight as parts per million of the sum, rounded down so the shares never
/// add up to more than the whole.
fn region_weights(regions: &[RegionRow]) -> Result<HashMap<RegionId, u32>, PolicyError> {
    let mut names = std::collections::HashSet::new();
    let mut out = HashMap::new();
    for (i, r) in regions.iter().enumerate() {
        let row = format!("regions[{i}] (name={})", r.name);
        if r.name.trim().is_empty() {
            return Err(err(row, "name", "must not be empty"));
        }
        if !names.insert(r.name.as_str()) {
            return Err(err(row, "name", "region name is used twice"));
        }
        if !(r.weight.is_finite() && r.weight > 0.0 && r.weight <= 1e6) {
            return Err(err(
                row,
                "weight",
                format!("must be above 0 and at most 1000000, got {}", r.weight),
            ));
        }
        if out.insert(RegionId(r.id), 0).is_some() {
            return Err(err(row, "id", format!("region id {} is used twice", r.id)));
        }
    }
    let total: f64 = regions.iter().map(|r| r.weight).sum();
    for r in regions {
        out.insert(
            RegionId(r.id),
            ((r.weight / total) * f64::from(PPM)).floor() as u32,
        );
    }
    Ok(out)
}

/// Parses a TOML policy document; errors name the line and field.
pub fn parse_toml(text: &str) -> Result<PolicyDocument, PolicyError> {
    toml::from_str(text).map_err(|e| err("file".into(), "toml", e.to_string().trim_end()))
}

/// Writes a policy document as TOML, the form [`parse_toml`] reads (a policy file).
pub fn to_toml(doc: &PolicyDocument) -> Result<String, PolicyError> {
    toml::to_string(doc).map_err(|e| err("file".into(), "toml", e.to_string().trim_end()))
}

/// The snapshot in force, swapped atomically when a source delivers a new valid one, and
/// when it was last confirmed (its age is a metric: a stale policy is a silent problem).
#[derive(Debug, Clone)]
pub struct PolicyHandle {
    current: Arc<arc_swap::ArcSwap<PolicySnapshot>>,
    confirmed_ms: Arc<AtomicI64>,
}

impl PolicyHandle {
    /// A handle holding `snapshot`, confirmed at `now_ms`.
    pub fn new(snapshot: PolicySnapshot, now_ms: i64) -> Self {
        Self {
            current: Arc::new(arc_swap::ArcSwap::from_pointee(snapshot)),
            confirmed_ms: Arc::new(AtomicI64::new(now_ms)),
        }
    }

    /// The snapshot in force.
    pub fn load(&self) -> Arc<PolicySnapshot> {
        self.current.load_full()
    }

    /// Puts a new snapshot in force.
    pub fn store(&self, snapshot: PolicySnapshot, now_ms: i64) {
        self.current.store(Arc::new(snapshot));
        self.confirmed(now_ms);
    }

    /// Records that the source was read at `now_ms` and still holds the snapshot in force.
    pub fn confirmed(&self, now_ms: i64) {
        self.confirmed_ms.store(now_ms, Ordering::Relaxed);
    }

    /// When the snapshot in force was last confirmed by its source.
    pub fn confirmed_ms(&self) -> i64 {
        self.confirmed_ms.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const EXAMPLE: &str = include_str!("../fixtures/policies/two_tiers.toml");

    fn snapshot() -> PolicySnapshot {
        PolicySnapshot::build(parse_toml(EXAMPLE).unwrap()).unwrap()
    }

    fn key(last: u8) -> KeyId {
        let mut k = [0u8; 16];
        k[15] = last;
        KeyId(k)
    }

    #[test]
    fn rows_resolve_with_wildcards_overrides_and_hot_keys() {
        let p = snapshot();
        assert_eq!(p.version(), 7);
        let (free, pro, read, write) = (TierId(0), TierId(1), RouteClassId(0), RouteClassId(1));
        assert_eq!(
            p.resolve(&key(1), read, free),
            LimitLookup::Check {
                limits: Limits::per_hour(10, 1.0, 100),
                mode: Mode::Enforce,
                sub_keys: 1,
                overridden: false
            }
        );
        assert_eq!(
            p.resolve(&key(1), write, free),
            LimitLookup::Check {
                limits: Limits::per_hour(2, 0.1, 10),
                mode: Mode::Shadow,
                sub_keys: 1,
                overridden: false
            }
        );
        assert_eq!(p.resolve(&key(1), read, pro), LimitLookup::Off);
        // The override replaces limits on every route and keeps the tier's mode.
        assert_eq!(
            p.resolve(&key(10), write, free),
            LimitLookup::Check {
                limits: Limits::per_hour(50, 5.0, 500),
                mode: Mode::Shadow,
                sub_keys: 1,
                overridden: true
            }
        );
        // The hot key's counters each hold a quarter.
        assert_eq!(
            p.resolve(&key(11), read, free),
            LimitLookup::Check {
                limits: Limits::per_hour(3, 0.25, 25),
                mode: Mode::Enforce,
                sub_keys: 4,
                overridden: false
            }
        );
        assert_eq!(
            p.resolve(&key(1), RouteClassId(9), free),
            LimitLookup::Unknown
        );
        assert_eq!(p.tier_id("pro"), Some(pro));
        assert_eq!(p.route_class_id("write"), Some(write));
    }

    #[test]
    fn kill_switches_win_over_everything() {
        let mut doc = parse_toml(EXAMPLE).unwrap();
        doc.tiers[0].kill_switch = true;
        let p = PolicySnapshot::build(doc.clone()).unwrap();
        assert_eq!(
            p.resolve(&key(1), RouteClassId(0), TierId(0)),
            LimitLookup::KillSwitch
        );
        assert_eq!(
            p.resolve(&key(1), RouteClassId(0), TierId(1)),
            LimitLookup::Off
        );
        doc.tiers[0].kill_switch = false;
        doc.kill_switch = true;
        let p = PolicySnapshot::build(doc).unwrap();
        assert_eq!(
            p.resolve(&key(10), RouteClassId(1), TierId(1)),
            LimitLookup::KillSwitch
        );
    }

    #[test]
    fn regions_weigh_their_share_and_bad_rows_are_refused() {
        let toml = format!(
            "{EXAMPLE}\n[[regions]]\nid = 0\nname = \"us-east-1\"\nweight = 2.0\n\n[[regions]]\nid = 1\nname = \"eu-central-1\"\n\n[[regions]]\nid = 2\nname = \"ap-southeast-1\"\n"
        );
        let p = PolicySnapshot::build(parse_toml(&toml).unwrap()).unwrap();
        assert!(p.is_multi_region());
        assert_eq!(p.region_static_ppm(RegionId(0)), 500_000);
        assert_eq!(p.region_static_ppm(RegionId(2)), 250_000);
        // A region the policy does not list gets an equal share, not the whole.
        assert_eq!(p.region_static_ppm(RegionId(9)), 250_000);
        // No regions: one region, the whole limit.
        let single = snapshot();
        assert!(!single.is_multi_region());
        assert_eq!(single.region_static_ppm(RegionId(9)), PPM);

        let region = |id: u16, name: &str, weight: f64| RegionRow {
            id,
            name: name.into(),
            weight,
        };
        assert_eq!(
            refused(|d| d.regions = vec![region(0, "a", 1.0), region(0, "b", 1.0)]),
            "policy regions[1] (name=b): id: region id 0 is used twice"
        );
        assert_eq!(
            refused(|d| d.regions = vec![region(0, "a", 1.0), region(1, "a", 1.0)]),
            "policy regions[1] (name=a): name: region name is used twice"
        );
        assert_eq!(
            refused(|d| d.regions = vec![region(0, "a", 0.0)]),
            "policy regions[0] (name=a): weight: must be above 0 and at most 1000000, got 0"
        );
    }

    fn refused(edit: impl FnOnce(&mut PolicyDocument)) -> String {
        let mut doc = parse_toml(EXAMPLE).unwrap();
        edit(&mut doc);
        PolicySnapshot::build(doc).unwrap_err().to_string()
    }

    #[test]
    fn invalid_rows_are_refused_with_row_and_field() {
        assert_eq!(
            refused(|d| d.limits[1].refill_per_s = -1.0),
            "policy limits[1] (tier=free, route_class=write): refill_per_s: must be 0.001 to 1000000000 tokens per second, got -1"
        );
        assert_eq!(
            refused(|d| d.limits[0].capacity = 0),
            "policy limits[0] (tier=free, route_class=*): capacity: must be 1 to 1000000000, got 0"
        );
        assert_eq!(
            refused(|d| d.limits[2].tier = "gold".into()),
            "policy limits[2] (tier=gold, route_class=*): tier: no such tier"
        );
        assert_eq!(
            refused(|d| {
                d.limits.remove(2);
            }),
            "policy tiers (name=pro): limits: no limits for route class read (add a row, or one with route_class = \"*\")"
        );
        assert!(refused(|d| d.tiers[1].id = 0).contains("tier id 0 is used twice"));
        assert!(refused(|d| d.hot_keys[0].sub_keys = 1).contains("hot_keys[0]"));
        assert!(refused(|d| d.overrides[0].hourly_quota = -5).contains(
            "overrides[0] (key_id=0000000000000000000000000000000a, route_class=*): hourly_quota"
        ));
        assert!(
            refused(|d| d.limits.push(d.limits[1].clone()))
                .contains("a second row for this tier and route class")
        );
    }

    #[test]
    fn toml_errors_name_the_field() {
        let e = parse_toml("version = 1\ntiers = []\nroute_classes = []\nlimits = []\nbogus = 3\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("bogus"), "{e}");
        let e = parse_toml(&EXAMPLE.replace("mode = \"shadow\"", "mode = \"shade\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("shade"), "{e}");
    }

    #[test]
    fn a_policy_written_as_toml_reads_back_the_same() {
        let doc = parse_toml(EXAMPLE).unwrap();
        let written = to_toml(&doc).unwrap();
        assert_eq!(parse_toml(&written).unwrap(), doc, "{written}");
        PolicySnapshot::build(parse_toml(&written).unwrap()).unwrap();
    }

    #[test]
    fn the_handle_swaps_snapshots() {
        let h = PolicyHandle::new(snapshot(), 1);
        let old = h.load();
        h.store(snapshot().with_version(8), 2);
        assert_eq!(
            (old.version(), h.load().version(), h.confirmed_ms()),
            (7, 8, 2)
        );
    }
}

#[cfg(test)]
mod example_file {
    use super::*;

    #[test]
    fn the_example_policy_file_is_valid() {
        let text = include_str!("../examples/policy.toml");
        let p = PolicySnapshot::build(parse_toml(text).unwrap()).unwrap();
        assert_eq!(
            (p.document().tiers.len(), p.document().route_classes.len()),
            (4, 3)
        );
        assert_eq!(
            p.rule(TierId(0), RouteClassId(2)).unwrap().limits.capacity,
            2
        );
        assert_eq!(
            p.rule(TierId(1), RouteClassId(0)).unwrap().mode,
            Mode::Shadow
        );
    }
}
