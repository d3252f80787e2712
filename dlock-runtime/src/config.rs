//! Configuration: defaults, the `DLOCK_*` environment, and validation. What is common to every
//! engine lives here; an engine's own options ride in its URL's query (see [`crate::url`]), the
//! older variables that set them being read as aliases through the table of engines.

use std::time::Duration;

use crate::{LockError, backend::ENGINES, url::EngineUrl};

/// Default wait for a lock (`DLOCK_TIMEOUT`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default lease (`DLOCK_EXPIRE`); also the lease renewed by `expire = "auto"`.
pub const DEFAULT_EXPIRE: Duration = Duration::from_secs(30);
/// Default prefix of every lock key (`DLOCK_KEY_PREFIX`).
pub const DEFAULT_KEY_PREFIX: &str = "dlock:";
/// Default longest key accepted, prefix included (`DLOCK_MAX_KEY_LEN`).
pub const DEFAULT_MAX_KEY_LEN: usize = 1024;
/// The engine when none is named: a Redis server on this machine (`DLOCK_URL`, or the older
/// `DLOCK_REDIS_URL`, then `REDIS_URL`).
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";
/// Default bounds of the jittered pause between attempts (`DLOCK_RETRY`, `min..max`).
pub const DEFAULT_RETRY: (Duration, Duration) =
    (Duration::from_millis(10), Duration::from_millis(50));
/// Default bound on one backend request (`DLOCK_REQUEST_TIMEOUT`): a reply that takes longer
/// counts as a failed (ambiguous) attempt.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_millis(500);

