//! The token table kept in memory, so checking a token costs no database round trip,
//! and reloaded often enough that a revocation holds within a second on every instance.

use std::{
    collections::HashMap,
    sync::{
        Arc, PoisonError, RwLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use plantstore_store::{Store, StoreError, TokenRecord};

/// Oldest copy a request is answered from. A revocation committed anywhere is seen by
/// every request that starts this long after it: within one second, with room to spare.
const MAX_AGE: Duration = Duration::from_millis(800);
/// Past this age, a request answered from the copy starts a reload in the background, so
/// under steady traffic nobody waits for one.
const REFRESH_AFTER: Duration = Duration::from_millis(400);
/// Reloads start at most this often. An unknown token is judged against a copy loaded
/// after it arrived (so a token made a moment ago works), and a flood of made-up tokens
/// costs one query per interval, not one each.
const MIN_RELOAD_INTERVAL: Duration = Duration::from_millis(100);

/// What the cache keeps of a token: everything `tokens::verify` checks.
#[derive(Debug)]
pub struct CachedToken {
    pub name: Arc<str>,
    pub secret_hash: Vec<u8>,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
}

#[derive(Default)]
struct Snapshot {
    by_lookup_id: HashMap<String, Arc<CachedToken>>,
    /// When the query that filled it started; `None` until the first load.
    loaded_at: Option<Instant>,
}

impl Snapshot {
    fn loaded_since(&self, instant: Instant) -> bool {
        self.loaded_at.is_some_and(|loaded| loaded >= instant)
    }
}

pub struct TokenCache {
    store: Arc<dyn Store>,
    snapshot: RwLock<Arc<Snapshot>>,
    /// Held for a whole reload, so concurrent misses share one query.
    reloading: tokio::sync::Mutex<()>,
    refresh_pending: AtomicBool,
    reloads: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl TokenCache {
    /// An empty cache: the first request loads the table.
    pub fn new(store: Arc<dyn Store>) -> Arc<Self> {
        Arc::new(Self {
            store,
            snapshot: RwLock::default(),
            reloading: tokio::sync::Mutex::new(()),
            refresh_pending: AtomicBool::new(false),
            reloads: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        })
    }

    /// How many times the table has been read.
    pub fn reloads(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed)
    }

    /// Lookups answered from the copy in memory.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Lookups that waited for the table to be read.
    pub fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed)
    }

    /// The token with this lookup id, from a copy no older than `MAX_AGE`; an unknown
    /// id is looked up in a copy loaded after this call began.
    pub async fn get(
        self: &Arc<Self>,
        lookup_id: &str,
    ) -> Result<Option<Arc<CachedToken>>, StoreError> {
        let arrived = Instant::now();
        let snapshot = self.current();
        if let Some(age) = snapshot.loaded_at.map(|at| arrived.duration_since(at))
            && age <= MAX_AGE
            && let Some(token) = snapshot.by_lookup_id.get(lookup_id)
        {
            if age > REFRESH_AFTER {
                self.refresh_in_background();
            }
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(Some(Arc::clone(token)));
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let snapshot = self.reload_unless_loaded_since(arrived).await?;
        Ok(snapshot.by_lookup_id.get(lookup_id).cloned())
    }

    fn current(&self) -> Arc<Snapshot> {
        // Only whole snapshots are ever stored, so a poisoned lock still holds a good one.
        Arc::clone(&self.snapshot.read().unwrap_or_else(PoisonError::into_inner))
    }

    async fn reload_unless_loaded_since(
        &self,
        instant: Instant,
    ) -> Result<Arc<Snapshot>, StoreError> {
        let _one_at_a_time = self.reloading.lock().await;
        let current = self.current();
        if current.loaded_since(instant) {
            return Ok(current);
        }
        if let Some(next) = current.loaded_at.map(|at| at + MIN_RELOAD_INTERVAL) {
            tokio::time::sleep_until(next.into()).await;
        }
        let started = Instant::now();
        let records = self.store.list_tokens().await?;
        self.reloads.fetch_add(1, Ordering::Relaxed);
        let fresh = Arc::new(Snapshot {
            by_lookup_id: records.into_iter().map(cached).collect(),
            loaded_at: Some(started),
        });
        *self
            .snapshot
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::clone(&fresh);
        Ok(fresh)
    }

    fn refresh_in_background(self: &Arc<Self>) {
        if self.refresh_pending.swap(true, Ordering::AcqRel) {
            return;
        }
        let cache = Arc::clone(self);
        tokio::spawn(async move {
            if let Err(err) = cache.reload_unless_loaded_since(Instant::now()).await {
                tracing::warn!(error = %err, "cannot reload the tokens; retrying on the next request");
            }
            cache.refresh_pending.store(false, Ordering::Release);
        });
    }
}

fn cached(record: TokenRecord) -> (String, Arc<CachedToken>) {
    let token = CachedToken {
        name: record.name.into(),
        secret_hash: record.secret_hash,
        expires_at: record.expires_at,
        revoked_at: record.revoked_at,
    };
    (record.lookup_id, Arc::new(token))
}

#[cfg(test)]
mod tests {
    use std::time::Duration as StdDuration;

    use plantstore_sqlite::SqliteStore;
    use plantstore_store::StoreSettings;

    use super::*;

    async fn cache_on_a_real_file() -> (Arc<TokenCache>, Arc<dyn Store>, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("t.db").display());
        let settings = StoreSettings {
            max_connections: 2,
            acquire_timeout: StdDuration::from_secs(3),
            idempotency_ttl: StdDuration::from_secs(60),
            commit_observer: None,
        };
        let store: Arc<dyn Store> =
            Arc::new(SqliteStore::connect(&url, settings).await.expect("open"));
        store.migrate().await.expect("migrate");
        (TokenCache::new(Arc::clone(&store)), store, dir)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flood_of_unknown_tokens_shares_a_few_reloads() {
        let (cache, _store, _dir) = cache_on_a_real_file().await;

        let lookups = (0..500).map(|n| {
            let cache = Arc::clone(&cache);
            tokio::spawn(async move { cache.get(&format!("unknown{n:05}")).await })
        });
        for lookup in futures::future::join_all(lookups).await {
            assert!(lookup.expect("task").expect("lookup").is_none());
        }

        // All 500 arrived within moments of each other: one reload, two if some arrived
        // while the first was running; never one each.
        assert!(cache.reloads() <= 2, "{} reloads", cache.reloads());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_known_token_is_read_from_memory_and_a_new_one_is_found_at_once() {
        let (cache, store, _dir) = cache_on_a_real_file().await;
        crate::auth::tokens::create(store.as_ref(), "first", None)
            .await
            .expect("token");
        let lookup_id = store.list_tokens().await.expect("list")[0]
            .lookup_id
            .clone();

        for _ in 0..1000 {
            assert!(cache.get(&lookup_id).await.expect("lookup").is_some());
        }
        assert_eq!(cache.reloads(), 1);

        crate::auth::tokens::create(store.as_ref(), "second", None)
            .await
            .expect("token");
        let tokens = store.list_tokens().await.expect("list");
        let second = tokens.iter().find(|t| t.name == "second").expect("second");
        let found = cache.get(&second.lookup_id).await.expect("lookup");
        assert_eq!(found.map(|t| t.name.to_string()).as_deref(), Some("second"));
    }
}
