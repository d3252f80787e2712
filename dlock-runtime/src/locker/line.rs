//! The in-process line of a key's waiters on one locker, and passing: the first waiter of a
//! line offers to take the lock straight from a holder of the same locker.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::time::Instant;

use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::{
    LockError,
    backend::{Backend, Token},
};

/// The in-process lines of waiters, one per contended key: the waiters of a key on one locker
/// queue here first come, first served, and only the first of them asks the engine, so a
/// release wakes one waiter per process instead of every one of them. On an engine with a queue
/// ([`FairOrder::Queue`](crate::backend::FairOrder::Queue)) a line also holds one place in the engine's queue for all its waiters
/// in turn: releases name the place first in line, so only that process's first waiter wakes.
pub(super) struct Lines {
    map: std::sync::Mutex<std::collections::HashMap<String, Arc<Line>>>,
    /// How many lines there are: an uncontended acquisition reads this, not the map.
    pub(super) open: AtomicUsize,
    /// The engine, for a line's place that leaves its queue.
    backend: Arc<dyn Backend>,
    /// The engine keeps a queue of places ([`FairOrder::Queue`](crate::backend::FairOrder::Queue), or RedLock's places for
    /// wake-ups); on the others a line has none.
    places: bool,
    /// The locker's background tasks, which closing waits for.
    background: TaskTracker,
    /// The locker's closing, which ends a wait for a turn.
    closing: CancellationToken,
    /// Whose first 8 hex digits every place of this locker starts with (see [`Token::tagged`]):
    /// a release names a place by them, so a process that waits on a key again, a new line with
    /// a new place, hears its releases on the channel it listened to before.
    tag: std::sync::OnceLock<Token>,
}

/// The waiters of one key on one locker.
pub(super) struct Line {
    pub(super) turns: tokio::sync::Semaphore,
    /// This line's place in the engine's queue, held for its waiters in turn; `None` on an
    /// engine without places (etcd, ZooKeeper), whose waiters then wait as on any engine
    /// without a queue.
    pub(super) place: Option<Token>,
    /// The place may be in the engine's queue: set before every request that may queue it, and
    /// cleared only by a grant that gave it up.
    pub(super) queued: AtomicBool,
    /// When a request that the engine answered last put the place in its queue or refreshed
    /// its deadline there (sent then, or earlier); `None` after a grant that gave the place
    /// up, and before the first.
    pub(super) refreshed: std::sync::Mutex<Option<tokio::time::Instant>>,
    /// How the last waiter left: [`NOT_HANDED_ON`] (it gave up, or nobody left yet), or holding
    /// the lock, when it had heard this many release wake-ups plus one (see [`Turn::handed_on`]).
    pub(super) handed_on: AtomicU64,
    /// Waiters in the line (the first one included); changed under the map's lock.
    pub(super) members: AtomicUsize,
    /// The first waiter's offer to take the lock straight from a holder of this locker.
    pub(super) baton: std::sync::Mutex<Option<Baton>>,
    /// Holds passed from one waiter of this line to the next in a row; a release passes only
    /// while there were fewer than [`MAX_PASSES`], then lets the lock go round the processes.
    pub(super) passes: AtomicU32,
}

/// How many times in a row a hold goes straight to the next waiter of the same locker (see
/// [`Baton`]) before a release frees the key and wakes the place first in the engine's queue:
/// a process with a hot key keeps the lock for at most this many holds more while other
/// processes wait, so none starves.
pub(super) const MAX_PASSES: u32 = 4;

/// The first waiter of a line, in the default mode on an engine that can pass a hold
/// ([`Backend::pass`](crate::backend::Backend::pass)), offers to take the lock straight from the holder: a holder of the same
/// locker that releases while the offer stands makes the key the waiter's in one request (a
/// compare-and-set with a new fence; on RedLock one round of them, one per master) instead of
/// deleting it, publishing a wake-up, and waiting
/// for the waiter's own attempt. The waiter withdraws its offer before each attempt of its own,
/// and once a holder took it, waits for that holder's answer instead: the key is never set for
/// a waiter that does not know it.
pub(super) struct Baton {
    pub(super) token: Token,
    pub(super) lease: Duration,
    pub(super) reply: tokio::sync::oneshot::Sender<Passed>,
}

