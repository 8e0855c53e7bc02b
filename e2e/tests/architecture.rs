//! The crate graph drawn in `docs/ARCHITECTURE.md` ("Crates") is the one `cargo metadata` reports:
//! every workspace crate with the workspace crates it depends on (normal and build dependencies;
//! dev-dependencies are the tests' own), in an order where each crate comes after everything it
//! depends on, which exists only while the graph has no cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

/// Each workspace crate and the workspace crates it depends on, from `cargo metadata`.
fn graph(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(root)
        .output()
        .expect("running cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON");
    let packages = meta["packages"].as_array().expect("packages");
    let names: BTreeSet<String> = packages
        .iter()
        .filter_map(|p| p["name"].as_str().map(str::to_string))
        .collect();
    packages
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|d| d["kind"].as_str() != Some("dev"))
                .filter_map(|d| d["name"].as_str())
                .filter(|d| names.contains(*d))
                .map(str::to_string)
                .collect();
            (p["name"].as_str().unwrap_or_default().to_string(), deps)
        })
        .collect()
}

/// The graph's lines, dependencies first (ties by name); `None` when a cycle leaves crates that
/// can never come next.
fn ordered(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    let mut placed = BTreeSet::new();
    let mut lines = Vec::new();
    while placed.len() < graph.len() {
        let next = graph
            .iter()
            .find(|(name, deps)| !placed.contains(*name) && deps.is_subset(&placed))?;
        let (name, deps) = next;
        let deps: Vec<&str> = deps.iter().map(String::as_str).collect();
        lines.push(match deps.is_empty() {
            true => name.to_string(),
            false => format!("{name} -> {}", deps.join(", ")),
        });
        placed.insert(name.clone());
    }
    Some(lines)
}

#[test]
fn the_documented_crate_graph_is_cargos_and_has_no_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace");
    let graph = graph(root);
    assert!(graph.len() >= 10, "the workspace's crates: {graph:?}");
    let lines = ordered(&graph).unwrap_or_else(|| panic!("the crate graph has a cycle: {graph:?}"));
    let doc = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let (start, end) = ("<!-- crate-graph -->\n```\n", "```\n<!-- /crate-graph -->");
    let drawn = doc
        .split_once(start)
        .and_then(|(_, rest)| rest.split_once(end))
        .map(|(block, _)| block)
        .expect("docs/ARCHITECTURE.md holds the crate graph between its markers");
    let expected: String = lines.iter().map(|l| format!("{l}\n")).collect();
    assert_eq!(
        drawn, expected,
        "docs/ARCHITECTURE.md's crate graph differs from cargo metadata; it should read:\n{expected}"
    );
}

#[test]
fn a_cycle_is_found() {
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    g.insert("b".to_string(), BTreeSet::from(["a".to_string()]));
    g.insert("c".to_string(), BTreeSet::new());
    assert_eq!(ordered(&g), None);
    g.remove("b");
    g.insert("a".to_string(), BTreeSet::from(["c".to_string()]));
    assert_eq!(
        ordered(&g),
        Some(vec!["c".to_string(), "a -> c".to_string()])
    );
}
