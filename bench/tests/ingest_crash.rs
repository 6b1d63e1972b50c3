//! `verdict ingest` killed with SIGKILL five times, against the real Kafka broker and S3
//! server (run as `verdict-bench ingest-with-faults`, the same worker with fault injection):
//! once the moment a flush has written files it has not committed (the store slowed by
//! `--put-delay-ms`), once right after a commit to the raw table's log and before its
//! offsets reach Kafka (held there by `--commit-pause-ms`),
//! the other times at random moments while more events are produced, commits included. A last worker runs until every partition is
//! flushed and stops on SIGTERM with exit status 0. Every produced (partition, offset) is
//! then in the raw table once, and the interrupted flushes' files are in no commit.
//!
//! And `verdict ingest` stopped with SIGSTOP past its Kafka session inside a flush, then
//! woken with SIGCONT once another worker has committed its partition: its commit is refused.
//! Woken instead while the other worker is still inside its flush, it wins the race: the
//! other's flush is refused, it resumes from the log, and no bad record is lost or doubled.

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use object_store::{ObjectStore, ObjectStoreExt};
use rand::{Rng, SeedableRng};
use verdict_tests::ingest_check::{
    Running, all_flushed, assert_exactly_once, assert_vacuum_takes_only_uncommitted, create_topic,
    kafka_committed, produce, progress, quarantined, raw_objects, recent_events, uncommitted,
    worker_config,
};
use verdict_tests::private::spare_port;
use verdict_tests::{
    Service, eventually, kafka_brokers, require, s3_endpoint, s3_store, unique_name,
};

const BUCKET: &str = "verdict-ingest-test";

/// The group member id of the workers that follow each other.
const WORKER: &str = "crash-test-worker";

/// `verdict ingest` as the group's member `instance`, its puts to the store each held
/// `put_delay_ms`.
fn worker_command(
    store_url: &str,
    topic: &str,
    group: &str,
    instance: &str,
    put_delay_ms: u64,
) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_verdict-bench"));
    cmd.args([
        "ingest-with-faults",
        "--store",
        store_url,
        "--s3-endpoint",
        &s3_endpoint(),
        "--brokers",
        &kafka_brokers(),
    ])
    .args([
        "--topic",
        topic,
        "--group",
        group,
        "--instance-id",
        instance,
    ])
    .args([
        "--flush-max-records",
        "700",
        "--flush-max-age-secs",
        "1",
        "--put-delay-ms",
        &put_delay_ms.to_string(),
    ])
    .env("AWS_ACCESS_KEY_ID", "verdict")
    .env("AWS_SECRET_ACCESS_KEY", "verdict")
    .env("AWS_REGION", "us-east-1")
    .env("RUST_LOG", "warn")
    .stdout(Stdio::null())
    .stderr(Stdio::inherit());
    cmd
}

fn spawn_worker(store_url: &str, topic: &str, group: &str, put_delay_ms: u64) -> Child {
    worker_command(store_url, topic, group, WORKER, put_delay_ms)
        .spawn()
        .expect("start verdict ingest")
}

/// Starts a worker and returns once it says it listens for SIGTERM, so that a SIGTERM sent
/// afterwards tests the clean stop rather than the moment before the handler exists. Its
/// log still reaches the test's stderr.
fn spawn_listening_worker(store_url: &str, topic: &str, group: &str, metrics_port: u16) -> Child {
    let mut child = worker_command(store_url, topic, group, WORKER, 0)
        .args(["--metrics-addr", &format!("127.0.0.1:{metrics_port}")])
        .env("RUST_LOG", "warn,verdict::signals=info")
        .stderr(Stdio::piped())
        .spawn()
        .expect("start verdict ingest");
    let stderr = child.stderr.take().expect("piped stderr");
    let (ready, listening) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("{line}");
            if line.contains("listening for SIGTERM") {
                let _ = ready.send(());
            }
        }
    });
    listening
        .recv_timeout(Duration::from_secs(30))
        .expect("the worker did not say it listens for SIGTERM within 30 s");
    child
}

fn kill_9(mut child: Child) {
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
}

