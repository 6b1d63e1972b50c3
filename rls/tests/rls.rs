//! The rate limit service on loopback, called as Envoy calls it (gRPC, `ShouldRateLimit`),
//! over a gateway without an upstream and memory counters: an API key over its limit, shadow
//! mode, a key id with a tier entry, descriptors that do not map (allowed or denied, and
//! counted), rules with their own counter per descriptor, `replaces`, and the health
//! service.

use std::net::SocketAddr;
use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use tonic::transport::Channel;
use verdict_gateway::{GatewayBuilder, GatewayStore, KeyDirectory};
use verdict_limiter::policy::parse_toml;
use verdict_limiter::{EventReceiver, LimiterMetrics, MemoryStore, PolicyHandle, PolicySnapshot};
use verdict_rls::{DescriptorMap, RlsConfig, Rule, RuleEntry, Unmapped};
use verdict_schemas::{KeyId, Verdict};

const POLICY: &str = include_str!("../fixtures/policies/rls.toml");

/// A client of a service on loopback, the far end of its event queue, the limiter's
/// metrics and the service's address.
type Served = (
    RateLimitServiceClient<Channel>,
    EventReceiver,
    Arc<LimiterMetrics>,
    SocketAddr,
);

/// A service on loopback with `map`.
async fn service(map: DescriptorMap) -> Served {
    serving(map).await.0
}

/// The same, and the service.
async fn serving(map: DescriptorMap) -> (Served, Arc<verdict_rls::Rls<GatewayStore>>) {
    let metrics = Arc::new(LimiterMetrics::new());
    let policy = PolicyHandle::new(
        PolicySnapshot::build(parse_toml(POLICY).unwrap()).unwrap(),
        0,
    );
    let keys = verdict_gateway::keys::parse(
        "keys.csv",
        "api_key,key_id,tier\n\
         k-free,0000000000000000000000000000000a,free\n\
         k-trial,0000000000000000000000000000000b,trial\n",
    )
    .unwrap();
    let built = GatewayBuilder::deciding_for(None).build(
        GatewayStore::Memory(Arc::new(MemoryStore::new(1_000))),
        policy,
        Arc::clone(&metrics),
        KeyDirectory::new(keys),
    );
    let rls = Arc::new(verdict_rls::Rls::new(
        Arc::new(built.gateway),
        RlsConfig {
            descriptors: map,
            ..RlsConfig::default()
        },
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(verdict_rls::serve(
        listener,
        Arc::clone(&rls),
        std::future::pending(),
    ));
    let client = RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    ((client, built.events, metrics, addr), rls)
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    descriptors: &[&[(&str, &str)]],
) -> RateLimitResponse {
    let request = RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: descriptors.iter().map(|d| descriptor(d)).collect(),
        hits_addend: 0,
    };
    client
        .should_rate_limit(request)
        .await
        .unwrap()
        .into_inner()
}

fn header<'a>(r: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key == name)
        .map(|h| h.value.as_str())
}

fn metric(metrics: &LimiterMetrics, series: &str) -> Option<u64> {
    metrics.render().lines().find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok())?
    })
}

#[tokio::test]
async fn an_api_key_over_its_limit_is_over_limit_with_verdicts_fields_and_every_decision_is_an_event()
 {
    let (mut client, mut events, _, _) = service(DescriptorMap::default()).await;
    let key = [("api_key", "k-free"), ("path", "/v1/items/7?x=1")];
    for left in [2u32, 1, 0] {
        let r = ask(&mut client, &[&key]).await;
        assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
        let s = &r.statuses[0];
        assert_eq!(s.code, Code::Ok as i32);
        assert_eq!(s.limit_remaining, left);
        let limit = s.current_limit.as_ref().unwrap();
        // A bucket of 3 refilling 0.001 a second: under one a second, per minute.
        assert_eq!(
            (limit.name.as_str(), limit.unit),
            ("burst", Unit::Minute as i32)
        );
        assert_eq!(
            header(&r, "ratelimit-policy"),
            Some("\"burst\";q=3;w=3000, \"hourly\";q=100;w=3600")
        );
        assert_eq!(header(&r, "retry-after"), None);
    }
    let r = ask(&mut client, &[&key]).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    let reset = r.statuses[0].duration_until_reset.unwrap();
    // A token every 1,000 s, less the refill since the first request.
    assert!((999..=1000).contains(&reset.seconds), "{reset:?}");
    assert_eq!(header(&r, "retry-after"), Some("1000"));
    assert_eq!(header(&r, "content-type"), Some("application/problem+json"));
    let body = String::from_utf8(r.raw_body).unwrap();
    assert!(
        body.contains("the burst allowance of 3 requests is spent"),
        "{body}"
    );

    let key_a: KeyId = "0000000000000000000000000000000a".parse().unwrap();
    let decided: Vec<(KeyId, Verdict)> = events
        .waiting()
        .into_iter()
        .map(|e| (e.key_id, e.verdict))
        .collect();
    let allowed = (key_a, Verdict::Allowed);
    assert_eq!(
        decided,
        [allowed, allowed, allowed, (key_a, Verdict::Denied)]
    );
}

