//! Engine URLs: the scheme of one URL (`DLOCK_URL`, [`LockerBuilder::url`](crate::LockerBuilder::url))
//! picks the engine from the table of engines (`backend::ENGINES`, which parses them), and
//! multi-host forms list their hosts with commas the way libpq and MongoDB URLs do. Engine
//! options ride in the query (`zk://h:2181?session_timeout=10s`, `redis://h:6379?wait=1`).
//! Parsing only: no I/O, and no password in any error or printout.

use std::fmt;

use crate::LockError;

/// An engine URL: its scheme names the engine (`redis://`, `redis+cluster://`,
/// `redis+sentinel://`, `redis+redlock://`, `etcd://`, `zk://`, `postgres://`, `memory://`, and
/// their TLS forms), and the engine checked the rest. `Display` and `Debug` hide the
/// credentials: the user-info part, and `user`, `username`, `pass` and `password` parameters.
///
/// ```
/// use dlock_runtime::EngineUrl;
///
/// let url: EngineUrl = "redis://app:s3cret@cache:6379/0".parse()?;
/// assert_eq!(url.to_string(), "redis://***@cache:6379/0");
/// assert_eq!(url.engine(), "redis");
/// let err = "nosuch://h:1".parse::<EngineUrl>().unwrap_err();
/// assert!(err.to_string().contains("unknown scheme"));
/// # Ok::<(), dlock_runtime::LockError>(())
/// ```
#[derive(Clone)]
pub struct EngineUrl {
    url: String,
    /// The name of the engine the scheme picks.
    engine: &'static str,
}

impl PartialEq for EngineUrl {
    fn eq(&self, other: &Self) -> bool {
        self.url == other.url
    }
}

impl Eq for EngineUrl {}

impl EngineUrl {
    /// A URL its engine checked already.
    pub(crate) fn checked(url: &str, engine: &'static str) -> Self {
        Self {
            url: url.to_owned(),
            engine,
        }
    }

    /// The name of the engine the scheme picks: `redis`, `redis-cluster`, `redis-sentinel`,
    /// `redlock`, `etcd`, `zookeeper`, `postgres` or `memory`.
    #[must_use]
    pub fn engine(&self) -> &'static str {
        self.engine
    }

    /// The scheme, without `://`.
    #[must_use]
    pub fn scheme(&self) -> &str {
        self.url.split_once("://").map_or("", |(scheme, _)| scheme)
    }

    /// The URL as given, credentials included: only for the engine's client.
    #[cfg_attr(
        not(any(feature = "__whole-url", test)),
        allow(dead_code, reason = "read by the engines that take the URL whole")
    )]
    pub(crate) fn as_str(&self) -> &str {
        &self.url
    }

    /// The value of the query parameter `name`, if the URL has one.
    #[cfg_attr(
        not(any(feature = "__options", test)),
        allow(dead_code, reason = "for the engines with options")
    )]
    pub(crate) fn query_param(&self, name: &str) -> Option<&str> {
        query_params(&self.url).find_map(|(n, v)| (n == name).then_some(v))
    }

    /// The URL with its credentials replaced by `***`: the whole user-info part (everything
    /// before the last `@`, so a password holding `/` or `?` is covered too) and the `user`,
    /// `username`, `pass` and `password` query parameters. Over-redacting is fine; leaking is
    /// not.
    pub(crate) fn redact(url: &str) -> String {
        let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
            return "***".to_owned();
        };
        let (scheme, rest) = url.split_at(scheme_end);
        let rest = match rest.rfind('@') {
            Some(at) => format!("***@{}", &rest[at + 1..]),
            None => rest.to_owned(),
        };
        match rest.split_once('?') {
            Some((path, query)) => {
                let query: Vec<String> = query
                    .split('&')
                    .map(|pair| match pair.split_once('=') {
                        Some((name, _))
                            if matches!(name, "user" | "username" | "pass" | "password") =>
                        {
                            format!("{name}=***")
                        }
                        _ => pair.to_owned(),
                    })
                    .collect();
                format!("{scheme}{path}?{}", query.join("&"))
            }
            None => format!("{scheme}{rest}"),
        }
    }
}

impl fmt::Debug for EngineUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", Self::redact(&self.url))
    }
}

impl fmt::Display for EngineUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&Self::redact(&self.url))
    }
}

