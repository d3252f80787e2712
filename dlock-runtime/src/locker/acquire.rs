//! Acquiring: the API of locks on a [`Locker`], and the rules for keys.

use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument as _;

use super::{Locker, wait::Wait};
use crate::{
    LockError, LockGuard, LockKind, LockOptions,
    backend::{Attempt, FairOrder, Request, Token},
    guard::{Hold, scoped_hold},
    lease::{Grant, Lease},
    options::Expire,
};

impl Locker {
    /// Waits for the lock on `key` (the configured prefix is put in front) and returns a guard
    /// that releases it when dropped or [released](LockGuard::release).
    ///
    /// # Errors
    /// - [`LockError::Timeout`] when another holder kept it for the whole wait;
    /// - [`LockError::Backend`] when the server could not be reached until the deadline;
    /// - [`LockError::InvalidKey`] for an empty key or one longer than `DLOCK_MAX_KEY_LEN`
    ///   (nothing is sent);
    /// - [`LockError::Config`] for a zero lease, or `max_hold` without `expire_auto`;
    /// - [`LockError::Conflict`] when the key is held as another kind of lock (see
    ///   [`LockOptions::permits`], [`LockOptions::read`], [`LockOptions::write`]).
    pub async fn acquire(&self, key: &str, options: LockOptions) -> Result<LockGuard, LockError> {
        self.acquire_full(self.full_key(key)?, &options).await
    }

    /// Waits for one of `permits` permits of the counting semaphore `key`: at most `permits`
    /// holders at once, each with its own lease (see [`LockOptions::permits`]). The guard
    /// works as a mutex's does.
    ///
    /// ```
    /// # async fn demo() -> Result<(), dlock_runtime::LockError> {
    /// use dlock_runtime::{LockOptions, Locker};
    ///
    /// let locker = Locker::memory();
    /// let permit = locker.acquire_permit("export:acme", 3, LockOptions::new()).await?;
    /// // … at most 3 exports of this tenant run at once, across every process …
    /// permit.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire); [`LockError::Config`] for `permits == 0` or on an engine
    /// that cannot count holders (RedLock); [`LockError::Conflict`] when the key is held with
    /// another permit count, or as another kind of lock.
    pub async fn acquire_permit(
        &self,
        key: &str,
        permits: u32,
        options: LockOptions,
    ) -> Result<LockGuard, LockError> {
        self.acquire(key, options.permits(permits)).await
    }