async fn has_uncommitted(store: &Arc<dyn ObjectStore>) -> bool {
    !uncommitted(store).await.is_empty()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_five_times_every_event_is_in_the_raw_table_exactly_once() {
    require(Service::Kafka);
    let bucket = s3_store(BUCKET).await;
    let run = unique_name("crash");
    let store: Arc<dyn ObjectStore> = Arc::new(verdict_lake::Prefixed::new(bucket, &run));
    let store_url = format!("s3://{BUCKET}/{run}");
    let topic = unique_name("decisions-crash");
    create_topic(&topic, 4).await;
    let group = unique_name("crash-group");
    let mut rng = rand::rngs::SmallRng::seed_from_u64(2026);

    let mut produced: BTreeMap<(i32, i64), Vec<u8>> =
        produce(&topic, recent_events(4_000, 10)).await;

    // Kill 1: inside a flush, between its files and its commit.
    let w = spawn_worker(&store_url, &topic, &group, 60);
    eventually(Duration::from_secs(90), "a flush in progress", || {
        has_uncommitted(&store)
    })
    .await;
    kill_9(w);
    assert!(
        has_uncommitted(&store).await,
        "the kill left an interrupted flush behind"
    );

    // Kill 2: right after a commit to the raw table's log, before its offsets reach Kafka
    // (the worker holds 30 s after each commit). The next worker must resume from the log,
    // not from Kafka's older offset, or it writes the committed events twice.
    let before = progress(&store, &topic, 4).await;
    let w = worker_command(&store_url, &topic, &group, WORKER, 0)
        .args(["--commit-pause-ms", "30000"])
        .spawn()
        .expect("start verdict ingest");
    eventually(Duration::from_secs(90), "a commit to the log", || async {
        progress(&store, &topic, 4).await != before
    })
    .await;
    kill_9(w);
    let after = progress(&store, &topic, 4).await;
    let (p, last) = after
        .iter()
        .find(|(p, v)| before[*p] != **v)
        .map(|(p, v)| (*p, v.expect("a committed partition has progress")))
        .unwrap();
    let kafka = kafka_committed(&group, &topic, p);
    println!("partition {p}: the log holds up to offset {last}, Kafka's group is at {kafka:?}");
    assert!(
        kafka.is_none_or(|next| next <= last),
        "Kafka has the offsets of the commit the kill interrupted: {kafka:?} after {last}"
    );

    // Kills 3–5: at random moments, with more events produced in between.
    for round in 3..=5u64 {
        let w = spawn_worker(&store_url, &topic, &group, 20);
        produced.extend(produce(&topic, recent_events(1_500, 10 + round)).await);
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..2_500))).await;
        kill_9(w);
    }

    let metrics_port = spare_port();
    let mut last = spawn_listening_worker(&store_url, &topic, &group, metrics_port);
    eventually(
        Duration::from_secs(180),
        "every partition flushed to its last offset",
        || all_flushed(&store, "main", &topic, &produced),
    )
    .await;
    // The last worker owns all four partitions and says so at /metrics.
    let metrics_url = format!("http://127.0.0.1:{metrics_port}/metrics");
    eventually(
        Duration::from_secs(30),
        "/metrics shows the four partitions owned",
        || async {
            let text = match reqwest::get(&metrics_url).await {
                Ok(r) => r.text().await.unwrap_or_default(),
                Err(_) => return false,
            };
            text.contains("verdict_ingest_partitions_owned 4")
                && text.contains("verdict_ingest_events_written_total")
        },
    )
    .await;
    let term = Command::new("kill")
        .args(["-TERM", &last.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(term.success());
    let status = last.wait().expect("wait");
    assert!(
        status.success(),
        "SIGTERM must flush, commit and exit 0, got {status}"
    );

    assert_exactly_once(&store, &produced).await;
    // What the kills interrupted is in no commit: readers never saw it, and vacuum takes it
    // and nothing else.
    assert_vacuum_takes_only_uncommitted(&store).await;
}

/// What the worker logs when the raw table refuses its flush.
const REFUSED: &str = "the raw table refused this flush";

/// A worker that stops for longer than its Kafka session (SIGSTOP: what a long GC pause, a
/// frozen VM or a partition from the broker looks like to the group) while a flush of its
/// is between its files and its commit. The group gives the partition to another worker,
/// which resumes from the raw table's log and commits the same offsets. When the first
/// worker wakes (SIGCONT) it finishes its flush: the raw table refuses the commit, because the
/// partition's `txn` version moved; the worker deletes the files it wrote for it and nothing
/// that is committed, and every offset is in the table once.
/// The child process, its stderr lines collected; killed when dropped.
struct Paused {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Paused {
    /// `verdict ingest` as member `instance`, writing through a store that takes
    /// `put_delay_ms` a put, so that a flush spends seconds between its first file and its
    /// commit; its log lines go to the test's output after `[label]`.
    fn start(
        store_url: &str,
        topic: &str,
        group: &str,
        (instance, put_delay_ms, label): (&str, u64, &'static str),
    ) -> Self {
        let mut child = worker_command(store_url, topic, group, instance, put_delay_ms)
            .env("RUST_LOG", "warn,verdict_ingest=info")
            .stderr(Stdio::piped())
            .spawn()
            .expect("start verdict ingest");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[{label}] {line}");
                sink.lock().unwrap().push(line);
            }
        });
        Self { child, lines }
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("running kill");
        assert!(status.success(), "kill {signal} failed: {status}");
    }

    fn logged(&self, text: &str) -> bool {
        self.lines.lock().unwrap().iter().any(|l| l.contains(text))
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_paused_past_its_session_has_its_commit_refused_and_deletes_nothing_committed() {
    require(Service::Kafka);
    verdict_tests::capture_logs();
    let bucket = s3_store(BUCKET).await;
    let run = unique_name("zombie");
    let store: Arc<dyn ObjectStore> = Arc::new(verdict_lake::Prefixed::new(bucket, &run));
    let store_url = format!("s3://{BUCKET}/{run}");
    let topic = unique_name("decisions");
    create_topic(&topic, 1).await;
    let group = unique_name("zombie-group");
    let produced = produce(&topic, recent_events(3_000, 41)).await;
    let progress = |store: Arc<dyn ObjectStore>| {
        let topic = topic.clone();
        async move { progress(&store, &topic, 1).await[&0] }
    };

    let paused = Paused::start(&store_url, &topic, &group, (WORKER, 1_500, "paused worker"));
    eventually(
        Duration::from_secs(90),
        "the first flush committed and a file of the next one written",
        || async {
            progress(Arc::clone(&store)).await.is_some() && !uncommitted(&store).await.is_empty()
        },
    )
    .await;
    paused.signal("-STOP");
    let before = progress(Arc::clone(&store)).await.unwrap();
    let in_flight = uncommitted(&store).await;
    println!("stopped at progress {before}, in flight: {in_flight:?}");

    // Another worker joins the group; the partition is its once the stopped one's session
    // (10 s) expires, and it resumes from the log's progress.
    let owner = Running::start(worker_config(&topic, &group, 1_000), Arc::clone(&store));
    eventually(
        Duration::from_secs(120),
        "the new owner flushed every offset",
        || all_flushed(&store, "main", &topic, &produced),
    )
    .await;
    let committed: BTreeSet<String> = raw_objects(&store)
        .await
        .into_iter()
        .map(|m| m.location.to_string())
        .collect();
    let owners = progress(Arc::clone(&store)).await.unwrap();
    assert!(owners > before, "the owner's progress {owners} ≤ {before}");
    assert!(
        !paused.logged(REFUSED),
        "the stopped worker logged while stopped"
    );

    paused.signal("-CONT");
    eventually(
        Duration::from_secs(60),
        "the woken worker's commit refused",
        || async { paused.logged(REFUSED) },
    )
    .await;
    eventually(
        Duration::from_secs(30),
        "the refused flush's files deleted",
        || async { uncommitted(&store).await.is_empty() },
    )
    .await;
    drop(paused);

    // The refused commit changed nothing: the same progress, every committed file there.
    assert_eq!(progress(Arc::clone(&store)).await, Some(owners));
    let now: BTreeSet<String> = raw_objects(&store)
        .await
        .into_iter()
        .map(|m| m.location.to_string())
        .collect();
    assert_eq!(now, committed, "the table's files changed");
    for path in &committed {
        store
            .head(&object_store::path::Path::from(path.as_str()))
            .await
            .unwrap_or_else(|e| panic!("committed file {path} is gone: {e}"));
    }
    assert_exactly_once(&store, &produced).await;
    assert_vacuum_takes_only_uncommitted(&store).await;
    println!("owner: {:?}", owner.stop().await);
}

/// The quarantine files of partition 0 of `topic` that the raw table's progress does not
/// cover yet: those of flushes that have not committed (or never will).
async fn quarantine_past_progress(
    store: &Arc<dyn ObjectStore>,
    topic: &str,
) -> Vec<verdict_ingest::flush::QuarantineFile> {
    let committed = progress(store, topic, 1).await[&0];
    let source = verdict_ingest::KafkaSource::new("main", topic, 0);
    verdict_ingest::flush::quarantine_files(
        store,
        &source,
        &verdict_ingest::flush::StoreCalls::default(),
    )
    .await
    .unwrap()
    .into_iter()
    .filter(|f| committed.is_none_or(|c| f.offsets.last > c))
    .collect()
}

/// The same stop as above, but the stopped worker wins: woken while the partition's new
/// owner (a slower store) is between its quarantine file and its commit, it commits first.
/// The new owner took the partition without deleting the stopped worker's quarantine file
/// (its flush could still commit, and did); its own flush is refused, it deletes its own
/// files, says the group still assigns it the partition and resumes from the log. Every
/// bad record ends in exactly one quarantine file, every good one in the raw table once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_that_wins_the_commit_race_keeps_its_bad_records_and_the_owner_goes_on() {
    require(Service::Kafka);
    let bucket = s3_store(BUCKET).await;
    let run = unique_name("race");
    let store: Arc<dyn ObjectStore> = Arc::new(verdict_lake::Prefixed::new(bucket, &run));
    let store_url = format!("s3://{BUCKET}/{run}");
    let topic = unique_name("decisions-race");
    create_topic(&topic, 1).await;
    let group = unique_name("race-group");
    // 1,400 good events and 14 bad records among them, one every 100: two flushes of
    // 700 records and a few records after them.
    let mut values = recent_events(1_400, 43);
    for i in 0..14 {
        values.insert(50 + i * 100, format!("not an event {i}").into_bytes());
    }
    let produced = produce(&topic, values).await;
    let (good, bad): (BTreeMap<_, _>, BTreeMap<_, _>) = produced
        .clone()
        .into_iter()
        .partition(|(_, v)| verdict_schemas::DecisionEvent::decode(v).is_ok());
    assert_eq!(bad.len(), 14);

    let stopped = Paused::start(
        &store_url,
        &topic,
        &group,
        (WORKER, 1_500, "stopped worker"),
    );
    eventually(
        Duration::from_secs(90),
        "the first flush committed and the quarantine file of the next one written",
        || async {
            progress(&store, &topic, 1).await[&0].is_some()
                && !quarantine_past_progress(&store, &topic).await.is_empty()
        },
    )
    .await;
    stopped.signal("-STOP");
    let in_flight = quarantine_past_progress(&store, &topic).await;
    assert_eq!(in_flight.len(), 1, "{in_flight:?}");
    let in_flight = in_flight[0].path.clone();

    // The new owner (its member id sorts first, so the group keeps the partition with it
    // when the stopped worker rejoins) writes through a store four times slower.
    let owner = Paused::start(
        &store_url,
        &topic,
        &group,
        ("a-race-owner", 6_000, "new owner"),
    );
    eventually(
        Duration::from_secs(120),
        "the new owner's quarantine file written beside the stopped worker's",
        || async { quarantine_past_progress(&store, &topic).await.len() == 2 },
    )
    .await;
    assert!(
        owner.logged("undecided_quarantine=1"),
        "the new owner did not keep the stopped worker's quarantine file as undecided"
    );
    stopped.signal("-CONT");
    eventually(
        Duration::from_secs(90),
        "the new owner's commit refused",
        || async { owner.logged(REFUSED) },
    )
    .await;
    assert!(
        owner.logged("the group still assigns it here, so it resumes from the raw table's log"),
        "the refused owner did not resume the partition"
    );
    assert!(
        !stopped.logged(REFUSED),
        "the stopped worker's commit was refused: it did not win the race"
    );
    eventually(Duration::from_secs(180), "every offset flushed", || {
        all_flushed(&store, "main", &topic, &produced)
    })
    .await;

    // The winner's quarantine file is there; every bad record is in one file.
    store
        .head(&in_flight)
        .await
        .unwrap_or_else(|e| panic!("the winning flush's quarantine file {in_flight} is gone: {e}"));
    let quarantined: BTreeSet<(i32, i64)> = quarantined(&store).await.into_keys().collect();
    assert_eq!(quarantined, bad.keys().copied().collect::<BTreeSet<_>>());
    assert_exactly_once(&store, &good).await;
    assert_vacuum_takes_only_uncommitted(&store).await;
}