/// The `name=value` pairs of `url`'s query.
#[cfg_attr(
    not(any(feature = "__options", test)),
    allow(dead_code, reason = "for the engines with options")
)]
pub(crate) fn query_params(url: &str) -> impl Iterator<Item = (&str, &str)> {
    url.split_once('?')
        .map_or("", |(_, query)| query)
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
}

/// A scheme's TLS form needs the `tls` feature.
#[cfg_attr(
    not(feature = "__tls-scheme"),
    allow(dead_code, reason = "for the engines with a TLS scheme")
)]
pub(crate) fn tls_needs_feature(var: &str, scheme: &str, tls: bool) -> Result<(), LockError> {
    if tls && !cfg!(feature = "tls") {
        return Err(LockError::config(format!(
            "{var}: `{scheme}://` (TLS) needs dlock-runtime's `tls` feature; enable it in Cargo.toml"
        )));
    }
    Ok(())
}

/// A multi-host URL taken apart: `scheme://[userinfo@]h1:p1,h2:p2[/path][?query]`.
#[derive(Clone, PartialEq, Eq)]
#[cfg_attr(
    not(any(feature = "__hosts", test)),
    allow(dead_code, reason = "for the engines with a list of hosts")
)]
pub(crate) struct HostList<'a> {
    pub(crate) tls: bool,
    pub(crate) userinfo: Option<&'a str>,
    pub(crate) hosts: Vec<(&'a str, u16)>,
    /// After the hosts, without the leading `/`; may be empty.
    pub(crate) path: &'a str,
    pub(crate) query: Option<&'a str>,
}

#[cfg_attr(
    not(any(feature = "__hosts", test)),
    allow(dead_code, reason = "for the engines with a list of hosts")
)]
impl<'a> HostList<'a> {
    /// Takes `url` apart; `form` is the expected form, for the error. Errors never show the
    /// URL (it may hold a password).
    pub(crate) fn parse(var: &str, url: &'a str, form: &str) -> Result<Self, LockError> {
        let bad = |why: &str| LockError::config(format!("{var}: {why}; expected `{form}`"));
        let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        // The password may hold `/` or `@`: the host list starts after the last `@`.
        let (userinfo, rest) = match rest.rfind('@') {
            Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
            None => (None, rest),
        };
        let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
        if hosts.is_empty() {
            return Err(bad("no host"));
        }
        let hosts = hosts
            .split(',')
            .map(|host| {
                let (name, port) = host
                    .rsplit_once(':')
                    .ok_or_else(|| bad("every host needs a port (`host:port`)"))?;
                let port = port
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| bad("a port is not a number from 1 to 65535"))?;
                if name.is_empty() {
                    return Err(bad("a host name is empty"));
                }
                Ok((name, port))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            tls: scheme.starts_with("rediss"),
            userinfo,
            hosts,
            path,
            query,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_lists_keep_passwords_with_separators() {
        let url = "rediss+cluster://app:p@ss/w,rd@h1:7000,h2:7001/?x=1";
        let hosts = HostList::parse("X", url, "").unwrap();
        assert!(hosts.tls);
        assert_eq!(hosts.userinfo, Some("app:p@ss/w,rd"));
        assert_eq!(hosts.hosts, vec![("h1", 7000), ("h2", 7001)]);
        assert_eq!(hosts.query, Some("x=1"));
    }

    #[test]
    fn credentials_are_redacted() {
        for url in [
            "redis://u:pa/ss@h:6379",
            "redis://u:p?a#ss@h:6379/0",
            "redis+unix:///tmp/r.sock?db=0&pass=s3cret",
            "redis+unix:///tmp/r.sock?user=me&password=s3cret&db=1",
        ] {
            let shown = EngineUrl::redact(url);
            assert!(
                !shown.contains("s3cret") && !shown.contains("pa/ss") && !shown.contains("p?a#ss"),
                "{url} -> {shown}"
            );
        }
        assert_eq!(
            EngineUrl::redact("redis+unix:///tmp/r.sock?db=0&pass=x"),
            "redis+unix:///tmp/r.sock?db=0&pass=***"
        );
    }

    #[test]
    fn options_are_read_from_the_query_and_can_be_left_out() {
        let url = EngineUrl::checked("memory://?a=1&wait=2&b", "memory");
        assert_eq!(url.query_param("wait"), Some("2"));
        assert_eq!(url.query_param("b"), Some(""));
        assert_eq!(url.query_param("c"), None);
    }
}
