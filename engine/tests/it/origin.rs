//! Read-through to a running control plane: links the snapshot does not have yet are served
//! from the origin, and only the origin says 404 (or 410) for them.

use std::time::Duration;

use crate::harness::{wait_until, Conn, Control, Site};

#[test]
fn misses_read_through_to_the_control_plane() {
    let site = Site::new();
    // An empty snapshot: nothing issued yet, every new code is inside the reserve.
    site.write_snapshot(0, 0, &[]);
    let control = Control::start(&site, &[]);
    let key = control.key.clone();
    let code = control.create("https://example.com/fresh");

    // `--snapshot` given and `--safe-mode off`: this test is about the read-through alone (the
    // feed, which also runs, has its own tests).
    let mut args = control.engine_args();
    args.extend(["--safe-mode".into(), "off".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let engine = site.start(&args);
    let mut conn = Conn::open(&engine.addr);
    let r = conn.get(&format!("/{code}"));
    assert_eq!(r.status, 302, "served through the origin");
    assert_eq!(r.header("location"), Some("https://example.com/fresh"));
    assert_eq!(
        conn.get("/never-created-alias").status,
        404,
        "the origin says 404"
    );

    // Deleted at the control plane: 410 within moments (the feed's state change, or the origin
    // once its one-second fresh answer ages out), never a lasting stale redirect.
    let status = ureq::delete(&format!("{}/v1/links/{code}", control.api))
        .set("Authorization", &format!("Bearer {key}"))
        .call()
        .expect("delete")
        .status();
    assert_eq!(status, 204);
    wait_until(Duration::from_secs(3), "deleted link answers 410", || {
        conn.get(&format!("/{code}")).status == 410
    });

    // Origin gone and nothing stale for this code: 503, never a false 404.
    drop(control);
    let unknown = site.scheme().encode_string(5).unwrap();
    assert_eq!(conn.get(&format!("/{unknown}")).status, 503);
    // A code the origin answered before is served stale.
    assert_eq!(conn.get(&format!("/{code}")).status, 410);
}
