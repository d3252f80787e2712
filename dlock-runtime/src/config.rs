//! Configuration: defaults, the `DLOCK_*` environment, and validation.

use std::{fmt, time::Duration};

use crate::LockError;

/// Default wait for a lock (`DLOCK_TIMEOUT`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default lease (`DLOCK_EXPIRE`); also the lease renewed by `expire = "auto"`.
pub const DEFAULT_EXPIRE: Duration = Duration::from_secs(30);
/// Default prefix of every lock key (`DLOCK_KEY_PREFIX`).
pub const DEFAULT_KEY_PREFIX: &str = "dlock:";
/// Default longest key accepted, prefix included (`DLOCK_MAX_KEY_LEN`).
pub const DEFAULT_MAX_KEY_LEN: usize = 1024;
/// Default Redis URL (`DLOCK_REDIS_URL`, then `REDIS_URL`).
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";
/// Default bounds of the jittered pause between attempts (`DLOCK_RETRY`, `min..max`).
pub const DEFAULT_RETRY: (Duration, Duration) =
    (Duration::from_millis(10), Duration::from_millis(50));
/// Default bound on one backend request (`DLOCK_REQUEST_TIMEOUT`): a reply that takes longer
/// counts as a failed (ambiguous) attempt.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_millis(500);
/// Default ZooKeeper session timeout (`DLOCK_ZK_SESSION_TIMEOUT`): how long a crashed or paused
/// holder keeps its lock at most, and how long a lost connection may last without losing
/// anything. 10s rides out a leader election (a few seconds) and sits inside the servers'
/// default bounds (4s to 40s with the default `tickTime` of 2s); Curator's 60s keeps a dead
/// holder's lock six times as long.
pub const DEFAULT_ZK_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// Which backend a [`Locker`](crate::Locker) talks to.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendKind {
    /// A Redis server at this URL (`redis://[user[:password]@]host[:port][/db]`).
    Redis(RedisUrl),
    /// A Redis Cluster reached through these seed nodes
    /// (`redis+cluster://[user:password@]h1:p1,h2:p2`; feature `redis-cluster`).
    RedisCluster(RedisUrl),
    /// A Redis master found through these sentinels
    /// (`redis+sentinel://[user:password@]s1:p1,s2:p2/<master>`; feature `redis-sentinel`).
    RedisSentinel(RedisUrl),
    /// RedLock over these independent Redis masters, an odd number of at least 3
    /// (`redis+redlock://[user:password@]h1:p1,h2:p2,h3:p3`; feature `redlock`).
    RedLock(RedisUrl),
    /// A PostgreSQL database (`postgres://[user[:password]@]host[:port][/dbname][?param=value…]`,
    /// or `postgresql://`; feature `postgres`): the lock table `dlock_locks`.
    Postgres(PostgresUrl),
    /// An etcd cluster reached through these endpoints (`etcd://[user:password@]h1:p1,h2:p2`,
    /// `etcds://` for TLS; feature `etcd`).
    Etcd(RedisUrl),
    /// A ZooKeeper ensemble (`zk://h1:p1,h2:p2[/chroot]`; feature `zookeeper`): Curator's lock
    /// recipe under the chroot.
    ZooKeeper(String),
    /// The embedded in-process backend.
    Memory,
}

impl fmt::Debug for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Redis(url) => f.debug_tuple("Redis").field(url).finish(),
            Self::RedisCluster(url) => f.debug_tuple("RedisCluster").field(url).finish(),
            Self::RedisSentinel(url) => f.debug_tuple("RedisSentinel").field(url).finish(),
            Self::RedLock(url) => f.debug_tuple("RedLock").field(url).finish(),
            Self::Postgres(url) => f.debug_tuple("Postgres").field(url).finish(),
            Self::Etcd(url) => f.debug_tuple("Etcd").field(url).finish(),
            Self::ZooKeeper(url) => f.debug_tuple("ZooKeeper").field(url).finish(),
            Self::Memory => f.write_str("Memory"),
        }
    }
}

/// A Redis URL whose `Debug` and `Display` hide the password.
///
/// ```
/// use dlock_runtime::RedisUrl;
///
/// let url: RedisUrl = "redis://app:s3cret@cache:6379/0".parse()?;
/// assert_eq!(url.to_string(), "redis://***@cache:6379/0");
/// # Ok::<(), dlock_runtime::LockError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl(String);

