//! Hot-set snapshots end to end: the control plane publishes what an edge should answer
//! locally within its budget (`--snapshot-recent-days`, `--snapshot-max-links`), a link outside
//! it is answered through the origin read-through (and then from its cache), and a link whose
//! clicks make it popular is in the next snapshot, answered by the snapshot layer.

use std::time::Duration;

use lasthop_testkit::{
    curl, in_sync, spool_to, subscribed_engine, wait_until, Control, Engine, Site,
};

const FIREFOX: &str = "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0";

fn answers(e: &Engine, layer: &str) -> f64 {
    e.metric(&format!(
        "lasthop_engine_answers_total{{layer=\"{layer}\"}}"
    ))
    .unwrap_or(0.0)
}

#[test]
fn a_cold_link_reads_through_and_a_clicked_one_is_promoted() {
    let site = Site::new();
    // Nothing counts as recent (0 days), so only clicks put a link in the snapshot.
    let control = Control::start(
        &site,
        &[
            "--clicks-flush-ms",
            "200",
            "--snapshot-recent-days",
            "0",
            "--snapshot-max-links",
            "1000",
        ],
    );
    let cold = control.create("https://example.com/cold");
    let hot = control.create("https://example.com/hot");
    let spool = spool_to(&control);
    let spool: Vec<&str> = spool.iter().map(String::as_str).collect();
    let e = subscribed_engine(&site, &control, &spool);
    wait_until(Duration::from_secs(15), "in sync", || in_sync(&e));
    // The budget holds neither link: the snapshot is empty and covers both creations, so the
    // overlay forgets them too.
    assert_eq!(control.publish_and_swap(&e), 0.0);
    let origin_before = answers(&e, "origin");
    let url = |code: &str| format!("http://{}/{code}", e.addr);
    assert_eq!(curl(&[&url(&cold)]).0, 302);
    assert!(answers(&e, "origin") > origin_before, "through the origin");

    // Three human clicks make `hot` popular; the next snapshot holds it.
    for _ in 0..3 {
        assert_eq!(curl(&["-A", FIREFOX, &url(&hot)]).0, 302);
    }
    wait_until(Duration::from_secs(30), "the clicks in the rollups", || {
        control.stats(&hot)["clicks"] == 3
    });
    assert_eq!(control.publish_and_swap(&e), 1.0, "the popular link alone");
    let snapshot_before = answers(&e, "snapshot");
    assert_eq!(curl(&["-A", FIREFOX, &url(&hot)]).0, 302);
    assert_eq!(
        answers(&e, "snapshot"),
        snapshot_before + 1.0,
        "answered from the snapshot"
    );
    // The cold link still reads through (from the origin cache or the origin).
    assert_eq!(curl(&[&url(&cold)]).0, 302);
}
