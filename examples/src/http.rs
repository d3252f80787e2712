//! A tiny HTTP/1.1 client: one request per connection (`Connection: close`), no TLS, no body
//! sent. Enough for the examples and tests to call the order service without an HTTP client
//! dependency.

use std::io;

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
};

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

/// Sends `method path` to `addr` (`127.0.0.1:3000`) with an empty body and reads the response.
///
/// # Errors
/// When the connection fails or the response is not HTTP/1.x.
pub async fn request(addr: &str, method: &str, path: &str) -> io::Result<Response> {
    let mut stream = TcpStream::connect(addr).await?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    parse(&raw)
}

fn parse(raw: &[u8]) -> io::Result<Response> {
    let bad = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad HTTP response: {what}"),
        )
    };
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of headers"))?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().ok_or_else(|| bad("empty"))?;
    let mut parts = status_line.splitn(3, ' ');
    if !parts.next().is_some_and(|v| v.starts_with("HTTP/1.")) {
        return Err(bad("not HTTP/1.x"));
    }
    let status = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status code"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut body = &raw[split + 4..];
    let mut response = Response {
        status,
        headers,
        body: String::new(),
    };
    let decoded;
    if response
        .header("transfer-encoding")
        .is_some_and(|te| te.eq_ignore_ascii_case("chunked"))
    {
        decoded = dechunk(body).ok_or_else(|| bad("broken chunked body"))?;
        body = &decoded;
    } else if let Some(len) = response
        .header("content-length")
        .and_then(|l| l.parse().ok())
    {
        body = body
            .get(..len)
            .ok_or_else(|| bad("body shorter than Content-Length"))?;
    }
    response.body = String::from_utf8_lossy(body).into_owned();
    Ok(response)
}

fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&body[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(body.get(..size)?);
        body = body.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn parses_length_and_chunked_bodies() {
        let r = parse(b"HTTP/1.1 409 Conflict\r\nRetry-After: 1\r\ncontent-length: 4\r\n\r\nbusy")
            .unwrap();
        assert_eq!(
            (r.status, r.header("retry-after"), r.body.as_str()),
            (409, Some("1"), "busy")
        );
        let r = parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").unwrap();
        assert_eq!(r.body, "abcde");
    }
}
