//! One smoke test per real service, each really using it: Kafka (produce and consume a
//! decision event with rdkafka), the S3 server (put/list/get/delete through object_store,
//! plus the three behaviours the pipeline relies on: multipart upload, conditional create
//! answered 412, list after write), Redis (a Lua script) and PostgreSQL (a query).
//! A service that is down fails its test with `scripts/services.sh up` in the message.

use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, WriteMultipart};
use verdict_schemas::{
    DecisionEvent, DecisionSource, DeniedBy, KeyId, RegionId, RouteClassId, TierId, Verdict,
};
use verdict_tests::{Service, require, s3_store, unique_name};

fn sample_event() -> DecisionEvent {
    DecisionEvent {
        event_time_ms: 1_796_047_200_123,
        key_id: KeyId(*b"smoke-test-key-1"),
        route_class: RouteClassId(2),
        tier: TierId(1),
        region: RegionId(1),
        gateway_instance: 7,
        verdict: Verdict::Denied,
        denied_by: DeniedBy {
            bucket: false,
            window: true,
        },
        source: DecisionSource::CounterStore,
        remaining_tokens: 3,
        remaining_window: 0,
        retry_after_ms: 1500,
        window_quota: 1000,
        policy_version: 9,
        sub_key: 0,
        sub_keys: 1,
    }
}

#[tokio::test]
async fn kafka_smoke_produce_and_consume_a_decision_event() {
    use rdkafka::ClientConfig;
    use rdkafka::message::Message;
    use rdkafka::producer::{FutureProducer, FutureRecord};

    require(Service::Kafka);
    let brokers = verdict_tests::kafka_brokers();
    let topic = unique_name("smoke");
    let event = sample_event();

    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("enable.idempotence", "true")
        .set("compression.type", "lz4")
        .set("message.timeout.ms", "30000")
        .create()
        .expect("producer");
    let payload = event.encode();
    producer
        .send(
            FutureRecord::to(&topic)
                .key(event.key_id.as_bytes().as_slice())
                .payload(payload.as_slice()),
            Duration::from_secs(30),
        )
        .await
        .map_err(|(e, _)| e)
        .expect("the broker acknowledges the record");

    let consumer = verdict_tests::kafka_consumer(&topic);
    let message = tokio::time::timeout(Duration::from_secs(60), consumer.recv())
        .await
        .expect("a record within 60 s")
        .expect("no consumer error");
    assert_eq!(message.key(), Some(event.key_id.as_bytes().as_slice()));
    let got = DecisionEvent::decode(message.payload().expect("a payload")).expect("a v1 event");
    assert_eq!(got, event);
}

/// The object at `path`, whole.
async fn read(store: &dyn ObjectStore, path: &Path) -> Bytes {
    let got = store.get(path).await.expect("get");
    got.bytes().await.expect("body")
}

#[tokio::test]
async fn s3_smoke_put_list_get_delete() {
    let store = s3_store("verdict-smoke").await;
    let prefix = Path::from(unique_name("put-list-get-delete"));
    let path = prefix.clone().join("a.bin");
    store
        .put(&path, PutPayload::from_static(b"hello verdict"))
        .await
        .expect("put");

    let listed: Vec<_> = store.list(Some(&prefix)).try_collect().await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].location, path);
    assert_eq!(listed[0].size, 13);

    let got = read(store.as_ref(), &path).await;
    assert_eq!(got, Bytes::from_static(b"hello verdict"));

    store.delete(&path).await.expect("delete");
    let listed: Vec<_> = store.list(Some(&prefix)).try_collect().await.expect("list");
    assert!(listed.is_empty(), "deleted object still listed: {listed:?}");
    assert!(matches!(
        store.get(&path).await,
        Err(object_store::Error::NotFound { .. })
    ));
}

#[tokio::test]
async fn s3_fidelity_multipart_upload() {
    let store = s3_store("verdict-smoke").await;
    let path = Path::from(unique_name("multipart")).join("big.parquet");
    // Three parts: S3's minimum part size is 5 MiB for all but the last.
    let part = 5 * 1024 * 1024;
    let data: Vec<u8> = (0..(2 * part + 1234)).map(|i| (i % 251) as u8).collect();
    let upload = store.put_multipart(&path).await.expect("start multipart");
    let mut writer = WriteMultipart::new_with_chunk_size(upload, part);
    writer.write(&data);
    writer.finish().await.expect("complete multipart");

    let got = read(store.as_ref(), &path).await;
    assert_eq!(got.len(), data.len());
    assert!(
        got.as_ref() == data.as_slice(),
        "multipart object differs from what was written"
    );
}

