//! Opaque API tokens: how they are made, stored (as hashes only) and checked.

use std::{sync::Arc, time::Duration};

use chrono::{DateTime, Utc};
use plantstore_store::{Store, StoreError, TokenRecord, time::storable_after};
use rand::{Rng, distr::Alphanumeric};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{AuthFailure, Caller, TokenCache};

/// Every token reads `pst_<lookup id>_<secret>`: the prefix lets secret scanners spot a
/// leaked one, the lookup id finds the row, and only the secret's hash is stored.
const PREFIX: &str = "pst_";
const LOOKUP_ID_LEN: usize = 12;
/// 40 alphanumerics: about 238 bits, so a plain SHA-256 is enough (no slow KDF needed).
const SECRET_LEN: usize = 40;
const MAX_NAME_LEN: usize = 64;

/// The name of the token made on the first start of a database with no tokens.
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

/// Why a presented token was refused, or that it could not be checked at all.
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
/// expired. Expiry is checked against `now`; a revocation is seen within a second (see
/// [`TokenCache`]).
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

/// Whether a presented token has the form of the service's own (`pst_…`).
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
    if valid {
        Ok(())
    } else {
        Err(TokenError::InvalidName)
    }
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
}
