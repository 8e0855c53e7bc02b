//! UTC days of Unix-millisecond times, reckoned here alone: the edge's visitor salt changes with
//! the day, the click pipeline counts and archives by it, the hot set looks back in whole days.

/// Milliseconds in a UTC day (Unix time gives every day exactly this many).
pub const DAY_MS: i64 = 86_400_000;

/// The UTC day of the Unix-millisecond time `ms`: days since 1970-01-01, negative before it.
pub const fn of_ms(ms: i64) -> i64 {
    ms.div_euclid(DAY_MS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_begin_at_utc_midnight() {
        assert_eq!(of_ms(0), 0);
        assert_eq!(of_ms(DAY_MS - 1), 0);
        assert_eq!(of_ms(DAY_MS), 1);
        assert_eq!(of_ms(-1), -1);
        // 2025-11-30T12:00:00Z.
        assert_eq!(of_ms(1_764_504_000_000), 20_422);
    }
}
