//! The rule for a test that cannot run here: a tool or server it needs is missing.
//!
//! It says so as `SKIPPED <what>: <why>`, which `scripts/test` lists; under `CI=true`, where
//! `scripts/test` has installed every such tool, the same call fails the test instead, so a green
//! CI means those suites ran.

/// True under `CI=true` (`.ci/run`, and `scripts/test` when CI sets it).
pub fn under_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// Reports that `what` cannot run here because of `why`: `SKIPPED what: why` on stdout, or, under
/// `CI=true`, a panic naming both (CI installs what these tests need; a skip there hides a
/// broken install).
pub fn skip(what: &str, why: &str) {
    assert!(
        !under_ci(),
        "{what} cannot run under CI: {why} (scripts/test installs what it needs)"
    );
    println!("SKIPPED {what}: {why}");
}
