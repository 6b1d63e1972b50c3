//! The Delta log against a real store (a local folder): commits from writers racing for a
//! version, the `txn` fence, conflicts, checkpoints and log cleanup, time travel, vacuum.

use std::sync::Arc;
use std::time::Duration;

use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use verdict_lake::action::{Action, Add, Format, Metadata};
use verdict_lake::snapshot::config;
use verdict_lake::table::{Commit, Conflict, LakeError, Table};
use verdict_lake::vacuum::{self, Doomed};

fn folder() -> (tempfile::TempDir, Arc<dyn ObjectStore>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
    (dir, store)
}

fn metadata(checkpoint_interval: u32) -> Metadata {
    Metadata {
        id: "5c0d3f8e-0000-4000-8000-000000000000".into(),
        name: Some("t".into()),
        description: None,
        format: Format::default(),
        schema_string: r#"{"type":"struct","fields":[{"name":"n","type":"long","nullable":false,"metadata":{}},{"name":"date","type":"date","nullable":false,"metadata":{}}]}"#.into(),
        partition_columns: vec!["date".into()],
        configuration: [
            (
                config::CHECKPOINT_INTERVAL.to_string(),
                Some(checkpoint_interval.to_string()),
            ),
            (
                config::DELETED_FILE_RETENTION.to_string(),
                Some("interval 1 hours".to_string()),
            ),
        ]
        .into(),
        created_time: None,
    }
}

