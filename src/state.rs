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

impl AppState {
    pub fn new(
        store: Arc<dyn Store>,
        rate_limiter: Option<Arc<RateLimiter>>,
        request_timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Self {
        store.observe(metrics.batch_sizes());
        Self {
            tokens: TokenCache::new(Arc::clone(&store)),
            store,
            rate_limiter,
            request_timeout,
            metrics,
            jwt: None,
            draining: Draining::default(),
            commit_signal: CommitSignal::default(),
        }
    }

    /// Accepts JWTs checked by `jwt` beside the service's own tokens.
    pub fn with_jwt(mut self, jwt: Option<Arc<JwtVerifier>>) -> Self {
        self.jwt = jwt;
        self
    }
}