impl std::str::FromStr for RedisUrl {
    type Err = LockError;

    /// Checks the scheme (`redis://`, `redis+unix://`, `unix://`, and `rediss://` with the `tls`
    /// feature); the rest is checked by the driver on first use.
    fn from_str(url: &str) -> Result<Self, LockError> {
        Self::parse("redis url", url)
    }
}

impl RedisUrl {
    /// Checks the scheme; the rest is checked by the driver on first use.
    pub(crate) fn parse(var: &str, url: &str) -> Result<Self, LockError> {
        let url = url.trim();
        if url.starts_with("redis://")
            || url.starts_with("redis+unix://")
            || url.starts_with("unix://")
        {
            Ok(Self(url.to_owned()))
        } else if url.starts_with("rediss://") {
            if cfg!(feature = "tls") {
                Ok(Self(url.to_owned()))
            } else {
                Err(LockError::config(format!(
                    "{var}: `rediss://` (TLS) needs dlock-runtime's `tls` feature; use `redis://` or enable it"
                )))
            }
        } else {
            Err(LockError::config(format!(
                "{var}: expected a URL like `redis://[user:password@]host:port[/db]`"
            )))
        }
    }

    /// A URL whose form [`crate::url::parse`] checked already.
    pub(crate) fn trusted(url: &str) -> Self {
        Self(url.to_owned())
    }

    #[cfg(any(feature = "redis", feature = "etcd"))]
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// The URL with its credentials replaced by `***`: the whole user-info part (everything
    /// before the last `@`, so a password holding `/` or `?` is covered too) and the `user`,
    /// `username`, `pass` and `password` query parameters. Over-redacting is fine; leaking is not.
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

    fn redacted(&self) -> String {
        Self::redact(&self.0)
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.redacted())
    }
}

impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// A PostgreSQL URL (libpq's URL form) whose `Debug` and `Display` hide the password, in the
/// user-info part and in a `password=` parameter alike.
///
/// ```
/// # #[cfg(feature = "postgres")] {
/// use dlock_runtime::PostgresUrl;
///
/// let url: PostgresUrl = "postgres://app:s3cret@db:5432/shop?sslmode=disable".parse()?;
/// assert_eq!(url.to_string(), "postgres://***@db:5432/shop?sslmode=disable");
/// # }
/// # Ok::<(), dlock_runtime::LockError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresUrl(String);

impl std::str::FromStr for PostgresUrl {
    type Err = LockError;

    /// Checks the scheme (`postgres://` or `postgresql://`), and with the `postgres` feature the
    /// whole URL as the driver reads it; without that feature every URL is refused.
    fn from_str(url: &str) -> Result<Self, LockError> {
        match crate::url::parse("postgres url", url)? {
            BackendKind::Postgres(url) => Ok(url),
            _ => Err(LockError::config(
                "postgres url: expected `postgres://[user[:password]@]host[:port][/dbname]`",
            )),
        }
    }
}

impl PostgresUrl {
    /// A URL whose form [`crate::url::parse`] checked already.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn trusted(url: &str) -> Self {
        Self(url.to_owned())
    }

    #[cfg(feature = "postgres")]
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", RedisUrl::redact(&self.0))
    }
}

impl fmt::Display for PostgresUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&RedisUrl::redact(&self.0))
    }
}

/// Everything a [`Locker`](crate::Locker) is configured with.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub(crate) backend: BackendKind,
    pub(crate) key_prefix: String,
    pub(crate) timeout: Duration,
    pub(crate) expire: Duration,
    pub(crate) retry: (Duration, Duration),
    pub(crate) max_key_len: usize,
    pub(crate) request_timeout: Duration,
    pub(crate) notify: bool,
    /// `DLOCK_REDIS_WAIT`: replicas that must acknowledge an acquisition; 0 = off.
    pub(crate) redis_wait: u32,
    /// `DLOCK_ZK_SESSION_TIMEOUT`: the session timeout asked of ZooKeeper.
    #[cfg_attr(not(feature = "zookeeper"), allow(dead_code))]
    pub(crate) zk_session_timeout: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            backend: BackendKind::Redis(RedisUrl(DEFAULT_REDIS_URL.to_owned())),
            key_prefix: DEFAULT_KEY_PREFIX.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            expire: DEFAULT_EXPIRE,
            retry: DEFAULT_RETRY,
            max_key_len: DEFAULT_MAX_KEY_LEN,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            notify: true,
            redis_wait: 0,
            zk_session_timeout: DEFAULT_ZK_SESSION_TIMEOUT,
        }
    }
}