fn add(path: &str, date: &str) -> Add {
    let partition = [("date".to_string(), Some(date.to_string()))].into();
    Add::new(path, partition, 1, 0).with_stats(r#"{"numRecords":10}"#)
}

fn append(path: &str) -> Commit {
    Commit::new("WRITE", vec![Action::Add(add(path, "2026-11-30"))])
}

fn now() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn conflict(e: LakeError) -> Conflict {
    match e {
        LakeError::Conflict { conflict, .. } => conflict,
        other => panic!("expected a conflict, got {other}"),
    }
}

#[tokio::test]
async fn writers_racing_for_a_version_both_land_in_order() {
    let (_dir, store) = folder();
    let table = Table::new(store, "t");
    let mut a = table.open_or_create(metadata(100)).await.unwrap();
    let mut b = a.clone();
    assert_eq!(table.commit(&mut a, append("a.parquet")).await.unwrap(), 1);
    // b planned on version 0: version 1 is taken, and a blind append goes in at 2.
    assert_eq!(table.commit(&mut b, append("b.parquet")).await.unwrap(), 2);
    assert_eq!(b.files().count(), 2);
    let latest = table.snapshot().await.unwrap();
    assert_eq!((latest.version(), latest.num_records()), (2, 20));
    // Creating again is a no-op that loads the table.
    let again = table.open_or_create(metadata(100)).await.unwrap();
    assert_eq!(again.version(), 2);
}

#[tokio::test]
async fn a_txn_fences_the_writer_that_comes_back_late() {
    let (_dir, store) = folder();
    let table = Table::new(store, "t");
    let base = table.open_or_create(metadata(100)).await.unwrap();
    let app = "cluster-a/verdict.decisions.v1/3";
    // The zombie planned its flush of offsets 0..=99 before it paused.
    let mut zombie = base.clone();
    // Meanwhile the new owner commits the same offsets, cut differently.
    let mut owner = base.clone();
    table
        .commit(
            &mut owner,
            append("owner-0-49.parquet").with_txn(app, None, 49, now()),
        )
        .await
        .unwrap();
    table
        .commit(
            &mut owner,
            append("owner-50-120.parquet").with_txn(app, Some(49), 120, now()),
        )
        .await
        .unwrap();
    // The zombie's commit meets a winner that advanced its application: refused.
    let e = table
        .commit(
            &mut zombie,
            append("zombie-0-99.parquet").with_txn(app, None, 99, now()),
        )
        .await
        .unwrap_err();
    assert_eq!(
        conflict(e),
        Conflict::ConcurrentTxn {
            app_id: app.into(),
            version: 49
        }
    );
    // With a fresh snapshot it is refused before it writes anything.
    let mut fresh = table.snapshot().await.unwrap();
    let e = table
        .commit(
            &mut fresh,
            append("zombie-0-99.parquet").with_txn(app, None, 99, now()),
        )
        .await
        .unwrap_err();
    assert_eq!(
        conflict(e),
        Conflict::TxnMoved {
            app_id: app.into(),
            expected: None,
            found: Some(120)
        }
    );
    let latest = table.snapshot().await.unwrap();
    assert_eq!(latest.txn_version(app), Some(120));
    assert_eq!(latest.files().count(), 2);
    assert!(latest.file("zombie-0-99.parquet").is_none());
    // Another application (another Kafka cluster's same partition) is not fenced by it.
    table
        .commit(
            &mut fresh,
            append("b.parquet").with_txn("cluster-b/verdict.decisions.v1/3", None, 99, now()),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn removing_a_file_someone_removed_or_reading_a_partition_someone_wrote_conflicts() {
    let (_dir, store) = folder();
    let table = Table::new(store, "t");
    let mut s = table.open_or_create(metadata(100)).await.unwrap();
    table.commit(&mut s, append("a.parquet")).await.unwrap();
    let compactor = s.clone();
    let mut retention = s.clone();
    let file = s.file("a.parquet").unwrap().clone();
    // Retention removes the file first; the compaction planned before it is refused.
    table
        .commit(
            &mut retention,
            Commit::new("DELETE", vec![Action::Remove(file.remove(now(), true))]),
        )
        .await
        .unwrap();
    let mut c = compactor.clone();
    let e = table
        .commit(
            &mut c,
            Commit::new(
                "OPTIMIZE",
                vec![
                    Action::Remove(file.remove(now(), false)),
                    Action::Add(add("compacted.parquet", "2026-11-30")),
                ],
            ),
        )
        .await
        .unwrap_err();
    assert_eq!(
        conflict(e),
        Conflict::FileGone {
            path: "a.parquet".into()
        }
    );
    // A replacement of a partition conflicts with an append to it, not to another one.
    let day = |d: &str| [("date".to_string(), Some(d.to_string()))].into();
    let mut replacer = table.snapshot().await.unwrap();
    let mut writer = replacer.clone();
    table
        .commit(
            &mut writer,
            Commit::new(
                "WRITE",
                vec![Action::Add(add("late.parquet", "2026-11-29"))],
            ),
        )
        .await
        .unwrap();
    table
        .commit(
            &mut writer.clone(),
            Commit::new("WRITE", vec![Action::Add(add("x.parquet", "2026-11-30"))]),
        )
        .await
        .unwrap();
    let e = table
        .commit(
            &mut replacer,
            Commit::new("REPLACE", vec![Action::Add(add("r.parquet", "2026-11-30"))])
                .reading(vec![day("2026-11-30")]),
        )
        .await
        .unwrap_err();
    assert_eq!(
        conflict(e),
        Conflict::ConcurrentAppend {
            path: "x.parquet".into()
        }
    );
}

#[tokio::test]
async fn checkpoints_bound_the_log_and_time_travel_reaches_what_it_keeps() {
    let (_dir, store) = folder();
    let table = Table::new(Arc::clone(&store), "t");
    let mut s = table.open_or_create(metadata(5)).await.unwrap();
    for i in 1..=12 {
        table
            .commit(&mut s, append(&format!("f{i:02}.parquet")))
            .await
            .unwrap();
    }
    let last = store
        .get(&Path::from("t/_delta_log/_last_checkpoint"))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let last: serde_json::Value = serde_json::from_slice(&last).unwrap();
    assert_eq!(last["version"], 10);
    assert_eq!(last["numOfAddFiles"], 10);
    // From the checkpoint and commits 11 and 12: the same table as the full replay.
    let latest = table.snapshot().await.unwrap();
    assert_eq!((latest.version(), latest.files().count()), (12, 12));
    let v3 = table.load(Some(3)).await.unwrap();
    assert_eq!(v3.files().count(), 3);
    let e = table.load(Some(13)).await.unwrap_err();
    assert!(e.to_string().contains("does not exist yet"), "{e}");
    // Cleanup as if the retention had passed: versions before the newest checkpoint go.
    let deleted = table.clean_log(now() + 1_000).await.unwrap();
    assert_eq!(
        deleted,
        10 + 1,
        "commits 0-9 and the checkpoint of version 5"
    );
    let e = table.load(Some(3)).await.unwrap_err();
    assert!(e.to_string().contains("older than the log keeps"), "{e}");
    assert_eq!(table.load(Some(11)).await.unwrap().files().count(), 11);
    assert_eq!(table.snapshot().await.unwrap().files().count(), 12);
    // Time travel by time: every version here was committed within the last minute.
    assert_eq!(table.load_as_of(now()).await.unwrap().version(), 12);
    assert!(table.load_as_of(now() - 60_000).await.is_err());
}

#[tokio::test]
async fn vacuum_deletes_removed_files_and_orphans_past_the_retention_only() {
    let (_dir, store) = folder();
    let table = Table::new(Arc::clone(&store), "t");
    let mut s = table.open_or_create(metadata(100)).await.unwrap();
    for p in ["kept.parquet", "removed.parquet", "orphan.parquet"] {
        store
            .put(
                &Path::from(format!("t/date=2026-11-30/{p}")),
                PutPayload::from_static(b"x"),
            )
            .await
            .unwrap();
    }
    let kept = add("date=2026-11-30/kept.parquet", "2026-11-30");
    let removed = add("date=2026-11-30/removed.parquet", "2026-11-30");
    table
        .commit(
            &mut s,
            Commit::new(
                "WRITE",
                vec![Action::Add(kept.clone()), Action::Add(removed.clone())],
            ),
        )
        .await
        .unwrap();
    table
        .commit(
            &mut s,
            Commit::new("DELETE", vec![Action::Remove(removed.remove(now(), true))]),
        )
        .await
        .unwrap();
    // Within the hour of retention nothing goes: a query planned before the removal, or a
    // writer about to commit its file, still needs it.
    let plan = vacuum::plan(&table, &s, None, now()).await.unwrap();
    assert!(plan.files.is_empty(), "{:?}", plan.files);
    let later = now() + 2 * 3_600_000;
    let plan = vacuum::plan(&table, &s, Some(Duration::from_secs(3_600)), later)
        .await
        .unwrap();
    let doomed: Vec<(String, Doomed)> = plan
        .files
        .iter()
        .map(|(m, d)| (m.location.to_string(), *d))
        .collect();
    assert_eq!(
        doomed,
        [
            (
                "t/date=2026-11-30/orphan.parquet".to_string(),
                Doomed::Orphan
            ),
            (
                "t/date=2026-11-30/removed.parquet".to_string(),
                Doomed::Removed
            ),
        ]
    );
    assert_eq!(vacuum::run(&table, &plan).await.unwrap(), 2);
    assert!(
        store
            .head(&Path::from("t/date=2026-11-30/kept.parquet"))
            .await
            .is_ok()
    );
    assert!(
        store
            .head(&Path::from("t/_delta_log/00000000000000000000.json"))
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn each_checkpoint_deletes_the_log_the_retention_no_longer_needs() {
    let (_dir, store) = folder();
    // A clock 31 days ahead: every checkpoint written is past the 30-day log retention.
    let table = Table::new(Arc::clone(&store), "t").with_clock(Arc::new(
        verdict_schemas::FakeClock::at(now() + 31 * 86_400_000),
    ));
    let mut s = table.open_or_create(metadata(5)).await.unwrap();
    let mut logged = Vec::new();
    for i in 1..=23 {
        table
            .commit(&mut s, append(&format!("f{i:02}.parquet")))
            .await
            .unwrap();
        if i % 5 == 0 {
            logged.push(log_names(&store).await);
        }
    }
    // The first cleanup lists the log; the later ones look the checkpoints up by name. Each
    // leaves the newest checkpoint and what follows it.
    for (k, names) in logged.iter().enumerate() {
        let v = 5 * (k as i64 + 1);
        let want: Vec<String> = [
            format!("{v:020}.checkpoint.parquet"),
            format!("{v:020}.json"),
        ]
        .into_iter()
        .chain(["_last_checkpoint".to_owned()])
        .collect();
        assert_eq!(names, &want, "after the checkpoint of version {v}");
    }
    assert_eq!(
        log_names(&store).await,
        [
            "00000000000000000020.checkpoint.parquet",
            "00000000000000000020.json",
            "00000000000000000021.json",
            "00000000000000000022.json",
            "00000000000000000023.json",
            "_last_checkpoint",
        ]
    );
    let latest = Table::new(Arc::clone(&store), "t")
        .snapshot()
        .await
        .unwrap();
    assert_eq!((latest.version(), latest.files().count()), (23, 23));
    let e = table.load(Some(19)).await.unwrap_err();
    assert!(e.to_string().contains("older than the log keeps"), "{e}");
}

/// A table of `commits` appends whose log, as another writer may leave it, starts at a
/// checkpoint of version `commits` written by `write` (commits before it deleted).
async fn log_starting_at_a_foreign_checkpoint(
    commits: usize,
    write: impl AsyncFnOnce(&Arc<dyn ObjectStore>, Vec<Action>),
) -> (tempfile::TempDir, Arc<dyn ObjectStore>, Table) {
    let (dir, store) = folder();
    let table = Table::new(Arc::clone(&store), "t");
    let mut s = table.open_or_create(metadata(1_000)).await.unwrap();
    for i in 1..=commits {
        table
            .commit(&mut s, append(&format!("f{i:02}.parquet")))
            .await
            .unwrap();
    }
    write(&store, s.checkpoint_actions().collect()).await;
    for v in 0..commits {
        store
            .delete(&Path::from(format!("t/_delta_log/{v:020}.json")))
            .await
            .unwrap();
    }
    (dir, store, table)
}

#[tokio::test]
async fn a_multi_part_checkpoint_is_read_part_by_part() {
    let (_dir, store, table) = log_starting_at_a_foreign_checkpoint(6, async |store, actions| {
        // Two parts, as Spark writes a large checkpoint: protocol and metadata in the first.
        let (first, second) = actions.split_at(4);
        for (part, actions) in [(1, first), (2, second)] {
            let (bytes, _) =
                verdict_lake::checkpoint::encode_checkpoint(actions.iter().cloned()).unwrap();
            let name = format!(
                "t/_delta_log/{:020}.checkpoint.{part:010}.{:010}.parquet",
                6, 2
            );
            store
                .put(&Path::from(name), PutPayload::from(bytes))
                .await
                .unwrap();
        }
        let last = r#"{"version":6,"size":8,"parts":2}"#;
        store
            .put(
                &Path::from("t/_delta_log/_last_checkpoint"),
                PutPayload::from(last.as_bytes().to_vec()),
            )
            .await
            .unwrap();
    })
    .await;
    // From the pointer, and from a listing.
    assert_eq!(table.snapshot().await.unwrap().files().count(), 6);
    assert_eq!(table.load(Some(6)).await.unwrap().files().count(), 6);
    // One part missing: the checkpoint cannot be read, and the error says what is left.
    store
        .delete(&Path::from(format!(
            "t/_delta_log/{:020}.checkpoint.{:010}.{:010}.parquet",
            6, 2, 2
        )))
        .await
        .unwrap();
    let e = table.load(Some(6)).await.unwrap_err();
    assert!(e.to_string().contains("older than the log keeps"), "{e}");
}

#[tokio::test]
async fn a_log_starting_at_a_v2_checkpoint_is_refused_by_name() {
    let name = "00000000000000000004.checkpoint.80a083e8-7026-4e79-81be-64bd76c43a11.json";
    let (_dir, _store, table) = log_starting_at_a_foreign_checkpoint(4, async |store, _| {
        store
            .put(
                &Path::from(format!("t/_delta_log/{name}")),
                PutPayload::from(b"{}".to_vec()),
            )
            .await
            .unwrap();
    })
    .await;
    let e = table.snapshot().await.unwrap_err().to_string();
    assert!(
        e.contains(&format!(
            "needs the v2 checkpoint {name} (the v2Checkpoint table feature)"
        )),
        "{e}"
    );
}

#[tokio::test]
async fn an_append_only_table_takes_no_removal_of_data() {
    let (_dir, store) = folder();
    let table = Table::new(Arc::clone(&store), "t");
    let mut meta = metadata(10);
    meta.configuration
        .insert(config::APPEND_ONLY.to_string(), Some("true".to_string()));
    let mut s = table.open_or_create(meta).await.unwrap();
    for name in ["a.parquet", "b.parquet"] {
        table.commit(&mut s, append(name)).await.unwrap();
    }
    let removes = |data_change: bool| {
        let actions = s
            .files()
            .map(|a| Action::Remove(a.remove(now(), data_change)))
            .collect();
        Commit::new("DELETE", actions)
    };
    let (deleting, compacting) = (removes(true), removes(false));
    let e = table.commit(&mut s, deleting).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "t: the table is append-only (delta.appendOnly = true): DELETE would remove 2 file(s) \
         of its data, which only a table without that property allows"
    );
    assert_eq!(s.files().count(), 2, "nothing was committed");
    // Rearranging the same rows (compaction's removes say no data changed) is allowed.
    table.commit(&mut s, compacting).await.unwrap();
}

#[tokio::test]
async fn a_table_that_needs_a_newer_writer_is_refused_when_a_writer_opens_it() {
    let (_dir, store) = folder();
    let table = Table::new(Arc::clone(&store), "t");
    table.open_or_create(metadata(10)).await.unwrap();
    // Another engine raises the protocol to table features (writer version 7).
    let upgrade = r#"{"protocol":{"minReaderVersion":1,"minWriterVersion":7,"writerFeatures":["appendOnly","checkConstraints"]}}"#;
    store
        .put(
            &Path::from("t/_delta_log/00000000000000000001.json"),
            PutPayload::from(upgrade.as_bytes().to_vec()),
        )
        .await
        .unwrap();
    // A reader still reads it; a writer is refused at open, before it writes any file.
    assert_eq!(table.snapshot().await.unwrap().version(), 1);
    let e = table.open_or_create(metadata(10)).await.unwrap_err();
    assert!(
        e.to_string().contains(
            "the table needs Delta writer version 7 (features [\"appendOnly\", \"checkConstraints\"]); verdict writes version 2"
        ),
        "{e}"
    );
}

async fn log_names(store: &Arc<dyn ObjectStore>) -> Vec<String> {
    use futures::TryStreamExt;
    let mut names: Vec<String> = store
        .list(Some(&Path::from("t/_delta_log")))
        .map_ok(|m| m.location.filename().unwrap_or_default().to_owned())
        .try_collect()
        .await
        .unwrap();
    names.sort();
    names
}
