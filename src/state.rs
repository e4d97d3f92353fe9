//! What every request handler may reach; it depends on nothing of the HTTP layer above it.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use plantstore_store::Store;

use crate::{
    auth::{TokenCache, jwt::JwtVerifier, rate_limit::RateLimiter},
    telemetry::Metrics,
    webhooks::CommitSignal,
};

#[derive(Clone)]
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub tokens: Arc<TokenCache>,
    pub rate_limiter: Option<Arc<RateLimiter>>,
    /// `PLANTSTORE_REQUEST_TIMEOUT`: how long any request may take before it is a 503.
    pub request_timeout: Duration,
    pub metrics: Arc<Metrics>,
    /// JWTs from an identity provider, when the settings name one.
    pub jwt: Option<Arc<JwtVerifier>>,
    pub draining: Draining,
    /// Raised after each committed delete, for this instance's webhook deliveries.
    pub commit_signal: CommitSignal,
}

/// Set once a shutdown is asked for: the instance still serves, but tells load balancers
/// and clients to go elsewhere (`PLANTSTORE_SHUTDOWN_DELAY`).
#[derive(Debug, Clone, Default)]
pub struct Draining(Arc<AtomicBool>);

impl Draining {
    pub fn start(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn is_on(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// What the request path is given at start; `AppState` is made from it in one step.
pub struct Services {
    pub store: Arc<dyn Store>,
    pub rate_limiter: Option<Arc<RateLimiter>>,
    pub request_timeout: Duration,
    pub metrics: Arc<Metrics>,
    /// JWTs checked beside the service's own tokens, when the settings name a key source.
    pub jwt: Option<Arc<JwtVerifier>>,
    pub commit_signal: CommitSignal,
}

impl AppState {
    pub fn new(services: Services) -> Self {
        let Services {
            store,
            rate_limiter,
            request_timeout,
            metrics,
            jwt,
            commit_signal,
        } = services;
        store.observe(metrics.batch_sizes());
        Self {
            tokens: TokenCache::new(Arc::clone(&store)),
            store,
            rate_limiter,
            request_timeout,
            metrics,
            jwt,
            draining: Draining::default(),
            commit_signal,
        }
    }
}
