//! What every request handler may reach; it depends on nothing of the HTTP layer above it.

use std::sync::Arc;

use plantstore_store::Store;

use crate::{rate_limit::RateLimiter, tokens::TokenCache};

#[derive(Clone)]
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub tokens: Arc<TokenCache>,
    pub rate_limiter: Option<Arc<RateLimiter>>,
}

impl AppState {
    pub fn new(store: Arc<dyn Store>, rate_limiter: Option<Arc<RateLimiter>>) -> Self {
        Self {
            tokens: TokenCache::new(Arc::clone(&store)),
            store,
            rate_limiter,
        }
    }
}
