//! Every watch of a locker on one watch stream: the loss watches of its holds and the wake-ups
//! of its waiters are watches of single keys, added to and cancelled on one stream (etcd
//! multiplexes them by watch id), so a hold or a wait costs two messages on a stream that is
//! already open instead of a stream of its own.
//!
//! The stream is opened by the first watch and belongs to one task, which sends the creates
//! and cancels and hands each deletion to its watch. When the stream breaks, every watch on it
//! hears so ([`Fired::Broken`]) and the next watch opens a new stream.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex, PoisonError, Weak},
};

use etcd_client::{EventType, WatchFilterType, WatchOptions, WatchResponse};
use tokio::sync::{mpsc, oneshot};

use super::conn::Conn;

/// What ended a watch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fired {
    /// Its key was deleted.
    Deleted,
    /// The stream could not keep it (broken, compacted, cancelled by the server): what it
    /// watched must be looked at again.
    Broken,
}

enum Command {
    Add {
        id: u64,
        key: String,
        start: Option<i64>,
        /// Every key under `key` (a semaphore's line), not `key` alone.
        prefix: bool,
    },
    Cancel(u64),
}

#[derive(Default)]
struct State {
    /// The stream task's inbox, while a stream is open.
    commands: Option<mpsc::UnboundedSender<Command>>,
    next_id: u64,
    /// Where each watch's end goes: how, and the revision of the response that ended it.
    handlers: HashMap<u64, oneshot::Sender<(Fired, i64)>>,
}

/// A locker's watches, on one stream.
pub(super) struct WatchHub {
    conn: Arc<Conn>,
    state: Arc<Mutex<State>>,
}

/// One key's watch: resolves with the key's deletion, or [`Fired::Broken`]. Dropping it cancels
/// the watch on the server.
pub(super) struct KeyWatch {
    id: u64,
    fired: oneshot::Receiver<(Fired, i64)>,
    /// The revision of the response that ended it, once it did.
    at: i64,
    state: Weak<Mutex<State>>,
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl WatchHub {
    pub(super) fn new(conn: Arc<Conn>) -> Self {
        Self {
            conn,
            state: Arc::default(),
        }
    }

    /// Watches the deletion of `key` from revision `start` (from now when `None`).
    pub(super) fn deletion(&self, key: String, start: Option<i64>) -> KeyWatch {
        self.add(key, start, false)
    }

    /// Watches the deletion of any key under `prefix` from revision `start`.
    pub(super) fn deletion_under(&self, prefix: String, start: Option<i64>) -> KeyWatch {
        self.add(prefix, start, true)
    }

    fn add(&self, key: String, start: Option<i64>, prefix: bool) -> KeyWatch {
        let mut state = lock(&self.state);
        state.next_id += 1;
        let id = state.next_id;
        let (tx, fired) = oneshot::channel();
        state.handlers.insert(id, tx);
        let command = Command::Add {
            id,
            key,
            start,
            prefix,
        };
        let command = match &state.commands {
            Some(commands) => commands.send(command).err().map(|e| e.0),
            None => Some(command),
        };
        if let Some(command) = command {
            let (commands, inbox) = mpsc::unbounded_channel();
            let _ = commands.send(command);
            state.commands = Some(commands);
            tokio::spawn(run(self.conn.clone(), Arc::downgrade(&self.state), inbox));
        }
        KeyWatch {
            id,
            fired,
            at: 0,
            state: Arc::downgrade(&self.state),
        }
    }
}

impl KeyWatch {
    /// Waits for the key's deletion (or the stream's failure).
    pub(super) async fn fired(&mut self) -> Fired {
        let (fired, at) = (&mut self.fired).await.unwrap_or((Fired::Broken, 0));
        self.at = at;
        fired
    }

