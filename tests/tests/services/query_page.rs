//! The analysts' page in headless Chromium, on the known-answer lake: each view shows the
//! known values, a wrong token gets a clear message, changing the range reloads the views,
//! and a key opens its history. Screenshots go to `target/page-screenshots/`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use verdict_load::browser::Browser;
use verdict_query::Limits;
use verdict_tests::query_fixture::{
    STEADY, STEADY_OVER, TIGHT, TRIAL, TRIAL_REFUSED, key_hex, known_local_engine, serve,
};

const TOKEN: &str = "page-analyst-token";
const WAIT: Duration = Duration::from_secs(30);

/// The text of every cell of the table whose caption is `caption`, row by row.
fn table_js(caption: &str) -> String {
    format!(
        "document.querySelectorAll('.data-block').forEach(b => b.showTable());
         [...document.querySelectorAll('table')].filter(t => t.caption && t.caption.textContent === {caption:?})
           .flatMap(t => [...t.tBodies[0].rows].map(r => [...r.cells].map(c => c.textContent)))"
    )
}

fn rows(b: &mut Browser, caption: &str) -> Vec<Vec<String>> {
    let v = b.eval(&table_js(caption)).expect("the table");
    serde_json::from_value(v).expect("rows of text")
}

/// Fills the token dialog with `token` and sends it.
fn give_token(b: &mut Browser, token: &str) {
    b.eval(&format!(
        "document.querySelector('#token').value = {token:?};
         document.querySelector('#token-form').requestSubmit(); true"
    ))
    .expect("the token form");
}

/// Waits for the page's load after number `before` to end in `state`.
fn wait_for_load(b: &mut Browser, before: u64, state: &str) {
    b.wait_for(
        &format!(
            "Number(document.body.dataset.loads) > {before} && document.body.dataset.state === {state:?}"
        ),
        WAIT,
    )
    .unwrap();
}

fn loads(b: &mut Browser) -> u64 {
    b.eval("Number(document.body.dataset.loads)")
        .expect("the load counter")
        .as_u64()
        .expect("a number")
}

fn text(b: &mut Browser, selector: &str) -> String {
    b.eval(&format!(
        "document.querySelector({selector:?})?.textContent ?? ''"
    ))
    .expect("text")
    .as_str()
    .unwrap_or_default()
    .to_string()
}

/// Where the screenshots go: `target/page-screenshots/` (of `CARGO_TARGET_DIR` if set).
fn screenshot_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
        .join("page-screenshots")
}

