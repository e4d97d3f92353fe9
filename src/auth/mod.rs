//! Identity: who a bearer token stands for, why one was refused, and each caller's rate.

pub mod jwt;
pub mod rate_limit;
pub mod tokens;

use std::sync::Arc;

#[derive(Debug, Clone)]
pub struct Caller {
    pub token_name: Arc<str>,
}

/// Why a request was not authenticated: counted in `/metrics`, never told to the client
/// beyond whether a token was sent at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    Missing,
    Malformed,
    Unknown,
    WrongSecret,
    Expired,
    Revoked,
    /// JWT: the signature does not verify, or another algorithm than the key's.
    BadSignature,
    /// JWT: `nbf` is still ahead.
    NotYetValid,
    /// JWT: wrong `iss` or `aud`, or no `sub` or `exp`.
    WrongClaims,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwtRejection {
    /// 401: not a valid token.
    Invalid(AuthFailure),
    /// 403: valid, but without the required scope.
    MissingScope,
    /// 503: its key is not known and the identity provider's JWKS cannot be read now.
    KeysUnavailable,
}

impl AuthFailure {
    pub fn as_str(self) -> &'static str {
        match self {
            AuthFailure::Missing => "missing",
            AuthFailure::Malformed => "malformed",
            AuthFailure::Unknown => "unknown",
            AuthFailure::WrongSecret => "wrong_secret",
            AuthFailure::Expired => "expired",
            AuthFailure::Revoked => "revoked",
            AuthFailure::BadSignature => "bad_signature",
            AuthFailure::NotYetValid => "not_yet_valid",
            AuthFailure::WrongClaims => "wrong_claims",
        }
    }
}
