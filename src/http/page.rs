//! The waiting-room page (`static/`), embedded in the binary so one file
//! runs the whole service; debug builds read the files from disk. With
//! `--page-dir`, a file there is served instead of the embedded one of the
//! same path (read when asked for, so operators change texts, styles and
//! logos without a rebuild or a restart).

use std::borrow::Cow;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, Uri, header};
use axum::response::{IntoResponse, Response};
use rust_embed::RustEmbed;

use super::AppState;
use super::client::Client;
use super::identity::allow_new_visitor;
use crate::error::ApiError;
use crate::error::ErrorCode;

#[derive(RustEmbed)]
#[folder = "static/"]
struct Assets;

/// `/` and every file of `static/` at the root; also the answer to every
/// path no other router knows (a JSON `404`, whatever the method).
pub fn router() -> Router<AppState> {
    Router::new().fallback(asset)
}

async fn asset(
    State(state): State<AppState>,
    Client(client): Client,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let path = uri.path().trim_start_matches('/');
    let path = if path.is_empty() { "index.html" } else { path };
    // The operator console's files are served on the operator listener
    // only (`console.rs`), like everything else of operators.
    let asset = if path.starts_with("admin/") {
        None
    } else {
        file(&state, path).await
    };
    match asset {
        Some(_) if method != Method::GET && method != Method::HEAD => {
            let mut response = ApiError::MethodNotAllowed.into_response();
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET,HEAD"));
            response
        }
        Some(file) => {
            let mime = mime_guess::from_path(path).first_or_octet_stream();
            let mut response = (
                [
                    (header::CONTENT_TYPE, mime.as_ref().to_owned()),
                    (header::CACHE_CONTROL, "no-cache".to_owned()),
                ],
                file,
            )
                .into_response();
            // The page's first load makes the visitor, before any of its
            // tabs joins (see `Identity::new_visitor`). Over the address's
            // visitor limit, or with the store away, the page is served
            // without one: the join then mints, and is refused, counted.
            if path == "index.html"
                && let Some((_, minted)) = state.identity().new_visitor(&headers)
                && allow_new_visitor(&state, &client).await.is_ok()
                && let Ok(value) = HeaderValue::from_str(&state.visitor_cookie(minted, &client))
            {
                response.headers_mut().append(header::SET_COOKIE, value);
            }
            response
        }
        None => ApiError::not_found(ErrorCode::NotFound, "no such resource").into_response(),
    }
}

/// The file at `path`: the page directory's, else the embedded one.
pub(super) async fn file(state: &AppState, path: &str) -> Option<Cow<'static, [u8]>> {
    if let Some(found) = state.page_dir().and_then(|dir| dir.file(path))
        && let Ok(bytes) = tokio::fs::read(&found).await
    {
        return Some(Cow::Owned(bytes));
    }
    Assets::get(path).map(|f| f.data)
}
