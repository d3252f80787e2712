//! What a holder holds: the guard, its lease on the client's clock, the watchdog, and the
//! holder scope (which holds the locked bodies running on a task have, for re-entry and
//! [`fencing_token`]).

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::{sync::Notify, task::JoinHandle, time::Instant};

use crate::{
    LockError, LockKind, Locker,
    backend::{BoxFuture, Token},
    error::BackendError,
    lease::{Grant, Lease, valid_until},
    locker::{HeldLock, release::spawn_release},
};

/// The hold as the client sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Ours until this instant of the client's monotonic clock (lease minus a safety margin,
    /// counted from when the request that set it was sent).
    Held {
        valid_until: Instant,
    },
    Lost,
}

/// Shared by the guard and its watchdog.
#[derive(Debug)]
pub(crate) struct Hold {
    locker: Locker,
    key: String,
    /// The mutex, a permit, a read or a write hold.
    kind: LockKind,
    token: Token,
    fence: u64,
    acquired_at: Instant,
    lease: Duration,
    /// Held until when, or lost; changed under its lock, then `changed` wakes those who wait
    /// for a loss. (A `watch` channel did both in a separate allocation of 8 `Notify`s, made
    /// and dropped at every acquisition.)
    state: Mutex<State>,
    changed: Notify,
    /// Guards sharing this hold: the first acquisition plus re-entries in its scope.
    holders: AtomicUsize,
    watchdog: Mutex<Option<JoinHandle<()>>>,
    /// The runtime it was acquired on: a guard dropped elsewhere (another thread, no runtime)
    /// still hands its release there.
    runtime: Option<tokio::runtime::Handle>,
    /// Extensions (watchdog and `extend`) one at a time, so the client applies them in the
    /// order the server ran them.
    extending: tokio::sync::Mutex<()>,
    /// Its number among its locker's holds ([`Locker::close`] releases those still held).
    id: u64,
    /// Its release was sent (or handed over): by the last guard, or by the locker's `close`.
    /// Sent once, whichever comes first.
    released: AtomicBool,
    /// The name of this kind of lock (`#[dlock]`'s key template), for the events.
    name: Option<&'static str>,
    /// `hold_at_least`: a release before this keeps the key until then.
    keep_until: Option<Instant>,
}

impl Hold {
    /// The hold of `key` (a lock of `kind`) by `token` that `grant` describes (its loss signal
    /// is the caller's to follow, [`follow_engine`](Self::follow_engine)); `name` names it in
    /// events; a release within `hold_at_least` of now keeps the key until then.
    pub(crate) fn new(
        locker: Locker,
        key: String,
        kind: LockKind,
        token: Token,
        grant: &Grant,
        name: Option<&'static str>,
        hold_at_least: Option<Duration>,
    ) -> Arc<Self> {
        let acquired_at = Instant::now();
        let (fence, lease) = (grant.fence, grant.lease.length);
        let state = Mutex::new(State::Held {
            valid_until: valid_until(grant.sent_at, lease),
        });
        let id = locker.next_hold_id();
        let hold = Arc::new(Self {
            locker: locker.clone(),
            key,
            kind,
            token,
            fence,
            acquired_at,
            lease,
            state,
            changed: Notify::new(),
            holders: AtomicUsize::new(1),
            watchdog: Mutex::new(None),
            runtime: tokio::runtime::Handle::try_current().ok(),
            extending: tokio::sync::Mutex::new(()),
            id,
            released: AtomicBool::new(false),
            name,
            keep_until: hold_at_least.and_then(|d| acquired_at.checked_add(d)),
        });
        let weak: std::sync::Weak<dyn HeldLock> = Arc::downgrade(&hold) as std::sync::Weak<Self>;
        locker.register_hold(id, weak);
        crate::stats::hold_began(name);
        hold
    }

    /// Claims the one release of this hold: `false` when it was claimed already (the locker
    /// was closed, or the last guard released it).
    pub(crate) fn claim_release(&self) -> bool {
        let claimed = !self.released.swap(true, Ordering::AcqRel);
        if claimed {
            crate::stats::hold_ended(self.name, self.acquired_at.elapsed());
        }
        claimed
    }

