//! Release notifications over one pub/sub connection per locker, shared by all its waiters.
//!
//! One task owns the connection: it reads messages and wakes the waiters of the channel, and it
//! carries out every SUBSCRIBE and UNSUBSCRIBE in the order they were asked for, so a waiter
//! that arrives just as the last one leaves is never left unsubscribed. When the connection
//! drops, every waiter is woken (they fall back to polling), and the task reconnects and
//! resubscribes while anyone still waits.
//!
//! A channel stays subscribed for [`LINGER`] after its last waiter leaves: a key that is
//! contended now is likely contended again soon, and a waiter that finds its channel already
//! subscribed is covered from its first attempt (no SUBSCRIBE, and no second attempt to cover
//! a release that came before the subscription).

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use tokio::time::Instant;

use futures_util::StreamExt as _;
use redis::{
    RedisResult,
    aio::{PubSubSink, PubSubStream},
};
use tokio::sync::{Notify, mpsc, oneshot};

use crate::backend::api::{Hearing, NextInLine, Watch};

/// How long a channel stays subscribed after its last waiter left.
const LINGER: Duration = Duration::from_secs(2);

/// How often a connection with subscribed channels is asked a `PING`: one that died silently
/// (a NAT or firewall that dropped it; redis-rs leaves TCP keepalive off) is then taken for
/// lost within this and a request timeout, waking every waiter, rather than never.
const HEARTBEAT: Duration = Duration::from_secs(3);

enum Op {
    Subscribe(String, oneshot::Sender<bool>),
    /// The server moved (a Sentinel failover): drop the connection and resubscribe there.
    #[cfg_attr(not(feature = "redis-sentinel"), allow(dead_code))]
    Reconnect,
    /// The last waiter of a channel left: its linger starts.
    Idle,
}

struct Channel {
    waiters: usize,
    /// The server confirmed the subscription and the connection has not dropped since.
    confirmed: bool,
    /// When the last waiter left, while nobody waits.
    idle_since: Option<Instant>,
    notify: Arc<Notify>,
    /// The fair waiter the last release named as next in line (the message's payload).
    next: NextInLine,
}

struct Shared {
    /// The server to subscribe on; `None` until known (a Sentinel master not yet found).
    client: Mutex<Option<redis::Client>>,
    /// A Cluster's seed nodes: channels are shard channels (`SSUBSCRIBE`), each on the node
    /// that serves its slot, over one RESP3 cluster connection.
    #[cfg(feature = "redis-cluster")]
    cluster: Option<Vec<String>>,
    request_timeout: Duration,
    channels: Mutex<HashMap<String, Channel>>,
    /// The server's ACL refused a SUBSCRIBE: waiters poll from then on, and nobody asks again.
    denied: std::sync::atomic::AtomicBool,
}

