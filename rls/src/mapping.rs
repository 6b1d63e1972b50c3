//! From an Envoy rate limit descriptor to the limiter's identity: key id, tier, route class.
//!
//! A descriptor is a list of entries (`key`, `value`), built by the route's `rate_limits`
//! actions in Envoy (`request_headers`, `generic_key`, `remote_address`, …). Two ways map
//! one, tried in this order:
//!
//! 1. **Rules** (from an envoyproxy/ratelimit configuration, `verdict policy import-envoy`):
//!    a rule matches a descriptor whose entries are exactly its entries, in order, each
//!    with the rule's value or, where the rule names none, any value. The caller is the
//!    descriptor itself: its key id is the first 16 bytes of BLAKE3 over the domain and
//!    every entry (so each distinct `remote_address` is counted on its own, as
//!    envoyproxy/ratelimit counts it), its tier and route class the rule's.
//! 2. **Entries that carry verdict's identity** (the defaults in brackets):
//!    - the key: `[api_key]`, an API key looked up in the key directory (which gives the
//!      tier too), or `[key_id]`, 32 hex digits;
//!    - the tier: `[tier]`, a tier name of the policy: needed with `key_id`, and it wins
//!      over the directory's tier when both are present;
//!    - the route class: `[route_class]`, a route class name of the policy, or `[path]`, a
//!      request path the policy's prefixes resolve (as the gateway resolves one).
//!
//! Anything else does not map: an API key the directory does not know, a key id that is
//! not 32 hex digits, a tier or route class the policy does not name, a path no prefix
//! covers, a descriptor with neither a key nor a matching rule, or another domain's
//! request when the rules name one. Such a descriptor is answered by
//! [`Unmapped`] (allowed by default) and counted; it is never an error that fails the
//! request.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use verdict_gateway::KeyDirectory;
use verdict_limiter::PolicySnapshot;
use verdict_schemas::{KeyId, RouteClassId, TierId};

/// What a descriptor that does not map is answered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unmapped {
    /// `OK`, and counted as unmapped: a descriptor verdict cannot place is not refused.
    #[default]
    Allow,
    /// `OVER_LIMIT`, and counted: for a deployment where every descriptor must map.
    Deny,
}

impl std::str::FromStr for Unmapped {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "allow" => Ok(Self::Allow),
            "deny" => Ok(Self::Deny),
            other => Err(format!("{other:?}: expected allow or deny")),
        }
    }
}

/// One entry a rule matches: its key, and its value or (none) any value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleEntry {
    /// The entry's key.
    pub key: String,
    /// The value it must have; any value when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// A descriptor pattern and the limit that counts what it matches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// The entries, in order; a descriptor matches with exactly these.
    pub entries: Vec<RuleEntry>,
    /// The tier (a name of the policy) its callers are counted at.
    pub tier: String,
    /// The route class (a name of the policy) whose limit applies.
    pub route_class: String,
    /// Its name, for `replaces`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The names of rules this one replaces: a request that matches both is counted by
    /// this one only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replaces: Vec<String>,
}

impl Rule {
    fn matches(&self, entries: &[(&str, &str)]) -> bool {
        self.entries.len() == entries.len()
            && self.entries.iter().zip(entries).all(|(rule, (k, v))| {
                rule.key == *k && rule.value.as_deref().is_none_or(|want| want == *v)
            })
    }
}

/// How descriptors map (see the module's documentation), as `--rls-descriptors FILE` (TOML)
/// spells it; every field has its default.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DescriptorMap {
    /// The entry carrying an API key.
    pub api_key: String,
    /// The entry carrying a key id (32 hex digits).
    pub key_id: String,
    /// The entry naming a tier.
    pub tier: String,
    /// The entry naming a route class.
    pub route_class: String,
    /// The entry carrying a request path.
    pub path: String,
    /// What a descriptor that does not map is answered.
    pub unmapped: Unmapped,
    /// The domain the rules answer (any, when empty).
    pub domain: String,
    /// Rules, tried first, in order.
    pub rules: Vec<Rule>,
}

impl Default for DescriptorMap {
    fn default() -> Self {
        Self {
            api_key: "api_key".into(),
            key_id: "key_id".into(),
            tier: "tier".into(),
            route_class: "route_class".into(),
            path: "path".into(),
            unmapped: Unmapped::Allow,
            domain: String::new(),
            rules: Vec::new(),
        }
    }
}

/// Why a descriptor did not map (the label of `verdict_rls_descriptors_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    /// Neither a rule nor a key entry.
    NoKey,
    /// An API key the directory does not know.
    UnknownApiKey,
    /// A key id that is not 32 hex digits.
    BadKeyId,
    /// A key id without a tier entry.
    NoTier,
    /// A tier the policy does not name.
    UnknownTier,
    /// Neither a route class entry nor a path entry.
    NoRoute,
    /// A route class the policy does not name, or a path no prefix covers.
    UnknownRoute,
    /// A request for another domain than the rules'.
    OtherDomain,
}