    fn stop_watchdog(&self) {
        if let Some(watchdog) = self
            .watchdog
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            watchdog.abort();
        }
    }

    /// Marks the hold lost when the engine reports it gone (`signal`) while the hold lives.
    pub(crate) fn follow_engine(self: &Arc<Self>, signal: Option<crate::lease::LossSignal>) {
        let Some(signal) = signal else {
            return;
        };
        let hold = Arc::downgrade(self);
        signal.on_fire(move || {
            if let Some(hold) = hold.upgrade() {
                hold.mark_lost("the engine reported the lease gone");
            }
        });
    }

    /// Hands the compare-and-delete of this hold to the runtime it was acquired on (unless its
    /// release was sent already).
    fn release_in_background(&self) {
        if self.claim_release() {
            self.hand_release_over();
        }
    }

    /// Hands the release this hold claimed to the runtime it was acquired on.
    fn hand_release_over(&self) {
        spawn_release(
            self.runtime.as_ref(),
            self.locker.clone(),
            (self.key.clone(), self.kind),
            self.token.clone(),
            true,
            self.keep_until,
        );
    }

    /// One extension, applied to the client's view only if the server ran it and the hold was
    /// not counted lost meanwhile. `Ok(false)`: the key is gone or not ours, or the hold had
    /// ended on the client's clock (the hold is lost). Loss is final: a hold whose lease ran
    /// out on the client's clock sends nothing, and a success answered after that end does not
    /// make it held again (the body may have been stopped, or `is_held` said `false`, on it).
    ///
    /// A lease that ends sooner than the client's view applies before the request is sent: the
    /// server may run it and its reply never come (a timeout, a lost connection, this future
    /// dropped), and the hold must not outlive the lease the server may have set.
    async fn extend(&self, lease: Duration) -> Result<bool, crate::error::BackendError> {
        let _one_at_a_time = self.extending.lock().await;
        if !self.still_held() {
            return Ok(false);
        }
        let sent_at = Instant::now();
        self.shorten_to(valid_until(sent_at, lease));
        if self
            .locker
            .backend()
            .extend(&self.key, self.kind, &self.token, lease)
            .await?
        {
            Ok(self.renewed(sent_at, lease))
        } else {
            Ok(false)
        }
    }

    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    pub(crate) fn locker(&self) -> &Locker {
        &self.locker
    }

    pub(crate) fn fence(&self) -> u64 {
        self.fence
    }

    pub(crate) fn kind(&self) -> LockKind {
        self.kind
    }

    /// Adds a holder if the hold is still good; `false` when it is lost or already let go.
    pub(crate) fn reenter(&self) -> bool {
        if !self.is_held() {
            return false;
        }
        self.holders
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n > 0).then_some(n + 1)
            })
            .is_ok()
    }

    /// Removes a holder; `true` for the last one, who must release the key.
    fn leave(&self) -> bool {
        let last = self.holders.fetch_sub(1, Ordering::AcqRel) == 1;
        if last {
            self.stop_watchdog();
        }
        last
    }

    /// Records a successful extension whose request was sent at `sent_at`; `false` when the hold
    /// was already counted lost, or its lease ran out on the client's clock before the reply
    /// came (it is marked lost then): it stays lost, the body may have been stopped on it.
    fn renewed(&self, sent_at: Instant, lease: Duration) -> bool {
        let seen = {
            let mut state = self.state_lock();
            match &mut *state {
                State::Held { valid_until: until } if Instant::now() < *until => {
                    *until = valid_until(sent_at, lease);
                    None
                }
                State::Held { .. } => Some(*state),
                State::Lost => return false,
            }
        };
        match seen {
            None => {
                self.changed.notify_waiters();
                true
            }
            Some(seen) => {
                self.lapsed(seen);
                false
            }
        }
    }

    /// Ends the hold at `until` on the client's clock if it ended later.
    fn shorten_to(&self, until: Instant) {
        let shortened = match &mut *self.state_lock() {
            State::Held { valid_until } if until < *valid_until => {
                *valid_until = until;
                true
            }
            _ => false,
        };
        if shortened {
            self.changed.notify_waiters();
        }
    }

    fn state_lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn state(&self) -> State {
        *self.state_lock()
    }

    /// Marks the hold lost; reports it once.
    fn mark_lost(&self, why: &'static str) {
        self.lose(None, why);
    }

    /// Marks the hold lost because its lease ran out on the client's clock while it was
    /// `seen`: not when a renewal changed it since (checked under the same lock).
    fn lapsed(&self, seen: State) {
        self.lose(Some(seen), "the lease ran out on the client's clock");
    }

    fn lose(&self, unless_changed_from: Option<State>, why: &'static str) {
        let newly = {
            let mut state = self.state_lock();
            if unless_changed_from.is_some_and(|seen| *state != seen) {
                return;
            }
            std::mem::replace(&mut *state, State::Lost) != State::Lost
        };
        if newly {
            self.changed.notify_waiters();
            tracing::warn!(key = %self.key, name = self.name, fencing_token = self.fence, why, "lock lost while held");
            crate::stats::lost(self.name);
        }
    }

    fn is_held(&self) -> bool {
        match self.state() {
            State::Held { valid_until } => Instant::now() < valid_until,
            State::Lost => false,
        }
    }

    /// [`is_held`](Self::is_held), marking the hold lost (and reporting it) when the lease ran
    /// out on the clock: a timer may not have fired yet, as when the thread was blocked.
    pub(crate) fn still_held(&self) -> bool {
        let seen = self.state();
        match seen {
            State::Held { valid_until } if Instant::now() < valid_until => true,
            State::Held { .. } => {
                self.lapsed(seen);
                self.is_held()
            }
            State::Lost => false,
        }
    }

    pub(crate) async fn lost(&self) {
        loop {
            // Registered before the state is read: a change from then on wakes it.
            let mut changed = std::pin::pin!(self.changed.notified());
            changed.as_mut().enable();
            let state = self.state();
            let State::Held { valid_until } = state else {
                return;
            };
            tokio::select! {
                () = tokio::time::sleep_until(valid_until) => self.lapsed(state),
                () = changed => {}
            }
        }
    }
}