/// Everything a [`Locker`](crate::Locker) is configured with.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    /// The engine; `None`: [`DEFAULT_REDIS_URL`].
    pub(crate) url: Option<EngineUrl>,
    pub(crate) key_prefix: String,
    pub(crate) timeout: Duration,
    pub(crate) expire: Duration,
    pub(crate) retry: (Duration, Duration),
    pub(crate) max_key_len: usize,
    pub(crate) request_timeout: Duration,
    pub(crate) notify: bool,
    /// Engine options set by an older variable or a builder method (`wait` by
    /// `DLOCK_REDIS_WAIT`): the option, its value, and where it came from (for errors). The
    /// URL's own query wins over them.
    pub(crate) engine_options: Vec<(&'static str, String, &'static str)>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            url: None,
            key_prefix: DEFAULT_KEY_PREFIX.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            expire: DEFAULT_EXPIRE,
            retry: DEFAULT_RETRY,
            max_key_len: DEFAULT_MAX_KEY_LEN,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            notify: true,
            engine_options: Vec::new(),
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
        settings.url = Some(match get("DLOCK_URL") {
            Some(url) => EngineUrl::parse("DLOCK_URL", &url)?,
            None => Self::older_engine_variables(&get)?,
        });
        // The older variables of engine options (`DLOCK_REDIS_WAIT`, …), whatever the engine.
        for option in ENGINES
            .iter()
            .filter_map(|e| e.built)
            .flat_map(|b| b.options)
        {
            let seen = settings
                .engine_options
                .iter()
                .any(|(_, _, v)| *v == option.var);
            if !seen && let Some(value) = get(option.var) {
                (option.check)(value.trim())
                    .map_err(|why| LockError::config(format!("{}: {why}", option.var)))?;
                settings
                    .engine_options
                    .push((option.name, value.trim().to_owned(), option.var));
            }
        }
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
        settings.validate()?;
        Ok(settings)
    }

    /// The engine from `DLOCK_BACKEND` and `DLOCK_REDIS_URL` (or `REDIS_URL`), when `DLOCK_URL`
    /// is not set (kept for compatibility).
    fn older_engine_variables(
        get: &impl Fn(&str) -> Option<String>,
    ) -> Result<EngineUrl, LockError> {
        // Checked whatever the backend, as it always was: a bad value is reported, not ignored.
        let redis = |var: &str, url: &str| {
            let parsed = EngineUrl::parse(var, url)?;
            if parsed.engine() == "redis" {
                Ok(parsed)
            } else {
                Err(LockError::config(format!(
                    "{var}: expected a URL like `redis://[user:password@]host:port[/db]` \
                     (other engines go in DLOCK_URL)"
                )))
            }
        };
        let url = match (get("DLOCK_REDIS_URL"), get("REDIS_URL")) {
            (Some(url), _) => Some(redis("DLOCK_REDIS_URL", &url)?),
            (None, Some(url)) => Some(redis("REDIS_URL", &url)?),
            (None, None) => None,
        };
        match get("DLOCK_BACKEND").as_deref().map(str::trim) {
            None | Some("redis") => match url {
                Some(url) => Ok(url),
                None => EngineUrl::parse("DLOCK_BACKEND", DEFAULT_REDIS_URL),
            },
            Some("memory") => EngineUrl::parse("DLOCK_BACKEND", "memory://"),
            Some(_) => Err(LockError::config(
                "DLOCK_BACKEND: expected `redis` or `memory` (or name any engine in DLOCK_URL)",
            )),
        }
    }

    /// Checks what the builder cannot check field by field.
    pub(crate) fn validate(&self) -> Result<(), LockError> {
        crate::lease::check_lease(self.expire)?;
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

    /// Sets engine option `name` (from `from`, a builder method), unless the URL's query does.
    pub(crate) fn set_engine_option(
        &mut self,
        name: &'static str,
        value: String,
        from: &'static str,
    ) {
        self.engine_options.retain(|(n, _, _)| *n != name);
        self.engine_options.push((name, value, from));
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

    fn engine(s: &Settings) -> (&'static str, String) {
        let url = s.url.as_ref().unwrap();
        (url.engine(), url.as_str().to_owned())
    }

    #[test]
    fn defaults() {
        let s = env(&[]).unwrap();
        assert_eq!(s.timeout, DEFAULT_TIMEOUT);
        assert_eq!(s.expire, DEFAULT_EXPIRE);
        assert_eq!(s.key_prefix, "dlock:");
        assert_eq!(s.max_key_len, 1024);
        if cfg!(feature = "redis") {
            assert_eq!(engine(&s), ("redis", DEFAULT_REDIS_URL.to_owned()));
        }
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
        ])
        .unwrap();
        assert_eq!(engine(&s).0, "memory");
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

    /// The older variables of engine options are read as aliases of the URL's query.
    #[test]
    fn engine_option_variables_are_aliases() {
        let mut expected = Vec::new();
        let mut vars = Vec::new();
        if cfg!(feature = "redis") {
            vars.push(("DLOCK_REDIS_WAIT", "2"));
            expected.push(("wait", "2".to_owned(), "DLOCK_REDIS_WAIT"));
        }
        if cfg!(feature = "zookeeper") {
            vars.push(("DLOCK_ZK_SESSION_TIMEOUT", "6s"));
            expected.push((
                "session_timeout",
                "6s".to_owned(),
                "DLOCK_ZK_SESSION_TIMEOUT",
            ));
        }
        vars.push(("DLOCK_URL", "memory://"));
        assert_eq!(env(&vars).unwrap().engine_options, expected);
    }

    #[cfg(feature = "redis")]
    #[test]
    fn redis_url_falls_back_to_redis_url() {
        let s = env(&[("REDIS_URL", "redis://h:1")]).unwrap();
        assert_eq!(engine(&s), ("redis", "redis://h:1".to_owned()));
        let s = env(&[
            ("REDIS_URL", "redis://h:1"),
            ("DLOCK_REDIS_URL", "redis://d:2"),
        ])
        .unwrap();
        assert_eq!(engine(&s), ("redis", "redis://d:2".to_owned()));
    }

    #[test]
    fn dlock_url_wins_over_the_older_variables() {
        let s = env(&[
            ("DLOCK_URL", "memory://"),
            ("DLOCK_BACKEND", "redis"),
            ("DLOCK_REDIS_URL", "redis://d:2"),
        ])
        .unwrap();
        assert_eq!(engine(&s).0, "memory");
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
            assert_eq!(engine(&s).0, "memory");
        }
        // Without DLOCK_URL the same values are still errors.
        assert!(env(&[("REDIS_URL", "not a url")]).is_err());
    }

    #[test]
    fn bad_values_name_the_variable() {
        let mut cases = vec![
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
        ];
        if cfg!(feature = "redis") {
            cases.extend([("DLOCK_REDIS_WAIT", "-1"), ("DLOCK_REDIS_WAIT", "all")]);
        }
        if cfg!(feature = "redis-cluster") {
            cases.push(("DLOCK_URL", "redis+cluster://"));
        }
        if cfg!(feature = "zookeeper") {
            cases.extend([
                ("DLOCK_ZK_SESSION_TIMEOUT", "0s"),
                ("DLOCK_ZK_SESSION_TIMEOUT", "long"),
            ]);
        }
        for (var, value) in cases {
            let err = env(&[(var, value)]).unwrap_err();
            assert!(err.is_config(), "{var}={value}: {err:?}");
            assert!(err.to_string().contains(var), "{var}={value}: {err}");
        }
    }

    #[cfg(feature = "redis")]
    #[test]
    fn password_is_redacted() {
        let s = env(&[("DLOCK_URL", "redis://user:s3cret@host:6379/2")]).unwrap();
        let url = s.url.as_ref().unwrap();
        assert_eq!(url.to_string(), "redis://***@host:6379/2");
        assert!(!format!("{url:?}").contains("s3cret"));
        assert!(!format!("{s:?}").contains("s3cret"));
    }
}
