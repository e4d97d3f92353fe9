//! What every request handler may reach; it depends on nothing of the HTTP layer above it.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use plantstore_store::Store;

use crate::{
    auth::{jwt::JwtVerifier, rate_limit::RateLimiter, tokens::TokenCache},
    config::ServeConfig,
    telemetry::Metrics,
};

#[derive(Clone)]
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub tokens: Arc<TokenCache>,
    pub rate_limiter: Option<Arc<RateLimiter>>,
    pub metrics: Arc<Metrics>,
    pub jwt: Option<Arc<JwtVerifier>>,
    pub draining: Draining,
}

/// Set once a shutdown is asked for: still serving, but telling clients to go elsewhere.
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
        config: &ServeConfig,
        metrics: Arc<Metrics>,
        jwt: Option<Arc<JwtVerifier>>,
    ) -> Self {
        Self {
            tokens: TokenCache::new(Arc::clone(&store)),
            store,
            rate_limiter: config
                .rate_limit
                .0
                .map(|rate| Arc::new(RateLimiter::new(rate))),
            metrics,
            jwt,
            draining: Draining::default(),
        }
    }
}