impl Settings {
    /// Reads the `DLOCK_*` variables through `var` (the process environment in production).
    pub(crate) fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Self, LockError> {
        let mut settings = Self::default();
        let get = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        // The one URL that names any engine wins: the older variables are then not read at all
        // (a platform's unrelated `REDIS_URL` cannot break a `DLOCK_URL=postgres://…`).
        settings.backend = match get("DLOCK_URL") {
            Some(url) => crate::url::parse("DLOCK_URL", &url)?,
            None => Self::older_engine_variables(&get)?,
        };
        if let Some(prefix) = var("DLOCK_KEY_PREFIX") {
            settings.key_prefix = prefix;
        }
        if let Some(v) = get("DLOCK_TIMEOUT") {
            settings.timeout = parse_duration("DLOCK_TIMEOUT", &v, true)?;
        }
        if let Some(v) = get("DLOCK_EXPIRE") {
            settings.expire = parse_duration("DLOCK_EXPIRE", &v, false)?;
        }
        if let Some(v) = get("DLOCK_RETRY") {
            settings.retry = parse_retry(&v)?;
        }
        if let Some(v) = get("DLOCK_MAX_KEY_LEN") {
            settings.max_key_len = match v.trim().parse::<usize>() {
                Ok(n) if n > 0 => n,
                _ => {
                    return Err(LockError::config(
                        "DLOCK_MAX_KEY_LEN: expected a positive whole number of bytes, like `1024`",
                    ));
                }
            };
        }
        if let Some(v) = get("DLOCK_REQUEST_TIMEOUT") {
            settings.request_timeout = parse_duration("DLOCK_REQUEST_TIMEOUT", &v, false)?;
        }
        if let Some(v) = get("DLOCK_NOTIFY") {
            settings.notify = match v.trim() {
                "on" | "true" | "1" => true,
                "off" | "false" | "0" => false,
                _ => return Err(LockError::config("DLOCK_NOTIFY: expected `on` or `off`")),
            };
        }
        if let Some(v) = get("DLOCK_REDIS_WAIT") {
            settings.redis_wait = v.trim().parse().map_err(|_| {
                LockError::config(
                    "DLOCK_REDIS_WAIT: expected how many replicas must acknowledge an \
                     acquisition, a whole number like `1` (0 turns it off)",
                )
            })?;
        }
        if let Some(v) = get("DLOCK_ZK_SESSION_TIMEOUT") {
            settings.zk_session_timeout = parse_duration("DLOCK_ZK_SESSION_TIMEOUT", &v, false)?;
        }
        settings.validate()?;
        Ok(settings)
    }

    /// The engine from `DLOCK_BACKEND` and `DLOCK_REDIS_URL` (or `REDIS_URL`), when `DLOCK_URL`
    /// is not set.
    fn older_engine_variables(
        get: &impl Fn(&str) -> Option<String>,
    ) -> Result<BackendKind, LockError> {
        // Checked whatever the backend, as it always was: a bad value is reported, not ignored.
        let url = match get("DLOCK_REDIS_URL") {
            Some(url) => RedisUrl::parse("DLOCK_REDIS_URL", &url)?,
            None => match get("REDIS_URL") {
                Some(url) => RedisUrl::parse("REDIS_URL", &url)?,
                None => RedisUrl(DEFAULT_REDIS_URL.to_owned()),
            },
        };
        match get("DLOCK_BACKEND").as_deref().map(str::trim) {
            None | Some("redis") => Ok(BackendKind::Redis(url)),
            Some("memory") => Ok(BackendKind::Memory),
            Some(_) => Err(LockError::config(
                "DLOCK_BACKEND: expected `redis` or `memory`",
            )),
        }
    }

