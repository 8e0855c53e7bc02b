//! The Prometheus text format's two line kinds, written straight into the exposition string.
//! A leaf: every module with counters to show imports this and nothing else of `metrics`, so
//! the metrics module that gathers them (`engine.rs`) imports them without a cycle.

use std::fmt::Write as _;

/// Appends one metric family's HELP and TYPE lines.
pub(crate) fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    // Writing to a String cannot fail.
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// Appends one sample line; `labels` is the inside of the braces (`k="v",...`) or empty.
pub(crate) fn sample(out: &mut String, name: &str, labels: &str, value: u64) {
    if labels.is_empty() {
        let _ = writeln!(out, "{name} {value}");
    } else {
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    }
}

#[cfg(test)]
pub(crate) mod tests {
    /// A strict-enough check of the text format: every sample belongs to a family announced by
    /// HELP and TYPE before it, names and labels are well formed, values parse, histogram buckets
    /// are cumulative, and no label is called `code`.
    pub(crate) fn check_exposition(text: &str) {
        use std::collections::{HashMap, HashSet};
        let mut typed: HashMap<String, String> = HashMap::new();
        let mut helped: HashSet<String> = HashSet::new();
        let mut seen_samples: HashSet<String> = HashSet::new();
        let mut last_bucket: HashMap<String, f64> = HashMap::new();
        let name_ok = |n: &str| {
            !n.is_empty()
                && n.chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        };
        assert!(text.ends_with('\n'), "ends with a newline");
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').expect("HELP name text");
                assert!(name_ok(name) && !help.is_empty(), "{line}");
                assert!(
                    helped.insert(name.to_string()),
                    "one HELP per family: {name}"
                );
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
                assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
                assert!(
                    typed.insert(name.to_string(), kind.to_string()).is_none(),
                    "{line}"
                );
                continue;
            }
            assert!(!line.starts_with('#') && !line.is_empty(), "{line:?}");
            let (series, value) = line.rsplit_once(' ').expect("series value");
            let value: f64 = if value == "+Inf" {
                f64::INFINITY
            } else {
                value.parse().expect(line)
            };
            let (name, labels) = match series.split_once('{') {
                Some((n, l)) => (n, l.strip_suffix('}').expect("closing brace")),
                None => (series, ""),
            };
            assert!(name_ok(name), "{line}");
            assert!(name.starts_with("lasthop_engine_"), "{line}");
            let fam = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| {
                    name.strip_suffix(s)
                        .filter(|f| typed.get(*f).map(String::as_str) == Some("histogram"))
                })
                .unwrap_or(name);
            assert!(
                typed.contains_key(fam) && helped.contains(fam),
                "family announced: {line}"
            );
            if typed[fam] == "counter" {
                assert!(fam.ends_with("_total"), "{line}");
            }
            if !labels.is_empty() {
                for pair in labels.split(',') {
                    let (k, v) = pair.split_once('=').expect("label pair");
                    assert!(name_ok(k) && k != "code", "{line}");
                    assert!(
                        v.len() >= 2 && v.starts_with('"') && v.ends_with('"'),
                        "{line}"
                    );
                }
            }
            assert!(
                seen_samples.insert(series.to_string()),
                "duplicate series {series}"
            );
            if name.ends_with("_bucket") {
                let prev = last_bucket.insert(fam.to_string(), value).unwrap_or(0.0);
                assert!(value >= prev, "cumulative buckets: {line}");
            }
        }
    }
}
