//! JWT bearer tokens from an identity provider: the key and claims they must have, and a
//! cache of verified tokens (a verified JWT is not verified again until it expires).

mod jwks;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

use anyhow::{Context, bail};
use jsonwebtoken::{Algorithm, DecodingKey, Validation, errors::ErrorKind};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::{
    auth::{AuthFailure, Caller, JwtRejection},
    config::JwtConfig,
};
use jwks::Jwks;

/// Seconds of clock difference allowed on `exp` and `nbf`.
const LEEWAY_SECS: u64 = 30;
/// Verified tokens kept; past it, expired ones are dropped, then all if need be.
const MAX_VERIFIED: usize = 10_000;
/// Prefixed to a JWT's `sub` wherever a caller is named (the audit row, rate limits), so
/// it cannot be taken for one of the service's own token names.
pub const SUBJECT_PREFIX: &str = "jwt:";

pub struct JwtVerifier {
    keys: Keys,
    issuer: Option<String>,
    audience: Option<String>,
    required_scope: Option<String>,
    verified: Mutex<HashMap<[u8; 32], Verified>>,
}

enum Keys {
    Fixed(DecodingKey, Algorithm),
    Jwks(Jwks),
}

#[derive(Clone)]
struct Verified {
    expires_at: u64,
    outcome: Result<Caller, JwtRejection>,
}

impl Verified {
    /// Whether still answerable from memory; saturating, as a huge `exp` must not overflow.
    fn in_force(&self, now: u64) -> bool {
        now < self.expires_at.saturating_add(LEEWAY_SECS)
    }
}

#[derive(Deserialize)]
struct Claims {
    sub: String,
    exp: u64,
    #[serde(default)]
    scope: Option<String>,
    #[serde(default)]
    scp: Option<Scopes>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Scopes {
    List(Vec<String>),
    Spaced(String),
}

impl JwtVerifier {
    /// The verifier the settings ask for; `None` when no key source is set.
    pub async fn from_config(config: &JwtConfig) -> anyhow::Result<Option<Arc<Self>>> {
        // An empty setting is unset: an empty HS256 secret would let anyone sign tokens.
        let config = config.without_empty_values();
        // One key source at most, and a long enough secret: `JwtConfig::check` saw to both.
        let keys = match (&config.jwt_secret, &config.jwt_public_key, &config.jwks_url) {
            (Some(secret), _, _) => Keys::Fixed(
                DecodingKey::from_secret(secret.expose().as_bytes()),
                Algorithm::HS256,
            ),
            (None, Some(path), _) => public_key(path)?,
            (None, None, Some(url)) => Keys::Jwks(Jwks::start(url.clone()).await?),
            (None, None, None) => return Ok(None),
        };
        Ok(Some(Arc::new(Self {
            keys,
            issuer: config.jwt_issuer.clone(),
            audience: config.jwt_audience.clone(),
            required_scope: config.jwt_required_scope.clone(),
            verified: Mutex::default(),
        })))
    }

    /// The caller a JWT stands for, checked at `now` (Unix seconds).
    pub async fn verify(&self, token: &str, now: u64) -> Result<Caller, JwtRejection> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(known) = self.cached(&digest, now) {
            return known;
        }
        let claims = self.check(token).await?;
        let outcome = match &self.required_scope {
            Some(scope) if !has_scope(&claims, scope) => Err(JwtRejection::MissingScope),
            _ => Ok(Caller {
                token_name: format!("{SUBJECT_PREFIX}{}", claims.sub).into(),
            }),
        };
        let known = Verified {
            expires_at: claims.exp,
            outcome: outcome.clone(),
        };
        self.remember(digest, known, now);
        outcome
    }

    async fn check(&self, token: &str) -> Result<Claims, JwtRejection> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| JwtRejection::Invalid(AuthFailure::Malformed))?;
        let (key, algorithm) = match &self.keys {
            Keys::Fixed(key, algorithm) => (key.clone(), *algorithm),
            Keys::Jwks(jwks) => jwks.key(header.kid.as_deref()).await?,
        };
        let mut validation = Validation::new(algorithm);
        validation.leeway = LEEWAY_SECS;
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp", "sub"]);
        match &self.audience {
            Some(audience) => validation.set_audience(&[audience]),
            None => validation.validate_aud = false,
        }
        if let Some(issuer) = &self.issuer {
            validation.set_issuer(&[issuer]);
        }
        jsonwebtoken::decode::<Claims>(token, &key, &validation)
            .map(|data| data.claims)
            .map_err(|err| JwtRejection::Invalid(failure(err.kind())))
    }

    fn cached(&self, digest: &[u8; 32], now: u64) -> Option<Result<Caller, JwtRejection>> {
        let verified = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
        verified
            .get(digest)
            .filter(|known| known.in_force(now))
            .map(|known| known.outcome.clone())
    }

    fn remember(&self, digest: [u8; 32], known: Verified, now: u64) {
        // A cache of tokens, not of secrets: it only spares the signature check.
        let mut verified = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
        if verified.len() >= MAX_VERIFIED {
            verified.retain(|_, known| known.in_force(now));
            if verified.len() >= MAX_VERIFIED {
                verified.clear();
            }
        }
        verified.insert(digest, known);
    }
}

fn failure(kind: &ErrorKind) -> AuthFailure {
    match kind {
        ErrorKind::ExpiredSignature => AuthFailure::Expired,
        ErrorKind::ImmatureSignature => AuthFailure::NotYetValid,
        ErrorKind::InvalidSignature | ErrorKind::InvalidAlgorithm => AuthFailure::BadSignature,
        ErrorKind::InvalidIssuer
        | ErrorKind::InvalidAudience
        | ErrorKind::InvalidSubject
        | ErrorKind::MissingRequiredClaim(_) => AuthFailure::WrongClaims,
        _ => AuthFailure::Malformed,
    }
}

fn has_scope(claims: &Claims, required: &str) -> bool {
    let spaced = claims.scope.iter().flat_map(|scope| scope.split(' '));
    let listed: Vec<&str> = match &claims.scp {
        Some(Scopes::List(list)) => list.iter().map(String::as_str).collect(),
        Some(Scopes::Spaced(scopes)) => scopes.split(' ').collect(),
        None => Vec::new(),
    };
    spaced.chain(listed).any(|scope| scope == required)
}

/// An RSA key (RS256) or a P-256 key (ES256), from a PEM file.
fn public_key(path: &std::path::Path) -> anyhow::Result<Keys> {
    let pem = std::fs::read(path)
        .with_context(|| format!("cannot read PLANTSTORE_JWT_PUBLIC_KEY {}", path.display()))?;
    if let Ok(key) = DecodingKey::from_rsa_pem(&pem) {
        return Ok(Keys::Fixed(key, Algorithm::RS256));
    }
    if let Ok(key) = DecodingKey::from_ec_pem(&pem) {
        return Ok(Keys::Fixed(key, Algorithm::ES256));
    }
    bail!(
        "PLANTSTORE_JWT_PUBLIC_KEY {} is not a PEM RSA or EC public key",
        path.display()
    )
}
