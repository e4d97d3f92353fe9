//! How long an event waits before its next attempt: exponential backoff with full jitter.

use std::time::Duration;

use rand::Rng;

use crate::config::DeliveryConfig;

/// The wait after `failures` failures: random from `min` to `min · 2^(failures-1)` (full
/// jitter spreads retries apart), capped at `max`, and raised by `retry_after` up to `max`.
pub(super) fn retry_wait(
    config: &DeliveryConfig,
    failures: u32,
    retry_after: Option<Duration>,
) -> Duration {
    let (min, max) = (config.webhook_retry_min, config.webhook_retry_max);
    let doubled = 2u32.saturating_pow(failures.saturating_sub(1).min(31));
    let ceiling = min.saturating_mul(doubled).min(max).max(min);
    let jittered = rand::rng().random_range(min..=ceiling);
    retry_after.map_or(jittered, |asked| jittered.max(asked.min(max)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> DeliveryConfig {
        let mut config = crate::config::Config::defaults().serve.webhooks;
        config.webhook_retry_min = Duration::from_secs(1);
        config.webhook_retry_max = Duration::from_secs(60);
        config
    }

    #[test]
    fn grows_within_its_bounds() {
        let config = config();
        for failures in 1..40 {
            let wait = retry_wait(&config, failures, None);
            let ceiling =
                Duration::from_secs(1u64 << (failures - 1).min(6)).min(config.webhook_retry_max);
            assert!(
                wait >= config.webhook_retry_min && wait <= ceiling,
                "{failures}: {wait:?}"
            );
        }
    }

    #[test]
    fn waits_at_least_what_retry_after_asks_up_to_the_maximum() {
        let config = config();
        assert!(retry_wait(&config, 1, Some(Duration::from_secs(30))) >= Duration::from_secs(30));
        assert_eq!(
            retry_wait(&config, 1, Some(Duration::from_secs(3600))),
            config.webhook_retry_max
        );
    }
}
