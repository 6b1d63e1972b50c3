//! An envoyproxy/ratelimit configuration (YAML: `domain`, nested `descriptors`, each with
//! `key`, `value`, `rate_limit`, `shadow_mode`, …) read as a verdict policy and the rules
//! that map Envoy's descriptors onto it, so a team points Envoy at verdict without rewriting
//! its limits (`verdict policy import-envoy`).
//!
//! Every descriptor with a `rate_limit`, at any depth, becomes one rule (its entries are the
//! keys and values from the top down to it; no `value` matches any value, each distinct one
//! counted on its own, as envoyproxy/ratelimit counts it) and one route class of the policy,
//! named after that path (`database=users/table`), limited at one tier named after the
//! domain:
//!
//! | envoyproxy/ratelimit | verdict |
//! | --- | --- |
//! | `unit: second`, `requests_per_unit: N` | a token bucket of N refilling N a second (the hourly quota 3,600 N, capped at 10^9) |
//! | `unit: minute`, N | a token bucket of N refilling N a minute (the hourly quota 60 N): a burst of N at a window's edge is not followed by another N |
//! | `unit: hour`, N | the sliding hour of N (the bucket N, refilling N an hour, so the window decides) |
//! | `requests_per_unit: 0` | a quota of 0: every request refused |
//! | `unlimited: true` | mode `off`: counted as passing, never refused |
//! | `shadow_mode: true` | mode `shadow`: would-deny recorded, never refused |
//! | `name`, `replaces` | the rule's name and the rules it replaces |
//! | `detailed_metric`, `value_to_metric`, `metadata` | accepted; they shape envoyproxy/ratelimit's own statistics and response metadata, which verdict's events replace |
//!
//! Refused, with the file, the field's path, line and column: `unit: day`, `week`,
//! `month` or `year` (verdict's longest window is an hour), a value with `*` (wildcards),
//! `quota_mode` and `share_threshold` (no counterpart), a unit with `unlimited`, a limit
//! without a unit, two descriptors of one level with the same key and value, an unknown
//! field. Matching differs in one case: envoyproxy/ratelimit walks its tree and stops at a
//! level where neither `key_value` nor `key` matches; verdict tries the rules with values
//! before those without at each level, so a descriptor that dead-ends under a specific
//! value there may be counted by a wildcard rule here.

use std::collections::BTreeSet;

use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer};
use verdict_limiter::policy::{LimitRow, Mode, PolicyDocument, RouteClassRow, TierRow};

use crate::mapping::{DescriptorMap, Rule, RuleEntry};

/// A policy and its descriptor rules, imported.
#[derive(Debug, Clone)]
pub struct Imported {
    /// The policy: one tier (the domain), a route class and a limit per rule.
    pub policy: PolicyDocument,
    /// The rules mapping Envoy's descriptors onto it.
    pub descriptors: DescriptorMap,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Root {
    domain: String,
    #[serde(default)]
    descriptors: Vec<Node>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Node {
    key: String,
    #[serde(default)]
    value: Exact,
    #[serde(default)]
    rate_limit: Option<YamlLimit>,
    #[serde(default)]
    descriptors: Vec<Node>,
    #[serde(default)]
    shadow_mode: bool,
    // Read to be refused when true.
    #[serde(default, rename = "quota_mode")]
    _quota_mode: QuotaMode,
    #[serde(default, rename = "share_threshold")]
    _share_threshold: ShareThreshold,
    // Accepted and not used: they shape envoyproxy/ratelimit's own statistics and response
    // metadata.
    #[serde(default, rename = "detailed_metric")]
    _detailed_metric: Option<IgnoredAny>,
    #[serde(default, rename = "value_to_metric")]
    _value_to_metric: Option<IgnoredAny>,
    #[serde(default, rename = "metadata")]
    _metadata: Option<IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, try_from = "RawLimit")]
struct YamlLimit {
    per: Option<Unit>,
    requests_per_unit: u32,
    name: Option<String>,
    replaces: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    #[serde(default)]
    requests_per_unit: u32,
    #[serde(default)]
    unit: Option<Unit>,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<Replace>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Replace {
    name: String,
}

impl TryFrom<RawLimit> for YamlLimit {
    type Error = String;

