//! An identity provider's JWKS, fetched at start and again for an unknown key id (at most
//! every 10 s): keys rotate without a restart, and a provider outage fails no known key.

use std::{
    collections::HashMap,
    sync::{PoisonError, RwLock},
    time::Duration,
};

use jsonwebtoken::{
    Algorithm, DecodingKey,
    jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm},
};
use tokio::{sync::Mutex, time::Instant};

use crate::auth::{AuthFailure, JwtRejection};

const MIN_REFETCH: Duration = Duration::from_secs(10);
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) struct Jwks {
    url: String,
    client: reqwest::Client,
    keys: RwLock<HashMap<String, (DecodingKey, Algorithm)>>,
    /// When the last fetch began; held during a fetch, so concurrent misses share it.
    fetched_at: Mutex<Option<Instant>>,
}

impl Jwks {
    /// Fetches the keys once. A provider that cannot be read now does not stop the
    /// service: its tokens are answered 503 until the keys can be fetched.
    pub(super) async fn start(url: String) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder().timeout(FETCH_TIMEOUT).build()?;
        let jwks = Self {
            url,
            client,
            keys: RwLock::default(),
            fetched_at: Mutex::default(),
        };
        if let Err(err) = jwks.refetch().await {
            tracing::warn!(error = %err, "cannot read the JWKS now; will retry when a JWT arrives");
        }
        Ok(jwks)
    }

    /// The key a token's `kid` names (a set of one key serves a token without `kid`); an
    /// unknown key is an invalid token, unless the keys cannot be read now to look for it.
    pub(super) async fn key(
        &self,
        kid: Option<&str>,
    ) -> Result<(DecodingKey, Algorithm), JwtRejection> {
        if let Some(found) = self.known(kid) {
            return Ok(found);
        }
        let mut fetched_at = self.fetched_at.lock().await;
        if let Some(found) = self.known(kid) {
            return Ok(found);
        }
        if fetched_at.is_some_and(|at| at.elapsed() < MIN_REFETCH) {
            return Err(JwtRejection::Invalid(AuthFailure::Unknown));
        }
        *fetched_at = Some(Instant::now());
        if let Err(err) = self.refetch().await {
            tracing::warn!(error = %err, "cannot read the JWKS");
            return Err(JwtRejection::KeysUnavailable);
        }
        self.known(kid)
            .ok_or(JwtRejection::Invalid(AuthFailure::Unknown))
    }

    fn known(&self, kid: Option<&str>) -> Option<(DecodingKey, Algorithm)> {
        let keys = self.keys.read().unwrap_or_else(PoisonError::into_inner);
        match kid {
            Some(kid) => keys.get(kid).cloned(),
            None if keys.len() == 1 => keys.values().next().cloned(),
            None => None,
        }
    }

    async fn refetch(&self) -> anyhow::Result<()> {
        let set: JwkSet = self
            .client
            .get(&self.url)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let keys: HashMap<_, _> = set
            .keys
            .iter()
            .filter_map(|jwk| {
                let kid = jwk.common.key_id.clone()?;
                let algorithm = algorithm(jwk)?;
                Some((kid, (DecodingKey::from_jwk(jwk).ok()?, algorithm)))
            })
            .collect();
        tracing::info!(keys = keys.len(), "read the JWKS");
        *self.keys.write().unwrap_or_else(PoisonError::into_inner) = keys;
        Ok(())
    }
}

/// The algorithm a key is for: its `alg` when given, else the usual one for its type.
fn algorithm(jwk: &Jwk) -> Option<Algorithm> {
    match jwk.common.key_algorithm {
        Some(KeyAlgorithm::RS256) => Some(Algorithm::RS256),
        Some(KeyAlgorithm::RS384) => Some(Algorithm::RS384),
        Some(KeyAlgorithm::RS512) => Some(Algorithm::RS512),
        Some(KeyAlgorithm::PS256) => Some(Algorithm::PS256),
        Some(KeyAlgorithm::ES256) => Some(Algorithm::ES256),
        Some(KeyAlgorithm::ES384) => Some(Algorithm::ES384),
        Some(KeyAlgorithm::EdDSA) => Some(Algorithm::EdDSA),
        Some(_) => None,
        None => match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => Some(Algorithm::RS256),
            AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P256 => {
                Some(Algorithm::ES256)
            }
            AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P384 => {
                Some(Algorithm::ES384)
            }
            _ => None,
        },
    }
}