    /// Checks what the builder cannot check field by field.
    pub(crate) fn validate(&self) -> Result<(), LockError> {
        crate::options::check_lease(self.expire)?;
        if self.retry.0 > self.retry.1 || self.retry.1.is_zero() {
            return Err(LockError::config(
                "retry: expected `min..max` with 0 < max and min <= max",
            ));
        }
        if self.request_timeout.is_zero() {
            return Err(LockError::config("request timeout: must be positive"));
        }
        if self.key_prefix.len() >= self.max_key_len {
            return Err(LockError::config(
                "DLOCK_KEY_PREFIX: the prefix alone is as long as DLOCK_MAX_KEY_LEN",
            ));
        }
        Ok(())
    }
}

/// Parses `"250ms"`, `"5s"`, `"1m30s"`, `"2h"`.
pub(crate) fn parse_duration(var: &str, value: &str, zero_ok: bool) -> Result<Duration, LockError> {
    match humantime::parse_duration(value.trim()) {
        Ok(d) if zero_ok || !d.is_zero() => Ok(d),
        Ok(_) => Err(LockError::config(format!(
            "{var}: expected a positive duration like `30s`, got zero"
        ))),
        Err(_) => Err(LockError::config(format!(
            "{var}: expected a duration like `250ms`, `5s` or `1m30s`"
        ))),
    }
}

