//! The one error type of dlock.

use std::{error::Error as StdError, fmt, time::Duration};

/// Why a lock could not be had, or was lost.
///
/// Messages name the lock key (never the token, never a password) so they are safe to log.
/// Inspect with the predicates ([`is_timeout`](Self::is_timeout), …) or match the variants;
/// the enum is `#[non_exhaustive]` because later backends and features add cases.
///
/// ```
/// # use dlock_runtime::LockError;
/// # fn check(result: Result<(), LockError>) {
/// match result {
///     Ok(()) => {}
///     Err(e) if e.is_timeout() => eprintln!("busy, try later: {e}"),
///     Err(e) => eprintln!("lock failed: {e}"),
/// }
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// Another holder kept the lock for the whole wait.
    #[error("timed out after {waited:?} waiting for lock `{key}`")]
    #[non_exhaustive]
    Timeout {
        /// The full lock key (prefix included).
        key: String,
        /// How long the caller waited.
        waited: Duration,
    },
    /// The backend could not be reached or answered with an error.
    #[error("lock backend error: {0}")]
    Backend(#[source] BackendError),
    /// The configuration (environment or builder) is invalid.
    #[error("invalid dlock configuration: {0}")]
    Config(String),
    /// The key is empty or longer than the configured maximum; nothing was sent.
    #[error("invalid lock key `{key}`: {reason}")]
    #[non_exhaustive]
    InvalidKey {
        /// The offending key, shortened to its first 64 characters.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The lease was lost while held: it expired, or the key was deleted or taken over.
    #[error("lock `{key}` was lost while held")]
    #[non_exhaustive]
    Lost {
        /// The full lock key (prefix included).
        key: String,
    },
    /// The key is in use in a way this acquisition cannot join: held as another kind of lock
    /// (a mutex, a semaphore, a read/write lock), as a semaphore with another permit count, or
    /// held for reading by the enclosing scope while this acquisition asks to write (a read
    /// lock is never upgraded). Nothing was taken. A mistake in the program, not contention:
    /// waiting would not cure it.
    #[error("lock `{key}` not acquired: {reason}")]
    #[non_exhaustive]
    Conflict {
        /// The full lock key (prefix included).
        key: String,
        /// How the key is in use, and what to do instead.
        reason: String,
    },
    /// The locker was [closed](crate::Locker::close): no acquisition starts any more, and one
    /// that was waiting gave up (after removing what it had put in the engine).
    #[error("lock `{key}` not acquired: the locker was closed")]
    #[non_exhaustive]
    Closed {
        /// The full lock key (prefix included).
        key: String,
    },
}

impl LockError {
    /// `true` for [`LockError::Timeout`]: the lock was busy for the whole wait.
    #[must_use]
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout { .. })
    }

    /// `true` for [`LockError::Backend`]: the server could not be reached or failed.
    #[must_use]
    pub fn is_backend(&self) -> bool {
        matches!(self, Self::Backend(_))
    }

    /// `true` for [`LockError::Config`].
    #[must_use]
    pub fn is_config(&self) -> bool {
        matches!(self, Self::Config(_))
    }

    /// `true` for [`LockError::InvalidKey`].
    #[must_use]
    pub fn is_invalid_key(&self) -> bool {
        matches!(self, Self::InvalidKey { .. })
    }

    /// `true` for [`LockError::Lost`].
    #[must_use]
    pub fn is_lost(&self) -> bool {
        matches!(self, Self::Lost { .. })
    }

    /// `true` for [`LockError::Conflict`]: the key is held as another kind of lock, or an
    /// upgrade from read to write was asked.
    #[must_use]
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Conflict { .. })
    }

    /// `true` for [`LockError::Closed`]: the locker was closed.
    #[must_use]
    pub fn is_closed(&self) -> bool {
        matches!(self, Self::Closed { .. })
    }

    /// The lock key this error is about, when it is about one.
    #[must_use]
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::Timeout { key, .. }
            | Self::InvalidKey { key, .. }
            | Self::Lost { key }
            | Self::Conflict { key, .. }
            | Self::Closed { key } => Some(key),
            Self::Backend(_) | Self::Config(_) => None,
        }
    }

    pub(crate) fn invalid_key(key: &str, reason: impl Into<String>) -> Self {
        let mut shown: String = key.chars().take(64).collect();
        if shown.len() < key.len() {
            shown.push('…');
        }
        Self::InvalidKey {
            key: shown,
            reason: reason.into(),
        }
    }

    pub(crate) fn config(message: impl Into<String>) -> Self {
        Self::Config(message.into())
    }
}

