//! The builder, and the process-wide locker.

use std::{
    fmt,
    sync::{Arc, OnceLock},
    time::Duration,
};

use super::Locker;
use crate::{
    LockError,
    backend::{Backend, MemoryBackend, engine_named, parse_url},
    config::{DEFAULT_REDIS_URL, Settings},
    url::EngineUrl,
};

/// Sets everything by code. Start from the built-in defaults with [`Locker::builder`], or from
/// the environment with [`LockerBuilder::from_env`].
///
/// ```
/// use std::time::Duration;
/// use dlock_runtime::Locker;
///
/// let locker = Locker::builder()
///     .redis_url("redis://127.0.0.1:6379")
///     .key_prefix("shop:")
///     .timeout(Duration::from_secs(2))
///     .expire(Duration::from_secs(10))
///     .build()?;
/// # Ok::<(), dlock_runtime::LockError>(())
/// ```
#[derive(Clone, Default)]
#[must_use]
pub struct LockerBuilder {
    settings: Settings,
    url: Option<String>,
    /// `memory()` by code makes a private table; `memory://` shares the process's.
    private_memory: bool,
}

impl fmt::Debug for LockerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockerBuilder")
            .field("settings", &self.settings)
            .field("url", &self.url.as_deref().map(EngineUrl::redact))
            .finish_non_exhaustive()
    }
}

impl LockerBuilder {
    /// Starts from the `DLOCK_*` environment (see the crate docs for the table).
    ///
    /// # Errors
    /// [`LockError::Config`] naming the first invalid variable.
    pub fn from_env() -> Result<Self, LockError> {
        Ok(Self {
            settings: crate::env::settings(|name| std::env::var(name).ok())?,
            url: None,
            private_memory: false,
        })
    }

    /// Starts from the built-in defaults (not the environment): the same as
    /// [`Locker::builder`].
    pub fn new() -> Self {
        Self::default()
    }

