//! Who a request is for: the one identity source of the queue, the order
//! gate and the demo order service.
//!
//! A queue is only as fair as its idea of who is in it, so every part that
//! names a buyer (a join, the ticket-user binding of position, events and
//! leave, [`crate::http::EntryPass`], `GET /api/orders/{id}`) asks the same
//! [`Identity`]. It runs in one of three modes:
//!
//! - **visitor** (the default, for anonymous shoppers): waitroom mints a
//!   random visitor id on first contact and keeps it in an HMAC-signed,
//!   `HttpOnly`, `SameSite=Lax` cookie. `X-User-Id` is ignored. A forged or
//!   altered cookie is simply not an identity: its bearer becomes a new
//!   visitor, never someone else. A queue ticket is good only together
//!   with its visitor's cookie ([`Identity::ticket_holder`]).
//! - **header**: a trusted gateway authenticates the buyer and sets
//!   `X-User-Id` (stripping any client-sent value).
//! - **signed**: the site's own login vouches for the buyer with a JWT
//!   (`Authorization: Bearer`, or a cookie), verified here; `sub` is the
//!   user id.
//!
//! The module knows HTTP headers but not axum's routing or the API's error
//! type: each boundary turns an [`IdentityError`] into its own answer.

// Without `signed-identity` (no jsonwebtoken), a verifier that cannot be
// built: `--identity signed` is refused at start naming the feature.
#[cfg(feature = "signed-identity")]
mod signed;
#[cfg(not(feature = "signed-identity"))]
#[path = "signed_off.rs"]
mod signed;
mod signed_config;
mod visitor;

use std::sync::Arc;

use axum::http::HeaderMap;

use crate::queue::UserId;

pub use signed_config::{SignedConfig, SignedKey};
pub use visitor::{VISITOR_COOKIE, VISITOR_COOKIE_SECURE, VISITOR_MAX_AGE_SECS};

/// Which identity source requests are read with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// A signed cookie minted by waitroom for anonymous visitors.
    Visitor,
    /// `X-User-Id`, set by a trusted gateway.
    Header,
    /// A JWT from the site's own login.
    Signed,
}

/// Why a request's identity was refused. Each boundary maps it to its own
/// answer (the HTTP API to an error code, `http::identity`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// Header mode: no `X-User-Id` where one is required.
    #[error("the X-User-Id header is required")]
    MissingUserHeader,
    /// Header mode: `X-User-Id` is not a valid user id.
    #[error("{0}")]
    InvalidUserHeader(String),
    /// Visitor or signed mode: nothing identifies the request.
    #[error("{0}")]
    Missing(&'static str),
    /// The credential is malformed, forged, for another issuer or audience,
    /// or names an invalid user.
    #[error("{0}")]
    Invalid(String),
    /// The credential was valid but is past its `exp`.
    #[error("the identity token has expired; sign in again")]
    Expired,
}

/// The buyer of a join: who it is and, when the visitor was minted just
/// now, the cookie to set.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The buyer.
    pub user: UserId,
    /// The signed cookie value of a visitor minted just now (the HTTP
    /// edge sets the cookie).
    pub minted: Option<String>,
}

/// The identity source; cheap to clone.
#[derive(Clone)]
pub struct Identity {
    source: Arc<Source>,
}

enum Source {
    Visitor(visitor::VisitorKey),
    Header,
    Signed(Box<signed::Verifier>),
}

impl Identity {
    /// Header mode: `X-User-Id` as a trusted gateway set it.
    pub fn header() -> Self {
        Self::from_source(Source::Header)
    }

    /// Visitor mode, signing cookies with a key derived from `secret` (the
    /// ticket secret: every instance that shares it accepts the others'
    /// visitors).
    pub fn visitor(secret: &[u8]) -> Self {
        Self::from_source(Source::Visitor(visitor::VisitorKey::derive(secret)))
    }

    /// Signed mode: JWTs verified as `config` says.
    pub fn signed(config: &SignedConfig) -> Result<Self, String> {
        Ok(Self::from_source(Source::Signed(Box::new(
            signed::Verifier::new(config)?,
        ))))
    }

    fn from_source(source: Source) -> Self {
        Self {
            source: Arc::new(source),
        }
    }