fn page_script(base: &str) {
    let mut b = Browser::start(1100, 900).unwrap_or_else(|e| panic!("{e}"));
    let shots = screenshot_dir();

    // The known lake's day, as a link to the page would carry it; the lake has 5 to 20
    // keys a tier, so the review judges limits from 5 keys.
    b.open(&format!(
        "{base}/#range=custom&from=2026-11-30T00:00&to=2026-12-01T00:00&min_keys=5"
    ))
    .unwrap();

    // No token yet: the service answers 401 and the page asks for one.
    b.wait_for("document.body.dataset.state === 'unauthorized'", WAIT)
        .unwrap();
    assert!(
        b.eval("document.querySelector('#token-dialog').open")
            .unwrap()
            == json!(true)
    );
    let asked = text(&mut b, "#token-message");
    assert!(asked.contains("Enter a token"), "{asked}");

    // A wrong token: refused, and the page says so.
    let before = loads(&mut b);
    give_token(&mut b, "not-the-token");
    wait_for_load(&mut b, before, "unauthorized");
    let refused = text(&mut b, "#token-message");
    assert!(
        refused.contains("The service refused this token (401"),
        "{refused}"
    );
    b.screenshot(&shots.join("wrong-token.png")).unwrap();

    // The right one: every view loads.
    let before = loads(&mut b);
    give_token(&mut b, TOKEN);
    wait_for_load(&mut b, before, "ready");
    assert!(
        b.eval("sessionStorage.getItem('verdict.token')").unwrap() == json!(TOKEN),
        "the token is kept in the session"
    );

    // 1. The denial rate: the policy change to version 2 marked at 11:00, where `steady`'s
    //    rate jumped from 5 in 1,245 to 100 in 200.
    let mark = b
        .eval("[...document.querySelectorAll('#view-rate .mark')].map(m => ({...m.dataset}))")
        .unwrap();
    assert_eq!(
        mark,
        json!([{"version": "2", "hour": "2026-11-30T11:00:00Z", "jumped": "steady × read"}]),
        "one mark, at the change, naming the limit whose rate jumped"
    );
    let rate = rows(&mut b, "denial rate per hour");
    let find = |tier: &str, version: &str| -> Vec<String> {
        rate.iter()
            .find(|r| r[1] == tier && r[9] == version)
            .unwrap_or_else(|| panic!("no {tier} row of version {version} in {rate:?}"))
            .clone()
    };
    // hour, tier, route class, mode, requests, denied, would deny, rates, version, source
    assert_eq!(
        find("steady", "1")[4..9],
        ["1,245", "5", "0", "0.4 %", "0.0 %"]
    );
    assert_eq!(
        find("steady", "2")[4..9],
        ["200", "100", "0", "50.0 %", "0.0 %"]
    );
    // The kill switch's three decisions are not the limiter's: 50 + 5 by the fallback.
    assert_eq!(find("roomy", "1")[4..6], ["55", "0"]);
    assert_eq!(find("tight", "1")[4..6], ["200", "100"]);
    assert!(rate.iter().all(|r| r[10] == "raw"), "{rate:?}");
    assert!(text(&mut b, "#view-rate .note").starts_with("From the raw decisions"));

    // 2. The limit review: `tight` marked too low, `roomy` too high, each with its reason,
    //    and each recommendation proven by the service's replay of the range.
    b.wait_for(
        "[...document.querySelectorAll('#view-review li.limit.verdict-too-low, #view-review li.limit.verdict-too-high')]\
         .every(li => li.dataset.proven && li.dataset.proven !== 'pending')",
        WAIT,
    )
    .unwrap();
    let review = b
        .eval(
            "[...document.querySelectorAll('#view-review li.limit')].map(li => ({
               tier: li.dataset.tier, override: li.dataset.override, verdict: li.dataset.verdict,
               colour: li.className, reason: li.querySelector('.reason').textContent,
               proven: li.dataset.proven,
               recommendation: li.querySelector('.recommendation').textContent }))",
        )
        .unwrap();
    let limit = |tier: &str| -> Value {
        review
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["tier"] == tier && l["override"] == "")
            .unwrap_or_else(|| panic!("no {tier} in {review}"))
            .clone()
    };
    assert_eq!(limit("tight")["verdict"], "too low");
    assert_eq!(limit("tight")["colour"], "limit verdict-too-low");
    // The recommendation shown is the one the replay proved, with what it refused beside
    // what the limit in force refused.
    assert_eq!(limit("tight")["proven"], "met", "{}", limit("tight"));
    let shown = limit("tight")["recommendation"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        shown.starts_with("Recommended, proven by replaying the range: quota 1,000 →")
            && shown.contains("Replayed: ")
            && shown.contains("under the limit in force: "),
        "{shown}"
    );
    assert!(
        ["met", "unmet"].contains(&limit("roomy")["proven"].as_str().unwrap()),
        "{}",
        limit("roomy")
    );
    assert_eq!(limit("roomy")["verdict"], "too high");
    assert_eq!(limit("roomy")["colour"], "limit verdict-too-high");
    assert!(!limit("tight")["reason"].as_str().unwrap().is_empty());
    // Clicking a limit shows its top keys.
    b.eval(
        "document.querySelector('#view-review li.limit[data-tier=\"tight\"][data-override=\"\"] button').click(); true",
    )
    .unwrap();
    b.wait_for("document.querySelector('#view-review .detail table')", WAIT)
        .unwrap();
    let top = rows(&mut b, "top keys of tight × read");
    assert!(!top.is_empty(), "the too-low tier has refused keys");
    // Every key shown is one of the tier's (its id holds the tier in byte 14).
    assert!(
        top.iter()
            .all(|r| r[0].get(28..30) == Some(&format!("{TIGHT:02x}"))),
        "{top:?}"
    );

    // 3. Shadow mode: `trial` would refuse 10 of its 610 requests, from one key of 20.
    let shadow = b
        .eval("[...document.querySelectorAll('#view-shadow .shadow-limits li')].map(li => ({...li.dataset, text: li.textContent}))")
        .unwrap();
    let trial = &shadow[0];
    assert_eq!(trial["tier"], "trial", "{shadow}");
    let shadow_rate: f64 = trial["wouldDenyRate"].as_str().unwrap().parse().unwrap();
    assert!((shadow_rate - 10.0 / 610.0).abs() < 1e-9, "{shadow}");
    assert_eq!(trial["keysWouldDeny"], "1");
    assert!(
        trial["text"]
            .as_str()
            .unwrap()
            .contains("would refuse 1.6 % of its requests (10 of 610)"),
        "{shadow}"
    );
    assert_eq!(
        b.eval("document.querySelectorAll('#view-shadow .series').length")
            .unwrap(),
        json!(1),
        "one would-deny line, the shadow tier's"
    );
    // The keys it would refuse: the one key, ten times.
    b.eval("document.querySelector('#view-shadow button.shadow-keys').click(); true")
        .unwrap();
    b.wait_for("document.querySelector('#view-shadow .detail table')", WAIT)
        .unwrap();
    let would = rows(&mut b, "keys trial × read would refuse");
    assert_eq!(
        would
            .iter()
            .map(|r| (r[0].clone(), r[1].clone()))
            .collect::<Vec<_>>(),
        [(key_hex(TRIAL, TRIAL_REFUSED), "10".to_string())]
    );

    // 4. Degraded decisions: region 1's five by the fallback, region 2's three by the kill
    //    switch, both at 10:00.
    let degraded = rows(&mut b, "degraded decisions");
    let cells: Vec<_> = degraded
        .iter()
        .map(|r| (r[1].clone(), r[2].clone(), r[4].clone(), r[5].clone()))
        .collect();
    assert_eq!(
        cells,
        [
            ("10".into(), "1".into(), "5".into(), "0".into()),
            ("10".into(), "2".into(), "0".into(), "3".into())
        ]
    );

    // 5. Top denied keys: `tight`'s ten, 20 refusals each, lead; the override is shown.
    let keys = b
        .eval("[...document.querySelectorAll('#view-keys table.keys tbody tr')].map(r => [...r.cells].map(c => c.textContent))")
        .unwrap();
    let keys: Vec<Vec<String>> = serde_json::from_value(keys).unwrap();
    assert_eq!(keys.len(), 20, "the page asks for 20");
    assert_eq!(keys[0][0], key_hex(TIGHT, 0));
    assert_eq!(keys[0][1..4], ["tight", "read", "20"]);
    assert_eq!(keys[0][8], "1,200", "the first tight key's override quota");
    // A key opens its hourly history: two hours of 20 requests, 10 refused.
    b.eval("document.querySelector('#view-keys table.keys button.key').click(); true")
        .unwrap();
    b.wait_for("document.querySelector('#view-keys .key-history')", WAIT)
        .unwrap();
    let history = rows(&mut b, &format!("history of key {}", key_hex(TIGHT, 0)));
    let hours: Vec<_> = history
        .iter()
        .map(|r| (r[3].clone(), r[4].clone(), r[7].clone()))
        .collect();
    assert_eq!(
        hours,
        [
            ("20".into(), "10".into(), "1".into()),
            ("20".into(), "10".into(), "2".into())
        ]
    );
    b.screenshot(&shots.join("known-lake.png")).unwrap();

    // Changing the range reloads every view: hour 11 alone has version 2 only, no
    // degraded decisions and no would-deny.
    let before = loads(&mut b);
    b.eval(
        "document.querySelector('#range').value = 'custom';
         document.querySelector('#from').value = '2026-11-30T11:00';
         document.querySelector('#to').value = '2026-11-30T12:00';
         document.querySelector('#choice').requestSubmit(); true",
    )
    .unwrap();
    wait_for_load(&mut b, before, "ready");
    assert!(
        b.eval("location.hash")
            .unwrap()
            .as_str()
            .unwrap()
            .contains("from=2026-11-30T11%3A00"),
        "the choice is in the address"
    );
    let rate = rows(&mut b, "denial rate per hour");
    assert!(
        !rate.is_empty() && rate.iter().all(|r| r[9] == "2"),
        "{rate:?}"
    );
    assert_eq!(
        b.eval("document.querySelectorAll('#view-rate .mark').length")
            .unwrap(),
        json!(0)
    );
    assert!(rows(&mut b, "degraded decisions").is_empty());
    assert_eq!(
        text(&mut b, "#view-degraded .chart"),
        "Every decision in this range was made on the shared counters."
    );
    let shadow = b
        .eval("[...document.querySelectorAll('#view-shadow .shadow-limits li')].map(li => li.dataset.keysWouldDeny)")
        .unwrap();
    assert_eq!(shadow, json!(["0"]), "no key would be refused in hour 11");
    assert!(text(&mut b, "#status").starts_with("2026-11-30 11:00 to 2026-11-30 12:00 UTC"));

    // A key filter follows into the views: the steady key over quota, in its tier.
    let before = loads(&mut b);
    b.eval(&format!(
        "document.querySelector('#range').value = 'custom';
         document.querySelector('#from').value = '2026-11-30T00:00';
         document.querySelector('#to').value = '2026-12-01T00:00';
         document.querySelector('#key').value = {:?};
         document.querySelector('#choice').requestSubmit(); true",
        key_hex(STEADY, STEADY_OVER)
    ))
    .unwrap();
    b.wait_for(
        &format!(
            "Number(document.body.dataset.loads) > {before} && document.body.dataset.state === 'ready' && document.querySelector('#view-keys .key-history')"
        ),
        WAIT,
    )
    .unwrap();
    let rate = rows(&mut b, "denial rate per hour");
    let per_hour: Vec<_> = rate.iter().map(|r| (r[4].clone(), r[5].clone())).collect();
    assert_eq!(
        per_hour,
        [("105".into(), "5".into()), ("10".into(), "5".into())],
        "the key's own two hours"
    );
    b.screenshot(&shots.join("one-key.png")).unwrap();

    let problems = b.problems();
    assert!(problems.is_empty(), "the page reported: {problems:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_each_views_known_values_asks_for_the_token_and_follows_the_range() {
    let (engine, _dir) = known_local_engine(Limits::default()).await;
    // The known lake's day is 2026-11-30: the page is asked on 2026-12-01, so the day is
    // within the raw table's 7 days whatever the date the test runs.
    let engine = engine.with_clock(Arc::new(verdict_schemas::FakeClock::at(1_796_083_200_000)));
    let (_state, base) = serve(engine, &[TOKEN]).await;
    tokio::task::spawn_blocking(move || page_script(&base))
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
}

