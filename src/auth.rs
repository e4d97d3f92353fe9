//! The `bearerAuth` security scheme: who is calling, checked before anything else.

use chrono::Utc;
use poem::Request;
use poem_openapi::{SecurityScheme, auth::Bearer};

use crate::{
    error::ApiError,
    state::AppState,
    tokens::{self, Caller, Rejection},
};

/// An API token from `plantstore token create`, or the `initial` one printed at first start.
#[derive(SecurityScheme)]
#[oai(ty = "bearer", rename = "bearerAuth", checker = "authenticate")]
pub struct BearerAuth(pub Caller);

async fn authenticate(req: &Request, bearer: Bearer) -> poem::Result<Caller> {
    let state = req.data::<AppState>().ok_or(ApiError::Internal)?;
    let caller = match tokens::verify(&state.tokens, &bearer.token, Utc::now()).await {
        Ok(caller) => caller,
        Err(Rejection::Invalid(failure)) => return Err(ApiError::Unauthorized(failure).into()),
        Err(Rejection::Store(err)) => return Err(ApiError::from(err).into()),
    };
    if let Some(limiter) = &state.rate_limiter {
        limiter.check(&caller.token_name)?;
    }
    Ok(caller)
}
