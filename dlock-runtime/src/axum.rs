//! `LockError` as an axum response (feature `axum`).

use axum::{
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};

use crate::LockError;

/// Maps a lock failure to an HTTP answer with a short body and no internal detail (no key,
/// prefix, URL, token or backend message):
///
/// | error | status | body |
/// | --- | --- | --- |
/// | [`Timeout`](LockError::Timeout) | 409 Conflict, `Retry-After: 1` | `resource busy, retry later` |
/// | [`Backend`](LockError::Backend) | 503 Service Unavailable | `lock service unavailable` |
/// | [`Closed`](LockError::Closed) | 503 Service Unavailable | `shutting down` |
/// | [`InvalidKey`](LockError::InvalidKey) | 400 Bad Request | `invalid request` |
/// | others | 500 Internal Server Error | `internal error` |
///
/// Log the error itself (its `Display` is safe to log) before converting it if you need the
/// detail.
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl IntoResponse for LockError {
    fn into_response(self) -> Response {
        let (status, body) = match &self {
            Self::Timeout { .. } => (StatusCode::CONFLICT, "resource busy, retry later"),
            Self::Backend(_) => (StatusCode::SERVICE_UNAVAILABLE, "lock service unavailable"),
            Self::Closed { .. } => (StatusCode::SERVICE_UNAVAILABLE, "shutting down"),
            Self::InvalidKey { .. } => (StatusCode::BAD_REQUEST, "invalid request"),
            Self::Config(_) | Self::Lost { .. } | Self::Conflict { .. } => {
                (StatusCode::INTERNAL_SERVER_ERROR, "internal error")
            }
        };
        let mut response = (status, body).into_response();
        if status == StatusCode::CONFLICT {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}
