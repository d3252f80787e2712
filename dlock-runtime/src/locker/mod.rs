//! The handle users hold: configuration plus one engine, the API of locks, and the pieces of
//! an acquisition in their own modules: the in-process line and passing ([`line`]), the wait
//! as named steps ([`wait`]), release and cleanup ([`release`]), closing ([`close`]), and the
//! builder with the process-wide locker ([`builder`]).

use std::{
    fmt,
    sync::{Arc, atomic::AtomicU64},
    time::Duration,
};

use tokio::time::Instant;
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::Instrument as _;

mod builder;
mod close;
mod line;
mod release;
mod wait;

pub use builder::{LockerBuilder, global, set_global};
pub(crate) use release::spawn_release;

use crate::{
    LockError, LockGuard, LockOptions,
    backend::{Attempt, Backend, Capabilities, FairOrder, MemoryBackend, Request, Token, Watch},
    config::Settings,
    guard::Hold,
    lease::{Grant, Lease},
    options::Expire,
    url::EngineUrl,
};
use line::Lines;
use wait::Wait;

/// A connection to a lock service, with its defaults. Cheap to clone (an `Arc`); clones share
/// the connection. `Send + Sync`.
///
/// ```
/// # async fn demo() -> Result<(), dlock_runtime::LockError> {
/// use std::time::Duration;
/// use dlock_runtime::{LockOptions, Locker};
///
/// let locker = Locker::memory();
/// let guard = locker
///     .acquire("order:42", LockOptions::new().timeout(Duration::from_secs(1)))
///     .await?;
/// assert_eq!(guard.key(), "dlock:order:42");
/// guard.release().await?;
/// # Ok(()) }
/// ```
///
/// # Behavior
/// - **Connection**: [`from_env`](Self::from_env) and the [builder](Self::builder) do no I/O; the
///   Redis connection is made on first use, multiplexed for every lock of this locker and its
///   clones, and re-established by itself after the server or the network drops it.
/// - **Waiting**: an acquisition tries at once, then sleeps a jittered pause (`DLOCK_RETRY`,
///   never longer than the holder's remaining lease nor past the deadline) between attempts; the
///   last attempt is made at the deadline. A timeout of zero makes exactly one attempt.
/// - **Ambiguous replies**: an attempt whose reply is lost keeps the same token, so the next
///   attempt recognises a lock it set itself; giving up removes such a lock.
/// - **Cancellation**: dropping an acquisition future leaves no lock behind.
/// - **Backend errors** while waiting are retried until the deadline; the last one is returned as
///   [`LockError::Backend`] when the deadline passes. A refusal that asking again cannot cure (a
///   permission the server's ACL denies, a lock key holding another type) fails at once.
/// - **Notifications**: a waiter refused once subscribes to the key's release channel (one
///   pub/sub connection per locker; a channel stays subscribed 2s after its last waiter) and is
///   woken by releases; the pause is the fallback.
/// - **Hot keys**: waiters of one key on one locker queue in-process (first come, first served)
///   and only the first asks the engine. On Redis and the embedded engine that first waiter holds
///   the process's place in the key's queue, kept for the waiters behind it: a release names the
///   place first in line, so it wakes one waiter of one process. In the default mode a free lock
///   still goes to whoever asks first; `fair` takes it only at the head of the queue.
/// - **Passing** (default mode, Redis and the embedded engine): a holder that releases while a
///   waiter of its locker is first in line passes the lock straight to that waiter, in one
///   request (a compare-and-set of the key to the waiter's token, with a new fence) instead of
///   deleting it and waking someone. At most 4 times in a row; then the release frees the key
///   and wakes the place first in the queue, so another process's waiters get their turn.
/// - **Re-entry**: inside a `#[dlock]` body or [`LockGuard::scope`], acquiring a key that scope
///   holds through this locker (or a clone) returns at once; nowhere else.
#[derive(Clone)]
pub struct Locker {
    inner: Arc<Inner>,
}

struct Inner {
    settings: Settings,
    backend: Arc<dyn Backend>,
    lines: Lines,
    /// What the engine can do, read once. How it orders waiters: on [`FairOrder::Queue`]
    /// waiters wait in the engine's queue of places; on [`FairOrder::Native`] (etcd, ZooKeeper)
    /// every attempt takes a place in the engine's own line, so a waiter holding one there must
    /// never also wait behind this process's other waiters here, or they would wait for each
    /// other: every waiter joins the in-process line before its first attempt there, as a fair
    /// one does everywhere. Whether it passes a hold straight to another acquisition
    /// ([`Backend::pass`]).
    capabilities: Capabilities,
    /// Acquisitions under way: [`Locker::close`] waits for them to give up.
    acquiring: TaskTracker,
    /// Releases and cleanups handed to the runtime (a guard dropped, a wait dropped, a
    /// removal that outlasted its bound): [`Locker::close`] waits for them.
    background: TaskTracker,
    /// Cancelled by [`Locker::close`]: no acquisition starts, waits give up.
    closing: CancellationToken,
    /// The holds guards still have, for [`Locker::close`].
    holds: Holds,
}