impl Shared {
    fn channels(&self) -> std::sync::MutexGuard<'_, HashMap<String, Channel>> {
        // Every update is one counter change, insert or remove: a poisoned map is consistent.
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

pub(crate) struct Notifier {
    shared: Arc<Shared>,
    control: Mutex<Control>,
}

/// The way to the connection task.
struct Control {
    ops: mpsc::UnboundedSender<Op>,
    /// Taken by the first waiter, which starts the task (building a locker needs no runtime).
    pending: Option<mpsc::UnboundedReceiver<Op>>,
}

impl Notifier {
    /// Notifications on `client` (one server, or `None` until a Sentinel master is found).
    pub(crate) fn new(client: Option<redis::Client>, request_timeout: Duration) -> Self {
        Self::with_shared(Shared {
            client: Mutex::new(client),
            #[cfg(feature = "redis-cluster")]
            cluster: None,
            request_timeout,
            channels: Mutex::default(),
            denied: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Release notifications of a Redis Cluster: shard channels on the nodes of `seeds`.
    #[cfg(feature = "redis-cluster")]
    pub(crate) fn cluster(seeds: Vec<String>, request_timeout: Duration) -> Self {
        Self::with_shared(Shared {
            client: Mutex::new(None),
            cluster: Some(seeds),
            request_timeout,
            channels: Mutex::default(),
            denied: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn with_shared(shared: Shared) -> Self {
        let (ops, receiver) = mpsc::unbounded_channel();
        Self {
            shared: Arc::new(shared),
            control: Mutex::new(Control {
                ops,
                pending: Some(receiver),
            }),
        }
    }

    /// The way to the connection task, starting it on the current runtime if it is not running:
    /// at first use, and again when the runtime it ran on has shut down (a locker outlives it).
    fn ops(&self) -> mpsc::UnboundedSender<Op> {
        let mut control = self.control.lock().unwrap_or_else(PoisonError::into_inner);
        if control.ops.is_closed() && control.pending.is_none() {
            tracing::debug!("release notification task gone with its runtime; starting it again");
            let (ops, receiver) = mpsc::unbounded_channel();
            *control = Control {
                ops,
                pending: Some(receiver),
            };
        }
        if let Some(receiver) = control.pending.take() {
            tokio::spawn(run(self.shared.clone(), receiver));
        }
        control.ops.clone()
    }

    /// Subscribes on `client` from now on (a Sentinel master found, or moved); an open
    /// connection to another server is dropped and its channels resubscribed on this one.
    #[cfg(feature = "redis-sentinel")]
    pub(crate) fn follow(&self, client: redis::Client) {
        let moved = {
            let mut current = self
                .shared
                .client
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let moved = current.as_ref().is_some_and(|c| {
                c.get_connection_info().addr() != client.get_connection_info().addr()
            });
            *current = Some(client);
            moved
        };
        if moved {
            let _ = self.ops().send(Op::Reconnect);
        }
    }

    /// A wake-up for releases of `key` when the channel is subscribed already (a waiter is on
    /// it, or one left less than [`LINGER`] ago); no I/O.
    pub(crate) fn watching(&self, key: &str) -> Option<Watch> {
        let (notify, next) = {
            let mut channels = self.shared.channels();
            let channel = channels.get_mut(key).filter(|c| c.confirmed)?;
            channel.waiters += 1;
            channel.idle_since = None;
            (channel.notify.clone(), channel.next.clone())
        };
        let registration = Registration {
            shared: self.shared.clone(),
            ops: self.ops(),
            key: key.to_owned(),
        };
        Some(Watch::new(notify, next, registration).hearing(self.hearing(key)))
    }

    /// A wake-up for releases of `key`, once the server has confirmed the subscription; `None`
    /// when notifications cannot be had now.
    pub(crate) async fn watch(&self, key: &str) -> Option<Watch> {
        if self
            .shared
            .denied
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return None;
        }
        let (notify, next) = {
            let mut channels = self.shared.channels();
            let channel = channels.entry(key.to_owned()).or_insert_with(|| Channel {
                waiters: 0,
                confirmed: false,
                idle_since: None,
                notify: Arc::new(Notify::new()),
                next: NextInLine::default(),
            });
            channel.waiters += 1;
            channel.idle_since = None;
            (channel.notify.clone(), channel.next.clone())
        };
        let ops = self.ops();
        let registration = Registration {
            shared: self.shared.clone(),
            ops: ops.clone(),
            key: key.to_owned(),
        };
        let (reply, confirmed) = oneshot::channel();
        ops.send(Op::Subscribe(key.to_owned(), reply)).ok()?;
        let subscribed = tokio::time::timeout(self.shared.request_timeout * 2, confirmed)
            .await
            .ok()?
            .ok()?;
        subscribed.then(|| Watch::new(notify, next, registration).hearing(self.hearing(key)))
    }

    /// Whether `key`'s channel is subscribed on a live connection: from a drop until the
    /// connection is back and subscribed again, its waiters hear no release.
    fn hearing(&self, key: &str) -> Hearing {
        let (shared, key) = (self.shared.clone(), key.to_owned());
        Arc::new(move || shared.channels().get(&key).is_some_and(|c| c.confirmed))
    }
}

/// One waiter's interest in a channel; the last one to go starts the channel's linger.
struct Registration {
    shared: Arc<Shared>,
    ops: mpsc::UnboundedSender<Op>,
    key: String,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut channels = self.shared.channels();
        let last = channels.get_mut(&self.key).is_some_and(|c| {
            c.waiters -= 1;
            if c.waiters == 0 {
                c.idle_since = Some(Instant::now());
            }
            c.waiters == 0
        });
        if last {
            let _ = self.ops.send(Op::Idle);
        }
    }
}

/// Where subscriptions are sent: a pub/sub connection, or (Cluster) a RESP3 cluster connection
/// that routes each `SSUBSCRIBE` to the node serving the channel's slot.
enum Sink {
    Plain(PubSubSink),
    #[cfg(feature = "redis-cluster")]
    Sharded(redis::cluster_async::ClusterConnection),
}

/// Where messages arrive.
enum Stream {
    Plain(PubSubStream),
    #[cfg(feature = "redis-cluster")]
    Sharded(mpsc::UnboundedReceiver<redis::PushInfo>),
}

impl Sink {
    async fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Self::Plain(sink) => sink.subscribe(channel).await,
            #[cfg(feature = "redis-cluster")]
            Self::Sharded(connection) => connection.ssubscribe(channel).await,
        }
    }

    async fn unsubscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Self::Plain(sink) => sink.unsubscribe(channel).await,
            #[cfg(feature = "redis-cluster")]
            Self::Sharded(connection) => connection.sunsubscribe(channel).await,
        }
    }

