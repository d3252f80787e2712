//! HTTP/1.1 requests on hyper's client: the tests call the order service with it, the
//! benchmark reads etcd's `/metrics`, and the etcd deployment asks its members for their status.

use std::{io, time::Duration};

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

/// A response, its body read to the end.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Response {
    /// The status code (`201`).
    pub status: u16,
    /// Header names (lower case) and values, in the order received.
    pub headers: Vec<(String, String)>,
    /// The body, decoded as UTF-8 (lossily).
    pub body: String,
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Sends `method path` to `addr` (`127.0.0.1:3000`) with `body` (JSON when not empty) over a new
/// connection, and reads the whole response; within 5 seconds.
///
/// # Errors
/// When the connection fails, the request is refused, or no response comes in time.
pub async fn request_with(
    addr: &str,
    method: &str,
    path: &str,
    body: &str,
) -> io::Result<Response> {
    tokio::time::timeout(Duration::from_secs(5), exchange(addr, method, path, body))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no HTTP response within 5s"))?
}

/// [`request_with`] without a body.
///
/// # Errors
/// As [`request_with`].
pub async fn request(addr: &str, method: &str, path: &str) -> io::Result<Response> {
    request_with(addr, method, path, "").await
}

/// [`request_with`] from code that is not async (the deployments), on a runtime of its own in a
/// thread of its own, so that it may be called from inside a test's runtime as well.
///
/// # Errors
/// As [`request_with`].
pub fn blocking(addr: &str, method: &str, path: &str, body: &str) -> io::Result<Response> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?
                    .block_on(request_with(addr, method, path, body))
            })
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the HTTP request's thread panicked")))
    })
}

async fn exchange(addr: &str, method: &str, path: &str, body: &str) -> io::Result<Response> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(io::Error::other)?;
    tokio::spawn(connection);
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, addr);
    if !body.is_empty() {
        request = request.header(hyper::header::CONTENT_TYPE, "application/json");
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_owned())))
        .map_err(io::Error::other)?;
    let response = sender
        .send_request(request)
        .await
        .map_err(io::Error::other)?;
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(io::Error::other)?
        .to_bytes();
    Ok(Response {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    })
}