/// Renews the lease at a third of its length until the guard goes, the hold is lost, or
/// `max_hold` is reached. It never re-acquires: extend of a key that is gone fails.
async fn watchdog(hold: Arc<Hold>, max_hold: Option<Duration>) {
    let lease = hold.lease;
    let period = lease / 3;
    let ceiling = max_hold.and_then(|m| hold.acquired_at.checked_add(m));
    let mut next = Instant::now() + period;
    loop {
        tokio::time::sleep_until(next).await;
        let now = Instant::now();
        if ceiling.is_some_and(|c| now >= c) {
            tracing::warn!(key = %hold.key, name = hold.name, "max_hold reached: the lease is no longer renewed");
            return;
        }
        if !hold.is_held() {
            hold.mark_lost("the lease ran out before it could be renewed");
            return;
        }
        match hold.extend(lease).await {
            Ok(true) => next = now + period,
            Ok(false) => {
                hold.mark_lost("the key was gone or held by another owner at renewal");
                return;
            }
            Err(error) => {
                tracing::debug!(key = %hold.key, error = %error, "lease renewal failed; retrying");
                crate::stats::renewal_failed(hold.name);
                next = Instant::now() + (period / 4).max(Duration::from_millis(1));
            }
        }
    }
}

/// Proof of holding a lock. Dropping it releases the lock.
///
/// # Behavior
/// - **Release**: [`release`](Self::release) deletes the key only while it still holds this
///   acquisition's token, and says [`LockError::Lost`] (deleting nothing) when it does not. When
///   a waiter of the same locker is first in line, the release may pass the key to it instead
///   (see [`Locker`](crate::Locker)'s *Passing*), under the same condition.
/// - **Drop** (including a panic in the holder and a dropped future): the same release is handed
///   to the tokio runtime the lock was acquired on, even when the guard is dropped on another
///   thread; nothing blocks in `Drop`. When that runtime is gone (shut down), the lease frees the
///   key. A [`release`](Self::release) future dropped before its reply hands the release over the
///   same way.
/// - **Re-entry**: inside [`scope`](Self::scope) (and inside a `#[dlock]` body), acquiring the
///   same key through the same locker returns at once with a guard on this hold; the key is
///   released when the last of them goes.
/// - **Expiry**: a fixed lease counts as lost on the client's monotonic clock shortly before the
///   server lets it go (1% + 2ms early); [`is_held`](Self::is_held) and [`lost`](Self::lost) tell.
///   The lease counts from when the acquisition was sent, or from the grant where the engine
///   counts its own `expire` from there (ZooKeeper and etcd, after their session opened).
/// - **Loss is final**: a hold counted lost stays lost. [`extend`](Self::extend) sends nothing
///   once the lease ran out on the client's clock, and an extension (or renewal) answered after
///   that end leaves the hold lost.
/// - **Renewal** (`expire_auto`): a watchdog task extends the lease at a third of its length; it
///   is aborted on release, drop and loss, and stops at `max_hold`. A renewal that finds the key
///   gone or taken marks the hold lost; one that cannot reach the server keeps trying until the
///   lease runs out on the client's clock.
/// - **Shortening**: [`extend`](Self::extend) with a lease that ends sooner than the one in force
///   moves the end on the client's clock before the request goes out, whatever its outcome. A
///   shortening request whose reply never came may still run on the server after a later
///   extension (a frozen server, a statement waiting on its old connection): the later
///   extension cannot know, so after an error, extend to the short lease again before counting
///   on a longer one.
#[derive(Debug)]
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard {
    hold: Arc<Hold>,
    released: bool,
}