    /// A `PING` (on a Cluster, to a node the connection picks).
    async fn ping(&mut self) -> RedisResult<()> {
        match self {
            Self::Plain(sink) => sink.ping::<redis::Value>().await.map(drop),
            #[cfg(feature = "redis-cluster")]
            Self::Sharded(connection) => redis::cmd("PING")
                .query_async::<redis::Value>(connection)
                .await
                .map(drop),
        }
    }
}

impl Stream {
    /// The next message's channel and payload; `None` when the connection is lost.
    async fn next(&mut self) -> Option<(String, String)> {
        match self {
            Self::Plain(stream) => stream.next().await.map(|message| {
                let payload = message.get_payload::<String>().unwrap_or_default();
                (message.get_channel_name().to_owned(), payload)
            }),
            #[cfg(feature = "redis-cluster")]
            Self::Sharded(pushes) => loop {
                let push = pushes.recv().await?;
                match push.kind {
                    redis::PushKind::SMessage => {
                        let mut data = push.data.into_iter();
                        let (Some(channel), Some(payload)) = (data.next(), data.next()) else {
                            continue;
                        };
                        let channel = redis::from_redis_value::<String>(channel).ok()?;
                        let payload =
                            redis::from_redis_value::<String>(payload).unwrap_or_default();
                        return Some((channel, payload));
                    }
                    redis::PushKind::Disconnection => return None,
                    _ => {}
                }
            },
        }
    }
}

async fn connect(shared: &Shared) -> Option<(Sink, Stream)> {
    #[cfg(feature = "redis-cluster")]
    if let Some(seeds) = &shared.cluster {
        let (pushes, received) = mpsc::unbounded_channel();
        let connected = async {
            let client = redis::cluster::ClusterClient::builder(seeds.clone())
                .use_protocol(redis::ProtocolVersion::RESP3)
                .push_sender(pushes)
                .connection_timeout(shared.request_timeout)
                .build()?;
            client.get_async_connection().await
        };
        return match tokio::time::timeout(shared.request_timeout, connected).await {
            Ok(Ok(connection)) => Some((Sink::Sharded(connection), Stream::Sharded(received))),
            Ok(Err(error)) => {
                tracing::debug!(error = %error, "release notifications unavailable; waiters poll");
                None
            }
            Err(_) => {
                tracing::debug!(
                    "release notifications unavailable (connect timed out); waiters poll"
                );
                None
            }
        };
    }
    let client = shared
        .client
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()?;
    match tokio::time::timeout(shared.request_timeout, client.get_async_pubsub()).await {
        Ok(Ok(pubsub)) => {
            let (sink, stream) = pubsub.split();
            Some((Sink::Plain(sink), Stream::Plain(stream)))
        }
        Ok(Err(error)) => {
            tracing::debug!(error = %error, "release notifications unavailable; waiters poll");
            None
        }
        Err(_) => {
            tracing::debug!("release notifications unavailable (connect timed out); waiters poll");
            None
        }
    }
}

async fn subscribe(shared: &Shared, sink: &mut Sink, key: &str) -> bool {
    match tokio::time::timeout(shared.request_timeout, sink.subscribe(key)).await {
        Ok(Ok(())) => true,
        Ok(Err(error)) if error.code() == Some("NOPERM") => {
            if !shared
                .denied
                .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                // Redis says "... to run the 'ssubscribe' command" when the command is refused
                // (7.2 puts the user's name before it), else it names the channel.
                let lacks = if error.detail().is_some_and(|d| d.contains("' command")) {
                    "the command, `+subscribe`, on a Cluster `+ssubscribe`"
                } else {
                    "the channel permission `&<prefix>*`"
                };
                tracing::warn!(
                    channel = %key,
                    "the Redis user may not SUBSCRIBE to release notifications (its ACL rule \
                     lacks {lacks}): this locker's waiters poll instead"
                );
            }
            false
        }
        Ok(Err(error)) => {
            tracing::debug!(error = %error, "SUBSCRIBE refused; waiters of this key poll");
            false
        }
        Err(_) => false,
    }
}

