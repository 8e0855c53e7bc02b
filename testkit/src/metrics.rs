//! Samples from a Prometheus text exposition (`/metrics`), as the programs export them.

/// The value of the sample `name`: a metric name with its labels exactly as exported
/// (`lasthop_engine_clicks_sent_total{sink="kafka"}`), followed by a space and the value.
pub fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The value of the first sample whose line starts with `prefix` (a name, or a name with part
/// of its labels); `None` when there is none or its value does not parse.
pub fn first_starting_with(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP x_total X.\n# TYPE x_total counter\nx_total 3\n\
                        x_total_more 9\ny{kind=\"a\"} 1.5\ny{kind=\"b\"} 2\n";

    #[test]
    fn sample_matches_the_whole_name_and_labels() {
        assert_eq!(sample(TEXT, "x_total"), Some(3.0));
        assert_eq!(sample(TEXT, "y{kind=\"b\"}"), Some(2.0));
        assert_eq!(sample(TEXT, "y"), None);
        assert_eq!(sample(TEXT, "absent"), None);
    }

    #[test]
    fn first_starting_with_takes_the_first_line_with_the_prefix() {
        assert_eq!(first_starting_with(TEXT, "y{"), Some(1.5));
        assert_eq!(first_starting_with(TEXT, "x_total_"), Some(9.0));
        assert_eq!(first_starting_with(TEXT, "absent"), None);
    }
}