/// A backend failure: what went wrong, with the driver's error as [`source`](StdError::source).
///
/// The message is written by dlock and never holds a URL, a password or a lock token.
pub struct BackendError {
    message: String,
    source: Option<Box<dyn StdError + Send + Sync>>,
    refused: bool,
    /// A release whose first sending may have deleted the key before its reply was lost, and
    /// whose repetition found the key gone: released by it, or lost before it.
    unsettled: bool,
    /// With `unsettled`: the engine can lose a hold without a release (a Redis restart without
    /// persistence, a failover, an eviction), so the lease cannot say it was released.
    may_vanish: bool,
    /// An attempt whose votes split between contenders (RedLock: some masters granted it,
    /// others hold another's key, too few answered for either): a waiter asks again at
    /// `DLOCK_RETRY` a few more times before backing off, as a retry settles a race.
    contended: bool,
}

impl BackendError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            source: None,
            refused: false,
            unsettled: false,
            may_vanish: false,
            contended: false,
        }
    }

    /// A release that may have deleted the key before its reply was lost, and found it gone
    /// when sent again (see [`is_unsettled`](Self::is_unsettled)).
    #[cfg(any(feature = "postgres", feature = "redis"))]
    pub(crate) fn unsettled(mut self) -> Self {
        self.unsettled = true;
        self
    }

    /// An unsettled release on an engine that can lose a hold without a release (see
    /// [`settled_by_lease`](Self::settled_by_lease)).
    #[cfg(feature = "redis")]
    pub(crate) fn may_vanish(mut self) -> Self {
        self.may_vanish = true;
        self
    }

    /// Whether this is a release the engine cannot tell released from lost. Sent after the
    /// hold's lease ran out on the client's clock, it is lost either way.
    pub(crate) fn is_unsettled(&self) -> bool {
        self.unsettled
    }

    /// Whether an unsettled release sent within the lease was the release: where nothing but a
    /// release deletes a hold (PostgreSQL), nobody else could have deleted it; where a hold can
    /// vanish (Redis), it cannot be told.
    pub(crate) fn settled_by_lease(&self) -> bool {
        self.unsettled && !self.may_vanish
    }

    /// An attempt whose votes split between contenders (see [`is_contended`](Self::is_contended)).
    #[cfg(feature = "redlock")]
    pub(crate) fn contended(mut self) -> Self {
        self.contended = true;
        self
    }

    /// Whether the attempt failed because its votes split with another contender's, not
    /// because the engine failed it alone: asked again soon, a race between live contenders
    /// settles itself.
    pub(crate) fn is_contended(&self) -> bool {
        self.contended
    }

    /// An error that asking again cannot cure (a permission the server's ACL denies, a lock key
    /// holding another type): an acquisition fails at once instead of retrying to its deadline.
    #[cfg(feature = "__net")]
    pub(crate) fn refused(mut self) -> Self {
        self.refused = true;
        self
    }

    /// `true` when the server refused the request for a reason that retrying cannot cure: a
    /// permission its ACL denies, credentials it does not accept, a lock key holding a value of
    /// another type. Such an acquisition fails at once rather than at its deadline.
    #[must_use]
    pub fn is_refused(&self) -> bool {
        self.refused
    }

    #[cfg(feature = "__token-lease")]
    pub(crate) fn with_source(
        message: impl Into<String>,
        source: impl StdError + Send + Sync + 'static,
    ) -> Self {
        Self {
            message: message.into(),
            source: Some(Box::new(source)),
            refused: false,
            unsettled: false,
            may_vanish: false,
            contended: false,
        }
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackendError")
            .field("message", &self.message)
            .field("source", &self.source)
            .field("refused", &self.refused)
            .finish()
    }
}

impl StdError for BackendError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

impl From<BackendError> for LockError {
    fn from(error: BackendError) -> Self {
        Self::Backend(error)
    }
}
