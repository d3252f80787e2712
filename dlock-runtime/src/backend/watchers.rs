//! The release wake-ups of engines whose releases reach the process as messages naming a key
//! (the embedded table, PostgreSQL's `NOTIFY`): one wake-up per key, shared by its waiters.

use std::{fmt, sync::Arc};

use tokio::sync::Notify;

use super::api::{NextInLine, Watch};

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

    /// Whether any waiter holds a wake-up (for an engine that announces a release only when
    /// someone waits).
    #[allow(
        dead_code,
        reason = "used by the engines that announce releases on demand"
    )]
    pub(crate) fn anyone_waits(&self) -> bool {
        self.map()
            .values()
            .any(|(notify, _)| notify.strong_count() > 0)
    }
}