#[tokio::test]
async fn hits_addend_takes_that_many_and_zero_only_checks() {
    let (mut client, mut events, _, _) = service(DescriptorMap::default()).await;
    let key = [("api_key", "k-free"), ("route_class", "read")];
    // A bucket of 3: (the descriptor's hits_addend, unset meaning the request's 1) → code,
    // what is left.
    let trace = [
        (Some(0), Code::Ok, 3),
        (Some(2), Code::Ok, 1),
        (Some(2), Code::OverLimit, 1),
        (Some(0), Code::Ok, 1),
        (None, Code::Ok, 0),
        (Some(0), Code::Ok, 0),
        (Some(4), Code::OverLimit, 0),
    ];
    let mut last = RateLimitResponse::default();
    for (i, (hits, code, left)) in trace.into_iter().enumerate() {
        let mut d = descriptor(&key);
        d.hits_addend = hits.map(|value| UInt64Value { value });
        let r = client
            .should_rate_limit(RateLimitRequest {
                domain: "edge".to_owned(),
                descriptors: vec![d],
                hits_addend: 0,
            })
            .await
            .unwrap()
            .into_inner();
        let s = &r.statuses[0];
        assert_eq!(
            (s.code, s.limit_remaining),
            (code as i32, left),
            "step {i}: hits_addend {hits:?}: {r:?}"
        );
        last = r;
    }
    // More hits than the bucket holds: never, so a window away (an hour).
    assert_eq!(header(&last, "retry-after"), Some("3600"));
    let verdicts: Vec<Verdict> = events.waiting().into_iter().map(|e| e.verdict).collect();
    use Verdict::{Allowed, Denied};
    assert_eq!(
        verdicts,
        [Allowed, Allowed, Denied, Allowed, Allowed, Allowed, Denied],
        "one event per decision, whatever its hits"
    );
}

#[tokio::test]
async fn a_changed_descriptors_file_is_in_force_at_the_next_read_and_a_broken_one_changes_nothing()
{
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("descriptors.toml");
    let write = |text: &str| std::fs::write(&file, text).unwrap();
    write("api_key = \"user\"\n");
    let map = DescriptorMap::from_toml("descriptors.toml", "api_key = \"user\"\n").unwrap();
    let ((mut client, _, metrics, _), rls) = serving(map).await;
    let every = std::time::Duration::from_millis(50);
    Arc::clone(&rls).spawn_descriptor_refresher(file.clone(), None, every);
    let no_key = "verdict_rls_descriptors_total{outcome=\"unmapped_no_key\"}";
    let by = |entry: &'static str| [(entry, "k-free"), ("route_class", "read")];
    // What is left of the key's bucket of 3 after a request naming it by `entry`; None
    // when the descriptor did not map.
    let mut left = async |entry: &'static str| {
        let before = metric(&metrics, no_key).unwrap_or(0);
        let r = ask(&mut client, &[&by(entry)]).await;
        (metric(&metrics, no_key).unwrap_or(0) == before).then_some(r.statuses[0].limit_remaining)
    };
    assert_eq!(left("user").await, Some(2));
    assert_eq!(left("account").await, None);

    write("api_key = \"account\"\n");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while rls.descriptors().api_key != "account" {
        assert!(
            std::time::Instant::now() < deadline,
            "the change was not read"
        );
        tokio::time::sleep(every).await;
    }
    assert_eq!(left("account").await, Some(1));
    assert_eq!(left("user").await, None);

    // A file that does not read: the map in force stays, through several reads.
    write("api_key = [\n");
    tokio::time::sleep(every * 4).await;
    assert_eq!(rls.descriptors().api_key, "account");
    assert_eq!(left("account").await, Some(0));
}

#[tokio::test]
async fn shadow_mode_answers_ok_and_records_the_would_deny() {
    let (mut client, mut events, _, _) = service(DescriptorMap::default()).await;
    let key = [("api_key", "k-trial"), ("route_class", "read")];
    for _ in 0..2 {
        let r = ask(&mut client, &[&key]).await;
        assert_eq!(r.overall_code, Code::Ok as i32);
    }
    let first = events.try_recv().unwrap();
    let second = events.try_recv().unwrap();
    assert_eq!(
        (first.verdict, second.verdict),
        (Verdict::Allowed, Verdict::WouldDeny)
    );
}

#[tokio::test]
async fn a_key_id_with_a_tier_entry_is_counted_as_that_key() {
    let (mut client, mut events, _, _) = service(DescriptorMap::default()).await;
    let id = "00112233445566778899aabbccddeeff";
    let key = [("key_id", id), ("tier", "free"), ("route_class", "read")];
    let r = ask(&mut client, &[&key]).await;
    assert_eq!(r.statuses[0].limit_remaining, 2);
    assert_eq!(
        events.try_recv().unwrap().key_id,
        id.parse::<KeyId>().unwrap()
    );
}

