//! How long to wait before the next attempt of an event: exponential, with full jitter,
//! and never sooner than the receiver's `Retry-After`.

use std::time::Duration;

use rand::Rng;

#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub min: Duration,
    pub max: Duration,
}

impl Backoff {
    /// The wait after `failures` failed attempts (1 after the first): a random time between
    /// `min` and `min · 2^(failures-1)`, capped at `max`. Full jitter spreads the retries of
    /// many events over the window instead of sending them together; `retry_after` raises
    /// the wait, up to `max`.
    pub fn after(&self, failures: u32, retry_after: Option<Duration>) -> Duration {
        let doubled = 2u32.saturating_pow(failures.saturating_sub(1).min(31));
        let ceiling = self.min.saturating_mul(doubled).min(self.max).max(self.min);
        let jittered = if ceiling > self.min {
            rand::rng().random_range(self.min..=ceiling)
        } else {
            self.min
        };
        match retry_after {
            Some(asked) => jittered.max(asked.min(self.max)),
            None => jittered,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BACKOFF: Backoff = Backoff {
        min: Duration::from_secs(1),
        max: Duration::from_secs(60),
    };

    #[test]
    fn grows_within_its_bounds() {
        for failures in 1..40 {
            let wait = BACKOFF.after(failures, None);
            let ceiling = Duration::from_secs(1u64 << (failures - 1).min(6)).min(BACKOFF.max);
            assert!(
                wait >= BACKOFF.min && wait <= ceiling,
                "{failures}: {wait:?}"
            );
        }
    }

    #[test]
    fn waits_at_least_what_retry_after_asks_up_to_the_maximum() {
        assert!(BACKOFF.after(1, Some(Duration::from_secs(30))) >= Duration::from_secs(30));
        assert_eq!(
            BACKOFF.after(1, Some(Duration::from_secs(3600))),
            BACKOFF.max
        );
    }
}