/// Marks `key`'s channel confirmed after the server accepted the subscription.
fn confirm(shared: &Shared, key: &str) {
    if let Some(channel) = shared.channels().get_mut(key) {
        channel.confirmed = true;
    }
}

/// Forgets the channels whose linger is over and returns them; `next` becomes the end of the
/// earliest linger still running.
fn expired(shared: &Shared, next: &mut Option<Instant>) -> Vec<String> {
    let now = Instant::now();
    let mut channels = shared.channels();
    let gone: Vec<String> = channels
        .iter()
        .filter(|(_, c)| c.waiters == 0 && c.idle_since.is_some_and(|t| t + LINGER <= now))
        .map(|(k, _)| k.clone())
        .collect();
    for key in &gone {
        channels.remove(key);
    }
    *next = channels
        .values()
        .filter(|c| c.waiters == 0)
        .filter_map(|c| c.idle_since)
        .min()
        .map(|t| t + LINGER);
    gone
}

/// The task that owns the pub/sub connection.
async fn run(shared: Arc<Shared>, ops: mpsc::UnboundedReceiver<Op>) {
    let mut listener = Listener {
        shared,
        ops,
        connection: None,
        subscribed: HashSet::new(),
        retry: Duration::from_millis(50),
        failed_at: None,
        missed: false,
        next_sweep: None,
        next_ping: Instant::now() + HEARTBEAT,
    };
    loop {
        let go_on = if listener.connection.is_some() {
            listener.serve().await
        } else {
            listener.connect().await
        };
        if !go_on {
            return;
        }
    }
}

/// The state of [`run`]: the pub/sub connection, its channels, and the requests of waiters.
struct Listener {
    shared: Arc<Shared>,
    ops: mpsc::UnboundedReceiver<Op>,
    connection: Option<(Sink, Stream)>,
    subscribed: HashSet<String>,
    /// The pause after a failed connection attempt before the next one (waiters poll).
    retry: Duration,
    /// When the last connection attempt failed, if none succeeded since (cleared too when the
    /// server moved: a Sentinel failover is tried at once).
    failed_at: Option<Instant>,
    /// The connection was lost, or could not be made, since waiters last looked: releases may
    /// have come that nobody heard.
    missed: bool,
    /// When the next lingering channel is due to be unsubscribed.
    next_sweep: Option<Instant>,
    /// When the connection is next asked a `PING` (see [`HEARTBEAT`]).
    next_ping: Instant,
}

