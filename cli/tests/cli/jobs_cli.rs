//! `verdict jobs once` and `verdict rollup` on the embedded default (a local folder as the
//! lake), as a cron user would run them: retention's dry run lists and keeps, the real
//! run deletes; the rollup of an hour writes its object; bad input is refused with a
//! message that names it.

use std::path::Path;
use std::process::{Command, Output};

use verdict_tests::rollup_check::commit_raw_object;

fn verdict(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_verdict"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run verdict")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn touch(root: &Path, rel: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, b"0123456789").unwrap();
}

/// Puts a 10-byte file in the raw table's `hour` and commits it.
fn raw_file(root: &Path, hour: &str) {
    let hour: verdict_schemas::HourPartition = hour.parse().unwrap();
    touch(root, &format!("{}/f.parquet", hour.raw_prefix()));
    let store: std::sync::Arc<dyn object_store::ObjectStore> =
        std::sync::Arc::new(object_store::local::LocalFileSystem::new_with_prefix(root).unwrap());
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(commit_raw_object(&store, hour, "f.parquet", 10));
}

#[test]
fn retention_once_lists_on_a_dry_run_and_deletes_otherwise() {
    let lake = tempfile::tempdir().unwrap();
    let root = lake.path();
    // On 2026-11-30 at noon, a raw hour of 8 days ago is past the 7-day window; one of
    // 6 days ago is not.
    raw_file(root, "2026-11-22T11");
    raw_file(root, "2026-11-24T11");
    let store = root.to_str().unwrap();
    let now = "2026-11-30T12:00:00Z";

    let retention = |now: &str, more: &[&str]| {
        verdict(
            &[
                &["jobs", "once", "retention", "--store", store, "--now", now],
                more,
            ]
            .concat(),
        )
    };
    let dry = retention(now, &["--dry-run"]);
    assert!(dry.status.success(), "{dry:?}");
    assert_eq!(
        stdout(&dry).trim(),
        "retention: would remove 1 expired partition(s), 10 bytes; vacuum would delete 0 file(s), 0 bytes, from the store"
    );
    assert!(root.join("raw/date=2026-11-22/hour=11").exists());

    let real = retention(now, &[]);
    assert!(real.status.success(), "{real:?}");
    assert_eq!(
        stdout(&real).trim(),
        "retention: removed 1 expired partition(s), 10 bytes; vacuum deleted 0 file(s), 0 bytes, from the store"
    );
    // The hour left the table; its bytes stay an hour for queries planned before, and the
    // next run past that hour vacuums them.
    let old = root.join("raw/date=2026-11-22/hour=11/f.parquet");
    assert!(old.exists());
    let later = retention("2026-11-30T13:30:00Z", &[]);
    assert!(later.status.success(), "{later:?}");
    assert_eq!(
        stdout(&later).trim(),
        "retention: removed 0 expired partition(s), 0 bytes; vacuum deleted 1 file(s), 10 bytes, from the store"
    );
    assert!(!old.exists(), "vacuum left the removed file");
    assert!(root.join("raw/date=2026-11-24/hour=11/f.parquet").exists());
}

/// Changes the raw table's metadata under `root` as another engine's `ALTER TABLE` does: a
/// commit of the table's metadata as `edit` leaves it.
fn alter_raw(root: &Path, edit: impl FnOnce(&mut verdict_lake::Metadata)) {
    use verdict_lake::{Action, Commit};
    let store: std::sync::Arc<dyn object_store::ObjectStore> =
        std::sync::Arc::new(object_store::local::LocalFileSystem::new_with_prefix(root).unwrap());
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let table = verdict_lake::tables::RAW.table(store);
        let mut snapshot = table.snapshot().await.unwrap();
        let mut metadata = snapshot.metadata().clone();
        edit(&mut metadata);
        let commit = Commit::new("ALTER TABLE", vec![Action::MetaData(metadata)]);
        table.commit(&mut snapshot, commit).await.unwrap();
    });
}

/// Sets `delta.appendOnly` on the raw table under `root` (`SET TBLPROPERTIES`).
fn make_raw_append_only(root: &Path) {
    alter_raw(root, |m| {
        m.configuration.insert(
            verdict_lake::snapshot::config::APPEND_ONLY.to_owned(),
            Some("true".to_owned()),
        );
    });
}

