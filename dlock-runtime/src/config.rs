//! Configuration: the defaults and what every engine shares, and its validation. An engine's
//! own options ride in its URL's query (see [`crate::url`]); the environment is read in
//! [`crate::env`].

use std::time::Duration;

use crate::{LockError, url::EngineUrl};

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
    /// Who this process is, recorded with every hold (`DLOCK_OWNER`, host, process id).
    pub(crate) identity: crate::holder::Identity,
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
            identity: crate::holder::Identity::default(),
        }
    }
}

impl Settings {
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

pub(crate) fn parse_retry(value: &str) -> Result<(Duration, Duration), LockError> {
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
