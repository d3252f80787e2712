//! What the workloads are written over: a [`Contender`] (anything that takes a key and lets it
//! go: an engine's own lock, another library, or dlock), the W3 [`Counter`] on the engine's own
//! data, the engine's [`ServerStats`], and the [`Setup`] of one engine that lists them.

use std::{future::Future, pin::Pin, time::Duration};

use dlock_runtime::{LockOptions, Locker, dlock};
use dlock_testkit::deployment::Engine;

pub(crate) type Error = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
/// What a client runs while it holds the key.
pub(crate) type Body<'a> = BoxFuture<'a, Result<(), Error>>;

/// One way to lock a key: makes clients, each with its own connections.
pub(crate) trait Contender: Send + Sync {
    /// Its name in the table.
    fn name(&self) -> String;
    /// A new client.
    fn client(&self) -> BoxFuture<'_, Result<Box<dyn Client>, Error>>;
}

/// A client of a [`Contender`].
pub(crate) trait Client: Send {
    /// Takes `key` (waiting the contender's own way: a queue, a watch, or a retry every
    /// millisecond), runs `body`, and lets `key` go.
    fn hold<'a>(&'a mut self, key: &'a str, body: Body<'a>) -> BoxFuture<'a, Result<(), Error>>;
}

/// W3's shared counter, on the engine's own data (a key, a row, a znode): read, then written
/// back plus one, as two requests — not atomic, so overlapping holders lose updates.
pub(crate) trait Counter: Send + Sync {
    /// A handle with its own connection.
    fn handle<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Box<dyn CounterHandle>, Error>>;
}

/// One client's way to the counter.
pub(crate) trait CounterHandle: Send {
    fn get(&mut self) -> BoxFuture<'_, Result<u64, Error>>;
    fn set(&mut self, n: u64) -> BoxFuture<'_, Result<(), Error>>;
}

/// What the engine's servers tell of the load on them.
pub(crate) trait ServerStats: Send + Sync {
    /// Requests served so far (commands, RPCs, statements), when the engine can tell; what it
    /// calls them.
    fn requests(&self) -> BoxFuture<'_, Option<u64>>;
    /// CPU time of each server so far, when it can tell.
    fn cpu(&self) -> BoxFuture<'_, Vec<Duration>>;
    /// Requests the counting itself costs (an `INFO` per server, …), subtracted from deltas.
    fn own_requests(&self) -> u64 {
        0
    }
}

/// One engine, ready to measure.
pub(crate) struct Setup {
    pub(crate) engine: Engine,
    /// What dlock's lockers connect with.
    pub(crate) url: String,
    /// What the first line says of the deployment.
    pub(crate) about: String,
    /// The engine's own lock: the floor every ratio is against.
    pub(crate) floor: Box<dyn Contender>,
    /// Other ways people lock on this engine today, measured beside it.
    pub(crate) others: Vec<Box<dyn Contender>>,
    pub(crate) counter: Box<dyn Counter>,
    pub(crate) stats: Box<dyn ServerStats>,
    /// `redis://` URLs of the servers that take writes, on the Redis engines (W4 asks them).
    pub(crate) masters: Vec<String>,
    /// What the requests of `stats` are (`commands`, `RPCs`, `statements`, `requests`).
    pub(crate) requests_are: &'static str,
    /// Every key starts with it (on a Cluster a hash tag: one slot, one master).
    pub(crate) prefix: &'static str,
    /// Keys spread over several servers, when the engine has them (a Cluster's masters): their
    /// prefix (no hash tag), and the floor on such keys.
    pub(crate) spread: Option<(&'static str, Box<dyn Contender>)>,
    /// The throwaway deployment, stopped when this is dropped.
    pub(crate) _deployment: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl Setup {
    /// dlock's ways to lock, beside the floor: the API and the attribute, in the default mode;
    /// for W3 also fair mode (where the engine has it) and notifications off.
    pub(crate) fn dlock(&self, prefix: &'static str, contended: bool) -> Vec<Box<dyn Contender>> {
        let dlock = |name: &'static str, options: LockOptions, notify: bool, attribute: bool| {
            Box::new(Dlock {
                name,
                url: self.url.clone(),
                prefix,
                options,
                notify,
                attribute,
            }) as Box<dyn Contender>
        };
        if !contended {
            return vec![
                dlock("dlock API", LockOptions::new(), true, false),
                dlock("dlock attribute", LockOptions::new(), true, true),
            ];
        }
        let mut modes = vec![dlock("dlock default", LockOptions::new(), true, false)];
        if self.engine != Engine::RedLock {
            modes.push(dlock("dlock fair", LockOptions::new().fair(), true, false));
        }
        modes.push(dlock("dlock notify off", LockOptions::new(), false, false));
        modes
    }
}

/// dlock itself, through the API or the attribute.
struct Dlock {
    name: &'static str,
    url: String,
    prefix: &'static str,
    options: LockOptions,
    notify: bool,
    attribute: bool,
}

impl Contender for Dlock {
    fn name(&self) -> String {
        self.name.to_owned()
    }

    fn client(&self) -> BoxFuture<'_, Result<Box<dyn Client>, Error>> {
        Box::pin(async move {
            let locker = Locker::builder()
                .url(self.url.as_str())
                .key_prefix(self.prefix)
                .timeout(Duration::from_secs(60))
                .notify(self.notify)
                .build()?;
            Ok(Box::new(DlockClient {
                locker,
                options: self.options.clone(),
                attribute: self.attribute,
            }) as Box<dyn Client>)
        })
    }
}

struct DlockClient {
    locker: Locker,
    options: LockOptions,
    attribute: bool,
}

impl Client for DlockClient {
    fn hold<'a>(&'a mut self, key: &'a str, body: Body<'a>) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            if self.attribute {
                return locked(&self.locker, key, body).await;
            }
            let guard = self.locker.acquire(key, self.options.clone()).await?;
            body.await?;
            if let Err(e) = guard.release().await {
                // Counted and shown under the engine's table, not fatal: a release whose reply
                // did not come within the request timeout (a ZooKeeper write behind a slow
                // `fsync` on loaded cores) is sent again by dlock in the background, or the
                // lease frees the key; one must not throw away an engine's whole run.
                if RELEASE_ERRORS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 {
                    eprintln!("bench: a dlock release failed ({e}); counted, the run goes on");
                }
            }
            Ok(())
        })
    }
}

/// dlock releases that returned an error, over the whole run (see [`DlockClient`]'s `hold`).
pub(crate) static RELEASE_ERRORS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// The attribute's variant: the body runs inside a `#[dlock]` function.
#[dlock(key = "<key>", client = locker, timeout = "60s")]
async fn locked(locker: &Locker, key: &str, body: Body<'_>) -> Result<(), Error> {
    body.await
}

/// Microseconds on the system clock, which all processes of one machine share (W4's start
/// line; the fenced floors' fence proposals).
pub(crate) fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// 128 random bits as hex: a floor's token. One `format!` of a `u128`, as a user writes it
/// (formatting each byte on its own cost the floors about 9k instructions a cycle, a third of
/// the Redis floor's client).
pub(crate) fn token() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("OS random generator");
    format!("{:032x}", u128::from_ne_bytes(bytes))
}