impl Listener {
    /// Without a connection: when someone waits, reconnect and resubscribe; when nobody does,
    /// connect when someone asks; within the retry pause after a failed attempt, neither.
    /// `false` when the locker is gone.
    async fn connect(&mut self) -> bool {
        let wanted: Vec<String> = {
            let mut channels = self.shared.channels();
            // Lingering channels are not worth a reconnection.
            channels.retain(|_, c| c.waiters > 0);
            channels.keys().cloned().collect()
        };
        self.next_sweep = None;
        // After a failed connection, none before the retry pause is over, whatever waiters ask
        // meanwhile (each asks again about once a second while it has no wake-up): they are
        // answered at once, and poll.
        if let Some(failed) = self.failed_at
            && failed.elapsed() < self.retry
        {
            return tokio::select! {
                () = tokio::time::sleep_until(failed + self.retry) => true,
                op = self.ops.recv() => match op {
                    None => false,
                    Some(Op::Subscribe(_, reply)) => {
                        let _ = reply.send(false);
                        true
                    }
                    Some(Op::Idle) => true,
                    // Another server: worth trying at once.
                    Some(Op::Reconnect) => {
                        self.failed_at = None;
                        true
                    }
                },
            };
        }
        if wanted.is_empty() {
            return match self.ops.recv().await {
                None => false,
                Some(Op::Idle | Op::Reconnect) => true,
                Some(Op::Subscribe(key, reply)) => {
                    let Some(mut connection) = connect(&self.shared).await else {
                        self.connect_failed();
                        let _ = reply.send(false);
                        return true;
                    };
                    self.connected();
                    // Nobody waited while it was down: nobody missed a release.
                    self.missed = false;
                    let ok = self.subscribe(&mut connection.0, key).await;
                    let _ = reply.send(ok);
                    self.connection = Some(connection);
                    true
                }
            };
        }
        if let Some(mut connection) = connect(&self.shared).await {
            for key in wanted {
                self.subscribe(&mut connection.0, key).await;
            }
            tracing::debug!("release notifications restored");
            self.connection = Some(connection);
            self.connected();
            if std::mem::take(&mut self.missed) {
                // Every waiter looks once more for what came while nobody listened.
                for channel in self.shared.channels().values() {
                    channel.next.heard(None);
                    channel.notify.notify_waiters();
                }
            }
            return true;
        }
        self.connect_failed();
        true
    }

    /// A connection attempt failed: the next one waits the retry pause, which doubles with each
    /// failure in a row up to 2s (from 50ms after a connection was made).
    fn connect_failed(&mut self) {
        self.missed = true;
        if self.failed_at.is_some() {
            self.retry = (self.retry * 2).min(Duration::from_secs(2));
        }
        self.failed_at = Some(Instant::now());
    }

    fn connected(&mut self) {
        self.failed_at = None;
        self.retry = Duration::from_millis(50);
        self.next_ping = Instant::now() + HEARTBEAT;
    }

    /// Subscribes `key` on `sink` (unless it is already), recording it; whether it worked.
    async fn subscribe(&mut self, sink: &mut Sink, key: String) -> bool {
        let ok = self.subscribed.contains(&key) || subscribe(&self.shared, sink, &key).await;
        if ok {
            confirm(&self.shared, &key);
            self.subscribed.insert(key);
        }
        ok
    }

