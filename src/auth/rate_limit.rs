//! Per-token request limits (`PLANTSTORE_RATE_LIMIT`), kept in this process's memory.

use std::{num::NonZeroU32, sync::Arc};

use governor::{DefaultKeyedRateLimiter, Quota, clock::Clock};

/// A GCRA limit per token name: `rate` requests a second on average, bursts up to `rate`.
#[derive(Debug)]
pub struct RateLimiter {
    limiter: DefaultKeyedRateLimiter<Arc<str>>,
}

impl RateLimiter {
    pub fn new(per_second: NonZeroU32) -> Self {
        Self {
            limiter: governor::RateLimiter::keyed(Quota::per_second(per_second)),
        }
    }

    pub fn check(&self, key: &Arc<str>) -> Result<(), RateLimited> {
        self.limiter.check_key(key).map_err(|not_until| {
            let wait = not_until.wait_time_from(self.limiter.clock().now());
            // Rounded up: a client that waits this long is let through.
            RateLimited {
                retry_after_secs: wait.as_secs_f64().ceil().max(1.0) as u64,
            }
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("rate limited")]
pub struct RateLimited {
    pub retry_after_secs: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_past_the_rate_is_refused_per_key() {
        let limiter = RateLimiter::new(NonZeroU32::new(3).expect("nonzero"));
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        for _ in 0..3 {
            assert!(limiter.check(&a).is_ok());
        }
        assert_eq!(
            limiter.check(&a),
            Err(RateLimited {
                retry_after_secs: 1
            })
        );
        assert!(limiter.check(&b).is_ok());
    }
}
