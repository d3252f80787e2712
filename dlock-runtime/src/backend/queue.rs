//! The queue of places that engines keeping their waiters' order in the client use (Redis,
//! PostgreSQL, the embedded table; [`FairOrder::Queue`](super::FairOrder::Queue)): a place per
//! waiting process and key, release wake-ups that name the place first in line (by the first 8
//! hex digits of its token), and, for engines whose releases reach the process as messages
//! naming a key, one wake-up per key shared by its waiters.

use std::{fmt, sync::Arc, time::Duration};

use tokio::sync::Notify;

use super::{Token, Watch};

/// How an attempt waits in the engine's queue ([`FairOrder::Queue`]). Releases name the place
/// first in line, so only the waiters of that place wake.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Queued<'a> {
    /// Who holds the place: the in-process line of the waiter's locker, which keeps one place
    /// for the waiters of the key in that process, in turn.
    pub(crate) place: &'a Token,
    /// A place not refreshed by an attempt within this long counts as gone.
    pub(crate) liveness: Duration,
    /// On success, keep the place (moved to the back of the queue): more waiters of this
    /// process wait behind this one.
    pub(crate) keep: bool,
    /// Take the lock only when the place is first in the queue (fair mode). Otherwise take it
    /// whenever it is free: the queue then only says whom a release wakes.
    pub(crate) strict: bool,
}

/// What the release wake-ups of one key said, shared by the key's waiters: whom the last one
/// named (the place first in line, or anyone), and how many there have been, so that a waiter
/// can tell whether one came since it last looked.
#[derive(Clone, Default)]
pub(crate) struct NextInLine(Arc<std::sync::Mutex<Heard>>);

#[derive(Default)]
struct Heard {
    next: Option<String>,
    count: u64,
}

impl NextInLine {
    fn heard_mut(&self) -> std::sync::MutexGuard<'_, Heard> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the last wake-up may be for `place`: it named no one, or it named `place` (by the
    /// first 8 hex digits: releases never publish a whole token or place).
    pub(super) fn names(&self, place: &Token) -> bool {
        self.heard_mut()
            .next
            .as_deref()
            .is_none_or(|next| place.0.starts_with(next))
    }

    /// How many wake-ups there have been.
    pub(super) fn count(&self) -> u64 {
        self.heard_mut().count
    }

    /// Records a wake-up naming `next` (8 hex digits of a place), or anyone; call before waking
    /// the key's waiters.
    pub(crate) fn heard(&self, next: Option<&str>) {
        let mut heard = self.heard_mut();
        heard.next = next.map(str::to_owned);
        heard.count += 1;
    }
}

/// The release wake-ups of an engine whose releases reach this process as messages naming a
/// key (the embedded table, PostgreSQL's `NOTIFY`): one entry per key, alive while a waiter
/// holds its [`Watch`].
#[derive(Default)]
pub(crate) struct Watchers(
    std::sync::Mutex<std::collections::HashMap<String, (std::sync::Weak<Notify>, NextInLine)>>,
);

impl fmt::Debug for Watchers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watchers").finish_non_exhaustive()
    }
}

impl Watchers {
    fn map(
        &self,
    ) -> std::sync::MutexGuard<
        '_,
        std::collections::HashMap<String, (std::sync::Weak<Notify>, NextInLine)>,
    > {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A wake-up for releases of `key`, shared with the key's other waiters.
    pub(crate) fn register(&self, key: &str) -> Watch {
        let mut watchers = self.map();
        // Dead entries go now and then, so the map stays as small as the keys waited for.
        if watchers.len() >= 1024 && watchers.len().is_power_of_two() {
            watchers.retain(|_, (notify, _)| notify.strong_count() > 0);
        }
        let live = watchers
            .get(key)
            .and_then(|(notify, next)| Some((notify.upgrade()?, next.clone())));
        let (notify, next) = live.unwrap_or_else(|| {
            let notify = Arc::new(Notify::new());
            let next = NextInLine::default();
            watchers.insert(key.to_owned(), (Arc::downgrade(&notify), next.clone()));
            (notify, next)
        });
        Watch::new(notify, next, ())
    }

    /// Wakes the waiters of `key` (of every key when `None`), telling them whom the release
    /// named.
    pub(crate) fn wake(&self, key: Option<&str>, next: Option<&str>) {
        let watchers = self.map();
        let wake = |(notify, named): &(std::sync::Weak<Notify>, NextInLine)| {
            if let Some(notify) = notify.upgrade() {
                named.heard(next);
                notify.notify_waiters();
            }
        };
        match key {
            None => watchers.values().for_each(wake),
            Some(key) => watchers.get(key).into_iter().for_each(wake),
        }
    }

    /// Whether any waiter holds a wake-up.
    #[cfg(feature = "postgres")]
    pub(crate) fn anyone_waits(&self) -> bool {
        self.map()
            .values()
            .any(|(notify, _)| notify.strong_count() > 0)
    }
}
