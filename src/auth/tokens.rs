//! Opaque API tokens, stored as hashes only and checked against the table kept in memory
//! (`TokenCache`): no database round trip per check, yet revocations hold within a second.

use std::{
    collections::HashMap,
    sync::{
        Arc, PoisonError, RwLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use plantstore_store::{Store, StoreError, TokenRecord, time::storable_after};
use rand::{Rng, distr::Alphanumeric};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{AuthFailure, Caller};

/// Every token reads `pst_<lookup id>_<secret>`: the prefix lets secret scanners spot a
/// leaked one, the lookup id finds the row, and only the secret's hash is stored.
const PREFIX: &str = "pst_";
const LOOKUP_ID_LEN: usize = 12;
/// 40 alphanumerics: about 238 bits, so a plain SHA-256 is enough (no slow KDF needed).
const SECRET_LEN: usize = 40;
const MAX_NAME_LEN: usize = 64;

pub const INITIAL_TOKEN_NAME: &str = "initial";

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error(
        "a token name must be 1 to {MAX_NAME_LEN} characters of letters, digits, '.', '_' or '-'"
    )]
    InvalidName,
    #[error("the expiry is too far in the future")]
    ExpiryOutOfRange,
    #[error("a token named '{0}' already exists")]
    NameTaken(String),
    #[error("no token is named '{0}'")]
    NoSuchToken(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[derive(Debug)]
pub enum Rejection {
    Invalid(AuthFailure),
    Store(StoreError),
}

/// Stores a new token and returns its full text, which exists nowhere else afterwards.
pub async fn create(
    store: &dyn Store,
    name: &str,
    expires_in: Option<Duration>,
) -> Result<String, TokenError> {
    validate_name(name)?;
    let now = Utc::now();
    let expires_at = expires_in
        .map(|ttl| storable_after(now, ttl).ok_or(TokenError::ExpiryOutOfRange))
        .transpose()?;
    let lookup_id = random_alphanumeric(LOOKUP_ID_LEN);
    let secret = random_alphanumeric(SECRET_LEN);
    let record = TokenRecord {
        name: name.to_owned(),
        lookup_id: lookup_id.clone(),
        secret_hash: hash(&secret),
        created_at: now,
        expires_at,
        revoked_at: None,
    };
    match store.insert_token(&record).await {
        Ok(()) => Ok(format!("{PREFIX}{lookup_id}_{secret}")),
        Err(StoreError::Duplicate) => Err(TokenError::NameTaken(name.to_owned())),
        Err(err) => Err(err.into()),
    }
}

/// Creates the `initial` token when the database has none at all; returns it to be shown
/// once. Two instances starting together may both try: the loser sees the name taken.
pub async fn ensure_initial(store: &dyn Store) -> Result<Option<String>, TokenError> {
    if store.count_tokens().await? > 0 {
        return Ok(None);
    }
    match create(store, INITIAL_TOKEN_NAME, None).await {
        Ok(token) => Ok(Some(token)),
        Err(TokenError::NameTaken(_)) => Ok(None),
        Err(err) => Err(err),
    }
}

pub async fn revoke(store: &dyn Store, name: &str) -> Result<(), TokenError> {
    match store.revoke_token(name, Utc::now()).await {
        Err(StoreError::NotFound) => Err(TokenError::NoSuchToken(name.to_owned())),
        other => Ok(other?),
    }
}

/// Checks a presented token: known, secret matching in constant time, not revoked, not
/// expired at `now`; a revocation is seen within a second (see [`TokenCache`]).
pub async fn verify(
    tokens: &Arc<TokenCache>,
    presented: &str,
    now: DateTime<Utc>,
) -> Result<Caller, Rejection> {
    let invalid = Rejection::Invalid;
    let (lookup_id, secret) = split(presented).ok_or(invalid(AuthFailure::Malformed))?;
    let token = tokens
        .get(lookup_id)
        .await
        .map_err(Rejection::Store)?
        .ok_or(invalid(AuthFailure::Unknown))?;
    let secret_matches: bool = hash(secret).ct_eq(&token.secret_hash).into();
    if !secret_matches {
        Err(invalid(AuthFailure::WrongSecret))
    } else if token.revoked_at.is_some() {
        Err(invalid(AuthFailure::Revoked))
    } else if token.expires_at.is_some_and(|at| now >= at) {
        Err(invalid(AuthFailure::Expired))
    } else {
        Ok(Caller {
            token_name: Arc::clone(&token.name),
        })
    }
}

pub fn is_ours(presented: &str) -> bool {
    presented.starts_with(PREFIX)
}

fn split(presented: &str) -> Option<(&str, &str)> {
    let (lookup_id, secret) = presented.strip_prefix(PREFIX)?.split_once('_')?;
    let well_formed = lookup_id.len() == LOOKUP_ID_LEN
        && secret.len() == SECRET_LEN
        && presented
            .bytes()
            .skip(PREFIX.len())
            .all(|b| b.is_ascii_alphanumeric() || b == b'_');
    well_formed.then_some((lookup_id, secret))
}

fn validate_name(name: &str) -> Result<(), TokenError> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    valid.then_some(()).ok_or(TokenError::InvalidName)
}

fn hash(secret: &str) -> Vec<u8> {
    Sha256::digest(secret.as_bytes()).to_vec()
}

fn random_alphanumeric(len: usize) -> String {
    rand::rng()
        .sample_iter(Alphanumeric)
        .take(len)
        .map(char::from)
        .collect()
}

/// Oldest copy a request is answered from: a revocation anywhere holds within a second.
const MAX_AGE: Duration = Duration::from_millis(800);
/// Past this age, a hit starts a reload in the background, so steady traffic never waits.
const REFRESH_AFTER: Duration = Duration::from_millis(400);
/// Reloads start at most this often: an unknown token is judged by a copy loaded after it
/// arrived (so a new token works), and made-up tokens cost a query per interval, not each.
const MIN_RELOAD_INTERVAL: Duration = Duration::from_millis(100);

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

    pub fn reloads(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed)
    }

    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    pub fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed)
    }

    /// From a copy at most `MAX_AGE` old; an unknown id, from one loaded after the call.
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
        if current.loaded_at.is_some_and(|loaded| loaded >= instant) {
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
    use super::*;

    #[test]
    fn split_accepts_only_the_issued_shape() {
        let lookup = "a".repeat(LOOKUP_ID_LEN);
        let secret = "b".repeat(SECRET_LEN);
        let token = format!("{PREFIX}{lookup}_{secret}");
        assert_eq!(split(&token), Some((lookup.as_str(), secret.as_str())));
        assert_eq!(split(&token[1..]), None);
        assert_eq!(split(&format!("{token}x")), None);
        assert_eq!(split(&format!("{PREFIX}{lookup}_{}!", &secret[1..])), None);
        assert_eq!(split(""), None);
    }

    #[test]
    fn names_are_short_and_plain() {
        assert!(validate_name("ci-bot.2").is_ok());
        assert!(validate_name("").is_err());
        assert!(validate_name("has space").is_err());
        assert!(validate_name(&"n".repeat(MAX_NAME_LEN + 1)).is_err());
    }

    async fn cache_on_a_real_file() -> (Arc<TokenCache>, Arc<dyn Store>, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = crate::config::Config::defaults();
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("t.db").display());
        config.database_url = url.into();
        let store = crate::database::open(&config, None).await.expect("open");
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

        // 500 arriving together: one reload, two if some came during the first; never 500.
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
