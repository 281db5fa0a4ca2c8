//! Reading a request body whole: the one reader of every endpoint that
//! takes a body, the API's JSON bodies (`super::extract`) and the order
//! gate's ([`crate::http::EntryPass`]).
//!
//! A read fails in three ways that call for three answers, and the cause
//! arrives wrapped by whatever layers sit in front (the body deadline, the
//! length limit, axum's own body type): too large is `413`, not arrived
//! within `--body-timeout-secs` is `408` (the client may retry), broken
//! off is `400`. Telling them apart in one place keeps a stalled order and
//! a stalled join answered alike.

use axum::body::{Body, Bytes};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::error::ApiError;
use crate::error::ErrorCode;

/// Why a body could not be read whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyError {
    /// Longer than the endpoint takes.
    TooLarge,
    /// It did not arrive within the body timeout.
    TimedOut,
    /// The client broke it off, or sent garbage framing.
    Broken,
}

/// The whole of `body`, at most `limit` bytes.
pub async fn read_whole(body: Body, limit: usize) -> Result<Bytes, BodyError> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) => Err(cause(&*e)),
    }
}

/// The failure found anywhere in `error`'s cause chain.
fn cause(error: &(dyn std::error::Error + 'static)) -> BodyError {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.is::<LengthLimitError>() {
            return BodyError::TooLarge;
        }
        if e.is::<tower_http::timeout::TimeoutError>() {
            return BodyError::TimedOut;
        }
        next = e.source();
    }
    BodyError::Broken
}

impl From<BodyError> for ApiError {
    fn from(e: BodyError) -> Self {
        match e {
            BodyError::TooLarge => ApiError::PayloadTooLarge,
            BodyError::TimedOut => ApiError::RequestTimeout,
            BodyError::Broken => {
                ApiError::bad_request(ErrorCode::InvalidBody, "the body could not be read")
            }
        }
    }
}
