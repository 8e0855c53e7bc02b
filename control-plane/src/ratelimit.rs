//! Token buckets by key: per owner for link creation, per client network (and one for all) for
//! anonymous reports.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// A token bucket per owner: `rate` tokens a second, at most `burst` saved.
#[derive(Debug)]
pub struct RateLimiter {
    rate: f64,
    burst: f64,
    buckets: Mutex<Buckets>,
}

#[derive(Debug, Default)]
struct Buckets {
    by_key: HashMap<String, (f64, Instant)>,
    /// When idle buckets were last dropped (at most once a second, so a map kept large by
    /// many distinct keys costs one scan a second, not one a call).
    swept: Option<Instant>,
}

impl RateLimiter {
    /// `rate == 0` disables limiting.
    pub fn new(rate: f64, burst: f64) -> Self {
        RateLimiter {
            rate,
            burst: burst.max(1.0),
            buckets: Mutex::new(Buckets::default()),
        }
    }

    /// Takes a token for `owner`, or says how many seconds until one is free.
    pub fn check(&self, owner: &str, now: Instant) -> Result<(), u64> {
        if self.rate <= 0.0 {
            return Ok(());
        }
        let Ok(mut buckets) = self.buckets.lock() else {
            return Ok(()); // a poisoned limiter must not stop creation
        };
        let due = buckets
            .swept
            .is_none_or(|t| now.saturating_duration_since(t).as_secs() >= 1);
        if buckets.by_key.len() > 100_000 && due {
            // Bound memory: idle keys' buckets are full anyway, so dropping them is exact.
            let horizon = self.burst / self.rate;
            buckets
                .by_key
                .retain(|_, (_, at)| now.saturating_duration_since(*at).as_secs_f64() < horizon);
            buckets.swept = Some(now);
        }
        let (tokens, at) = buckets
            .by_key
            .entry(owner.to_string())
            .or_insert((self.burst, now));
        let elapsed = now.saturating_duration_since(*at).as_secs_f64();
        *tokens = (*tokens + elapsed * self.rate).min(self.burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - *tokens) / self.rate).ceil().max(1.0) as u64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn bucket_refills() {
        let rl = RateLimiter::new(2.0, 3.0);
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(rl.check("a", t0), Ok(()));
        }
        assert_eq!(rl.check("a", t0), Err(1));
        assert_eq!(rl.check("b", t0), Ok(()), "owners are independent");
        assert_eq!(rl.check("a", t0 + Duration::from_millis(600)), Ok(()));
        assert!(RateLimiter::new(0.0, 0.0).check("a", t0).is_ok());
    }
}