    /// With a connection: delivers a message, unsubscribes lingering channels, or serves a
    /// waiter's request. `false` when the locker is gone.
    async fn serve(&mut self) -> bool {
        let Some((mut sink, mut stream)) = self.connection.take() else {
            return true;
        };
        let sweep_at = self.next_sweep.unwrap_or_else(crate::lease::far_future);
        let pings = !self.subscribed.is_empty();
        tokio::select! {
            message = stream.next() => match message {
                Some((name, payload)) => {
                    let channels = self.shared.channels();
                    if let Some(channel) = channels.get(&name) {
                        channel.next.heard(Some(payload.as_str()).filter(|p| !p.is_empty()));
                        channel.notify.notify_waiters();
                    }
                }
                None => {
                    tracing::debug!("release notification connection lost; waiters poll until it is back");
                    self.drop_connection(true);
                    return true;
                }
            },
            () = tokio::time::sleep_until(sweep_at), if self.next_sweep.is_some() => {
                for key in expired(&self.shared, &mut self.next_sweep) {
                    if self.subscribed.remove(&key) {
                        let _ = tokio::time::timeout(self.shared.request_timeout, sink.unsubscribe(&key)).await;
                    }
                }
            }
            () = tokio::time::sleep_until(self.next_ping), if pings => {
                let answered = tokio::time::timeout(self.shared.request_timeout, sink.ping()).await;
                if !matches!(answered, Ok(Ok(()))) {
                    tracing::debug!("release notification connection did not answer a PING; waiters poll until it is back");
                    self.drop_connection(true);
                    return true;
                }
                self.next_ping = Instant::now() + HEARTBEAT;
            }
            op = self.ops.recv() => match op {
                None => return false,
                Some(Op::Subscribe(key, reply)) => {
                    let ok = self.subscribe(&mut sink, key).await;
                    let _ = reply.send(ok);
                }
                Some(Op::Idle) => {
                    if self.next_sweep.is_none() {
                        self.next_sweep = Some(Instant::now() + LINGER);
                    }
                }
                Some(Op::Reconnect) => {
                    tracing::debug!("release notifications move to the new master");
                    self.drop_connection(false);
                    return true;
                }
            },
        }
        self.connection = Some((sink, stream));
        true
    }

    /// The connection is gone (lost, or to a master that is no more): every waiter looks at
    /// once (`lost`: as if any release happened) and polls until it is back.
    fn drop_connection(&mut self, lost: bool) {
        self.connection = None;
        self.missed = true;
        self.subscribed.clear();
        for channel in self.shared.channels().values_mut() {
            channel.confirmed = false;
            if lost {
                channel.next.heard(None);
            }
            channel.notify.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{super::test_server::Server, *};

    /// What the notification task logs, as text.
    #[derive(Clone, Default)]
    struct Log(Arc<Mutex<Vec<u8>>>);

    impl Log {
        /// Debug events of this thread written here while the guard lives.
        fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
            let log = Self::default();
            let subscriber = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::DEBUG)
                .with_ansi(false)
                .with_writer({
                    let log = log.clone();
                    move || log.clone()
                })
                .finish();
            (log, tracing::subscriber::set_default(subscriber))
        }
    }

