//! Three regions, one of whose Redis is stopped mid-test (real Redis servers, real
//! PostgreSQL): the other regions carry on with their shares, the stopped region decides
//! locally within its share, the reconcile job goes on every interval without waiting for
//! it, and the stopped region's share returns to its static weight once it has been silent
//! for `stale_after` + `decay`. Then its Redis comes back and it counts there again.

use std::time::Duration;

use verdict_limiter::algo::PPM;
use verdict_limiter::regions::Share;
use verdict_policy_store::PgShares;
use verdict_schemas::RegionId;
use verdict_tests::regions::{INTERVAL, World, reconcile_config};
use verdict_tests::{eventually, services_script};

async fn shares_of(world: &World, region: u16) -> Share {
    let snapshot = PgShares::new(&world.pg_url)
        .read(RegionId(region))
        .await
        .expect("read the shares");
    let entry = snapshot
        .entries
        .iter()
        .find(|(k, _)| k.0 == world.key)
        .map(|(_, e)| *e)
        .unwrap_or_else(|| panic!("no share of the key for region {region}"));
    entry.after
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_region_falls_back_locally_and_the_others_carry_on() {
    let world = World::start("regions_outage").await;
    let (busy, quiet) = (Duration::from_millis(3), Duration::from_millis(40));

    // ap-southeast-1 carries most of the traffic: it gets most of the share.
    let (_, _, before) = tokio::join!(
        world.drive(0, quiet, INTERVAL * 3),
        world.drive(1, quiet, INTERVAL * 3),
        world.drive(2, busy, INTERVAL * 3),
    );
    assert!(before.iter().all(|s| !s.local));
    let last = shares_of(&world, 2).await;
    assert!(last.bucket_ppm > PPM / 2, "{last:?}");
    let rounds_before = world.rounds.lock().unwrap().len();

    // Its Redis stops.
    let port = world.gateways[2]
        .redis_url
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned();
    let out = std::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port, "shutdown", "nosave"])
        .output()
        .expect("run redis-cli (installed by scripts/services.sh)");
    eprintln!("redis-cli shutdown: {out:?}");
    let stopped_at = verdict_tests::regions::now_ms();

    let cfg = reconcile_config();
    let outage = cfg.stale_after + cfg.decay + INTERVAL * 2;
    let (a, b, c) = tokio::join!(
        world.drive(0, quiet, outage),
        world.drive(1, quiet, outage),
        world.drive(2, busy, outage),
    );

    // The others decided in their own Redis, and allowed traffic.
    for (name, sent) in [("us-east-1", &a), ("eu-central-1", &b)] {
        assert!(sent.iter().all(|s| !s.local), "{name} decided locally");
        assert!(sent.iter().any(|s| s.allowed), "{name} allowed nothing");
    }
    // The stopped region decided locally (after its breaker opened), and still allowed
    // requests, within at most its last share of the global bucket over the outage.
    let local = c.iter().filter(|s| s.local).count();
    let allowed = c.iter().filter(|s| s.allowed).count();
    let most = (f64::from(last.bucket_ppm) / f64::from(PPM))
        * (f64::from(verdict_tests::regions::CAPACITY)
            + f64::from(verdict_tests::regions::REFILL_PER_S) * outage.as_secs_f64())
        + 1.0;
    eprintln!(
        "stopped region: {} requests, {local} decided locally, {allowed} allowed (at most {most:.0})",
        c.len()
    );
    assert!(
        local >= c.len() * 9 / 10,
        "{local} of {} decided locally",
        c.len()
    );
    assert!(
        allowed > 0 && allowed as f64 <= most,
        "{allowed} allowed; at most {most}"
    );

    // The job went on every interval, never waiting on the stopped region, and knew it.
    let rounds = world.rounds.lock().unwrap().clone();
    let during: Vec<_> = rounds[rounds_before..]
        .iter()
        .filter(|(at, ..)| *at > stopped_at + 500)
        .collect();
    assert!(
        during.len() as f64 >= outage.as_secs_f64() / INTERVAL.as_secs_f64() - 2.0,
        "{} rounds",
        during.len()
    );
    for (_, took, outcome) in &during {
        assert_eq!(outcome.unreachable, vec![RegionId(2)], "{outcome:?}");
        assert!(*took < INTERVAL, "a round took {took:?}");
    }

    // Silent for stale_after + decay: back to its static weight; the others share the rest.
    let now = shares_of(&world, 2).await;
    let third = PPM / 3;
    assert!(
        now.bucket_ppm.abs_diff(third) <= 1 && now.window_ppm <= last.window_ppm.max(third),
        "{now:?}"
    );
    let (sa, sb) = (shares_of(&world, 0).await, shares_of(&world, 1).await);
    let sum = sa.bucket_ppm + sb.bucket_ppm + now.bucket_ppm;
    eprintln!("after the outage: {sa:?} {sb:?} {now:?}");
    assert!(sum <= PPM && sum > PPM - 10, "bucket shares sum to {sum}");
    assert!(sa.window_ppm + sb.window_ppm + now.window_ppm <= PPM);

    // Its Redis comes back: the region counts there again.
    let up = std::process::Command::new(services_script())
        .args(["up", "regions"])
        .status()
        .expect("run scripts/services.sh up regions");
    assert!(up.success());
    eventually(
        Duration::from_secs(10),
        "the region deciding in its Redis again",
        || async { !world.send(2).await.0.local },
    )
    .await;
}