impl Miss {
    /// Its label.
    pub fn label(self) -> &'static str {
        match self {
            Self::NoKey => "no_key",
            Self::UnknownApiKey => "unknown_api_key",
            Self::BadKeyId => "bad_key_id",
            Self::NoTier => "no_tier",
            Self::UnknownTier => "unknown_tier",
            Self::NoRoute => "no_route",
            Self::UnknownRoute => "unknown_route",
            Self::OtherDomain => "other_domain",
        }
    }
}

/// A descriptor placed: who is counted, under which limit, and the rule that placed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// The key id counted.
    pub key_id: KeyId,
    /// Its tier.
    pub tier: TierId,
    /// The route class whose limit applies.
    pub route_class: RouteClassId,
    /// The index of the rule that matched, if one did.
    pub rule: Option<usize>,
}

impl DescriptorMap {
    /// Reads a mapping from TOML text; `path` names the file in errors.
    pub fn from_toml(path: &str, text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| format!("{path}: {e}"))
    }

    /// Places one descriptor of a request for `domain`.
    pub fn place(
        &self,
        domain: &str,
        entries: &[(&str, &str)],
        policy: &PolicySnapshot,
        keys: &KeyDirectory,
        route: impl Fn(&str) -> Option<RouteClassId>,
    ) -> Result<Placed, Miss> {
        if let Some((i, rule)) = self
            .rules
            .iter()
            .enumerate()
            .find(|(_, r)| r.matches(entries))
        {
            if !self.domain.is_empty() && self.domain != domain {
                return Err(Miss::OtherDomain);
            }
            let tier = policy.tier_id(&rule.tier).ok_or(Miss::UnknownTier)?;
            let route_class = policy
                .route_class_id(&rule.route_class)
                .ok_or(Miss::UnknownRoute)?;
            return Ok(Placed {
                key_id: descriptor_key_id(domain, entries),
                tier,
                route_class,
                rule: Some(i),
            });
        }
        let get = |name: &str| {
            entries
                .iter()
                .find(|(k, _)| !name.is_empty() && *k == name)
                .map(|(_, v)| *v)
        };
        let tier_entry = get(&self.tier);
        let (key_id, tier) = if let Some(api_key) = get(&self.api_key) {
            let entry = keys.get(api_key).ok_or(Miss::UnknownApiKey)?;
            let name = tier_entry.unwrap_or(&entry.tier);
            (entry.key_id, policy.tier_id(name).ok_or(Miss::UnknownTier)?)
        } else if let Some(hex) = get(&self.key_id) {
            let key_id: KeyId = hex.parse().map_err(|_| Miss::BadKeyId)?;
            let name = tier_entry.ok_or(Miss::NoTier)?;
            (key_id, policy.tier_id(name).ok_or(Miss::UnknownTier)?)
        } else {
            return Err(Miss::NoKey);
        };
        let route_class = if let Some(name) = get(&self.route_class) {
            policy.route_class_id(name).ok_or(Miss::UnknownRoute)?
        } else if let Some(path) = get(&self.path) {
            let path = path.split(['?', '#']).next().unwrap_or(path);
            route(path).ok_or(Miss::UnknownRoute)?
        } else {
            return Err(Miss::NoRoute);
        };
        Ok(Placed {
            key_id,
            tier,
            route_class,
            rule: None,
        })
    }

    /// The rules `placed` replaces by name: the indexes of the rules whose names are in the
    /// `replaces` of a rule that placed one of them.
    pub fn replaced<'a>(&self, placed: impl Iterator<Item = &'a Placed>) -> Vec<usize> {
        let names: HashMap<&str, usize> = self
            .rules
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.name.as_deref().map(|n| (n, i)))
            .collect();
        placed
            .filter_map(|p| p.rule)
            .flat_map(|i| self.rules[i].replaces.iter())
            .filter_map(|name| names.get(name.as_str()).copied())
            .collect()
    }
}

/// The key id of a descriptor counted by a rule: the first 16 bytes of BLAKE3 over the
/// domain and the entries, each part ended by a zero byte.
pub fn descriptor_key_id(domain: &str, entries: &[(&str, &str)]) -> KeyId {
    let mut h = blake3::Hasher::new();
    h.update(domain.as_bytes());
    h.update(&[0]);
    for (k, v) in entries {
        h.update(k.as_bytes());
        h.update(&[0]);
        h.update(v.as_bytes());
        h.update(&[0]);
    }
    let mut id = [0u8; 16];
    id.copy_from_slice(&h.finalize().as_bytes()[..16]);
    KeyId(id)
}