impl LockGuard {
    pub(crate) fn new(hold: Arc<Hold>, lease: Lease, max_hold: Option<Duration>) -> Self {
        if lease.renewed
            && let Some(runtime) = &hold.runtime
        {
            let task = runtime.spawn(watchdog(hold.clone(), max_hold));
            *hold
                .watchdog
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(task);
        }
        Self {
            hold,
            released: false,
        }
    }

    /// A further guard on a hold an enclosing scope has (re-entry): no request is sent.
    pub(crate) fn reentered(hold: Arc<Hold>) -> Self {
        Self {
            hold,
            released: false,
        }
    }

    /// The full lock key, prefix included (`dlock:order:42`).
    #[must_use]
    pub fn key(&self) -> &str {
        &self.hold.key
    }

    /// This acquisition's fencing token: greater than every token issued earlier for the same
    /// key. Pass it to the resource you protect and have it refuse writes with a lower one.
    /// (A semaphore's permits each have a token of their own, in the order they were granted;
    /// a read lock's readers hold the key together and, on etcd and ZooKeeper, readers let in
    /// together may share one; a writer's is above every earlier hold's.)
    #[must_use]
    pub fn fencing_token(&self) -> u64 {
        self.hold.fence
    }

    /// What this guard holds: the mutex, a semaphore's permit, a read or a write hold.
    #[must_use]
    pub fn kind(&self) -> LockKind {
        self.hold.kind
    }

    /// `true` while the lease is known to be ours: not lost, and not past its end on the
    /// client's clock.
    #[must_use]
    pub fn is_held(&self) -> bool {
        self.hold.is_held()
    }

    /// Resolves when the hold is lost: the lease ran out, or renewal found the key gone or
    /// taken. Never resolves while renewal keeps succeeding.
    pub async fn lost(&self) {
        self.hold.lost().await;
    }

    /// Runs `body` inside this hold: there, acquiring the same key through the same locker (or
    /// a clone) re-enters at once without a request, and [`crate::fencing_token`] is this
    /// hold's. `#[dlock]` bodies run this way.
    ///
    /// ```
    /// # async fn demo() -> Result<(), dlock_runtime::LockError> {
    /// use dlock_runtime::{LockOptions, Locker};
    ///
    /// let locker = Locker::memory();
    /// let outer = locker.acquire("report", LockOptions::new()).await?;
    /// outer
    ///     .scope(async {
    ///         // The same key again: no waiting, same fencing token.
    ///         let inner = locker.acquire("report", LockOptions::new()).await?;
    ///         assert_eq!(inner.fencing_token(), outer.fencing_token());
    ///         inner.release().await
    ///     })
    ///     .await?;
    /// outer.release().await
    /// # }
    /// ```
    pub fn scope<F: std::future::Future>(
        &self,
        body: F,
    ) -> impl std::future::Future<Output = F::Output> + use<F> {
        in_scope(&self.hold, body)
    }