fn parse_retry(value: &str) -> Result<(Duration, Duration), LockError> {
    const EXPECTED: &str = "DLOCK_RETRY: expected `min..max` like `10ms..50ms`, with min <= max";
    let (min, max) = value
        .split_once("..")
        .ok_or_else(|| LockError::config(EXPECTED))?;
    let min = humantime::parse_duration(min.trim()).map_err(|_| LockError::config(EXPECTED))?;
    let max = humantime::parse_duration(max.trim()).map_err(|_| LockError::config(EXPECTED))?;
    if min > max || max.is_zero() {
        return Err(LockError::config(EXPECTED));
    }
    Ok((min, max))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Result<Settings, LockError> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Settings::from_lookup(move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn defaults() {
        let s = env(&[]).unwrap();
        assert_eq!(s.timeout, DEFAULT_TIMEOUT);
        assert_eq!(s.expire, DEFAULT_EXPIRE);
        assert_eq!(s.key_prefix, "dlock:");
        assert_eq!(s.max_key_len, 1024);
        assert_eq!(
            s.backend,
            BackendKind::Redis(RedisUrl(DEFAULT_REDIS_URL.into()))
        );
    }

    #[test]
    fn every_variable_is_read() {
        let s = env(&[
            ("DLOCK_BACKEND", "memory"),
            ("DLOCK_KEY_PREFIX", "app:"),
            ("DLOCK_TIMEOUT", "0s"),
            ("DLOCK_EXPIRE", "1m30s"),
            ("DLOCK_RETRY", "5ms..7ms"),
            ("DLOCK_MAX_KEY_LEN", "64"),
            ("DLOCK_REQUEST_TIMEOUT", "2s"),
            ("DLOCK_NOTIFY", "off"),
            ("DLOCK_REDIS_WAIT", "2"),
            ("DLOCK_ZK_SESSION_TIMEOUT", "6s"),
        ])
        .unwrap();
        assert_eq!(s.zk_session_timeout, Duration::from_secs(6));
        assert_eq!(s.redis_wait, 2);
        assert_eq!(s.backend, BackendKind::Memory);
        assert_eq!(s.key_prefix, "app:");
        assert_eq!(s.timeout, Duration::ZERO);
        assert_eq!(s.expire, Duration::from_secs(90));
        assert_eq!(
            s.retry,
            (Duration::from_millis(5), Duration::from_millis(7))
        );
        assert_eq!(s.max_key_len, 64);
        assert_eq!(s.request_timeout, Duration::from_secs(2));
        assert!(!s.notify);
    }

    #[test]
    fn redis_url_falls_back_to_redis_url() {
        let s = env(&[("REDIS_URL", "redis://h:1")]).unwrap();
        assert_eq!(
            s.backend,
            BackendKind::Redis(RedisUrl("redis://h:1".into()))
        );
        let s = env(&[
            ("REDIS_URL", "redis://h:1"),
            ("DLOCK_REDIS_URL", "redis://d:2"),
        ])
        .unwrap();
        assert_eq!(
            s.backend,
            BackendKind::Redis(RedisUrl("redis://d:2".into()))
        );
    }

    #[test]
    fn dlock_url_wins_over_the_older_variables() {
        let s = env(&[
            ("DLOCK_URL", "memory://"),
            ("DLOCK_BACKEND", "redis"),
            ("DLOCK_REDIS_URL", "redis://d:2"),
        ])
        .unwrap();
        assert_eq!(s.backend, BackendKind::Memory);
        let s = env(&[("DLOCK_URL", "redis://u:1"), ("DLOCK_BACKEND", "memory")]).unwrap();
        assert_eq!(
            s.backend,
            BackendKind::Redis(RedisUrl("redis://u:1".into()))
        );
        let err = env(&[
            ("DLOCK_URL", "nosuch://e:2181"),
            ("DLOCK_REDIS_URL", "redis://d:2"),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("DLOCK_URL"), "{err}");
    }

    /// A hosting platform's `REDIS_URL` (TLS, or no URL at all) beside `DLOCK_URL` is not read.
    #[test]
    fn with_dlock_url_the_older_variables_are_not_read() {
        for broken in ["rediss://default:pw@cache:6380", "not a url"] {
            let s = env(&[
                ("DLOCK_URL", "memory://"),
                ("REDIS_URL", broken),
                ("DLOCK_REDIS_URL", broken),
                ("DLOCK_BACKEND", "etcd"),
            ])
            .unwrap_or_else(|e| panic!("{broken}: {e}"));
            assert_eq!(s.backend, BackendKind::Memory);
        }
        // Without DLOCK_URL the same values are still errors.
        assert!(env(&[("REDIS_URL", "not a url")]).is_err());
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (var, value) in [
            ("DLOCK_BACKEND", "etcd"),
            ("DLOCK_REDIS_URL", "http://x"),
            ("DLOCK_TIMEOUT", "soon"),
            ("DLOCK_EXPIRE", "0s"),
            ("DLOCK_EXPIRE", "-3s"),
            ("DLOCK_RETRY", "50ms"),
            ("DLOCK_RETRY", "50ms..10ms"),
            ("DLOCK_MAX_KEY_LEN", "0"),
            ("DLOCK_MAX_KEY_LEN", "big"),
            ("DLOCK_NOTIFY", "maybe"),
            ("DLOCK_URL", "ftp://x"),
            ("DLOCK_REDIS_WAIT", "-1"),
            ("DLOCK_REDIS_WAIT", "all"),
            ("DLOCK_URL", "redis+cluster://"),
            ("DLOCK_ZK_SESSION_TIMEOUT", "0s"),
            ("DLOCK_ZK_SESSION_TIMEOUT", "long"),
        ] {
            let err = env(&[(var, value)]).unwrap_err();
            assert!(err.is_config(), "{var}={value}: {err:?}");
            assert!(err.to_string().contains(var), "{var}={value}: {err}");
        }
    }

    #[test]
    fn password_is_redacted() {
        let url = RedisUrl::parse("X", "redis://user:s3cret@host:6379/2").unwrap();
        assert_eq!(url.to_string(), "redis://***@host:6379/2");
        assert!(!format!("{url:?}").contains("s3cret"));
        let kind = BackendKind::Redis(url);
        assert!(!format!("{kind:?}").contains("s3cret"));
        for url in [
            "redis://u:pa/ss@h:6379",
            "redis://u:p?a#ss@h:6379/0",
            "redis+unix:///tmp/r.sock?db=0&pass=s3cret",
            "redis+unix:///tmp/r.sock?user=me&password=s3cret&db=1",
        ] {
            let shown = RedisUrl::redact(url);
            assert!(
                !shown.contains("s3cret") && !shown.contains("pa/ss") && !shown.contains("p?a#ss"),
                "{url} -> {shown}"
            );
        }
        assert_eq!(
            RedisUrl::redact("redis+unix:///tmp/r.sock?db=0&pass=x"),
            "redis+unix:///tmp/r.sock?db=0&pass=***"
        );
    }
}