    fn try_from(raw: RawLimit) -> Result<Self, String> {
        let per = match (raw.unlimited, raw.unit) {
            (true, Some(_)) => {
                return Err("rate_limit: should not specify a unit when unlimited".into());
            }
            (true, None) => None,
            (false, Some(unit)) => Some(unit),
            (false, None) => return Err("rate_limit: needs a unit (or unlimited: true)".into()),
        };
        Ok(Self {
            per,
            requests_per_unit: raw.requests_per_unit,
            name: raw.name,
            replaces: raw.replaces.into_iter().map(|r| r.name).collect(),
        })
    }
}

/// The units verdict expresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    Second,
    Minute,
    Hour,
}

impl<'de> Deserialize<'de> for Unit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        match text.to_ascii_lowercase().as_str() {
            "second" => Ok(Self::Second),
            "minute" => Ok(Self::Minute),
            "hour" => Ok(Self::Hour),
            longer @ ("day" | "week" | "month" | "year") => Err(serde::de::Error::custom(format!(
                "unit {longer} cannot be expressed: verdict's longest window is an hour \
                 (divide requests_per_unit into an hourly limit, or keep this limit in \
                 envoyproxy/ratelimit)"
            ))),
            other => Err(serde::de::Error::custom(format!(
                "invalid rate limit unit {other:?} (expected second, minute or hour)"
            ))),
        }
    }
}

/// A descriptor value matched exactly, or none (any value).
#[derive(Debug, Clone, Default)]
struct Exact(Option<String>);

impl<'de> Deserialize<'de> for Exact {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = String::deserialize(d)?;
        if value.contains('*') {
            return Err(serde::de::Error::custom(format!(
                "value {value:?}: wildcard values cannot be expressed (list the values, or \
                 leave value out to count every value on its own)"
            )));
        }
        Ok(Self(Some(value)))
    }
}

/// A flag verdict has no counterpart for: only `false` is read.
macro_rules! refused_flag {
    ($name:ident, $why:literal) => {
        #[derive(Debug, Default)]
        struct $name;

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                if bool::deserialize(d)? {
                    return Err(serde::de::Error::custom($why));
                }
                Ok(Self)
            }
        }
    };
}

refused_flag!(
    QuotaMode,
    "quota_mode cannot be expressed: verdict has no quota mode (remove it, or use shadow_mode)"
);
refused_flag!(
    ShareThreshold,
    "share_threshold cannot be expressed: it needs wildcard values, which verdict does not match"
);

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {problem}")]
pub struct ImportError {
    /// The file.
    pub file: String,
    /// What is wrong, with the field's path, line and column when the YAML reader knows them.
    pub problem: String,
}

/// Most requests a limit may allow in a window (the policy's bound).
const MAX_LIMIT: i64 = verdict_limiter::algo::MAX_LIMIT as i64;

