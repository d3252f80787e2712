//! The handle users hold: configuration plus one engine. Its parts live in their own modules,
//! each below the one that uses it: acquiring ([`acquire`]: the API and the key rules), the
//! wait as named steps ([`wait`]), the in-process line and passing ([`line`]), release and
//! cleanup ([`release`]), closing and the readiness check ([`close`]), and the builder with the
//! process-wide locker ([`builder`]).

use std::{
    fmt,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use tokio_util::{sync::CancellationToken, task::TaskTracker};

mod acquire;
pub(crate) mod builder;
mod close;
mod inspect;
mod line;
pub(crate) mod release;
mod wait;

use crate::{
    backend::{Backend, BoxFuture, Capabilities, FairOrder},
    config::Settings,
    error::BackendError,
    url::EngineUrl,
};
use line::Lines;

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
///   clones, and re-established by itself after the server or the network drops it (a request
///   that finds it dropped is sent once more on the new one: see `docs/redis.md`).
/// - **Waiting**: an acquisition tries at once, then sleeps a jittered pause (`DLOCK_RETRY`,
///   never longer than the holder's remaining lease nor past the deadline) between attempts; the
///   last attempt is made at the deadline. A timeout of zero makes exactly one attempt.
/// - **Ambiguous replies**: an attempt whose reply is lost keeps the same token, so the next
///   attempt recognises a lock it set itself; giving up removes such a lock.
/// - **Cancellation**: dropping an acquisition future leaves no lock behind.
/// - **Backend errors** while waiting are retried until the deadline; the last one is returned as
///   [`LockError::Backend`](crate::LockError::Backend) when the deadline passes. A refusal that asking again cannot cure (a
///   permission the server's ACL denies, a lock key holding another type) fails at once.
/// - **Notifications**: a waiter refused once subscribes to the release channel of its key (on
///   Redis, of its process's place in the key's queue; one pub/sub connection per locker, asked
///   a `PING` every 3s while it has channels; a channel stays subscribed 2s after its last
///   waiter) and is woken by releases; the pause is
///   the fallback, longer once the wake-up is had: 250-500ms (at least `DLOCK_RETRY`) on Redis,
///   RedLock and PostgreSQL, whose releases name the place they wake (`DLOCK_RETRY` again while
///   the notification connection is down, and after an attempt that failed, backing off over
///   failures in a row), 1s on etcd and
///   ZooKeeper.
/// - **Hot keys**: waiters of one key on one locker queue in-process (first come, first served)
///   and only the first asks the engine. On Redis (RedLock: in the key's first master) and the
///   embedded engine, that first waiter holds
///   the process's place in the key's queue, kept for the waiters behind it: a release names the
///   place first in line, so it wakes one waiter of one process. In the default mode a free lock
///   still goes to whoever asks first; `fair` takes it only at the head of the queue.
/// - **Passing** (default mode, Redis, RedLock and the embedded engine): a holder that releases
///   while a waiter of its locker is first in line passes the lock straight to that waiter, in
///   one request (a compare-and-set of the key to the waiter's token, with a new fence; on
///   RedLock one round of them, one per master) instead of deleting it and waking someone. At most 4 times in a row; then the release frees the key
///   and wakes the place first in the queue, so another process's waiters get their turn.
/// - **Re-entry**: inside a `#[dlock]` body or [`LockGuard::scope`](crate::LockGuard::scope), acquiring a key that scope
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
    /// Ordered by number, not hashed: numbers only grow, so a hold's entry goes at the end (a
    /// `HashMap`'s SipHash of the number was most of a registration's cost, counted).
    map: std::sync::Mutex<std::collections::BTreeMap<u64, std::sync::Weak<dyn HeldLock>>>,
    next: AtomicU64,
}

/// A hold a guard still has, as [`Locker::close`] sees it.
pub(crate) trait HeldLock: Send + Sync {
    /// Counts the hold lost, stops its renewal, and releases it unless its release was sent.
    fn close(&self) -> BoxFuture<'_, Result<(), BackendError>>;
    /// Its full key, for a warning.
    fn key(&self) -> &str;
}

impl Holds {
    fn map(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<u64, std::sync::Weak<dyn HeldLock>>>
    {
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
    fn with_backend(settings: Settings, backend: Arc<dyn Backend>) -> Self {
        let (background, closing) = (TaskTracker::new(), CancellationToken::new());
        let capabilities = backend.capabilities();
        // A line's place serves an engine that keeps a queue of them.
        let places = capabilities.fair == FairOrder::Queue || capabilities.places;
        Self {
            inner: Arc::new(Inner {
                settings,
                capabilities,
                lines: Lines::new(backend.clone(), places, background.clone(), closing.clone()),
                backend,
                acquiring: TaskTracker::new(),
                background,
                closing,
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

    pub(crate) fn same_as(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Whether [`close`](Self::close) was called.
    pub(crate) fn is_closing(&self) -> bool {
        self.inner.closing.is_cancelled()
    }

    /// Runs `task` on `runtime` (or the current one), counted by [`close`](Self::close); `None`
    /// when there is no runtime to run it on.
    pub(crate) fn spawn_background<T: Send + 'static>(
        &self,
        runtime: Option<&tokio::runtime::Handle>,
        task: impl std::future::Future<Output = T> + Send + 'static,
    ) -> Option<tokio::task::JoinHandle<T>> {
        let runtime = runtime
            .cloned()
            .or_else(|| tokio::runtime::Handle::try_current().ok())?;
        Some(self.inner.background.spawn_on(task, &runtime))
    }

    pub(crate) fn next_hold_id(&self) -> u64 {
        self.inner.holds.next.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn register_hold(&self, id: u64, hold: std::sync::Weak<dyn HeldLock>) {
        self.inner.holds.map().insert(id, hold);
    }

    pub(crate) fn forget_hold(&self, id: u64) {
        self.inner.holds.map().remove(&id);
    }
}