    /// Waits for a read (shared) hold of the read/write lock `key` (see [`LockOptions::read`]).
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire); [`LockError::Config`] on an engine that cannot count
    /// holders (RedLock).
    pub async fn acquire_read(
        &self,
        key: &str,
        options: LockOptions,
    ) -> Result<LockGuard, LockError> {
        self.acquire(key, options.read()).await
    }

    /// Waits for the write (exclusive) hold of the read/write lock `key` (see
    /// [`LockOptions::write`]).
    ///
    /// ```
    /// # async fn demo() -> Result<(), dlock_runtime::LockError> {
    /// use dlock_runtime::{LockOptions, Locker};
    ///
    /// let locker = Locker::memory();
    /// let reader = locker.acquire_read("doc:7", LockOptions::new()).await?;
    /// let refused = reader
    ///     .scope(locker.acquire_write("doc:7", LockOptions::new()))
    ///     .await;
    /// assert!(refused.is_err_and(|e| e.is_conflict()), "no upgrade from read to write");
    /// reader.release().await?;
    /// let writer = locker.acquire_write("doc:7", LockOptions::new()).await?;
    /// writer.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire); [`LockError::Conflict`] inside a read hold of the same
    /// key (an upgrade); [`LockError::Config`] on an engine that cannot count holders
    /// (RedLock).
    pub async fn acquire_write(
        &self,
        key: &str,
        options: LockOptions,
    ) -> Result<LockGuard, LockError> {
        self.acquire(key, options.write()).await
    }

    /// [`acquire`](Self::acquire) with a key the caller made for it (the attribute's): its
    /// buffer becomes the full key.
    pub(crate) async fn acquire_owned(
        &self,
        key: String,
        options: LockOptions,
    ) -> Result<LockGuard, LockError> {
        self.acquire_full(self.full_key_from(key)?, &options).await
    }

    /// `options` by reference: an `async fn` keeps each argument twice in its future (the
    /// argument and its binding), and the caller's future holds the options already.
    async fn acquire_full(
        &self,
        full_key: String,
        options: &LockOptions,
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
        self.check_kind(options)?;
        if let Some(minimum) = options.hold_at_least {
            if let Some(why) = self.inner.capabilities.cannot_keep {
                return Err(LockError::config(format!("hold_at_least: {why}")));
            }
            if minimum.is_zero() || minimum > crate::MAX_LEASE {
                return Err(LockError::config(
                    "hold_at_least: expected a positive duration of at most 365 days",
                ));
            }
        }
        if let Some(guard) = self.reenter(&full_key, options.kind)? {
            return Ok(guard);
        }
        if self.is_closing() {
            let closed = Err(LockError::Closed { key: full_key });
            crate::stats::Waiting::start(options.name).finish(&closed);
            return closed;
        }
        // Counted until it returns (or is dropped): `close` waits for it to give up.
        let _acquiring = self.inner.acquiring.token();
        if options.fair
            && let FairOrder::Unsupported(why) = self.inner.capabilities.fair
        {
            return Err(LockError::config(format!("fair: {why}")));
        }
        let span = tracing::debug_span!("dlock.acquire", key = %full_key, name = options.name, ?timeout, expire = ?lease.length, renewed = lease.renewed);
        let waiting = crate::stats::Waiting::start(options.name);
        let result = Wait::run(self, full_key, timeout, lease, options)
            .instrument(span)
            .await;
        waiting.finish(&result);
        result
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
            kind: LockKind::Mutex,
            liveness: lease,
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
            counted_from,
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
            sent_at: counted_from.map_or(sent_at, |from| from.max(sent_at)),
            lease,
            lost,
        };
        let hold = Hold::new(
            self.clone(),
            key,
            LockKind::Mutex,
            token,
            &grant,
            None,
            None,
        );
        hold.follow_engine(grant.lost);
        Ok((first, LockGuard::new(hold, lease, None)))
    }

    /// What the engine must be able to hold for `options`' kind, checked before anything is
    /// sent.
    fn check_kind(&self, options: &LockOptions) -> Result<(), LockError> {
        let kind = options.kind;
        if kind.is_mutex() {
            return Ok(());
        }
        if let Some(why) = self.inner.capabilities.cannot_share {
            return Err(LockError::config(format!("{kind}: {why}")));
        }
        if kind == (LockKind::Semaphore { permits: 0 }) {
            return Err(LockError::config(
                "permits: a semaphore of 0 permits admits nobody; give at least 1",
            ));
        }
        if options.hold_at_least.is_some() {
            return Err(LockError::config(format!(
                "hold_at_least: a job lock's minimum hold is for a mutex, not a {kind}"
            )));
        }
        if options.fair && self.inner.capabilities.fair != FairOrder::Native {
            return Err(LockError::config(format!(
                "fair: a {kind} is served in arrival order on the engines with a line of their \
                 own (etcd, ZooKeeper); on this engine leave `fair` off"
            )));
        }
        Ok(())
    }

    /// A further guard when an enclosing scope of this task (a locked body, or
    /// [`LockGuard::scope`]) holds `key` through this locker as `kind` (a write hold covers a
    /// read); a conflict when it holds it as another kind, or for reading while `kind` asks to
    /// write (an upgrade, which could deadlock with another reader doing the same).
    fn reenter(&self, key: &str, kind: LockKind) -> Result<Option<LockGuard>, LockError> {
        let Some(hold) = scoped_hold(self, key) else {
            return Ok(None);
        };
        let held = hold.kind();
        if held != kind && !(held == LockKind::Write && kind == LockKind::Read) {
            let reason = if held == LockKind::Read && kind == LockKind::Write {
                "this task holds it for reading, and a read lock is not upgraded to a write \
                 lock (two readers upgrading would wait for each other forever); release the \
                 read lock first, or take the write lock from the start"
                    .to_owned()
            } else {
                format!("this task holds it as a {held}; it cannot also take it as a {kind}")
            };
            return Err(LockError::Conflict {
                key: key.to_owned(),
                reason,
            });
        }
        if !hold.reenter() {
            return Ok(None);
        }
        tracing::debug!(key = %key, fencing_token = hold.fence(), "lock re-entered by its holder");
        Ok(Some(LockGuard::reentered(hold)))
    }

    pub(super) fn full_key(&self, key: &str) -> Result<String, LockError> {
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
