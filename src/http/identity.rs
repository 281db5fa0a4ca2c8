//! The API's side of the identity source ([`crate::identity`]): the
//! extractor of a join's buyer and the API's answer to a refused identity.
//!
//! Position, events and leave check the ticket's user against the same
//! source ([`super::extract::Member`]); the order routes go through the
//! gate, which holds the same source.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use super::error::ApiError;
use crate::app::AppState;
use crate::identity::{IdentityError, forwarded_https};
use crate::queue::UserId;

impl From<IdentityError> for ApiError {
    fn from(e: IdentityError) -> Self {
        let code = e.code();
        match e {
            // Header mode keeps the gateway contract's answers.
            IdentityError::MissingUserHeader | IdentityError::InvalidUserHeader(_) => {
                ApiError::bad_request(code, e.to_string())
            }
            _ => ApiError::unauthorized(code, e.to_string()),
        }
    }
}

/// The buyer of a join: the request's identity or, in visitor mode, a
/// visitor minted just now, whose cookie the answer must set.
pub struct Joiner {
    pub user: UserId,
    /// `Set-Cookie` value of a newly minted visitor.
    pub set_cookie: Option<String>,
}

impl FromRequestParts<AppState> for Joiner {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let resolved = state
            .identity()
            .for_join(&parts.headers, forwarded_https(&parts.headers))?;
        Ok(Joiner {
            user: resolved.user,
            set_cookie: resolved.set_cookie,
        })
    }
}
