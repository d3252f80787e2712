//! Test harness for dlock: starts real `redis-server` processes on free loopback ports and stops
//! them when dropped, with the faults the fault tests need (kill, restart on the same port,
//! SIGSTOP/SIGCONT), and the Cluster and Sentinel deployments of the engine suite.
//!
//! The deployments and the proxy live in [`dlock_testkit`], where the examples and the
//! benchmark use them too; they are re-exported here under the names the tests use
//! ([`RedisServer`], [`cluster`], [`sentinel`], [`free_port`], [`INSTALL_REDIS`], [`proxy`]). A
//! missing server binary fails the test with the command that installs it.
#![warn(unreachable_pub, missing_debug_implementations)]

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use dlock_runtime::Locker;

pub mod engines;
pub mod pg;
pub mod store;
pub use dlock_testkit::postgres::{self, PostgresServer};
pub use dlock_testkit::{
    INSTALL_REDIS, RedisServer, cluster, etcd, free_port, proxy, redlock, resp, sentinel, zookeeper,
};
pub use engines::Engine;

/// Takes `key` with default options and releases it at once, panicking on any error: a warm-up
/// (connection made, scripts loaded) or a check that the key is free.
///
/// # Panics
/// When the lock cannot be taken or released.
pub async fn acquire_and_release(locker: &Locker, key: &str) {
    let guard = locker
        .acquire(key, dlock_runtime::LockOptions::new())
        .await
        .unwrap_or_else(|e| panic!("acquire `{key}`: {e}"));
    guard
        .release()
        .await
        .unwrap_or_else(|e| panic!("release `{key}`: {e}"));
}

/// A task that waits for `key` on `waiter` (up to 20s), releases it, and returns when it got it.
///
/// # Panics
/// (In the task) when the lock cannot be taken or released.
pub fn spawn_waiter(waiter: &Locker, key: &str) -> tokio::task::JoinHandle<tokio::time::Instant> {
    let (waiter, key) = (waiter.clone(), key.to_owned());
    tokio::spawn(async move {
        let options = dlock_runtime::LockOptions::new().timeout(Duration::from_secs(20));
        let guard = waiter.acquire(&key, options).await.unwrap();
        let at = tokio::time::Instant::now();
        guard.release().await.unwrap();
        at
    })
}

/// A waiter with the release wake-up asks the engine a few times a second while the lock is
/// held: one waiter of `waiter` behind `holder`'s hold of `key`, once `in_line` says it waits
/// in the engine's queue, makes 2 to 12 requests in 2s (every 250-500ms; at `DLOCK_RETRY`'s
/// 10-50ms it made 40-200), and the release still wakes it within 1s. `requests` reads a running
/// count of the engine's requests, each reading adding `own` to it; `what` names them.
///
/// # Panics
/// When the waiter asks more or less often, or is not woken.
pub async fn asks_a_few_times_a_second<R, F>(
    (holder, waiter): (&Locker, &Locker),
    key: &str,
    in_line: impl std::future::Future<Output = ()>,
    mut requests: R,
    (own, what): (u64, &str),
) where
    R: FnMut() -> F,
    F: std::future::Future<Output = u64>,
{
    let held = holder
        .acquire(key, dlock_runtime::LockOptions::new())
        .await
        .unwrap();
    let waiting = spawn_waiter(waiter, key);
    in_line.await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = requests().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let asked = requests().await - before - own;
    assert!(
        (2..=12).contains(&asked),
        "{asked} {what} in 2s of waiting with the wake-up"
    );
    let released_at = tokio::time::Instant::now();
    held.release().await.unwrap();
    let woke = waiting.await.unwrap() - released_at;
    assert!(woke < Duration::from_secs(1), "woken after {woke:?}");
}

