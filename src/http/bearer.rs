//! The `bearerAuth` security scheme: who is calling, checked before anything else, by
//! the identity layer, and its refusals as HTTP errors.

use chrono::Utc;
use poem::Request;
use poem_openapi::{SecurityScheme, auth::Bearer};

use super::error::ApiError;
use crate::{
    auth::{
        Caller,
        jwt::JwtRejection,
        tokens::{self, Rejection},
    },
    state::AppState,
};

/// An API token from `plantstore token create` (or the `initial` one printed at first
/// start), or a JWT from the identity provider the settings name.
#[derive(SecurityScheme)]
#[oai(ty = "bearer", rename = "bearerAuth", checker = "authenticate")]
pub(super) struct BearerAuth(pub Caller);

async fn authenticate(req: &Request, bearer: Bearer) -> poem::Result<Caller> {
    let state = req.data::<AppState>().ok_or(ApiError::Internal)?;
    let caller = match &state.jwt {
        // The service's own tokens start `pst_`; anything else may be a JWT.
        Some(jwt) if !tokens::is_ours(&bearer.token) => {
            let now = u64::try_from(Utc::now().timestamp()).unwrap_or_default();
            jwt.verify(&bearer.token, now)
                .await
                .map_err(|rejection| match rejection {
                    JwtRejection::Invalid(failure) => ApiError::Unauthorized(failure),
                    JwtRejection::MissingScope => ApiError::Forbidden,
                    JwtRejection::KeysUnavailable => ApiError::KeysUnavailable,
                })?
        }
        _ => match tokens::verify(&state.tokens, &bearer.token, Utc::now()).await {
            Ok(caller) => caller,
            Err(Rejection::Invalid(failure)) => {
                return Err(ApiError::Unauthorized(failure).into());
            }
            Err(Rejection::Store(err)) => return Err(ApiError::from(err).into()),
        },
    };
    if let Some(limiter) = &state.rate_limiter {
        limiter.check(&caller.token_name).map_err(ApiError::from)?;
    }
    Ok(caller)
}
