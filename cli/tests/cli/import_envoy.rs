//! `verdict policy import-envoy` as a team moving from envoyproxy/ratelimit runs it: the
//! policy and the descriptor rules written, each read back by what uses it (the policy
//! file source, the rate limit service's mapping), existing files never overwritten, and a
//! limit that cannot be expressed refused with its field and line.

use std::process::{Command, Output};

use verdict_limiter::PolicySnapshot;
use verdict_limiter::policy::parse_toml;

const CONFIG: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../rls/fixtures/envoy/ratelimit.yaml"
);

fn import(dir: &std::path::Path, config: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_verdict"))
        .args(["policy", "import-envoy", config, "--policy-out"])
        .arg(dir.join("policy.toml"))
        .arg("--descriptors-out")
        .arg(dir.join("descriptors.toml"))
        .output()
        .expect("run verdict")
}

#[test]
fn an_envoy_ratelimit_config_becomes_a_policy_and_descriptor_rules_that_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let out = import(dir.path(), CONFIG);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with("imported 6 limit(s) of domain edge from "),
        "{text}"
    );
    assert!(text.contains("remote_address                           enforce           10        0.167          600"), "{text}");

    let policy = std::fs::read_to_string(dir.path().join("policy.toml")).unwrap();
    let snapshot = PolicySnapshot::build(parse_toml(&policy).unwrap()).unwrap();
    assert_eq!(snapshot.document().route_classes.len(), 6);
    let descriptors = std::fs::read_to_string(dir.path().join("descriptors.toml")).unwrap();
    let map = verdict_rls::DescriptorMap::from_toml("descriptors.toml", &descriptors).unwrap();
    assert_eq!((map.domain.as_str(), map.rules.len()), ("edge", 6));

    // Run again: the files exist and are kept.
    let again = import(dir.path(), CONFIG);
    assert!(!again.status.success());
    let err = String::from_utf8(again.stderr).unwrap();
    assert!(
        err.contains("policy.toml exists: the import writes new files only"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("policy.toml")).unwrap(),
        policy
    );
}

#[test]
fn a_limit_verdict_cannot_express_is_refused_with_its_field_and_line_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("daily.yaml");
    std::fs::write(
        &config,
        "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit:\n      unit: day\n      requests_per_unit: 1000\n",
    )
    .unwrap();
    let out = import(dir.path(), config.to_str().unwrap());
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("daily.yaml: descriptors[0].rate_limit: unit day cannot be expressed"),
        "{err}"
    );
    assert!(err.contains("at line 5 column 7"), "{err}");
    assert!(!dir.path().join("policy.toml").exists());
}