/// Waits for `waiters` (of [`spawn_waiter`], each on a locker whose poll is 3s) and checks that
/// each got the lock within 2.5s of `released_at`: from release wake-ups, in turn, not a poll.
///
/// # Panics
/// When a waiter failed, or got the lock later.
pub async fn woken_in_turn(
    waiters: Vec<tokio::task::JoinHandle<tokio::time::Instant>>,
    released_at: tokio::time::Instant,
) {
    for waiter in waiters {
        let got = waiter.await.unwrap() - released_at;
        assert!(
            got < Duration::from_millis(2500),
            "a waiter got the lock {got:?} after the first release: a 3s poll, not a wake-up"
        );
    }
}

/// How many connections of the Redis server `redis` is connected to subscribe to `channel`.
///
/// # Panics
/// When the server does not answer.
pub fn subscribers(redis: &mut redis::Connection, channel: &str) -> usize {
    let (_, n): (String, usize) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query(redis)
        .unwrap();
    n
}

/// Four lockers on `url` that poll only once a second take turns on one key with empty bodies,
/// 25 holds each, each asking again at once after its release (as the benchmark's W3 does):
/// every hold but the first is taken while the others sleep in line, and many are taken by a
/// process that just released, which no sleeping waiter was refused by. The key must never sit
/// free until a poll: each release must wake the line.
///
/// # Panics
/// When a lock call fails, or the key stayed free 400ms or more with waiters asleep.
pub async fn releases_keep_waking_the_line(url: &str) {
    let key = unique_key("retaken");
    let sections = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let locker = Locker::builder()
                .url(url)
                .retry(Duration::from_secs(1), Duration::from_secs(1))
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap();
            let (key, sections) = (key.clone(), sections.clone());
            tokio::spawn(async move {
                for _ in 0..25 {
                    let guard = locker
                        .acquire(&key, dlock_runtime::LockOptions::new())
                        .await
                        .unwrap();
                    let acquired = tokio::time::Instant::now();
                    tokio::task::yield_now().await;
                    let released = tokio::time::Instant::now();
                    guard.release().await.unwrap();
                    sections.lock().unwrap().push((acquired, released));
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let mut sections = sections.lock().unwrap().clone();
    sections.sort();
    let longest = sections.windows(2).map(|w| w[1].0 - w[0].1).max().unwrap();
    assert!(
        longest < Duration::from_millis(400),
        "the key stayed free for {longest:?} with waiters asleep"
    );
}

/// A place that leaves a key's queue while the key is held wakes nobody; the release that follows
/// wakes the place then first (Redis and RedLock share `leave.lua`). `lockers` are three
/// processes' lockers, a, b and c, polling slowly (several seconds); `queue` is a connection to
/// the server holding the key's queue (RedLock: the key's first master) and the queue's name;
/// `wake_ups` counts that server's `PUBLISH` calls.
///
/// c holds; a's waiter, then b's, are in line in that order; a's is dropped: no `PUBLISH`. Then
/// c's next waiter is passed the lock and c's place, behind b's, leaves; then c releases: one
/// `PUBLISH`, and b gets the lock within a second of that release (its poll is slower).
///
/// # Panics
/// When a lock call fails, the queue never has the places it should, or a count is off.
pub async fn leaving_while_held_wakes_nobody(
    [a, b, c]: [&Locker; 3],
    key: &str,
    (mut redis, queue): (redis::Connection, &str),
    wake_ups: impl Fn() -> u64,
) {
    use dlock_runtime::LockOptions;
    use tokio::time::Instant;

    let mut places = async |len: usize| queue_reaches(&mut redis, queue, len).await;
    let waiter = |locker: &Locker| {
        let (locker, key) = (locker.clone(), key.to_owned());
        tokio::spawn(async move {
            locker
                .acquire(&key, LockOptions::new().timeout(Duration::from_secs(20)))
                .await
        })
    };

    let holder = c.acquire(key, LockOptions::new()).await.unwrap();
    let before = wake_ups();
    let dropped = waiter(a);
    places(1).await;
    let b_waits = waiter(b);
    places(2).await;
    dropped.abort();
    places(1).await;
    assert_eq!(
        wake_ups() - before,
        0,
        "a's place leaving woke b's while c held the key"
    );

    let before = wake_ups();
    let passed = waiter(c);
    places(2).await;
    // In line, c's waiter offers to take the lock from c's holder.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let first_fence = holder.fencing_token();
    holder.release().await.unwrap();
    let passed = passed.await.unwrap().unwrap();
    assert!(passed.fencing_token() > first_fence);
    places(1).await;
    assert!(!b_waits.is_finished(), "b got the lock while c held it");
    let released_at = Instant::now();
    passed.release().await.unwrap();
    let b_holds = b_waits.await.unwrap().unwrap();
    let woke = released_at.elapsed();
    assert!(
        woke < Duration::from_secs(1),
        "b got the lock {woke:?} after the release: its poll, not a wake-up"
    );
    assert_eq!(
        wake_ups() - before,
        1,
        "beyond the wake-up that handed the lock to b, c's place leaving after the pass woke b's"
    );
    b_holds.release().await.unwrap();
    places(0).await;
}

/// The name of the Redis list that holds the waiting places of `key` (a key of the default
/// prefix, `dlock:`): on one server, a Cluster's key slot, or RedLock's first master for the key.
#[must_use]
pub fn queue_of(key: &str) -> String {
    format!("dlock:__fair:{{dlock:{key}}}:queue")
}

/// Waits (up to 15s) until the Redis list `queue` (a key's queue of places) holds `places`
/// places.
///
/// # Panics
/// When it never does, or the server does not answer.
pub async fn queue_reaches(redis: &mut redis::Connection, queue: &str, places: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let now: usize = redis::Commands::llen(redis, queue).unwrap();
        if now == places {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the queue has {now} places, never {places}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs the `dlock-env-check` binary (`exe`: its `CARGO_BIN_EXE_dlock-env-check`) with none of
/// this process's `DLOCK_*`, `REDIS_URL` or `SSL_CERT*` variables, but `env` and, when given,
/// `SSL_CERT_FILE=ca` (how rustls' native roots learn of a private CA); returns what it printed.
///
/// # Panics
/// When it cannot be run or fails.
#[must_use]
pub fn env_check(exe: &str, env: &[(&str, &str)], ca: Option<&std::path::Path>) -> String {
    let mut command = std::process::Command::new(exe);
    for (name, _) in std::env::vars() {
        if name.starts_with("DLOCK_") || name == "REDIS_URL" || name.starts_with("SSL_CERT") {
            command.env_remove(name);
        }
    }
    command.envs(env.iter().copied());
    if let Some(ca) = ca {
        command.env("SSL_CERT_FILE", ca);
    }
    let output = command.output().expect("run dlock-env-check");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

/// A key no other test in this process uses.
#[must_use]
pub fn unique_key(name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{name}:{}:{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A non-atomic increment with an `.await` between the read and the write: callers that are not
/// excluded from each other lose updates (each writes back what it read, plus one).
pub async fn racy_increment(counter: &AtomicU64) {
    let seen = counter.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(10)).await;
    counter.store(seen + 1, Ordering::SeqCst);
}

/// `waiters` tasks of `locker` contend for `key` at once, each taking it once (with `options`)
/// to run [`racy_increment`] on one counter; returns the counter, which is `waiters` unless
/// holders overlapped.
///
/// # Panics
/// When an acquisition or a release fails.
pub async fn contend(
    locker: &Locker,
    key: &str,
    options: &dlock_runtime::LockOptions,
    waiters: u64,
) -> u64 {
    let counter = std::sync::Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..waiters)
        .map(|_| {
            let (locker, key, counter, options) = (
                locker.clone(),
                key.to_owned(),
                counter.clone(),
                options.clone(),
            );
            tokio::spawn(async move {
                let guard = locker.acquire(&key, options).await.unwrap();
                racy_increment(&counter).await;
                guard.release().await.unwrap();
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    counter.load(Ordering::SeqCst)
}

/// A `tracing` writer that keeps what is written, for tests that read the events dlock emitted.
#[derive(Clone, Debug, Default)]
pub struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Captured {
    /// Everything written so far.
    ///
    /// # Panics
    /// When a writer panicked while holding the buffer.
    #[must_use]
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("not poisoned")).into_owned()
    }

    /// Waits up to `within` until a line written here `matches`, looking every 10ms.
    ///
    /// # Panics
    /// When none did by then: `what` did not happen, with everything written.
    pub async fn wait_for_line(
        &self,
        within: Duration,
        matches: impl Fn(&str) -> bool,
        what: &str,
    ) {
        let deadline = tokio::time::Instant::now() + within;
        while !self.text().lines().any(&matches) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what} within {within:?}:\n{}",
                self.text()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Runs `future` on a runtime of this thread alone, every task of which (background
    /// releases too) logs here, events up to `level` without colours. A do-nothing dispatcher
    /// is kept for the whole process beside this one: while a process has a single dispatcher,
    /// `tracing` settles each event's interest from whichever thread first meets it, and
    /// another test's thread, with no subscriber, would turn the event off here too.
    ///
    /// # Panics
    /// When the runtime cannot be made.
    pub fn block_on<F: std::future::Future>(&self, level: tracing::Level, future: F) -> F::Output {
        static BESIDE: std::sync::OnceLock<tracing::Dispatch> = std::sync::OnceLock::new();
        BESIDE.get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()));
        let subscriber = tracing_subscriber::fmt()
            .with_writer(self.clone())
            .with_max_level(level)
            .with_ansi(false)
            .finish();
        let _subscribed = tracing::subscriber::set_default(subscriber);
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime")
            .block_on(future)
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("not poisoned").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Self;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// A `dlock-worker` process in `pause-holder` mode that took a lock and was then frozen with
/// SIGSTOP while holding it.
#[derive(Debug)]
pub struct FrozenHolder {
    child: std::process::Child,
    out: std::io::BufReader<std::process::ChildStdout>,
    /// The fencing token the worker's acquisition got.
    pub fence: u64,
}

impl FrozenHolder {
    /// Starts `command` (a worker in `pause-holder` mode), waits for its `acquired <fence>`,
    /// then stops it.
    ///
    /// # Panics
    /// When the worker cannot start, says anything else, or cannot be stopped.
    #[must_use]
    pub fn spawn(command: &mut std::process::Command) -> Self {
        use std::io::BufRead as _;
        let mut child = command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {command:?}: {e}"));
        let mut out = std::io::BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        out.read_line(&mut line).expect("the worker's first line");
        let fence = line
            .trim()
            .strip_prefix("acquired ")
            .and_then(|f| f.parse().ok())
            .unwrap_or_else(|| panic!("worker said {line:?}"));
        signal(&child, "-STOP");
        Self { child, out, fence }
    }

    /// Continues the worker, lets it try its fenced write and release (`go`), and returns what
    /// it reports (`held=… lost_resolved=… write_accepted=… release=…`) once it exited cleanly.
    ///
    /// # Panics
    /// When the worker cannot be continued, says nothing, or fails.
    #[must_use]
    pub fn resume(mut self) -> String {
        use std::io::{BufRead as _, Write as _};
        signal(&self.child, "-CONT");
        self.child
            .stdin
            .take()
            .expect("piped stdin")
            .write_all(b"go\n")
            .expect("tell the worker to go on");
        let mut report = String::new();
        self.out
            .read_line(&mut report)
            .expect("the worker's report");
        assert!(self.child.wait().expect("the worker ends").success());
        report.trim().to_owned()
    }
}

impl Drop for FrozenHolder {
    /// A test that fails before [`resume`](Self::resume) leaves no stopped worker behind.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Sends `signal` (`-STOP`, `-CONT`, …) to `child` with kill(1).
///
/// # Panics
/// When kill fails.
pub fn signal(child: &std::process::Child, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} failed");
}

/// How many holds in a row a process may get by passes (the runtime's bound), plus the hold
/// that was not passed.
pub const MAX_PASSES: usize = 4;

/// Over the part of `history` (pid, fence) where both processes had holds to come (from the
/// first hold of the later one to the last hold of the one done first): the longest run of
/// consecutive holds by one process, the share of hand-offs from one process to the other,
/// and how many holds that part has.
///
/// # Panics
/// When `history` does not have exactly two processes.
#[allow(clippy::cast_precision_loss)]
#[must_use]
pub fn longest_run_while_both_wait(history: &[(u32, u64)]) -> (usize, f64, usize) {
    let pids: std::collections::BTreeSet<u32> = history.iter().map(|h| h.0).collect();
    assert_eq!(pids.len(), 2, "both processes held the lock");
    let first = |pid: u32| history.iter().position(|h| h.0 == pid).unwrap();
    let last = |pid: u32| history.iter().rposition(|h| h.0 == pid).unwrap();
    let start = pids.iter().map(|&p| first(p)).max().unwrap();
    let end = pids.iter().map(|&p| last(p)).min().unwrap();
    if start > end {
        return (0, 0.0, 0);
    }
    let both = &history[start..=end];
    let mut longest = 1;
    let mut run = 1;
    let mut switches = 0;
    for pair in both.windows(2) {
        if pair[0].0 == pair[1].0 {
            run += 1;
            longest = longest.max(run);
        } else {
            run = 1;
            switches += 1;
        }
    }
    (
        longest,
        switches as f64 / (both.len().max(2) - 1) as f64,
        both.len(),
    )
}

/// Runs two `dlock-worker` processes (`exe`, the tests' `CARGO_BIN_EXE_dlock-worker`) in `mode`
/// (`hot` or `hot-fair`) on `key` of `url`, `per_process` waiters each, started together; the
/// holds they made.
///
/// # Panics
/// When a worker fails or prints something else.
#[must_use]
pub fn hot_workers(exe: &str, url: &str, key: &str, per_process: u64, mode: &str) -> u64 {
    let workers: Vec<_> = (0..2)
        .map(|_| {
            std::process::Command::new(exe)
                .args([url, key, &per_process.to_string(), mode])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut made = 0u64;
    for worker in workers {
        let out = worker.wait_with_output().unwrap();
        assert!(out.status.success(), "{mode}: a worker failed");
        let out = String::from_utf8(out.stdout).unwrap();
        made += out
            .trim()
            .strip_prefix("done ")
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{mode}: a worker said {out:?}"));
    }
    made
}

/// The holds the workers recorded on `key` in `data` (their Redis store), in order: each
/// holder's pid and fence.
///
/// # Panics
/// When the list cannot be read or holds something else.
#[must_use]
pub fn hold_history(data: &mut redis::Connection, key: &str) -> Vec<(u32, u64)> {
    let holders: Vec<String> =
        redis::Commands::lrange(data, format!("{key}:holders"), 0, -1).unwrap();
    holders
        .iter()
        .map(|h| {
            let (pid, fence) = h.split_once(' ').unwrap();
            (pid.parse().unwrap(), fence.parse().unwrap())
        })
        .collect()
}

/// The holds whose release loses its reply in
/// [`release_with_its_reply_lost`]: a mutex and a semaphore's permit, each within its lease
/// (30s: `false`) and after it ran out (1s, waited out: `true`).
pub fn lost_reply_cases() -> [(dlock_runtime::LockOptions, Duration, bool); 4] {
    let (mutex, permit) = (
        dlock_runtime::LockOptions::new(),
        dlock_runtime::LockOptions::new().permits(2),
    );
    let (within, after) = (Duration::from_secs(30), Duration::from_secs(1));
    [
        (mutex.clone(), within, false),
        (mutex, after, true),
        (permit.clone(), within, false),
        (permit, after, true),
    ]
}

/// A hold of `key` (`options`, `lease`; waited out when `lapsed`) released through `proxy` with
/// its reply lost (see [`lose_the_release_reply`]). What the release, sent again on a new
/// connection, returns.
///
/// # Panics
/// When the acquisition fails, or the release has not run within 5s.
pub async fn release_with_its_reply_lost<G, F>(
    locker: &Locker,
    proxy: &proxy::Proxy,
    key: &str,
    (options, lease, lapsed): (dlock_runtime::LockOptions, Duration, bool),
    gone: G,
) -> Result<(), dlock_runtime::LockError>
where
    G: FnMut() -> F,
    F: std::future::Future<Output = bool>,
{
    let guard = locker.acquire(key, options.expire(lease)).await.unwrap();
    if lapsed {
        tokio::time::sleep(lease + Duration::from_millis(100)).await;
        assert!(!guard.is_held());
    }
    lose_the_release_reply(proxy, key, gone, || tokio::spawn(guard.release()))
        .await
        .await
        .unwrap()
}

/// Releases `key` through `proxy` by `release` with its reply lost: the replies are cut once
/// the release is written, and once the server ran it (`gone` says the hold is gone there) the
/// proxy closes the connection, dropping the reply. Returns what `release` returned, once that
/// happened.
///
/// # Panics
/// When the release has not run within 5s.
pub async fn lose_the_release_reply<G, F, T>(
    proxy: &proxy::Proxy,
    key: &str,
    mut gone: G,
    release: impl FnOnce() -> T,
) -> T
where
    G: FnMut() -> F,
    F: std::future::Future<Output = bool>,
{
    proxy.cut_replies_on(key.as_bytes());
    let releasing = release();
    // The release ran on the server; its reply waits in the proxy.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !(gone().await && proxy.replies_cut()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the release never ran"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    proxy.reset();
    releasing
}

/// Waits up to 20s for `waiting` (of [`spawn_waiter`]): how long after `since` it got the lock
/// (zero when before).
///
/// # Panics
/// When the waiter failed, or did not get the lock within 20s.
pub async fn got_lock_since(
    since: tokio::time::Instant,
    waiting: tokio::task::JoinHandle<tokio::time::Instant>,
) -> Duration {
    tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the waiter got the lock within 20s")
        .unwrap()
        .saturating_duration_since(since)
}

/// Checks that `waiting` (of [`spawn_waiter`]) got the lock within `bound` of `since` (the
/// release, or the moment the release's wake-up could reach it).
///
/// # Panics
/// As [`got_lock_since`], and when the lock came later than `bound`.
pub async fn woken_since(
    since: tokio::time::Instant,
    waiting: tokio::task::JoinHandle<tokio::time::Instant>,
    bound: Duration,
) {
    let after = got_lock_since(since, waiting).await;
    assert!(
        after < bound,
        "the lock came {after:?} after it could be woken: a poll, not a wake-up"
    );
}

#[cfg(test)]
mod tests {
    use super::Captured;

    /// An event met first on another thread, with no subscriber there, is still written to a
    /// capture of this thread's (without the dispatcher kept beside it, `tracing` had settled
    /// the event as never wanted).
    #[test]
    fn a_capture_hears_an_event_another_thread_met_first() {
        fn event() {
            tracing::warn!("met on two threads");
        }
        let captured = Captured::default();
        captured.block_on(tracing::Level::WARN, async {
            std::thread::spawn(event).join().unwrap();
            event();
        });
        assert!(
            captured.text().contains("met on two threads"),
            "{}",
            captured.text()
        );
    }
}