/// A holder's answer to a [`Baton`].
pub(super) enum Passed {
    /// The key is the waiter's, with this fence, since a request sent at `sent_at`.
    Held { fence: u64, sent_at: Instant },
    /// The holder no longer held it: nothing changed.
    Refused,
    /// The pass failed without an answer (or the holder gave up waiting for one): the key may
    /// be the waiter's.
    Unknown,
}

impl Line {
    fn baton(&self) -> std::sync::MutexGuard<'_, Option<Baton>> {
        self.baton
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Offers to take the lock from a holder of this locker; the answer comes on the receiver.
    pub(super) fn offer(
        &self,
        token: &Token,
        lease: Duration,
    ) -> tokio::sync::oneshot::Receiver<Passed> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        *self.baton() = Some(Baton {
            token: token.clone(),
            lease,
            reply,
        });
        answer
    }

    /// Takes `token`'s offer back; `false` when a holder took it first (its answer is coming).
    pub(super) fn withdraw(&self, token: &Token) -> bool {
        self.baton().take_if(|b| b.token == *token).is_some()
    }
}

/// [`Line::handed_on`] when the last waiter did not leave holding the lock, or its wake-ups were
/// not counted (it had no watch).
const NOT_HANDED_ON: u64 = 0;

impl Lines {
    pub(super) fn new(
        backend: Arc<dyn Backend>,
        places: bool,
        background: TaskTracker,
        closing: CancellationToken,
    ) -> Self {
        Self {
            map: std::sync::Mutex::default(),
            open: AtomicUsize::new(0),
            backend,
            places,
            background,
            closing,
            tag: std::sync::OnceLock::new(),
        }
    }

    /// A new line's place: random, but for the locker's tag (none on an engine without
    /// places).
    fn new_place(&self) -> Result<Option<Token>, LockError> {
        if !self.places {
            return Ok(None);
        }
        let place = Token::generate()?;
        let tag = self.tag.get_or_init(|| place.clone());
        Ok(Some(place.tagged(tag)))
    }

    fn map(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Arc<Line>>> {
        self.map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether `key` has waiters in this process already (then it is hot: a new waiter goes
    /// behind them without asking the engine first).
    pub(super) fn busy(&self, key: &str) -> bool {
        self.open.load(Ordering::Relaxed) > 0 && self.map().contains_key(key)
    }

    /// Waits (until `deadline`) to be first in `key`'s line; `None` when the deadline (or the
    /// locker's closing) came first.
    /// Dropping the future, or the turn, gives the place up at once. The turn says whether it
    /// had to wait for it.
    pub(super) async fn turn(
        &self,
        key: &str,
        deadline: Instant,
    ) -> Result<Option<Turn<'_>>, LockError> {
        let line = {
            let mut lines = self.map();
            let line = match lines.get(key) {
                Some(line) => line.clone(),
                None => {
                    let line = Arc::new(Line {
                        turns: tokio::sync::Semaphore::new(1),
                        place: self.new_place()?,
                        queued: AtomicBool::new(false),
                        refreshed: std::sync::Mutex::new(None),
                        handed_on: AtomicU64::new(NOT_HANDED_ON),
                        members: AtomicUsize::new(0),
                        baton: std::sync::Mutex::new(None),
                        passes: AtomicU32::new(0),
                    });
                    lines.insert(key.to_owned(), line.clone());
                    self.open.store(lines.len(), Ordering::Relaxed);
                    line
                }
            };
            line.members.fetch_add(1, Ordering::Relaxed);
            line
        };
        let mut turn = Turn {
            lines: self,
            key: key.to_owned(),
            line,
            permit: false,
            waited: false,
            leaving_holder: None,
            departed: false,
        };
        // The permit is given back by hand when the turn is dropped.
        turn.permit = turn.line.turns.try_acquire().map(|p| p.forget()).is_ok();
        if turn.permit {
            return Ok(Some(turn));
        }
        let line = turn.line.clone();
        let permit = tokio::select! {
            permit = tokio::time::timeout_at(deadline, line.turns.acquire()) => permit,
            () = self.closing.cancelled() => return Ok(None),
        };
        match permit {
            Ok(Ok(permit)) => permit.forget(),
            _ => return Ok(None),
        }
        turn.permit = true;
        turn.waited = true;
        Ok(Some(turn))
    }

    /// The offer of `key`'s first waiter to take the lock from a holder (see [`Baton`]), unless
    /// the line had its [`MAX_PASSES`] in a row.
    pub(super) fn baton(&self, key: &str) -> Option<Baton> {
        if self.open.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let line = self.map().get(key)?.clone();
        if line.passes.load(Ordering::Acquire) >= MAX_PASSES {
            return None;
        }
        line.baton().take()
    }
}

/// Being first in a key's line; the next waiter's turn comes when it is dropped. The last one to
/// leave removes the line, and its place in the engine's queue.
pub(super) struct Turn<'a> {
    lines: &'a Lines,
    key: String,
    pub(super) line: Arc<Line>,
    /// Holds the line's one permit (forgotten when taken, given back on drop).
    permit: bool,
    /// Others were ahead: the lock may have changed hands meanwhile.
    pub(super) waited: bool,
    /// Leaves holding the lock, having heard this many release wake-ups (`Some(None)`: it had
    /// no watch to count them).
    pub(super) leaving_holder: Option<Option<u64>>,
    /// It left the line already ([`depart`](Self::depart)).
    departed: bool,
}

impl Line {
    fn refreshed_at(&self) -> std::sync::MutexGuard<'_, Option<tokio::time::Instant>> {
        self.refreshed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the place is in the engine's queue with a deadline refreshed less than
    /// `within` ago (then an attempt need not refresh it: see `Queued::refresh`). A grant that
    /// gave the place up clears the time with `queued`.
    pub(super) fn refreshed_within(&self, within: std::time::Duration) -> bool {
        self.refreshed_at().is_some_and(|at| at.elapsed() < within)
    }