#[tokio::test]
async fn descriptors_that_do_not_map_are_allowed_and_counted_or_denied_when_told() {
    let (mut client, mut events, metrics, _) = service(DescriptorMap::default()).await;
    let cases: [&[(&str, &str)]; 5] = [
        &[("generic_key", "checkout")],
        &[("api_key", "k-nobody"), ("path", "/v1/items")],
        &[("api_key", "k-free"), ("path", "/v2/other")],
        &[
            ("key_id", "not-hex"),
            ("tier", "free"),
            ("route_class", "read"),
        ],
        &[("api_key", "k-free")],
    ];
    for d in cases {
        let r = ask(&mut client, &[d]).await;
        assert_eq!(r.overall_code, Code::Ok as i32, "{d:?}");
        assert_eq!(r.statuses[0].current_limit, None);
    }
    assert!(events.try_recv().is_none(), "nothing was decided");
    for (why, n) in [
        ("no_key", 1),
        ("unknown_api_key", 1),
        ("unknown_route", 1),
        ("bad_key_id", 1),
        ("no_route", 1),
    ] {
        let series = format!("verdict_rls_descriptors_total{{outcome=\"unmapped_{why}\"}}");
        assert_eq!(metric(&metrics, &series), Some(n), "{series}");
    }

    let deny = DescriptorMap {
        unmapped: Unmapped::Deny,
        ..DescriptorMap::default()
    };
    let (mut client, _, _, _) = service(deny).await;
    let r = ask(&mut client, &[&[("generic_key", "checkout")]]).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
}

#[tokio::test]
async fn a_rule_counts_each_descriptor_on_its_own_and_a_replaced_rule_is_not_decided() {
    let rule = |entries: &[(&str, Option<&str>)], name: Option<&str>, replaces: &[&str]| Rule {
        entries: entries
            .iter()
            .map(|(k, v)| RuleEntry {
                key: (*k).to_owned(),
                value: v.map(str::to_owned),
            })
            .collect(),
        tier: "envoy".to_owned(),
        route_class: "per_address".to_owned(),
        name: name.map(str::to_owned),
        replaces: replaces.iter().map(|s| (*s).to_owned()).collect(),
    };
    let map = DescriptorMap {
        domain: "edge".to_owned(),
        rules: vec![
            rule(&[("remote_address", None)], Some("per_address"), &[]),
            rule(&[("generic_key", Some("vip"))], None, &["per_address"]),
        ],
        ..DescriptorMap::default()
    };
    let (mut client, mut events, metrics, _) = service(map).await;
    let a = [("remote_address", "10.0.0.1")];
    let b = [("remote_address", "10.0.0.2")];
    let codes = |r: &RateLimitResponse| r.statuses.iter().map(|s| s.code).collect::<Vec<_>>();
    assert_eq!(ask(&mut client, &[&a]).await.overall_code, Code::Ok as i32);
    assert_eq!(ask(&mut client, &[&a]).await.overall_code, Code::Ok as i32);
    assert_eq!(
        ask(&mut client, &[&a]).await.overall_code,
        Code::OverLimit as i32
    );
    // Another address has a counter of its own.
    assert_eq!(ask(&mut client, &[&b]).await.overall_code, Code::Ok as i32);
    // With the vip descriptor beside it, the address's rule is replaced: not decided.
    let r = ask(&mut client, &[&a, &[("generic_key", "vip")]]).await;
    assert_eq!(codes(&r), [Code::Ok as i32, Code::Ok as i32]);
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(
        metric(
            &metrics,
            "verdict_rls_descriptors_total{outcome=\"replaced\"}"
        ),
        Some(1)
    );
    let key_ids: Vec<KeyId> = std::iter::from_fn(|| events.try_recv())
        .map(|e| e.key_id)
        .collect();
    assert_eq!(key_ids.len(), 5, "3 + 1 + the vip descriptor");
    assert_eq!(key_ids[0], key_ids[1]);
    assert_ne!(key_ids[0], key_ids[3]);
    // Another domain's requests do not match the rules.
    let other = RateLimitRequest {
        domain: "internal".to_owned(),
        descriptors: vec![descriptor(&b)],
        hits_addend: 0,
    };
    let r = client.should_rate_limit(other).await.unwrap().into_inner();
    assert_eq!(r.statuses[0].current_limit, None);
    assert_eq!(
        metric(
            &metrics,
            "verdict_rls_descriptors_total{outcome=\"unmapped_other_domain\"}"
        ),
        Some(1)
    );
}

#[tokio::test]
async fn the_health_service_says_serving_for_the_server_and_the_rate_limit_service() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    let (_, _, _, addr) = service(DescriptorMap::default()).await;
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    for service in ["", verdict_rls::server::SERVICE_NAME] {
        let r = health
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.status, ServingStatus::Serving as i32, "{service:?}");
    }
}
