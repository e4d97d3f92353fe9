//! Per-token request limits (`PLANTSTORE_RATE_LIMIT`), kept in this process's memory.

use std::{
    collections::HashMap,
    num::NonZeroU32,
    sync::{Mutex, PoisonError},
    time::Instant,
};

use crate::error::ApiError;

/// A token bucket per token name: `rate` requests a second on average, bursts up to
/// `rate` at once. Each instance counts its own requests.
#[derive(Debug)]
pub struct RateLimiter {
    rate: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

#[derive(Debug)]
struct Bucket {
    available: f64,
    refilled_at: Instant,
}

impl RateLimiter {
    pub fn new(per_second: NonZeroU32) -> Self {
        Self {
            rate: f64::from(per_second.get()),
            buckets: Mutex::default(),
        }
    }

    /// Takes one request from `key`'s bucket, or says how long until one is free.
    pub fn check(&self, key: &str) -> Result<(), ApiError> {
        let now = Instant::now();
        // A panic elsewhere while holding the lock leaves only counters behind: keep going.
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        let bucket = buckets.entry(key.to_owned()).or_insert(Bucket {
            available: self.rate,
            refilled_at: now,
        });
        let elapsed = now.duration_since(bucket.refilled_at).as_secs_f64();
        bucket.available = (bucket.available + elapsed * self.rate).min(self.rate);
        bucket.refilled_at = now;
        if bucket.available >= 1.0 {
            bucket.available -= 1.0;
            Ok(())
        } else {
            let wait = (1.0 - bucket.available) / self.rate;
            // Rounded up: a client that waits this long is let through.
            Err(ApiError::RateLimited {
                retry_after_secs: wait.ceil().max(1.0) as u64,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_past_the_rate_is_refused_per_key() {
        let limiter = RateLimiter::new(NonZeroU32::new(3).expect("nonzero"));
        for _ in 0..3 {
            assert!(limiter.check("a").is_ok());
        }
        assert!(matches!(
            limiter.check("a"),
            Err(ApiError::RateLimited {
                retry_after_secs: 1
            })
        ));
        assert!(limiter.check("b").is_ok());
    }
}