#[tokio::test]
async fn s3_fidelity_conditional_create_refuses_an_existing_key() {
    let store = s3_store("verdict-smoke").await;
    let path = Path::from(unique_name("conditional")).join("_flush.marker");
    let create = PutOptions::from(PutMode::Create);
    store
        .put_opts(&path, PutPayload::from_static(b"first"), create.clone())
        .await
        .expect("creating a new key succeeds");
    let second = store
        .put_opts(&path, PutPayload::from_static(b"second"), create)
        .await;
    assert!(
        matches!(second, Err(object_store::Error::AlreadyExists { .. })),
        "a create of an existing key must be refused (412), got {second:?}"
    );
    let got = read(store.as_ref(), &path).await;
    assert_eq!(
        got,
        Bytes::from_static(b"first"),
        "the refused create must not overwrite"
    );
}

#[tokio::test]
async fn s3_fidelity_list_after_write() {
    let store = s3_store("verdict-smoke").await;
    let prefix = Path::from(unique_name("list-after-write"));
    for i in 0..25 {
        let path = prefix
            .clone()
            .join(format!("hour={:02}", i % 3))
            .join(format!("{i:03}.parquet"));
        store
            .put(&path, PutPayload::from(vec![i as u8; i + 1]))
            .await
            .expect("put");
        // Every object is listed the moment its put returns.
        let listed: Vec<_> = store.list(Some(&prefix)).try_collect().await.expect("list");
        assert_eq!(listed.len(), i + 1, "after {} puts", i + 1);
    }
    let hour1 = store
        .list_with_delimiter(Some(&prefix.clone().join("hour=01")))
        .await
        .expect("list");
    assert_eq!(hour1.objects.len(), 8);
}

#[tokio::test]
async fn redis_smoke_runs_a_lua_script() {
    use fred::prelude::*;
    use fred::types::scripts::Script;

    require(Service::Redis);
    let client = Builder::from_config(Config::from_url(&verdict_tests::redis_url()).expect("url"))
        .build()
        .expect("client");
    client.init().await.expect("connect");
    let key = unique_name("smoke");
    // Increment by ARGV[1], set a TTL, and answer the new value with the server's clock.
    let script = Script::from_lua(
        "local v = redis.call('INCRBY', KEYS[1], ARGV[1]) \
         redis.call('PEXPIRE', KEYS[1], 60000) \
         local t = redis.call('TIME') \
         return {v, tonumber(t[1])}",
    );
    script.load(&client).await.expect("SCRIPT LOAD");
    let first: Vec<i64> = script
        .evalsha(&client, key.as_str(), 5)
        .await
        .expect("EVALSHA");
    let second: Vec<i64> = script
        .evalsha(&client, key.as_str(), 7)
        .await
        .expect("EVALSHA");
    assert_eq!((first[0], second[0]), (5, 12));
    assert!(
        second[1] > 1_700_000_000,
        "server time {} is not a Unix time",
        second[1]
    );
    let ttl: i64 = client.pttl(key.as_str()).await.expect("PTTL");
    assert!(ttl > 0 && ttl <= 60_000, "ttl {ttl}");
    client.quit().await.expect("quit");
}

#[tokio::test]
async fn postgres_smoke_runs_a_query() {
    require(Service::Postgres);
    let (client, connection) =
        tokio_postgres::connect(&verdict_tests::postgres_url(), tokio_postgres::NoTls)
            .await
            .expect("connect");
    tokio::spawn(connection);
    client
        .batch_execute("create temporary table smoke (tier text primary key, quota int not null)")
        .await
        .expect("create");
    for (tier, quota) in [("free", 1000), ("pro", 50_000)] {
        client
            .execute("insert into smoke values ($1, $2)", &[&tier, &quota])
            .await
            .expect("insert");
    }
    let row = client
        .query_one(
            "select sum(quota)::int, count(*) from smoke where quota > $1",
            &[&500i32],
        )
        .await
        .expect("select");
    assert_eq!((row.get::<_, i32>(0), row.get::<_, i64>(1)), (51_000, 2));
}
