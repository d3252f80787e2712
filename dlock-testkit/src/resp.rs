//! A raw RESP2 client, enough for the deployments to ask their servers and sentinels about
//! themselves over fresh plain connections (no driver, no connection state to go stale across
//! the faults the tests inject).

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    time::Duration,
};

/// Sends one command to the server (or sentinel) on 127.0.0.1:`port` over a fresh plain
/// connection and returns the raw RESP reply, whole (`None` when nothing complete arrives, each
/// read waiting up to a second).
pub(crate) fn command_at(port: u16, args: &[&str]) -> Option<String> {
    exchange(port, args).map(|raw| String::from_utf8_lossy(&raw).into_owned())
}

/// [`command_at`], parsed.
pub(crate) fn query(port: u16, args: &[&str]) -> Option<Reply> {
    Reply::parse(&exchange(port, args)?).map(|(reply, _)| reply)
}

/// Writes one command and reads until one whole reply has arrived: a bulk reply such as
/// `CLUSTER NODES` can take more than one read.
fn exchange(port: u16, args: &[&str]) -> Option<Vec<u8>> {
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let mut request = format!("*{}\r\n", args.len());
    for a in args {
        request.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    stream.write_all(request.as_bytes()).ok()?;
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = stream.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if Reply::parse(&buf).is_some() {
            return Some(buf);
        }
    }
}

/// One RESP2 reply, as the harness's raw client reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Option<String>),
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The reply at the start of `buf` and the bytes it takes; `None` while it is incomplete
    /// (or is not RESP2).
    fn parse(buf: &[u8]) -> Option<(Self, usize)> {
        let end = buf.windows(2).position(|w| w == b"\r\n")?;
        let line = String::from_utf8_lossy(buf.get(1..end)?).into_owned();
        let next = end + 2;
        let reply = match buf[0] {
            b'+' => (Self::Status(line), next),
            b'-' => (Self::Error(line), next),
            b':' => (Self::Int(line.parse().ok()?), next),
            b'$' => match usize::try_from(line.parse::<i64>().ok()?) {
                Err(_) => (Self::Bulk(None), next),
                Ok(len) => {
                    let data = buf.get(next..next + len)?;
                    buf.get(next + len..next + len + 2)?;
                    let text = String::from_utf8_lossy(data).into_owned();
                    (Self::Bulk(Some(text)), next + len + 2)
                }
            },
            b'*' => match usize::try_from(line.parse::<i64>().ok()?) {
                Err(_) => (Self::Array(None), next),
                Ok(len) => {
                    let mut items = Vec::with_capacity(len.min(1024));
                    let mut at = next;
                    for _ in 0..len {
                        let (item, used) = Self::parse(buf.get(at..)?)?;
                        items.push(item);
                        at += used;
                    }
                    (Self::Array(Some(items)), at)
                }
            },
            _ => return None,
        };
        Some(reply)
    }

    /// The text of a status or bulk reply.
    pub(crate) fn text(&self) -> Option<&str> {
        match self {
            Self::Status(s) | Self::Bulk(Some(s)) => Some(s),
            _ => None,
        }
    }

    /// The items of an array reply.
    pub(crate) fn items(&self) -> Option<&[Reply]> {
        match self {
            Self::Array(Some(items)) => Some(items),
            _ => None,
        }
    }

    /// `true` for `+OK`.
    pub(crate) fn is_ok(&self) -> bool {
        matches!(self, Self::Status(s) if s == "OK")
    }
}

/// The value of `field` in an `INFO`-style text (`field:value` lines).
pub(crate) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(str::trim_end)
}