    /// Resets the lease to `lease` from now, if the key still holds this acquisition's token.
    /// A lease that ends sooner than the one in force ends this hold sooner from the moment
    /// the request is sent, whatever comes of it: the server may have run a request whose
    /// reply never came.
    ///
    /// Loss is final: a hold whose lease already ran out on the client's clock is not extended
    /// (nothing is sent), and one whose lease runs out before the reply comes stays lost even
    /// when the server did extend it (that lease then lapses, or is freed by the release).
    ///
    /// # Errors
    /// [`LockError::Lost`] when the key is gone or someone else's (nothing is re-created), or
    /// the hold's lease ran out on the client's clock first;
    /// [`LockError::Backend`] when the server cannot be reached.
    pub async fn extend(&self, lease: Duration) -> Result<(), LockError> {
        crate::lease::check_lease(lease)?;
        match self.hold.extend(lease).await {
            Ok(true) => Ok(()),
            Ok(false) => {
                self.hold
                    .mark_lost("extend found the key gone or held by another owner");
                Err(self.lost_error())
            }
            Err(error) => Err(LockError::Backend(error)),
        }
    }

    /// Releases the lock now.
    ///
    /// A release sent once more after its connection closed that finds the key gone cannot
    /// tell whether its first sending deleted it. Sent after the lease ran out on the client's
    /// clock it says [`LockError::Lost`]. Sent within it, on PostgreSQL it succeeds (nothing
    /// else deletes the row, short of [`Locker::force_release`](crate::Locker::force_release));
    /// on Redis, where a key can also vanish (a restart without persistence, a failover, an
    /// eviction), it is a [`LockError::Backend`] error.
    ///
    /// # Errors
    /// [`LockError::Lost`] when the key had expired or been taken over (nothing of another
    /// holder was deleted);
    /// [`LockError::Backend`] when the server could not be reached (the lease will free it), or
    /// on Redis when a release sent again within the lease cannot tell (above).
    pub async fn release(mut self) -> Result<(), LockError> {
        self.released = true;
        let hold = &self.hold;
        if !hold.leave() || !hold.claim_release() {
            // An outer holder on this task still holds it, or the locker was closed (which
            // released it and counts it lost).
            return if hold.is_held() {
                Ok(())
            } else {
                Err(self.lost_error())
            };
        }
        // An engine that cannot tell whether its release deleted the key (see below) is judged
        // by the lease on the client's clock as the release goes out.
        let held_when_sent = hold.is_held();
        // If this future is dropped before the reply, the request may never have been written:
        // hand the release to the runtime then.
        let mut in_flight = ReleaseInFlight(Some(hold));
        let outcome = hold
            .locker
            .let_go(&hold.key, hold.kind, &hold.token, hold.keep_until)
            .await;
        in_flight.0 = None;
        match outcome {
            Ok(true) => {
                tracing::debug!(key = %hold.key, held = ?hold.acquired_at.elapsed(), "lock released");
                Ok(())
            }
            Ok(false) => {
                hold.mark_lost("at release the key was gone or held by another owner");
                Err(self.lost_error())
            }
            // Deleted by a first sending whose reply was lost, or gone before it: while the
            // lease held on the client's clock, nobody else could have deleted the key.
            Err(error) if error.settled_by_lease() && held_when_sent => {
                tracing::debug!(key = %hold.key, "lock released (its first reply was lost; the key was gone when sent again, within the lease)");
                Ok(())
            }
            Err(error) if error.is_unsettled() && held_when_sent => {
                tracing::warn!(key = %hold.key, name = hold.name, "lock release: its first reply was lost, and sent again it found the key gone; whether it released or the hold was lost before (a restart, a failover) cannot be told");
                Err(LockError::Backend(error))
            }
            Err(error) if error.is_unsettled() => {
                hold.mark_lost("at release the key was gone, and the lease had run out");
                Err(self.lost_error())
            }
            Err(error) => {
                tracing::error!(key = %hold.key, name = hold.name, error = %error, "lock release failed; the lease will free it");
                Err(LockError::Backend(error))
            }
        }
    }

