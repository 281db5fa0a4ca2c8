//! The waiting-room page (`static/`), embedded in the binary so one file
//! runs the whole service; debug builds read the files from disk.

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, Uri, header};
use axum::response::{IntoResponse, Response};
use rust_embed::RustEmbed;

use super::error::ApiError;
use crate::app::AppState;
use crate::identity::forwarded_https;

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
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let path = uri.path().trim_start_matches('/');
    let path = if path.is_empty() { "index.html" } else { path };
    match Assets::get(path) {
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
                file.data,
            )
                .into_response();
            // The page's first load makes the visitor, before any of its
            // tabs joins (see `Identity::new_visitor`).
            if path == "index.html"
                && let Some((_, cookie)) = state
                    .identity()
                    .new_visitor(&headers, forwarded_https(&headers))
                && let Ok(value) = HeaderValue::from_str(&cookie)
            {
                response.headers_mut().append(header::SET_COOKIE, value);
            }
            response
        }
        None => ApiError::not_found("not_found", "no such resource").into_response(),
    }
}