/// The page opened on its default range (the 7 whole days before the service's today) once
/// the service's warming has run: every answer of its first load is a kept one, computed
/// by the warming, and the views show them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pages_first_load_after_the_warming_is_answered_from_kept_answers() {
    use verdict_query::http::page::{FirstLoadWarmed, warm_first_load};

    let (engine, _dir) = known_local_engine(Limits::default()).await;
    let engine = engine.with_clock(Arc::new(verdict_schemas::FakeClock::at(1_796_083_200_000)));
    let warmed = engine.warm_parts().await.expect("the parts warmed");
    let last_day = warmed.newest.expect("the known lake's day is closed");
    assert_eq!(last_day.to_string(), "2026-11-30");
    let day = |d: &str| d.parse::<chrono::NaiveDate>().unwrap();
    let first = warm_first_load(&engine, last_day).await.expect("warmed");
    assert_eq!(
        first,
        FirstLoadWarmed {
            days: (day("2026-11-24"), day("2026-11-30")),
            computed: 6,
            kept: 0
        }
    );
    let again = warm_first_load(&engine, last_day).await.expect("warmed");
    assert_eq!((again.computed, again.kept), (0, 6), "nothing changed");

    let (state, base) = serve(engine, &[]).await;
    // The default range as the page computes it on 2026-12-01, written out (the browser's
    // clock is today's).
    let url = format!("{base}/#range=custom&from=2026-11-24T00:00&to=2026-12-01T00:00");
    let (review, keys) = tokio::task::spawn_blocking(move || {
        let mut b = Browser::start(1100, 900).unwrap_or_else(|e| panic!("{e}"));
        b.open(&url).unwrap();
        wait_for_load(&mut b, 0, "ready");
        let review = b
            .eval("document.querySelectorAll('#view-review li.limit').length")
            .unwrap();
        (
            review,
            rows(
                &mut b,
                "Keys with the most refusals (denied and would deny)",
            ),
        )
    })
    .await
    .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    assert!(
        review.as_u64().unwrap() >= 4,
        "every limit judged: {review}"
    );
    assert!(!keys.is_empty(), "the keys refused most are shown");
    let metrics = state.metrics.render();
    let count = |outcome: &str| {
        verdict_tests::metric_in::<u64>(
            &metrics,
            &format!("verdict_query_answer_cache_total{{outcome=\"{outcome}\"}}"),
        )
    };
    assert_eq!(count("hit"), Some(6), "{metrics}");
    assert_eq!(
        count("miss"),
        None,
        "no answer computed when the page opened: {metrics}"
    );
}
