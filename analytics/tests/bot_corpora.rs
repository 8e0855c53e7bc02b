//! The shipped bot rules against held-out corpora of real user agents (`tests/data/ua/`; each
//! file's header and `tests/data/ua/refresh` say where it comes from and under what license).
//! The rules are generated from other lists (isbot, crawler-user-agents) plus hand-kept
//! behaviour rules, so these rates measure them. Goal: at least 99 % of each bot corpus
//! counted as bots, at most 0.5 % of the browsers.
//!
//! Each user agent is cut as the edge cuts it into a click event (`MAX_USER_AGENT` bytes).

use std::path::PathBuf;

use lasthop_analytics::Rules;
use lasthop_core::click::{truncate, MAX_USER_AGENT};

fn corpus(name: &str) -> Vec<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/ua")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let mut lines = text.lines().peekable();
    // The header: comment lines before the first user agent.
    while lines.next_if(|l| l.starts_with("# ")).is_some() {}
    lines
        .map(|ua| truncate(ua, MAX_USER_AGENT).to_owned())
        .collect()
}

/// (flagged, total, the first few that were not flagged / were flagged).
fn measure(rules: &Rules, agents: &[String], want_bot: bool) -> (usize, usize, Vec<String>) {
    let mut flagged = 0;
    let mut wrong = Vec::new();
    for ua in agents {
        let bot = rules.match_agent(ua).is_some();
        flagged += usize::from(bot);
        if bot != want_bot && wrong.len() < 40 {
            wrong.push(ua.clone());
        }
    }
    (flagged, agents.len(), wrong)
}

/// Measures `name` and asserts its flagged share: at least `bound` for a bot corpus
/// (`want_bot`), at most `bound` for browsers; prints the rate and a few it got wrong.
fn check(name: &str, want_bot: bool, bound: f64) {
    let rules = Rules::builtin();
    let agents = corpus(name);
    assert!(agents.len() > 1000, "{name}: {} user agents", agents.len());
    let (flagged, total, wrong) = measure(&rules, &agents, want_bot);
    let share = flagged as f64 / total as f64;
    let pct = share * 100.0;
    eprintln!("{name}: {flagged} of {total} counted as bots ({pct:.3} %); wrong: {wrong:?}");
    let ok = if want_bot {
        share >= bound
    } else {
        share <= bound
    };
    assert!(
        ok,
        "{name}: {flagged} of {total} ({pct:.2} %) counted as bots; wrong, for example:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn crawlerdetect_crawlers_are_bots() {
    check("crawlers-crawlerdetect.txt", true, 0.99);
}

#[test]
fn device_detector_bots_are_bots() {
    check("bots-device-detector.txt", true, 0.99);
}

#[test]
fn browsers_are_people() {
    check("browsers-user-agents.txt", false, 0.005);
}
