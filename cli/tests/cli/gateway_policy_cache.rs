//! A gateway started while the policy store is down: with `--policy-cache` it starts from
//! the copy an earlier run kept, enforces that policy and says how old it is; without it,
//! it refuses to start and says what would let it.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use verdict_tests::private::{PrivatePostgres, spare_port};
use verdict_tests::{eventually, metric};

const KEY: &str = "key-free-1";

struct Gateway(Child);

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn gateway(args: &[&str], stderr: std::fs::File) -> Gateway {
    Gateway(
        Command::new(env!("CARGO_BIN_EXE_verdict"))
            .arg("gateway")
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start verdict gateway"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_policy_store_down_a_gateway_starts_from_its_copy_or_refuses() {
    let mut pg = PrivatePostgres::start();
    let url = pg.url();
    let source = verdict_policy_store::PgSource::new(&url);
    source.migrate().await.unwrap();
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .batch_execute(
            "insert into verdict_policy.tiers (id, name) values (0, 'free');
             insert into verdict_policy.route_classes (id, name, prefixes) values (0, 'api', '{/v1}');
             insert into verdict_policy.limits values ('free', '*', 3, 0.001, 1000, 'enforce');",
        )
        .await
        .unwrap();
    let version: i64 = client
        .query_one("select version from verdict_policy.meta", &[])
        .await
        .map(|r| r.get(0))
        .unwrap_or_else(|e| panic!("policy version: {e}"));

    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.csv");
    // A key id of this run's own: with VERDICT_REDIS_URL set the counters are in the
    // tests' Redis, where another run's key would still be out of tokens for the hour.
    let key_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    std::fs::write(
        &keys,
        format!("api_key,key_id,tier\n{KEY},{key_id:032x},free\n"),
    )
    .unwrap();
    let copy = dir.path().join("policy-copy.toml");
    let up = verdict_demo::spawn_upstream().await.unwrap().port();
    let http = reqwest::Client::new();
    let start = |port: u16, cache: bool, log: &str| {
        let upstream = format!("http://127.0.0.1:{up}");
        let listen = format!("127.0.0.1:{port}");
        let mut args = vec![
            "--upstream",
            upstream.as_str(),
            "--keys-file",
            keys.to_str().unwrap(),
            "--policy-postgres",
            url.as_str(),
            "--listen",
            listen.as_str(),
        ];
        if cache {
            args.extend(["--policy-cache", copy.to_str().unwrap()]);
        }
        let log = std::fs::File::create(dir.path().join(log)).unwrap();
        gateway(&args, log)
    };

    // With the store up: the copy is kept.
    let port = spare_port();
    let first = start(port, true, "first.log");
    eventually(Duration::from_secs(60), "the first gateway up", || async {
        metric::<i64>(&http, port, "verdict_policy_version").await == Some(version)
    })
    .await;
    assert!(copy.exists(), "the gateway kept a copy of the policy");
    drop(first);

    // The store down: without a copy the gateway refuses, naming the way out.
    pg.stop();
    let refused = Command::new(env!("CARGO_BIN_EXE_verdict"))
        .args(["gateway", "--upstream", "http://127.0.0.1:1", "--keys-file"])
        .arg(&keys)
        .args(["--policy-postgres", &url, "--listen"])
        .arg(format!("127.0.0.1:{}", spare_port()))
        .output()
        .expect("run verdict gateway");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        stderr.contains("loading the policy") && stderr.contains("--policy-cache"),
        "{stderr}"
    );

    // With the copy it starts, enforces the copied limits and says how old they are.
    let port = spare_port();
    let _second = start(port, true, "second.log");
    eventually(Duration::from_secs(60), "the second gateway up", || async {
        metric::<i64>(&http, port, "verdict_policy_version").await == Some(version)
    })
    .await;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let r = http
            .get(format!("http://127.0.0.1:{port}/v1/items"))
            .header("x-api-key", KEY)
            .send()
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses, vec![200, 200, 200, 429], "the copy's burst of 3");
    assert!(
        metric::<i64>(&http, port, "verdict_policy_reload_errors_total")
            .await
            .is_some_and(|n| n >= 1),
        "the source still polled, and failing"
    );
    let log = std::fs::read_to_string(dir.path().join("second.log")).unwrap();
    assert!(log.contains("starting from the last copy"), "{log}");
}