    pub(crate) fn hold(&self) -> &Arc<Hold> {
        &self.hold
    }

    pub(crate) fn lost_error(&self) -> LockError {
        LockError::Lost {
            key: self.hold.key.clone(),
        }
    }
}

/// What [`Locker::close`] does to a hold a guard still has: the hold is lost (a body stopped
/// on loss stops), renewal stops, and the key is released, unless its release was sent
/// already.
impl HeldLock for Hold {
    fn close(&self) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async move {
            self.mark_lost("the locker was closed");
            self.stop_watchdog();
            if !self.claim_release() {
                return Ok(());
            }
            match crate::locker::release::rest_of_minimum(self.keep_until) {
                // A job lock's minimum hold outlives the locker.
                Some(rest) => {
                    self.locker
                        .backend()
                        .keep(&self.key, &self.token, rest)
                        .await
                }
                None => {
                    self.locker
                        .backend()
                        .release(&self.key, self.kind, &self.token)
                        .await
                }
            }
            .map(drop)
        })
    }

    fn key(&self) -> &str {
        &self.key
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.locker.forget_hold(self.id);
        if !*self.released.get_mut() {
            // Its release was never claimed: it ends here for the metrics.
            crate::stats::hold_ended(self.name, self.acquired_at.elapsed());
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.released && self.hold.leave() {
            self.hold.release_in_background();
        }
    }
}

/// A release whose reply has not arrived; dropped unanswered, it hands the release over.
struct ReleaseInFlight<'a>(Option<&'a Hold>);

impl Drop for ReleaseInFlight<'_> {
    fn drop(&mut self) {
        if let Some(hold) = self.0.take() {
            hold.hand_release_over();
        }
    }
}

/// What the locked bodies running on this task hold: the innermost body's hold, and those of
/// the bodies around it, innermost last (empty, so unallocated, for a body not nested in another).
struct Scope {
    innermost: Arc<Hold>,
    outer: Vec<Arc<Hold>>,
}

tokio::task_local! {
    static SCOPE: Scope;
}

/// `body` with `hold` added to the task's scope: re-entry and `fencing_token()` see it.
pub(crate) fn in_scope<F: Future>(
    hold: &Arc<Hold>,
    body: F,
) -> impl Future<Output = F::Output> + use<F> {
    let outer = SCOPE
        .try_with(|s| {
            let mut outer = Vec::with_capacity(s.outer.len() + 1);
            outer.extend(s.outer.iter().cloned());
            outer.push(s.innermost.clone());
            outer
        })
        .unwrap_or_default();
    let scope = Scope {
        innermost: hold.clone(),
        outer,
    };
    SCOPE.scope(scope, body)
}

/// The hold on `key` through `locker` that an enclosing scope of this task has.
pub(crate) fn scoped_hold(locker: &Locker, key: &str) -> Option<Arc<Hold>> {
    SCOPE
        .try_with(|scope| {
            std::iter::once(&scope.innermost)
                .chain(scope.outer.iter().rev())
                .find(|h| h.key() == key && h.locker().same_as(locker))
                .cloned()
        })
        .ok()
        .flatten()
}

/// The fencing token of the lock held by the innermost `#[dlock]` function running on this task.
///
/// ```
/// # use dlock_runtime::{dlock, LockError};
/// #[dlock(key = "report", client = locker)]
/// async fn write_report(locker: &dlock_runtime::Locker) -> Result<u64, LockError> {
///     Ok(dlock_runtime::fencing_token().expect("inside a locked body"))
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # let locker = dlock_runtime::Locker::memory();
/// let first = write_report(&locker).await.unwrap();
/// let second = write_report(&locker).await.unwrap();
/// assert!(second > first);
/// assert_eq!(dlock_runtime::fencing_token(), None);
/// # }
/// ```
#[must_use]
pub fn fencing_token() -> Option<u64> {
    SCOPE.try_with(|scope| scope.innermost.fence()).ok()
}