/// Reads an envoyproxy/ratelimit configuration; `file` names it in errors.
///
/// # Errors
/// What cannot be read or expressed, naming the file, the field and its line.
pub fn import(file: &str, yaml: &str) -> Result<Imported, ImportError> {
    let refuse = |problem: String| ImportError {
        file: file.to_owned(),
        problem,
    };
    if yaml.trim().is_empty() {
        return Err(refuse(
            "the file is empty (expected domain and descriptors)".into(),
        ));
    }
    let root: Root = yaml_serde::from_str(yaml).map_err(|e| refuse(e.to_string()))?;
    if root.domain.is_empty() {
        return Err(refuse("domain: must not be empty".into()));
    }
    let mut rules = Vec::new();
    let mut limits = Vec::new();
    let mut path = Vec::new();
    walk(
        &root.descriptors,
        "descriptors",
        &mut path,
        &mut rules,
        &mut limits,
    )
    .map_err(refuse)?;
    if rules.is_empty() {
        return Err(refuse(
            "no descriptor has a rate_limit: there is nothing to import".into(),
        ));
    }
    if rules.len() > 256 {
        return Err(refuse(format!(
            "{} limits: a verdict policy holds at most 256 route classes",
            rules.len()
        )));
    }
    // At each level, rules with a value before those without (envoyproxy/ratelimit tries
    // `key_value` before `key`); otherwise in the file's order.
    let mut order: Vec<usize> = (0..rules.len()).collect();
    order.sort_by_key(|&i| {
        let r: &Rule = &rules[i];
        r.entries
            .iter()
            .map(|e| e.value.is_none())
            .collect::<Vec<_>>()
    });
    let tier = root.domain.clone();
    let mut policy = PolicyDocument {
        version: 1,
        tiers: vec![TierRow {
            id: 0,
            name: tier.clone(),
            kill_switch: false,
        }],
        ..PolicyDocument::default()
    };
    let mut sorted_rules = Vec::with_capacity(rules.len());
    for (id, i) in order.into_iter().enumerate() {
        let rule: Rule = rules[i].clone();
        policy.route_classes.push(RouteClassRow {
            id: id as u8,
            name: rule.route_class.clone(),
            prefixes: Vec::new(),
        });
        let mut limit: LimitRow = limits[i].clone();
        limit.tier.clone_from(&tier);
        policy.limits.push(limit);
        sorted_rules.push(Rule {
            tier: tier.clone(),
            ..rule
        });
    }
    verdict_limiter::PolicySnapshot::build(policy.clone())
        .map_err(|e| refuse(format!("the imported policy is not valid: {e}")))?;
    Ok(Imported {
        policy,
        descriptors: DescriptorMap {
            domain: root.domain,
            rules: sorted_rules,
            ..DescriptorMap::default()
        },
    })
}

/// Collects a rule and a limit for every descriptor with a rate limit under `nodes`, the
/// descriptors at `at` (`descriptors[0].descriptors`); refuses two of one level with the
/// same key and value, as envoyproxy/ratelimit refuses a duplicate composite key.
fn walk(
    nodes: &[Node],
    at: &str,
    path: &mut Vec<RuleEntry>,
    rules: &mut Vec<Rule>,
    limits: &mut Vec<LimitRow>,
) -> Result<(), String> {
    let mut seen = BTreeSet::new();
    for (i, n) in nodes.iter().enumerate() {
        let here = format!("{at}[{i}]");
        if !seen.insert((n.key.as_str(), n.value.0.as_deref())) {
            let value = n.value.0.as_ref().map(|v| format!(", value {v:?}"));
            return Err(format!(
                "{here}: duplicate descriptor: key {:?}{} is already at this level",
                n.key,
                value.unwrap_or_default()
            ));
        }
        path.push(RuleEntry {
            key: n.key.clone(),
            value: n.value.0.clone(),
        });
        if let Some(limit) = &n.rate_limit {
            let route_class = path
                .iter()
                .map(|e| match &e.value {
                    Some(v) => format!("{}={v}", e.key),
                    None => e.key.clone(),
                })
                .collect::<Vec<_>>()
                .join("/");
            limits.push(limit_row(&route_class, limit, n.shadow_mode));
            rules.push(Rule {
                entries: path.clone(),
                tier: String::new(),
                route_class,
                name: limit.name.clone(),
                replaces: limit.replaces.clone(),
            });
        }
        walk(
            &n.descriptors,
            &format!("{here}.descriptors"),
            path,
            rules,
            limits,
        )?;
        path.pop();
    }
    Ok(())
}

/// The limit row of one imported rate limit (see the module's table).
fn limit_row(route_class: &str, limit: &YamlLimit, shadow: bool) -> LimitRow {
    let n = i64::from(limit.requests_per_unit);
    let (capacity, refill_per_s, hourly_quota, mode) = match limit.per {
        None => (MAX_LIMIT, MAX_LIMIT as f64, MAX_LIMIT, Mode::Off),
        Some(unit) => {
            let seconds = match unit {
                Unit::Second => 1,
                Unit::Minute => 60,
                Unit::Hour => 3600,
            };
            let mode = if shadow { Mode::Shadow } else { Mode::Enforce };
            let per_hour = (n * (3600 / seconds)).min(MAX_LIMIT);
            let refill = (n as f64 / seconds as f64).max(0.001);
            (n.clamp(1, MAX_LIMIT), refill, per_hour, mode)
        }
    };
    LimitRow {
        tier: String::new(),
        route_class: route_class.to_owned(),
        capacity,
        refill_per_s,
        hourly_quota,
        mode,
    }
}