    impl std::io::Write for Log {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// While the server cannot be reached and nobody waits, waiters asking for a subscription
    /// (each asks again about once a second while it has none) connect no more often than the
    /// retry pause after a failed connection: 20 requests 10ms apart make a few connection
    /// attempts (each logged), not one each.
    #[tokio::test]
    async fn requests_while_the_server_is_unreachable_back_off() {
        // A port nobody listens on: every connection is refused.
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        // The test's runtime has one thread, which the notification task runs on too.
        let (log, _default) = Log::capture();
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
        let notifier = Notifier::new(Some(client), Duration::from_millis(200));
        for _ in 0..20 {
            assert!(notifier.watch("k").await.is_none());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
        let attempts = text.matches("release notifications unavailable").count();
        eprintln!("{attempts} connection attempts for 20 requests");
        assert!(
            (1..=6).contains(&attempts),
            "{attempts} connection attempts for 20 requests"
        );
    }

    /// A Sentinel move ends the retry pause: after a few failed connection attempts in a row
    /// the pause is 800ms, and a waiter that asks just after the locker follows the new master
    /// is subscribed there at once (before, it was answered "no" until the pause was over, and
    /// polled).
    #[cfg(feature = "redis-sentinel")]
    #[tokio::test]
    async fn a_sentinel_move_ends_the_retry_pause() {
        let refused = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let new_master = Server::start();
        let (log, _default) = Log::capture();
        let attempts = || {
            String::from_utf8(log.0.lock().unwrap().clone())
                .unwrap()
                .matches("release notifications unavailable")
                .count()
        };
        let client = |port: u16| redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
        let notifier = Notifier::new(Some(client(refused)), Duration::from_millis(500));
        // Five failures in a row: the pause after the fifth is 800ms (50, 100, 200, 400, 800).
        let deadline = Instant::now() + Duration::from_secs(10);
        while attempts() < 5 {
            assert!(Instant::now() < deadline, "{} attempts in 10s", attempts());
            assert!(notifier.watch("k").await.is_none());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        notifier.follow(client(new_master.1));
        let watch = notifier.watch("k").await;
        assert!(
            watch.is_some(),
            "a waiter asking right after the move was not subscribed on the new master \
             ({} connection attempts failed)",
            attempts()
        );
    }

    /// A connection that stops answering without closing (the server frozen with SIGSTOP: its
    /// socket stays open, as behind a NAT that dropped the connection silently) is taken for
    /// lost at its next `PING`: the subscribed waiter is woken, and the channel is no longer
    /// taken for subscribed.
    #[tokio::test]
    async fn a_connection_that_stops_answering_is_taken_for_lost() {
        let server = Server::start();
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", server.1)).unwrap();
        let notifier = Notifier::new(Some(client), Duration::from_millis(300));
        let watch = notifier.watch("k").await.expect("subscribed");
        let heard = watch.heard();
        let signal = |name: &str| {
            let status = std::process::Command::new("kill")
                .args([name, &server.0.id().to_string()])
                .status()
                .unwrap();
            assert!(status.success(), "kill {name}");
        };
        signal("-STOP");
        let deadline = Instant::now() + HEARTBEAT + Duration::from_secs(3);
        while watch.heard() == heard {
            if Instant::now() >= deadline {
                signal("-CONT");
                panic!("a connection that stopped answering woke nobody");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            notifier.watching("k").is_none(),
            "still taken for subscribed"
        );
        signal("-CONT");
    }

    /// Releases while the notification connection is down are heard by nobody: once it is
    /// back, every waiter is told to look once more. The server is stopped under a subscribed
    /// waiter (which is woken by the loss, and whose wake-up says it hears nothing meanwhile:
    /// the waiter asks at `DLOCK_RETRY`), and started again on its port: the waiter is woken a
    /// second time once the connection is made again, and its wake-up hears again.
    #[tokio::test]
    async fn a_connection_made_again_wakes_every_waiter() {
        let server = Server::start();
        let port = server.1;
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
        let notifier = Notifier::new(Some(client), Duration::from_millis(300));
        let watch = notifier.watch("k").await.expect("subscribed");
        assert!(watch.hears(), "subscribed, yet deaf");
        let heard = watch.heard();
        drop(server);
        let deadline = Instant::now() + Duration::from_secs(5);
        while watch.heard() == heard {
            assert!(Instant::now() < deadline, "the loss woke nobody");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            !watch.hears(),
            "taken to hear releases with its connection lost"
        );
        // Down for a while: a few connection attempts fail.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let after_loss = watch.heard();
        let _again = Server::start_on(port);
        let deadline = Instant::now() + Duration::from_secs(5);
        while watch.heard() == after_loss {
            assert!(
                Instant::now() < deadline,
                "the waiter was not told to look again once the connection was back"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(notifier.watching("k").is_some(), "subscribed again");
        assert!(watch.hears(), "deaf with its connection back");
    }
}
