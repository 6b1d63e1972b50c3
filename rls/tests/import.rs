//! An envoyproxy/ratelimit configuration imported as a policy and descriptor rules: the
//! mapping of each unit, shadow mode, unlimited and replaces; the rules in the order
//! envoyproxy/ratelimit matches; the files written and read back; and every refusal naming
//! the file, the field and its line.

use verdict_limiter::policy::{Mode, parse_toml};
use verdict_rls::import::import;
use verdict_rls::{DescriptorMap, RuleEntry};

const CONFIG: &str = include_str!("../fixtures/envoy/ratelimit.yaml");

#[test]
fn each_limit_becomes_a_route_class_a_limit_and_a_rule() {
    let imported = import("ratelimit.yaml", CONFIG).unwrap();
    let p = &imported.policy;
    assert_eq!(p.tiers.len(), 1);
    assert_eq!(p.tiers[0].name, "edge");
    let rows: Vec<(&str, i64, f64, i64, Mode)> = p
        .limits
        .iter()
        .map(|l| {
            let (c, r, q) = (l.capacity, l.refill_per_s, l.hourly_quota);
            (l.route_class.as_str(), c, r, q, l.mode)
        })
        .collect();
    let off = (1_000_000_000, 1e9, 1_000_000_000, Mode::Off);
    assert_eq!(
        rows,
        [
            // The rules with a value at each level before those without (of one length:
            // a rule matches descriptors of its own length only), else the file's order.
            ("database=users", 500, 500.0, 1_800_000, Mode::Enforce),
            ("client=vip", 1000, 1000.0, 3_600_000, Mode::Enforce),
            ("remote_address", 10, 10.0 / 60.0, 600, Mode::Enforce),
            ("database", 50, 50.0, 180_000, Mode::Shadow),
            ("to_number/from_number=internal", off.0, off.1, off.2, off.3),
            (
                "to_number/from_number",
                100,
                100.0 / 3600.0,
                100,
                Mode::Enforce
            ),
        ]
    );
    let rules = &imported.descriptors.rules;
    assert_eq!(imported.descriptors.domain, "edge");
    let entry = |key: &str, value: Option<&str>| RuleEntry {
        key: key.to_owned(),
        value: value.map(str::to_owned),
    };
    assert_eq!(rules[0].entries, [entry("database", Some("users"))]);
    assert_eq!(
        rules[4].entries,
        [
            entry("to_number", None),
            entry("from_number", Some("internal"))
        ]
    );
    assert_eq!(rules[1].replaces, ["per_address"]);
    assert_eq!(rules[2].name.as_deref(), Some("per_address"));
    assert!(rules.iter().all(|r| r.tier == "edge"));
    assert!(
        rules
            .iter()
            .zip(&p.limits)
            .all(|(r, l)| r.route_class == l.route_class)
    );
}

#[test]
fn the_written_files_read_back_as_what_was_imported() {
    let imported = import("ratelimit.yaml", CONFIG).unwrap();
    let policy = toml::to_string(&imported.policy).unwrap();
    assert_eq!(parse_toml(&policy).unwrap(), imported.policy);
    let descriptors = toml::to_string(&imported.descriptors).unwrap();
    let read = DescriptorMap::from_toml("descriptors.toml", &descriptors).unwrap();
    assert_eq!(read, imported.descriptors);
}

#[test]
fn what_cannot_be_expressed_is_refused_naming_the_file_the_field_and_the_line() {
    let cases = [
        (
            "domain: edge\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: day\n      requests_per_unit: 5\n",
            "descriptors[0].rate_limit: unit day cannot be expressed: verdict's longest window is an hour",
            "line 5",
        ),
        (
            "domain: edge\ndescriptors:\n  - key: path\n    value: /v1/*\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
            "descriptors[0]: value \"/v1/*\": wildcard values cannot be expressed",
            "line 3",
        ),
        (
            "domain: edge\ndescriptors:\n  - key: a\n    quota_mode: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
            "descriptors[0]: quota_mode cannot be expressed",
            "line 3",
        ),
        (
            "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, unlimited: true}\n",
            "descriptors[0]: rate_limit: should not specify a unit when unlimited",
            "line 3",
        ),
        (
            "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
            "descriptors[0].rate_limit: invalid rate limit unit \"fortnight\"",
            "line 4",
        ),
        (
            "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 2}\n",
            "descriptors[1]: duplicate descriptor: key \"a\" is already at this level",
            "",
        ),
        (
            "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    burst: 4\n",
            "descriptors[0]: unknown field `burst`, expected one of `key`, `value`",
            "line 5",
        ),
    ];
    for (yaml, says, line) in cases {
        let e = import("ratelimit.yaml", yaml).unwrap_err().to_string();
        assert!(e.starts_with("ratelimit.yaml: "), "{e}");
        assert!(e.contains(says), "{e}\n  should say: {says}");
        assert!(e.contains(line), "{e}\n  should name {line}");
    }
    let empty = import("ratelimit.yaml", "  \n").unwrap_err().to_string();
    assert_eq!(
        empty,
        "ratelimit.yaml: the file is empty (expected domain and descriptors)"
    );
    let nothing = import("ratelimit.yaml", "domain: edge\ndescriptors:\n  - key: a\n");
    assert_eq!(
        nothing.unwrap_err().to_string(),
        "ratelimit.yaml: no descriptor has a rate_limit: there is nothing to import"
    );
}