#[test]
fn a_raw_table_missing_a_column_is_refused_naming_it_when_the_lake_is_opened() {
    let lake = tempfile::tempdir().unwrap();
    let root = lake.path();
    raw_file(root, "2026-11-22T11");
    alter_raw(root, |m| {
        let mut schema: serde_json::Value = serde_json::from_str(&m.schema_string).unwrap();
        let fields = schema["fields"].as_array_mut().unwrap();
        fields.retain(|c| c["name"] != "kafka_cluster");
        m.schema_string = schema.to_string();
    });
    let out = verdict(&[
        "sql",
        "--store",
        root.to_str().unwrap(),
        "SELECT COUNT(*) FROM decisions",
    ]);
    assert!(!out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("raw: column kafka_cluster (string) is missing from the table's schema"),
        "{said}"
    );
}

#[test]
fn retention_refuses_an_append_only_table_on_a_dry_run_as_on_a_run() {
    let lake = tempfile::tempdir().unwrap();
    let root = lake.path();
    raw_file(root, "2026-11-22T11");
    make_raw_append_only(root);
    let store = root.to_str().unwrap();
    let now = "2026-11-30T12:00:00Z";
    let args = ["jobs", "once", "retention", "--store", store, "--now", now];
    let dry = verdict(&[&args[..], &["--dry-run"]].concat());
    let real = verdict(&args);
    let said = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();
    for run in [&dry, &real] {
        assert!(!run.status.success(), "{run:?}");
        assert!(
            said(run).contains(
                "raw: the table is append-only (delta.appendOnly = true): retention would remove \
                 1 file(s) of its data, which only a table without that property allows"
            ),
            "{}",
            said(run)
        );
    }
    assert!(root.join("raw/date=2026-11-22/hour=11/f.parquet").exists());
}

#[test]
fn bad_input_is_refused_with_a_message_that_names_it() {
    let lake = tempfile::tempdir().unwrap();
    let store = lake.path().to_str().unwrap();
    let cases: [(&[&str], &str); 3] = [
        (
            &["jobs", "once", "vacuum", "--store", store],
            "unknown job \"vacuum\"",
        ),
        (
            &["jobs", "once", "rollup", "--store", store, "--dry-run"],
            "--dry-run applies to the retention job only",
        ),
        (
            &["rollup", "--store", store, "--hour", "2026-11-30T24"],
            "2026-11-30T24",
        ),
    ];
    for (args, says) in cases {
        let o = verdict(args);
        assert!(!o.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn rollup_of_an_hour_without_events_writes_an_empty_rollup() {
    let lake = tempfile::tempdir().unwrap();
    let store = lake.path().to_str().unwrap();
    // A folder with no raw table is not a lake of empty hours: refused, naming the lake and
    // what it lacks, and nothing written.
    let o = verdict(&["rollup", "--store", store, "--hour", "2026-11-30T03"]);
    assert!(!o.status.success(), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("rolling up 2026-11-30T03 of the lake {store}"))
            && err.contains("not a Delta table (no raw/_delta_log/)"),
        "{err}"
    );
    assert!(!lake.path().join("rollup").exists());
    // A raw table with another hour's file: this hour's rollup is empty.
    raw_file(lake.path(), "2026-11-30T02");
    let o = verdict(&["rollup", "--store", store, "--hour", "2026-11-30T03"]);
    assert!(o.status.success(), "{o:?}");
    assert!(
        stdout(&o).starts_with("rolled up 1 hour(s): 0 raw events in 0 files, 0 rollup rows"),
        "{}",
        stdout(&o)
    );
    // One file in the hour's folder, and the table's first commits: creation, the hour.
    let folder = lake
        .path()
        .join("rollup/denied_hourly/date=2026-11-30/hour=03");
    let files: Vec<_> = std::fs::read_dir(&folder)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].starts_with("denied_hourly-"), "{files:?}");
    let log = lake.path().join("rollup/denied_hourly/_delta_log");
    assert!(log.join("00000000000000000001.json").exists());
    let commit = std::fs::read_to_string(log.join("00000000000000000001.json")).unwrap();
    assert!(commit.contains(&files[0]), "{commit}");
}

#[test]
fn every_job_refuses_a_lake_without_a_raw_table_naming_it() {
    let lake = tempfile::tempdir().unwrap();
    let store = lake.path().to_str().unwrap();
    for job in ["rollup", "compact", "overage", "retention"] {
        let o = verdict(&["jobs", "once", job, "--store", store]);
        assert!(!o.status.success(), "{job}: {o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(&format!("the {job} job on the lake {store}"))
                && err.contains("raw: not a Delta table (no raw/_delta_log/)")
                && err.contains("is this the lake the ingest workers write?"),
            "{job}: {err}"
        );
    }
    // Nothing was written into the folder.
    assert_eq!(std::fs::read_dir(lake.path()).unwrap().count(), 0);
}