    /// The engine answered a request sent at `sent_at` that queued the place or refreshed it
    /// (`Some`), or granted the lock and gave the place up (`None`).
    pub(super) fn set_refreshed(&self, sent_at: Option<tokio::time::Instant>) {
        *self.refreshed_at() = sent_at;
    }
}

impl Turn<'_> {
    /// Others wait behind this one in the line (the place is worth keeping).
    pub(super) fn others_waiting(&self) -> bool {
        self.line.members.load(Ordering::Relaxed) > 1
    }

    /// When the waiter before this one took the lock and kept the line's place in the engine's
    /// queue: how many release wake-ups it had heard then. Until this process hears another,
    /// there is nothing to ask (the lock is held here, and the place waits in the queue).
    pub(super) fn handed_on(&self) -> Option<u64> {
        let heard = self.line.handed_on.load(Ordering::Acquire);
        (self.waited && heard != NOT_HANDED_ON && self.line.queued.load(Ordering::Acquire))
            .then(|| heard - 1)
    }
}

impl Turn<'_> {
    /// Leaves the line (the next waiter's turn comes); when this was its last waiter and the
    /// line's place may be in the engine's queue, the place, which must leave it.
    pub(super) fn depart(&mut self) -> Option<Token> {
        if std::mem::replace(&mut self.departed, true) {
            return None;
        }
        if std::mem::take(&mut self.permit) {
            let handed_on = match self.leaving_holder {
                Some(Some(heard)) => heard.saturating_add(1),
                _ => NOT_HANDED_ON,
            };
            self.line.handed_on.store(handed_on, Ordering::Release);
            self.line.turns.add_permits(1);
        }
        let lines = self.lines;
        let last = {
            let mut map = lines.map();
            let last = self.line.members.fetch_sub(1, Ordering::Relaxed) == 1;
            if last {
                map.remove(&self.key);
                lines.open.store(map.len(), Ordering::Relaxed);
            }
            last
        };
        // Nobody here waits any more: the place leaves the engine's queue.
        (last && self.line.queued.load(Ordering::Acquire))
            .then(|| self.line.place.clone())
            .flatten()
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if let Some(place) = self.depart()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let (backend, key) = (self.lines.backend.clone(), std::mem::take(&mut self.key));
            self.lines.background.spawn_on(
                async move {
                    if let Err(error) = backend.leave_queue(&key, &place).await {
                        tracing::debug!(key = %key, error = %error, "leaving the queue failed; the place lapses on its own");
                    }
                },
                &runtime,
            );
        }
    }
}