    /// The mode this source runs in.
    pub fn mode(&self) -> Mode {
        match &*self.source {
            Source::Visitor(_) => Mode::Visitor,
            Source::Header => Mode::Header,
            Source::Signed(_) => Mode::Signed,
        }
    }

    /// Who `headers` identify, verified. `Ok(None)`: nobody is named (no
    /// `X-User-Id` in header mode; no valid visitor cookie in visitor mode,
    /// where a forged one counts as none). In signed mode a missing or bad
    /// token is an error: only the site's login can name a buyer.
    pub fn presented(&self, headers: &HeaderMap) -> Result<Option<UserId>, IdentityError> {
        match &*self.source {
            Source::Header => header_user(headers),
            Source::Visitor(key) => Ok(key.verify_request(headers)),
            Source::Signed(verifier) => verifier.verify_request(headers).map(Some),
        }
    }

    /// [`Identity::presented`], required: nobody named is an error.
    pub fn required(&self, headers: &HeaderMap) -> Result<UserId, IdentityError> {
        self.presented(headers)?.ok_or_else(|| match &*self.source {
            Source::Header => IdentityError::MissingUserHeader,
            _ => {
                IdentityError::Missing("no visitor cookie: join the queue first (the join sets it)")
            }
        })
    }

    /// Who a queue ticket presented with `headers` must belong to. A ticket
    /// alone is a bearer credential that leaks easily (a log line, a
    /// screenshot, a shared link), so wherever the request itself says
    /// who it is for, the ticket must be theirs: in visitor mode the
    /// visitor cookie is required (a browser sends it with every request
    /// of the page, EventSource included), in signed mode the login token.
    /// `Ok(None)` only in header mode without `X-User-Id`: the gateway
    /// decides who reaches waitroom, and an API client's ticket alone
    /// proves its place.
    pub fn ticket_holder(&self, headers: &HeaderMap) -> Result<Option<UserId>, IdentityError> {
        match &*self.source {
            Source::Header => header_user(headers),
            Source::Visitor(key) => key
                .verify_request(headers)
                .map(Some)
                .ok_or(IdentityError::Missing(TICKET_WITHOUT_VISITOR)),
            Source::Signed(verifier) => verifier.verify_request(headers).map(Some),
        }
    }

    /// The buyer of a join: the presented one, or in visitor mode a new
    /// visitor with the cookie value to set.
    pub fn for_join(&self, headers: &HeaderMap) -> Result<Resolved, IdentityError> {
        if let Some((user, value)) = self.new_visitor(headers) {
            return Ok(Resolved {
                user,
                minted: Some(value),
            });
        }
        Ok(Resolved {
            user: self.required(headers)?,
            minted: None,
        })
    }

    /// Visitor mode, for a request without a valid visitor cookie: a new
    /// visitor and its signed cookie value. The page mints one as it is
    /// served, so tabs opened together join as one visitor rather than
    /// racing to mint one each. `None` in the other modes or when the
    /// request already has a visitor.
    pub fn new_visitor(&self, headers: &HeaderMap) -> Option<(UserId, String)> {
        match &*self.source {
            Source::Visitor(key) if key.verify_request(headers).is_none() => Some(key.mint()),
            _ => None,
        }
    }
}

/// Visitor mode's refusal of a ticket that comes without a valid cookie.
const TICKET_WITHOUT_VISITOR: &str = "send the visitor cookie with the ticket: a ticket is \
    good only together with the cookie of the visitor it was issued to";

/// The one `X-User-Id` of `headers`: absent is `None`, malformed an error.
fn header_user(headers: &HeaderMap) -> Result<Option<UserId>, IdentityError> {
    let Some(raw) = headers.get("x-user-id") else {
        return Ok(None);
    };
    let text = raw
        .to_str()
        .map_err(|_| IdentityError::InvalidUserHeader("X-User-Id must be ASCII".into()))?;
    UserId::parse(text)
        .map(Some)
        .map_err(|e| IdentityError::InvalidUserHeader(e.0.to_owned()))
}

/// The values of every cookie called `name` in `headers`.
fn cookies<'a>(headers: &'a HeaderMap, name: &'a str) -> impl Iterator<Item = String> + 'a {
    headers
        .get_all("cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|text| cookie::Cookie::split_parse(text).flatten())
        .filter(move |c| c.name() == name)
        .map(|c| c.value().to_owned())
}