    /// The engine and its address, chosen by the URL's scheme (as `DLOCK_URL`; the crate docs
    /// list every form, and the engine options its query takes). Checked by
    /// [`build`](Self::build). Default: `redis://127.0.0.1:6379`.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self.private_memory = false;
        self
    }

    /// Use Redis at this URL (`redis://[user[:password]@]host[:port][/db]`); the same as
    /// [`url`](Self::url), which also takes the other engines' URLs.
    pub fn redis_url(self, url: impl Into<String>) -> Self {
        self.url(url)
    }

    /// Use a new private embedded table instead of a server (`memory://` shares the
    /// process's table instead).
    pub fn memory(mut self) -> Self {
        self.url = Some("memory://".to_owned());
        self.private_memory = true;
        self
    }

    /// Prefix of every lock key. Default: `dlock:`. On ZooKeeper it is the path of the
    /// locks' parent node (`/dlock:/order:42`; `locks/` gives `/locks/order:42`).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.settings.key_prefix = prefix.into();
        self
    }

    /// Default wait. Default: 5s.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeout = timeout;
        self
    }

    /// Default lease, and the lease renewed by `expire = "auto"`. Default: 30s.
    pub fn expire(mut self, expire: Duration) -> Self {
        self.settings.expire = expire;
        self
    }

    /// Bounds of the jittered pause between attempts. Default: 10ms..50ms. A waiter woken by
    /// releases pauses longer between attempts (at least 250-500ms on Redis, RedLock and
    /// PostgreSQL, 1s on etcd and ZooKeeper): there the pause is only a fallback. On Redis,
    /// RedLock and PostgreSQL it is this one again while the waiter's notification connection
    /// is down and after an attempt that failed (doubled after each failure in a row, up to
    /// the longer pause).
    pub fn retry(mut self, min: Duration, max: Duration) -> Self {
        self.settings.retry = (min, max);
        self
    }

    /// Longest key accepted, prefix included, in bytes. Default: 1024.
    pub fn max_key_len(mut self, max: usize) -> Self {
        self.settings.max_key_len = max;
        self
    }

    /// Bound on one backend request (a reply later than this is a failed, ambiguous attempt).
    /// Default: 500ms.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.settings.request_timeout = timeout;
        self
    }

    /// Wake waiters by release notifications (Redis pub/sub; in-process for memory) instead of
    /// only polling. Default: on (`DLOCK_NOTIFY=off` turns it off).
    pub fn notify(mut self, on: bool) -> Self {
        self.settings.notify = on;
        self
    }

    /// An acquisition counts only once this many replicas acknowledged it (Redis `WAIT`, within
    /// the request timeout); with fewer it is undone and the attempt fails with a
    /// [`LockError::Backend`] saying so, retried until the deadline. Redis, Sentinel and Cluster;
    /// the same as the URL's `?wait=N` (which wins). Default: 0, off (`DLOCK_REDIS_WAIT`). It
    /// needs Redis 6.2 or later and, with an ACL, `+client|info`: each acquisition asks `CLIENT
    /// INFO` with its script and with its `WAIT`, so that the `WAIT` counts the very connection
    /// that wrote the lock (see dlock's docs/redis.md).
    pub fn redis_wait(mut self, replicas: u32) -> Self {
        self.settings
            .set_engine_option("wait", replicas.to_string(), "LockerBuilder::redis_wait");
        self
    }

    /// The session timeout asked of ZooKeeper (`zk://` URLs): the longest a crashed or paused
    /// holder keeps its lock, and the longest a lost connection lasts without losing the holds;
    /// the same as the URL's `?session_timeout=10s` (which wins). Default: 10s
    /// (`DLOCK_ZK_SESSION_TIMEOUT`).
    pub fn zk_session_timeout(mut self, timeout: Duration) -> Self {
        self.settings.set_engine_option(
            "session_timeout",
            format!("{}ms", timeout.as_millis()),
            "LockerBuilder::zk_session_timeout",
        );
        self
    }

    /// The holder's name recorded with every lock this locker takes, beside the host name and
    /// the process id (`DLOCK_OWNER`); default: the host name. [`Locker::inspect`] and
    /// `dlock show` read it back.
    pub fn owner(mut self, name: impl AsRef<str>) -> Self {
        self.settings.identity = crate::holder::Identity::new(Some(name.as_ref()));
        self
    }

    /// Checks the settings and builds the locker, without any I/O.
    ///
    /// # Errors
    /// [`LockError::Config`] for an invalid URL, a zero lease, an empty retry range, or a prefix
    /// as long as the key limit.
    pub fn build(mut self) -> Result<Locker, LockError> {
        if let Some(url) = self.url.take() {
            self.settings.url = Some(parse_url("LockerBuilder::url", &url)?);
        }
        self.settings.validate()?;
        let url = match &self.settings.url {
            Some(url) => url.clone(),
            None => parse_url("the default engine URL", DEFAULT_REDIS_URL)?,
        };
        let backend: Arc<dyn Backend> = if self.private_memory {
            Arc::new(MemoryBackend::private(&self.settings.identity))
        } else {
            let built = engine_named(url.engine())
                .and_then(|engine| engine.built)
                .ok_or_else(|| LockError::config("the engine is not compiled in"))?;
            (built.build)(&url, &self.settings)?
        };
        self.settings.url = Some(url);
        Ok(Locker::with_backend(self.settings, backend))
    }
}

impl Locker {
    /// Builds a locker from the `DLOCK_*` environment variables, without any I/O.
    ///
    /// # Errors
    /// [`LockError::Config`] naming the variable whose value is invalid.
    pub fn from_env() -> Result<Self, LockError> {
        LockerBuilder::from_env()?.build()
    }

    /// A locker on a new, private embedded table: locks exclude each other among this locker and
    /// its clones only. For tests and single-process programs.
    #[must_use]
    pub fn memory() -> Self {
        Self::with_backend(
            Settings {
                url: Some(EngineUrl::checked("memory://", "memory")),
                ..Settings::default()
            },
            Arc::new(MemoryBackend::private(&crate::holder::Identity::default())),
        )
    }

    /// A builder starting from the built-in defaults (not the environment; see
    /// [`LockerBuilder::from_env`]).
    pub fn builder() -> LockerBuilder {
        LockerBuilder::default()
    }
}

static GLOBAL: OnceLock<Locker> = OnceLock::new();

/// The process-wide locker used by `#[dlock]` functions without `client = …`: the one installed
/// by [`set_global`], or else one built from the environment on first use.
///
/// # Errors
/// [`LockError::Config`] when the environment is invalid (reported on every use until fixed).
pub fn global() -> Result<&'static Locker, LockError> {
    if let Some(locker) = GLOBAL.get() {
        return Ok(locker);
    }
    let locker = Locker::from_env()?;
    Ok(GLOBAL.get_or_init(|| locker))
}

/// Installs the process-wide locker. Call it before the first locked call.
///
/// # Errors
/// Gives the locker back when one is already installed (or was already built from the
/// environment by an earlier [`global`]).
pub fn set_global(locker: Locker) -> Result<(), Locker> {
    GLOBAL.set(locker)
}
