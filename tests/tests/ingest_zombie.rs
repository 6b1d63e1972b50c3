//! A worker that stops for longer than its Kafka session (SIGSTOP: what a long GC pause, a
//! frozen VM or a partition from the broker looks like to the group) while a flush of its
//! is between its files and its commit. The group gives the partition to another worker,
//! which resumes from the raw table's log and commits the same offsets. When the first
//! worker wakes (SIGCONT) it finishes its flush: the raw table refuses the commit, because the
//! partition's `txn` version moved; the worker deletes the files it wrote for it and nothing
//! that is committed, and every offset is in the table once.
//!
//! The paused worker runs in a process of its own (this test binary again, running the
//! ignored `paused_worker_process`), so that it can be stopped whole, its librdkafka threads
//! and heartbeats included.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use object_store::throttle::{ThrottleConfig, ThrottledStore};
use object_store::{ObjectStore, ObjectStoreExt};
use verdict_ingest::{IngestConfig, IngestWorker, KafkaSource};
use verdict_lake::tables::RAW;
use verdict_tests::ingest_check::{
    Running, all_flushed, assert_exactly_once, assert_vacuum_takes_only_uncommitted, create_topic,
    produce, raw_objects, recent_events, uncommitted, worker_config,
};
use verdict_tests::{Service, eventually, require, s3_store, unique_name};

const BUCKET: &str = "verdict-ingest-test";
/// Tells the child process what to run: the store prefix, the topic and the group.
const CHILD: &str = "VERDICT_TEST_PAUSED_WORKER";
/// What the worker logs when the raw table refuses its flush.
const REFUSED: &str = "the raw table refused this flush";

fn config(topic: &str, group: &str) -> IngestConfig {
    worker_config(topic, group, 1_000)
}

async fn prefixed(run: &str) -> Arc<dyn ObjectStore> {
    Arc::new(verdict_ingest::Prefixed::new(s3_store(BUCKET).await, run))
}

/// The worker to be paused: it writes through a store that takes 1.5 s a put, so that a
/// flush spends seconds between its first file and its commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run in a process of its own by a_worker_paused_past_its_session_has_its_commit_refused_and_deletes_nothing_committed"]
async fn paused_worker_process() {
    let spec = std::env::var(CHILD).unwrap_or_else(|_| {
        panic!("{CHILD} is not set: this process is started by a_worker_paused_past_its_session_has_its_commit_refused_and_deletes_nothing_committed")
    });
    let [run, topic, group]: [&str; 3] = spec
        .split('\n')
        .collect::<Vec<_>>()
        .try_into()
        .unwrap_or_else(|_| panic!("{CHILD}: run, topic and group on three lines"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            "warn,verdict_ingest=info",
        ))
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
    let slow: Arc<dyn ObjectStore> = Arc::new(ThrottledStore::new(
        prefixed(run).await,
        ThrottleConfig {
            wait_put_per_call: Duration::from_millis(1_500),
            ..ThrottleConfig::default()
        },
    ));
    IngestWorker::new(config(topic, group), slow)
        .unwrap()
        .run(std::future::pending())
        .await
        .expect("the paused worker");
}

/// The child process, its stderr lines collected; killed when dropped.
struct Paused {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Paused {
    fn start(run: &str, topic: &str, group: &str) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "paused_worker_process",
                "--ignored",
                "--nocapture",
            ])
            .env(CHILD, format!("{run}\n{topic}\n{group}"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the worker process");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[paused worker] {line}");
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
    let run = unique_name("zombie");
    let store = prefixed(&run).await;
    let topic = unique_name("decisions");
    create_topic(&topic, 1).await;
    let group = unique_name("zombie-group");
    let produced = produce(&topic, recent_events(3_000, 41)).await;
    let source = KafkaSource::new("main", &topic, 0);
    let progress = |store: Arc<dyn ObjectStore>| {
        let app = source.app_id();
        async move {
            RAW.table(store)
                .snapshot_if_any()
                .await
                .unwrap()
                .and_then(|s| s.txn_version(&app))
        }
    };

    let paused = Paused::start(&run, &topic, &group);
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
    let owner = Running::start(config(&topic, &group), Arc::clone(&store));
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