    /// The revision at which it fired (0 before, or when the stream broke).
    pub(super) fn at(&self) -> i64 {
        self.at
    }
}

impl Drop for KeyWatch {
    fn drop(&mut self) {
        let Some(state) = self.state.upgrade() else {
            return;
        };
        let mut state = lock(&state);
        if state.handlers.remove(&self.id).is_some()
            && let Some(commands) = &state.commands
        {
            let _ = commands.send(Command::Cancel(self.id));
        }
    }
}

fn options(start: Option<i64>, prefix: bool) -> WatchOptions {
    let options = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
    let options = if prefix {
        options.with_prefix()
    } else {
        options
    };
    match start {
        Some(revision) => options.with_start_revision(revision),
        None => options,
    }
}

/// The stream's task: opens the stream with the first watch, then sends what the hub asks and
/// hands out what etcd says, until the stream breaks or the hub is gone.
async fn run(
    conn: Arc<Conn>,
    state: Weak<Mutex<State>>,
    mut inbox: mpsc::UnboundedReceiver<Command>,
) {
    let Some(Command::Add {
        id,
        key,
        start,
        prefix,
    }) = inbox.recv().await
    else {
        return;
    };
    let opened = conn
        .call("watch lock keys", |mut c| async move {
            c.watch(key, Some(options(start, prefix))).await
        })
        .await;
    let Ok(stream) = opened else {
        fail_all(&state);
        return;
    };
    let (mut sender, mut responses) = stream.split();
    // Our ids in the order their creates were sent: etcd answers creates in order.
    let mut creating: VecDeque<u64> = VecDeque::from([id]);
    // Our id of each server watch id, and back.
    let mut ours: HashMap<i64, u64> = HashMap::new();
    let mut theirs: HashMap<u64, i64> = HashMap::new();
    loop {
        tokio::select! {
            command = inbox.recv() => {
                let sent = match command {
                    Some(Command::Add { id, key, start, prefix }) => {
                        creating.push_back(id);
                        sender.watch(key, Some(options(start, prefix))).await
                    }
                    Some(Command::Cancel(id)) => match theirs.remove(&id) {
                        Some(watch_id) => {
                            ours.remove(&watch_id);
                            sender.cancel(watch_id).await
                        }
                        // Not created yet: cancelled when it is.
                        None => Ok(()),
                    },
                    None => return,
                };
                if sent.is_err() {
                    break;
                }
            }
            response = responses.message() => {
                let Ok(Some(response)) = response else { break };
                let Some(state) = state.upgrade() else { return };
                let cancel = dispatch(&state, &response, &mut creating, &mut ours, &mut theirs);
                drop(state);
                if let Some(watch_id) = cancel
                    && sender.cancel(watch_id).await.is_err()
                {
                    break;
                }
            }
        }
    }
    fail_all(&state);
}

/// Hands one response to its watch; the server watch to cancel, if any (one that fired, or
/// whose watch was dropped before it was created).
fn dispatch(
    state: &Mutex<State>,
    response: &WatchResponse,
    creating: &mut VecDeque<u64>,
    ours: &mut HashMap<i64, u64>,
    theirs: &mut HashMap<u64, i64>,
) -> Option<i64> {
    let watch_id = response.watch_id();
    let mut state = lock(state);
    if response.created() {
        let id = creating.pop_front()?;
        if response.canceled() || watch_id < 0 {
            if let Some(handler) = state.handlers.remove(&id) {
                let _ = handler.send((Fired::Broken, 0));
            }
            return None;
        }
        if !state.handlers.contains_key(&id) {
            // Dropped while it was being created.
            return Some(watch_id);
        }
        ours.insert(watch_id, id);
        theirs.insert(id, watch_id);
    }
    let id = *ours.get(&watch_id)?;
    let fired = if response.canceled() || response.compact_revision() > 0 {
        Fired::Broken
    } else if response
        .events()
        .iter()
        .any(|e| e.event_type() == EventType::Delete)
    {
        Fired::Deleted
    } else {
        return None;
    };
    ours.remove(&watch_id);
    theirs.remove(&id);
    if let Some(handler) = state.handlers.remove(&id) {
        // The last event's: a watch started after it misses nothing that came later.
        let at = response
            .events()
            .iter()
            .filter_map(|e| e.kv().map(etcd_client::KeyValue::mod_revision))
            .max()
            .unwrap_or(0);
        let _ = handler.send((fired, at));
    }
    (fired == Fired::Deleted).then_some(watch_id)
}

/// The stream is gone: every watch on it hears so, and the next one opens a new stream.
fn fail_all(state: &Weak<Mutex<State>>) {
    let Some(state) = state.upgrade() else {
        return;
    };
    let mut state = lock(&state);
    state.commands = None;
    for (_, handler) in state.handlers.drain() {
        let _ = handler.send((Fired::Broken, 0));
    }
}
