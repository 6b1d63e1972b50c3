//! What a user reads from `verdict`, as snapshots (insta): the top-level `--help`, and
//! `verdict sql`'s tables over the known-answer lake in a local folder (a query and a named
//! report, and that report's SQL, served and portable). A change to any of them shows as a diff to review (`cargo insta review`, or
//! `INSTA_UPDATE=always`), not as a silent change.

use std::process::{Command, Output};

fn verdict(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_verdict"))
        .args(args)
        .env("RUST_LOG", "warn")
        // clap wraps help at the terminal's width: fix it, so the snapshot is the same
        // everywhere.
        .env("COLUMNS", "100")
        .env_remove("VERDICT_STORE")
        .env_remove("VERDICT_POLICY_FILE")
        .env_remove("VERDICT_POLICY_POSTGRES")
        .output()
        .expect("run verdict")
}

fn stdout(o: &Output) -> String {
    assert!(
        o.status.success(),
        "verdict failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).expect("UTF-8 output")
}

#[test]
fn the_top_level_help_lists_every_command() {
    insta::assert_snapshot!(stdout(&verdict(&["--help"])));
}

/// The known-answer lake (`verdict_tests::query_fixture`) in a temporary folder, and its
/// policy file.
fn known_lake() -> (tempfile::TempDir, String, String) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let lake = dir.path().join("lake");
    std::fs::create_dir_all(&lake).unwrap();
    let store: std::sync::Arc<dyn object_store::ObjectStore> =
        std::sync::Arc::new(object_store::local::LocalFileSystem::new_with_prefix(&lake).unwrap());
    let policy = tokio::runtime::Runtime::new().unwrap().block_on(
        verdict_tests::query_fixture::write_known_lake(&store, dir.path()),
    );
    (
        dir,
        lake.to_str().unwrap().to_owned(),
        policy.to_str().unwrap().to_owned(),
    )
}

/// `verdict sql`'s arguments for the limit review of the known lake's day, after `common`.
fn review_args<'a>(common: &[&'a str]) -> Vec<&'a str> {
    let review = [
        "--report",
        "wrong-limits",
        "-p",
        "from=2026-11-30T00:00:00Z",
        "-p",
        "to=2026-12-01T00:00:00Z",
        "-p",
        "min_keys=5",
    ];
    [&["sql"][..], common, &review].concat()
}

#[test]
fn sql_prints_a_query_and_a_report_as_tables() {
    let (_dir, lake, policy) = known_lake();
    let common = ["--store", &lake, "--policy-file", &policy, "--threads", "2"];
    let query = [
        &["sql"][..],
        &common,
        &["SELECT tier, verdict, COUNT(*) AS n FROM decisions GROUP BY tier, verdict ORDER BY tier, verdict"],
    ]
    .concat();
    insta::assert_snapshot!("sql_query_table", stdout(&verdict(&query)));

    let report = review_args(&common);
    insta::assert_snapshot!("sql_report_wrong_limits_table", stdout(&verdict(&report)));

    // Its SQL: the service's reads the kept parts of the day; the portable one the
    // decisions, as other engines can.
    let served = stdout(&verdict(&[&report[..], &["--show-sql"]].concat()));
    assert!(
        served.contains(
            "FROM review_parts('2026-11-30T00:00:00.000Z', '2026-12-01T00:00:00.000Z') k"
        ),
        "{served}"
    );
    let portable = stdout(&verdict(
        &[&report[..], &["--show-sql", "--portable"]].concat(),
    ));
    assert!(!portable.contains("_parts("), "{portable}");
    assert!(portable.contains("FROM decisions x"), "{portable}");
}

/// `verdict query levels` as cron runs it over the known-answer lake: the first run stores
/// each level's part of the closed day, the second finds them unchanged, and a report read
/// from them has the rows it has from the decisions.
#[test]
fn query_levels_stores_each_closed_day_once() {
    let (_dir, lake, policy) = known_lake();
    let common = ["--store", &lake, "--policy-file", &policy, "--threads", "2"];
    let levels = [&["query", "levels"][..], &common].concat();
    let report = review_args(&common);
    let from_decisions = stdout(&verdict(&report));
    assert_eq!(
        stdout(&verdict(&levels)).trim(),
        "levels: 5 part(s) written, 0 unchanged, 0 removed (days the raw table no longer holds), 0 old file(s) deleted"
    );
    assert!(
        std::path::Path::new(&lake)
            .join("levels/review_parts/_delta_log/00000000000000000000.json")
            .exists()
    );
    assert_eq!(
        stdout(&verdict(&levels)).trim(),
        "levels: 0 part(s) written, 5 unchanged, 0 removed (days the raw table no longer holds), 0 old file(s) deleted"
    );
    assert_eq!(stdout(&verdict(&report)), from_decisions);
}

/// `verdict jobs run --levels` over the known-answer lake: after its first round the closed
/// day's levels are stored (counted as the job `levels`), and `verdict query levels` then
/// finds every part unchanged; SIGTERM stops the schedule cleanly.
#[test]
fn jobs_run_with_levels_stores_the_closed_days_levels_after_its_round() {
    let (dir, lake, policy) = known_lake();
    let log = dir.path().join("jobs.log");
    // The lake's day is a fixed date: kept whatever today is.
    let mut jobs = std::process::Command::new(env!("CARGO_BIN_EXE_verdict"))
        .args(["jobs", "run", "--store", &lake, "--raw-keep-days", "36500"])
        .args(["--levels", "--policy-file", &policy, "--threads", "2"])
        .env("RUST_LOG", "info")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("run verdict jobs run");
    let stored = "the reports' levels of the closed days are stored";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let said = loop {
        let said = std::fs::read_to_string(&log).unwrap();
        if said.contains(stored) || std::time::Instant::now() > deadline {
            break said;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let term = std::process::Command::new("kill")
        .args(["-TERM", &jobs.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let status = jobs.wait().unwrap();
    let said = said + &std::fs::read_to_string(&log).unwrap();
    let line = said.lines().find(|l| l.contains(stored));
    assert!(
        line.is_some_and(|l| l.contains("written=5") && l.contains("unchanged=0")),
        "{said}"
    );
    assert!(status.success(), "{status}: {said}");
    let common = ["--store", &lake, "--policy-file", &policy, "--threads", "2"];
    assert_eq!(
        stdout(&verdict(&[&["query", "levels"][..], &common].concat())).trim(),
        "levels: 0 part(s) written, 5 unchanged, 0 removed (days the raw table no longer holds), 0 old file(s) deleted"
    );
}