/// The holds of a locker's guards, by number, so that [`Locker::close`] can release those
/// still held. A hold adds itself when it is made and goes when it is dropped.
#[derive(Default)]
struct Holds {
    map: std::sync::Mutex<std::collections::HashMap<u64, std::sync::Weak<Hold>>>,
    next: AtomicU64,
}

impl Holds {
    fn map(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, std::sync::Weak<Hold>>> {
        self.map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl fmt::Debug for Locker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.inner.settings;
        f.debug_struct("Locker")
            .field("engine", &s.url.as_ref().map(EngineUrl::engine))
            .field("url", &s.url)
            .field("key_prefix", &s.key_prefix)
            .field("timeout", &s.timeout)
            .field("expire", &s.expire)
            .finish_non_exhaustive()
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
                url: EngineUrl::parse("Locker::memory", "memory://").ok(),
                ..Settings::default()
            },
            Arc::new(MemoryBackend::default()),
        )
    }

    /// A builder starting from the built-in defaults (not the environment; see
    /// [`LockerBuilder::from_env`]).
    pub fn builder() -> LockerBuilder {
        LockerBuilder::default()
    }

    fn with_backend(settings: Settings, backend: Arc<dyn Backend>) -> Self {
        Self {
            inner: Arc::new(Inner {
                settings,
                capabilities: backend.capabilities(),
                backend,
                lines: Lines::default(),
                acquiring: TaskTracker::new(),
                background: TaskTracker::new(),
                closing: CancellationToken::new(),
                holds: Holds::default(),
            }),
        }
    }

    /// The configured prefix of every lock key (`DLOCK_KEY_PREFIX`).
    #[must_use]
    pub fn key_prefix(&self) -> &str {
        &self.inner.settings.key_prefix
    }

    pub(crate) fn backend(&self) -> &dyn Backend {
        &*self.inner.backend
    }

    /// Waits for the lock on `key` (the configured prefix is put in front) and returns a guard
    /// that releases it when dropped or [released](LockGuard::release).
    ///
    /// # Errors
    /// - [`LockError::Timeout`] when another holder kept it for the whole wait;
    /// - [`LockError::Backend`] when the server could not be reached until the deadline;
    /// - [`LockError::InvalidKey`] for an empty key or one longer than `DLOCK_MAX_KEY_LEN`
    ///   (nothing is sent);
    /// - [`LockError::Config`] for a zero lease, or `max_hold` without `expire_auto`.
    pub async fn acquire(&self, key: &str, options: LockOptions) -> Result<LockGuard, LockError> {
        self.acquire_full(self.full_key(key)?, options).await
    }

    /// [`acquire`](Self::acquire) with a key the caller made for it (the attribute's): its
    /// buffer becomes the full key.
    pub(crate) async fn acquire_owned(
        &self,
        key: String,
        options: LockOptions,
    ) -> Result<LockGuard, LockError> {
        self.acquire_full(self.full_key_from(key)?, options).await
    }

    async fn acquire_full(
        &self,
        full_key: String,
        options: LockOptions,
    ) -> Result<LockGuard, LockError> {
        let settings = &self.inner.settings;
        let timeout = options.timeout.unwrap_or(settings.timeout);
        let lease = match options.expire {
            Some(Expire::Fixed(length)) => Lease {
                length,
                renewed: false,
            },
            Some(Expire::Auto) => Lease {
                length: settings.expire,
                renewed: true,
            },
            None => Lease {
                length: settings.expire,
                renewed: false,
            },
        };
        crate::lease::check_lease(lease.length)?;
        if options.max_hold.is_some() && !lease.renewed {
            // A fixed lease already ends on its own; a ceiling on renewal would be ignored.
            return Err(LockError::config(
                "max_hold: only a renewed lease (`expire_auto`) has a ceiling to set",
            ));
        }
        if let Some(guard) = self.reenter(&full_key) {
            return Ok(guard);
        }
        if self.is_closing() {
            return Err(LockError::Closed { key: full_key });
        }
        // Counted until it returns (or is dropped): `close` waits for it to give up.
        let _acquiring = self.inner.acquiring.token();
        if options.fair
            && let FairOrder::Unsupported(why) = self.inner.capabilities.fair
        {
            return Err(LockError::config(format!("fair: {why}")));
        }
        let span = tracing::debug_span!("dlock.acquire", key = %full_key, name = options.name, ?timeout, expire = ?lease.length, renewed = lease.renewed);
        Wait::new(self, full_key, timeout, lease, &options)?
            .run()
            .instrument(span)
            .await
    }

    /// One attempt: the guard when the lock was free, `None` when it is held.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire), except that a busy lock is `Ok(None)`.
    pub async fn try_acquire(
        &self,
        key: &str,
        expire: Duration,
    ) -> Result<Option<LockGuard>, LockError> {
        match self
            .acquire(
                key,
                LockOptions::new().timeout(Duration::ZERO).expire(expire),
            )
            .await
        {
            Ok(guard) => Ok(Some(guard)),
            Err(LockError::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Two attempts with one token, as when the first attempt's reply was lost and the wait
    /// tried again: the first attempt's fence (which its caller never learnt) and the guard of
    /// the second. For the shared semantic suite, through `__private`.
    pub(crate) async fn attempt_twice(
        &self,
        key: &str,
        lease: Duration,
    ) -> Result<(u64, LockGuard), LockError> {
        crate::lease::check_lease(lease)?;
        let key = self.full_key(key)?;
        let token = Token::generate()?;
        let request = Request {
            key: &key,
            token: &token,
            lease,
            queue: None,
        };
        let Attempt::Acquired { fence: first, .. } = self.backend().acquire(request).await? else {
            return Err(LockError::Timeout {
                key,
                waited: Duration::ZERO,
            });
        };
        let sent_at = Instant::now();
        let Attempt::Acquired {
            fence,
            granted,
            lost,
        } = self.backend().acquire(request).await?
        else {
            return Err(LockError::Lost { key });
        };
        let lease = Lease {
            length: lease,
            renewed: false,
        }
        .granted(granted);
        let grant = Grant {
            fence,
            sent_at,
            lease,
            lost,
        };
        let hold = Hold::new(self.clone(), key, token, &grant, None);
        hold.follow_engine(grant.lost);
        Ok((first, LockGuard::new(hold, lease, None)))
    }

    pub(crate) fn same_as(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// A further guard when an enclosing scope of this task (a locked body, or
    /// [`LockGuard::scope`]) holds `key` through this locker.
    fn reenter(&self, key: &str) -> Option<LockGuard> {
        let hold = crate::scope::scoped_hold(self, key)?;
        if !hold.reenter() {
            return None;
        }
        tracing::debug!(key = %key, fencing_token = hold.fence(), "lock re-entered by its holder");
        Some(LockGuard::reentered(hold))
    }

    fn full_key(&self, key: &str) -> Result<String, LockError> {
        self.check_key(key)?;
        let prefix = &self.inner.settings.key_prefix;
        let mut full = String::with_capacity(prefix.len() + key.len());
        full.push_str(prefix);
        full.push_str(key);
        self.engine_accepts(full)
    }

    /// [`full_key`](Self::full_key) made in `key`'s own buffer (no allocation when it has room
    /// for the prefix).
    fn full_key_from(&self, mut key: String) -> Result<String, LockError> {
        self.check_key(&key)?;
        key.insert_str(0, &self.inner.settings.key_prefix);
        self.engine_accepts(key)
    }

    /// The full key, unless the engine cannot store it.
    fn engine_accepts(&self, full: String) -> Result<String, LockError> {
        match self.backend().key_error(&full) {
            Some(reason) => {
                let key = &full[self.inner.settings.key_prefix.len()..];
                Err(LockError::invalid_key(key, reason))
            }
            None => Ok(full),
        }
    }

    /// The rules for a key, before its prefix.
    fn check_key(&self, key: &str) -> Result<(), LockError> {
        let settings = &self.inner.settings;
        if key.is_empty() {
            return Err(LockError::invalid_key(key, "the key is empty"));
        }
        let len = settings.key_prefix.len() + key.len();
        if len > settings.max_key_len {
            return Err(LockError::invalid_key(
                key,
                format!(
                    "the key is {len} bytes with its prefix; the longest accepted is {} (DLOCK_MAX_KEY_LEN)",
                    settings.max_key_len
                ),
            ));
        }
        // The engines' own bookkeeping lives in a reserved namespace after the prefix,
        // `__word:` (Redis's fencing counters `__fence:{tag}`, fair mode's `__fair:{…}`): a lock
        // key may not start so, on any engine alike.
        if let Some(word) = key.strip_prefix("__").and_then(|rest| rest.split_once(':'))
            && !word.0.is_empty()
            && word.0.bytes().all(|b| b.is_ascii_lowercase())
        {
            return Err(LockError::invalid_key(
                key,
                "keys starting with `__<word>:` (after the prefix, like `__fence:`) are \
                 reserved for the engines' own bookkeeping",
            ));
        }
        Ok(())
    }
}

impl Locker {
    /// A release wake-up for `key`: a subscription already up (no I/O), or else a new one.
    async fn wake_up(&self, key: &str, token: &Token) -> Option<Watch> {
        match self.backend().watching(key, token) {
            Some(watch) => Some(watch),
            None => self.backend().watch(key, token).await,
        }
    }
}
