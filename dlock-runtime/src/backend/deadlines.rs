//! One clock per engine for the times its holds keep on the client (ZooKeeper's and etcd's
//! `expire`, etcd's start of a loss watch): a sorted queue and one task that sleeps until the
//! earliest entry, instead of a task and a timer per hold. A grant costs an insert under a lock
//! and wakes nothing (a later time than the earliest needs no wake-up); its release, a removal.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex, PoisonError, Weak},
};

use tokio::{sync::Notify, task::JoinHandle, time::Instant};

/// What the clock does with a due entry: called on the clock's task, outside its lock, with the
/// entry's key (which tells it from a later entry for the same hold) and its value.
pub(crate) type OnDue<E> = Box<dyn Fn(Due, E) + Send + Sync>;

/// The clock: dropping it ends its task.
pub(crate) struct Deadlines<E> {
    shared: Arc<Shared<E>>,
}

struct Shared<E> {
    state: Mutex<State<E>>,
    /// Rung when an entry goes in before every other one: the task sleeps until then instead.
    earlier: Notify,
    on_due: OnDue<E>,
}

struct State<E> {
    queue: BTreeMap<Due, E>,
    next: u64,
    /// The task, started with the first entry on the runtime of its caller, and again should
    /// that runtime have shut down.
    task: Option<JoinHandle<()>>,
}

/// An entry's key: its time, and a number that tells entries of the same time apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Due(Instant, u64);

/// An entry in the clock; dropping it takes the entry out (a release, a hold moved on by a
/// renewal) unless it came due already.
#[derive(Debug)]
pub(crate) struct Scheduled<E> {
    shared: Weak<Shared<E>>,
    due: Due,
}

impl<E> Scheduled<E> {
    /// This entry's key.
    pub(crate) fn due(&self) -> Due {
        self.due
    }
}

/// Takes `token`'s acquisition out of `entries` when its entry `scheduled` picks is the one that
/// came due (`due`); `None` when a renewal moved it since, or the acquisition is gone.
pub(crate) fn take_due<T, E>(
    entries: &Mutex<HashMap<String, T>>,
    token: &str,
    due: Due,
    scheduled: impl Fn(&T) -> Option<&Scheduled<E>>,
) -> Option<T> {
    let mut all = entries.lock().unwrap_or_else(PoisonError::into_inner);
    if all
        .get(token)
        .and_then(&scheduled)
        .is_none_or(|s| s.due() != due)
    {
        return None;
    }
    all.remove(token)
}

impl<E> Drop for Scheduled<E> {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            shared.state().queue.remove(&self.due);
        }
    }
}

impl<E> std::fmt::Debug for Deadlines<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deadlines")
            .field("pending", &self.shared.state().queue.len())
            .finish()
    }
}

impl<E> Shared<E> {
    fn state(&self) -> std::sync::MutexGuard<'_, State<E>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<E: Send + 'static> Deadlines<E> {
    /// A clock that hands each entry to `on_due` when its time comes.
    pub(crate) fn new(on_due: OnDue<E>) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    queue: BTreeMap::new(),
                    next: 0,
                    task: None,
                }),
                earlier: Notify::new(),
                on_due,
            }),
        }
    }

    /// Puts `value` in the clock for `at`. Called inside a tokio runtime (the clock's task is
    /// started there when none runs).
    pub(crate) fn schedule(&self, at: Instant, value: E) -> Scheduled<E> {
        let mut state = self.shared.state();
        let due = Due(at, state.next);
        state.next += 1;
        let first = state.queue.first_key_value().is_none_or(|(d, _)| due < *d);
        state.queue.insert(due, value);
        if state.task.as_ref().is_none_or(JoinHandle::is_finished) {
            state.task = Some(tokio::spawn(keep(self.shared.clone())));
        }
        drop(state);
        if first {
            // Stored when the task is not waiting yet: it sees it at its next wait.
            self.shared.earlier.notify_one();
        }
        Scheduled {
            shared: Arc::downgrade(&self.shared),
            due,
        }
    }

    /// How many entries wait (tests).
    #[cfg(test)]
    fn pending(&self) -> usize {
        self.shared.state().queue.len()
    }
}

impl<E> Drop for Deadlines<E> {
    fn drop(&mut self) {
        if let Some(task) = self.shared.state().task.take() {
            task.abort();
        }
    }
}

/// The clock's task: sleeps until the earliest entry (or until an earlier one goes in), then
/// hands every due entry over. The clock's owner aborts it when it drops the clock.
async fn keep<E>(shared: Arc<Shared<E>>) {
    loop {
        let now = Instant::now();
        let mut due = Vec::new();
        let next = {
            let mut state = shared.state();
            while let Some(entry) = state.queue.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                due.push(entry.remove_entry());
            }
            state.queue.first_key_value().map(|(d, _)| d.0)
        };
        for (key, value) in due {
            (shared.on_due)(key, value);
        }
        let earlier = shared.earlier.notified();
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = earlier => {}
                }
            }
            None => earlier.await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{Arc, Mutex},
        time::Duration,
    };

    use tokio::time::Instant;

    use super::Deadlines;

    fn recording() -> (Deadlines<&'static str>, Arc<Mutex<Vec<&'static str>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let clock = Deadlines::new(Box::new({
            let seen = seen.clone();
            move |_, value| seen.lock().unwrap().push(value)
        }));
        (clock, seen)
    }

    /// Waits (up to 10s) until `seen` has `n` entries.
    async fn until_seen(seen: &Mutex<Vec<&'static str>>, n: usize) {
        let t0 = Instant::now();
        while seen.lock().unwrap().len() < n && t0.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Entries come due in the order of their times, whatever the order they went in; one taken
    /// out never does; one earlier than the one the task sleeps for wakes it.
    #[tokio::test]
    async fn entries_come_due_in_time_order_and_dropped_ones_never() {
        let (clock, seen) = recording();
        let t0 = Instant::now();
        let late = clock.schedule(t0 + Duration::from_secs(3), "late");
        let dropped = clock.schedule(t0 + Duration::from_millis(100), "dropped");
        let soon = clock.schedule(t0 + Duration::from_millis(50), "soon");
        drop(dropped);
        assert_eq!(clock.pending(), 2);
        until_seen(&seen, 1).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(*seen.lock().unwrap(), ["soon"]);
        let _sooner = clock.schedule(Instant::now() + Duration::from_millis(20), "sooner");
        until_seen(&seen, 2).await;
        assert_eq!(*seen.lock().unwrap(), ["soon", "sooner"]);
        until_seen(&seen, 3).await;
        assert_eq!(*seen.lock().unwrap(), ["soon", "sooner", "late"]);
        assert_eq!(clock.pending(), 0);
        // Dropping entries that came due already takes nothing out.
        let _later = clock.schedule(Instant::now() + Duration::from_secs(60), "later");
        drop((late, soon));
        assert_eq!(clock.pending(), 1);
    }

    /// A clock whose runtime shut down starts its task again on the next runtime it is used on.
    #[test]
    fn the_task_is_started_again_on_another_runtime() {
        let (clock, seen) = recording();
        let first = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let kept = first.block_on(async { clock.schedule(Instant::now(), "first") });
        first.block_on(async { tokio::time::sleep(Duration::from_millis(50)).await });
        drop(first);
        drop(kept);
        let second = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        second.block_on(async {
            let _kept = clock.schedule(Instant::now() + Duration::from_millis(10), "second");
            tokio::time::sleep(Duration::from_millis(200)).await;
        });
        assert_eq!(*seen.lock().unwrap(), ["first", "second"]);
    }
}
