//! The engines every semantic case runs on, in one place: adding an engine is one name in
//! [`engine_suite!`](crate::engine_suite) plus an arm in [`Engine::start`] that starts its
//! servers.

use std::{
    sync::{Arc, Mutex, Weak},
    time::Duration,
};

use crate::resp::Value;
use dlock_runtime::{LockError, LockGuard, LockOptions, Locker};

use crate::{
    PostgresServer, RedisServer, cluster::RedisCluster, etcd::EtcdCluster, redlock::RedLockServers,
    sentinel::RedisSentinels, zookeeper::ZkEnsemble,
};

/// The names of the engines the shared suite runs on; [`engine_suite!`](crate::engine_suite)
/// makes one test module of each.
///
/// - `redis`: one `redis-server`, the default user.
/// - `redis_acl`: the same, as a user created with exactly the ACL rule docs/redis.md gives.
/// - `redis_acl_no_channels`: that rule without its channel pattern: releases must still
///   succeed, and waiters poll.
/// - `redis_cluster`: a 3-master, 3-replica Redis Cluster (one per test binary, shared), as a
///   user created on every node with exactly the ACL rule docs/redis.md gives.
/// - `redis_sentinel`: a master, 2 replicas and 3 sentinels (one per test binary, shared), as
///   that user, created on the master and the replicas.
/// - `redlock`: RedLock over 5 independent `redis-server`s (one set per test binary, shared).
/// - `postgres`: a throwaway PostgreSQL cluster (one per test binary, shared; `initdb` takes a
///   second or two).
/// - `etcd`: one etcd member (one per test binary, shared).
/// - `etcd_cluster`: 3 etcd members of one cluster, local processes (one per test binary,
///   shared).
/// - `zookeeper`: one standalone ZooKeeper server (one per test binary, shared: a JVM takes a
///   second to start).
/// - `zookeeper_ensemble`: a 3-server ZooKeeper ensemble (one per test binary, shared).
/// - `memory`: the embedded backend.
pub const ENGINES: &[&str] = &[
    "redis",
    "redis_acl",
    "redis_acl_no_channels",
    "redis_cluster",
    "redis_sentinel",
    "redlock",
    "postgres",
    "etcd",
    "etcd_cluster",
    "zookeeper",
    "zookeeper_ensemble",
    "memory",
];

/// The engine of the runtime's table each deployment of [`ENGINES`] runs (as
/// `EngineUrl::engine` names it), so that a test can check the suite covers every engine.
pub const COVERS: &[(&str, &str)] = &[
    ("redis", "redis"),
    ("redis_acl", "redis"),
    ("redis_acl_no_channels", "redis"),
    ("redis_cluster", "redis-cluster"),
    ("redis_sentinel", "redis-sentinel"),
    ("redlock", "redlock"),
    ("postgres", "postgres"),
    ("etcd", "etcd"),
    ("etcd_cluster", "etcd"),
    ("zookeeper", "zookeeper"),
    ("zookeeper_ensemble", "zookeeper"),
    ("memory", "memory"),
];

/// Expands to one module per engine of [`ENGINES`], each with one `#[tokio::test]` per case;
/// a case is an `async fn(Engine)` in the calling file.
///
/// ```text
/// dlock_tests::engine_suite!(acquire_then_release, busy_lock_is_not_granted);
/// ```
#[macro_export]
macro_rules! engine_suite {
    ($($case:ident),* $(,)?) => {
        $crate::engine_suite!(
            @engines [redis, redis_acl, redis_acl_no_channels, redis_cluster, redis_sentinel, redlock, postgres, etcd, etcd_cluster, zookeeper, zookeeper_ensemble, memory]
            [$($case),*]
        );
    };
    (@engines [$($engine:ident),*] $cases:tt) => {
        $( $crate::engine_suite!(@engine $engine $cases); )*
    };
    (@engine $engine:ident [$($case:ident),*]) => {
        mod $engine {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case($crate::engines::Engine::start(stringify!($engine))).await;
                }
            )*
        }
    };
}

/// One engine deployment under test, stopped when dropped.
#[derive(Debug)]
pub enum Engine {
    /// A `redis-server`, and the URL its lockers use (with an ACL user's credentials, or not).
    Redis {
        /// The server.
        server: RedisServer,
        /// What lockers connect with.
        url: String,
    },
    /// A deployment shared by the tests of this binary that run at the same time (slow to
    /// start), and the URL of its engine.
    Shared {
        /// Keeps the deployment up while this test runs.
        deployment: Arc<dyn std::any::Any + Send + Sync>,
        /// What lockers connect with.
        url: String,
        /// Where workers and tests keep their data when lockers log in as the ACL user of
        /// docs/redis.md, whose keys are lock keys only (else `url`).
        data_url: Option<String>,
    },
    /// The embedded backend: lockers from [`Engine::locker`] share one table.
    Memory(Locker),
}

/// The deployment of `slot`, started by `start` unless a running test still holds one: tests of
/// one binary share it, and the last one to finish stops it (nothing outlives the binary).
///
/// # Panics
/// When `start` does.
pub fn shared<T: Send + Sync + 'static>(
    slot: &'static Mutex<Weak<T>>,
    start: impl FnOnce() -> T,
) -> Arc<T> {
    let mut current = slot
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(deployment) = current.upgrade() {
        return deployment;
    }
    let deployment = Arc::new(start());
    *current = Arc::downgrade(&deployment);
    deployment
}

impl Engine {
    /// A shared deployment whose lockers and data use the same `url`.
    fn shared(deployment: Arc<dyn std::any::Any + Send + Sync>, url: String) -> Self {
        Self::Shared {
            deployment,
            url,
            data_url: None,
        }
    }

    /// Starts the engine named in [`ENGINES`].
    ///
    /// # Panics
    /// For a name not in [`ENGINES`], or when its servers do not start (a missing binary names
    /// the package to install).
    #[must_use]
    pub fn start(name: &str) -> Self {
        match name {
            "redis" => {
                let server = RedisServer::start();
                let url = server.url();
                Self::Redis { server, url }
            }
            "redis_acl" | "redis_acl_no_channels" => {
                let server = RedisServer::start();
                let mut rule = readme_acl_rule();
                if name == "redis_acl_no_channels" {
                    rule.retain(|word| !word.starts_with('&'));
                }
                set_acl_user(&rule, |args| server.command(args));
                let url = format!(
                    "redis://dlock-app:{ACL_PASSWORD}@127.0.0.1:{}",
                    server.port()
                );
                Self::Redis { server, url }
            }
            "redis_cluster" => {
                static CLUSTER: Mutex<Weak<RedisCluster>> = Mutex::new(Weak::new());
                let cluster = shared(&CLUSTER, || {
                    let cluster = RedisCluster::start();
                    for port in cluster.live() {
                        set_acl_user(&readme_acl_rule(), |args| cluster.command(port, args));
                    }
                    cluster
                });
                let data_url = cluster.url();
                let url = with_acl_user(&data_url);
                Self::Shared {
                    deployment: cluster,
                    url,
                    data_url: Some(data_url),
                }
            }
            "redis_sentinel" => {
                static SENTINELS: Mutex<Weak<RedisSentinels>> = Mutex::new(Weak::new());
                let sentinels = shared(&SENTINELS, || {
                    let sentinels = RedisSentinels::start();
                    let data =
                        std::iter::once(sentinels.master_port()).chain(sentinels.replica_ports());
                    for port in data {
                        set_acl_user(&readme_acl_rule(), |args| sentinels.command(port, args));
                    }
                    sentinels
                });
                let data_url = sentinels.url();
                let url = with_acl_user(&data_url);
                Self::Shared {
                    deployment: sentinels,
                    url,
                    data_url: Some(data_url),
                }
            }
            "redlock" => {
                static MASTERS: Mutex<Weak<RedLockServers>> = Mutex::new(Weak::new());
                let masters = shared(&MASTERS, RedLockServers::start);
                let url = masters.url();
                Self::shared(masters, url)
            }
            "etcd" | "etcd_cluster" => {
                static SINGLE: Mutex<Weak<EtcdCluster>> = Mutex::new(Weak::new());
                static THREE: Mutex<Weak<EtcdCluster>> = Mutex::new(Weak::new());
                let etcd = if name == "etcd" {
                    shared(&SINGLE, EtcdCluster::single)
                } else {
                    shared(&THREE, || EtcdCluster::start(3))
                };
                let url = etcd.url();
                Self::shared(etcd, url)
            }
            "postgres" => {
                static POSTGRES: Mutex<Weak<PostgresServer>> = Mutex::new(Weak::new());
                let server = shared(&POSTGRES, || {
                    let server = PostgresServer::start();
                    // Once, here: concurrent `CREATE TABLE IF NOT EXISTS` can fail.
                    server
                        .sql(&format!(
                            "{}\n{};",
                            crate::pg::TABLES,
                            crate::pg::ORDER_TABLE
                        ))
                        .expect("create the workers' tables");
                    server
                });
                let url = server.url();
                Self::shared(server, url)
            }
            "zookeeper" => {
                static ZOOKEEPER: Mutex<Weak<ZkEnsemble>> = Mutex::new(Weak::new());
                let server = shared(&ZOOKEEPER, ZkEnsemble::single);
                let url = server.url();
                Self::shared(server, url)
            }
            "zookeeper_ensemble" => {
                static ENSEMBLE: Mutex<Weak<ZkEnsemble>> = Mutex::new(Weak::new());
                let ensemble = shared(&ENSEMBLE, || ZkEnsemble::start(3));
                let url = ensemble.url();
                Self::shared(ensemble, url)
            }
            "memory" => Self::Memory(
                Locker::builder()
                    .memory()
                    .timeout(Duration::from_secs(5))
                    .expire(Duration::from_secs(10))
                    .build()
                    .expect("valid memory locker"),
            ),
            other => panic!("unknown engine `{other}`; the engines are {ENGINES:?}"),
        }
    }

    /// A new client with short test defaults (5s wait, 10s lease): its own connection on a
    /// server, a clone sharing the table for memory.
    #[must_use]
    pub fn locker(&self) -> Locker {
        self.locker_with_expire(Duration::from_secs(10))
    }

    /// A new client whose default (and renewed) lease is `expire`. For memory it has a private
    /// table.
    ///
    /// # Panics
    /// When the locker cannot be built.
    #[must_use]
    pub fn locker_with_expire(&self, expire: Duration) -> Locker {
        match self {
            Self::Redis { url, .. } | Self::Shared { url, .. } => {
                let mut builder = Locker::builder()
                    .url(url.as_str())
                    .timeout(Duration::from_secs(5))
                    .expire(expire);
                if url.starts_with("redis+redlock") {
                    // RedLock refuses a request timeout above a fifth of the lease.
                    builder = builder.request_timeout((expire / 5).min(Duration::from_millis(500)));
                }
                builder.build().expect("valid test locker")
            }
            Self::Memory(locker) if expire == Duration::from_secs(10) => locker.clone(),
            Self::Memory(_) => Locker::builder()
                .memory()
                .timeout(Duration::from_secs(5))
                .expire(expire)
                .build()
                .expect("valid memory locker"),
        }
    }
}

impl Engine {
    /// The URL its lockers connect with (`DLOCK_URL` for a process of its own); `None` for the
    /// embedded engine, whose table lives in this process.
    #[must_use]
    pub fn url(&self) -> Option<&str> {
        match self {
            Self::Redis { url, .. } | Self::Shared { url, .. } => Some(url),
            Self::Memory(_) => None,
        }
    }

    /// Where the workers and the tests keep their data ([`Store`](crate::store::Store)): the lock
    /// URL, or for the ACL engines the server's own (their user may touch lock keys only).
    #[must_use]
    pub fn data_url(&self) -> Option<String> {
        match self {
            Self::Redis { server, .. } => Some(server.url()),
            Self::Shared { url, data_url, .. } => Some(data_url.as_ref().unwrap_or(url).clone()),
            Self::Memory(_) => None,
        }
    }

    /// What the engine holds for the full lock key `full_key` (a key without `/`, `%` or glob
    /// characters, as [`unique_key`](crate::unique_key) makes), read with the engine's own
    /// tools, one line per entry: Redis keys that name it on every data node (`redis-cli
    /// --scan`: the lock and fair mode's queue), etcd keys in its line (`etcdctl`), ZooKeeper
    /// nodes in its line (and in a semaphore's `locks` and `leases`), PostgreSQL rows of the
    /// lock and of its queue (`psql`). Nothing for the embedded engine, whose table lives in
    /// the process.
    ///
    /// # Panics
    /// When the engine's tool cannot be run.
    pub async fn leftovers(&self, full_key: &str) -> Vec<String> {
        let deployment: &(dyn std::any::Any + Send + Sync) = match self {
            Self::Redis { server, .. } => return redis_keys(&[server.port()], full_key),
            Self::Shared { deployment, .. } => deployment.as_ref(),
            Self::Memory(_) => return Vec::new(),
        };
        if let Some(cluster) = deployment.downcast_ref::<RedisCluster>() {
            return redis_keys(&cluster.masters(), full_key);
        }
        if let Some(sentinels) = deployment.downcast_ref::<RedisSentinels>() {
            return redis_keys(&[sentinels.master_port()], full_key);
        }
        if let Some(masters) = deployment.downcast_ref::<RedLockServers>() {
            return redis_keys(&masters.ports(), full_key);
        }
        if let Some(server) = deployment.downcast_ref::<PostgresServer>() {
            let rows = server
                .sql(&format!(
                    "SELECT 'lock ' || fence FROM dlock_locks WHERE key = '{full_key}' \
                     UNION ALL SELECT 'place ' || place FROM dlock_waiters WHERE key = '{full_key}' \
                     UNION ALL SELECT 'shared ' || mode || ' ' || fence FROM dlock_shared \
                      WHERE key = '{full_key}' AND to_regclass('dlock_shared') IS NOT NULL"
                ))
                .expect("psql");
            return rows.lines().map(str::to_owned).collect();
        }
        if let Some(etcd) = deployment.downcast_ref::<EtcdCluster>() {
            // The keys in its line. (A locker's session lease outlives its keys until the
            // locker closes or its TTL runs out; it holds nothing up, and `etcd.rs` checks
            // that closing revokes it.)
            let keys = etcdctl(
                etcd,
                &["get", "--prefix", "--keys-only", &format!("{full_key}/")],
            );
            return keys
                .lines()
                .filter(|l| !l.is_empty())
                .map(|k| format!("key {k}"))
                .collect();
        }
        if let Some(zookeeper) = deployment.downcast_ref::<ZkEnsemble>() {
            let client = zookeeper_client::Client::connect(&zookeeper.hosts())
                .await
                .expect("connect to ZooKeeper");
            // The lock's node, under the default prefix's parent node (`/dlock:/<key>`).
            let key = full_key
                .strip_prefix("dlock:")
                .expect("a key under the default prefix `dlock:`");
            let path = format!("/dlock:/{key}");
            // A server that lags the leader catches up first.
            client.sync(&path).await.expect("zookeeper sync");
            let children = |path: String| {
                let client = client.clone();
                async move {
                    match client.list_children(&path).await {
                        Ok(children) => children,
                        Err(zookeeper_client::Error::NoNode) => Vec::new(),
                        Err(e) => panic!("list the children of {path}: {e}"),
                    }
                }
            };
            // A semaphore's nodes are in its `locks` and `leases` (Curator's layout); those
            // containers themselves, empty, are removed by the server later.
            let mut nodes = Vec::new();
            for child in children(path.clone()).await {
                if child == "locks" || child == "leases" {
                    for node in children(format!("{path}/{child}")).await {
                        nodes.push(format!("node {child}/{node}"));
                    }
                } else {
                    nodes.push(format!("node {child}"));
                }
            }
            return nodes;
        }
        panic!("no tool to read this engine's entries")
    }
}

/// The keys naming `full_key` on the Redis servers at `ports` (`redis-cli --scan`).
fn redis_keys(ports: &[u16], full_key: &str) -> Vec<String> {
    let mut keys = Vec::new();
    for port in ports {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &port.to_string(), "--scan", "--pattern"])
            .arg(format!("*{full_key}*"))
            .output()
            .expect("run redis-cli (installed with redis-server)");
        assert!(out.status.success(), "redis-cli: {out:?}");
        keys.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(|k| format!("{port} {k}")),
        );
    }
    keys.sort();
    keys
}

fn etcdctl(etcd: &EtcdCluster, args: &[&str]) -> String {
    let out = etcd.etcdctl().args(args).output().expect("run etcdctl");
    assert!(out.status.success(), "etcdctl {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The password the ACL engines' user gets in place of the README's `>CHANGE-ME`.
const ACL_PASSWORD: &str = "acl-test-pw";

/// The `ACL SETUSER dlock-app …` line of the Redis page (`docs/redis.md`), split into words,
/// with the test password: the suite runs as exactly the user the docs tell operators to
/// create.
///
/// # Panics
/// When the page has no such line.
#[must_use]
pub fn readme_acl_rule() -> Vec<String> {
    let page = include_str!("../../docs/redis.md");
    let line = page
        .lines()
        .find(|l| l.starts_with("ACL SETUSER dlock-app "))
        .expect("docs/redis.md gives the ACL rule for a dlock user");
    line.split_whitespace()
        .map(|word| match word {
            ">CHANGE-ME" => format!(">{ACL_PASSWORD}"),
            other => other.to_owned(),
        })
        .collect()
}

/// Creates `dlock-app` with `rule` (`ACL SETUSER` and its words) through `command` (one data
/// node's call).
///
/// # Panics
/// When the node does not answer `OK`.
fn set_acl_user(rule: &[String], command: impl FnOnce(&[&str]) -> crate::resp::RedisResult<Value>) {
    let args: Vec<&str> = rule.iter().map(String::as_str).collect();
    let reply = command(&args);
    assert!(matches!(reply, Ok(Value::Okay)), "{args:?}: {reply:?}");
}

/// A `redis+cluster://` or `redis+sentinel://` URL that logs in as `dlock-app` (the data
/// nodes' user; the sentinels are asked as before).
fn with_acl_user(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
    format!("{scheme}://dlock-app:{ACL_PASSWORD}@{rest}")
}

/// The ACL rule of [`readme_acl_rule`] less the words `without`, as `ACL SETUSER`
/// arguments, and the password it sets (for a URL, and to check no error shows it).
#[must_use]
pub fn acl_rule_without(without: &[&str]) -> (Vec<String>, &'static str) {
    let mut rule = readme_acl_rule();
    rule.retain(|word| !without.contains(&word.as_str()));
    (rule, ACL_PASSWORD)
}

/// A locker at `url` that waits up to 10s and asks again only every 3s: one that gets a lock
/// within a second of its release was woken, not polling.
pub fn slow_poller(url: &str) -> dlock_runtime::LockerBuilder {
    Locker::builder()
        .url(url)
        .retry(Duration::from_secs(3), Duration::from_secs(3))
        .timeout(Duration::from_secs(10))
}

/// Two lockers at `url` hand a fresh key over twice, a waiter blocked behind a holder until the
/// holder's release wakes it, with every `warn` captured, which this returns (a user refused
/// the release notifications' channels is told there, once per locker). The lockers retry
/// every 3s, so a waiter that was not woken but polled could not get the lock within the
/// second after the release that each hand-off must take.
///
/// # Panics
/// When a hand-off fails or takes a second or more, or the log shows the ACL user's password.
#[must_use]
pub fn hand_offs_logged(url: &str) -> String {
    let captured = crate::Captured::default();
    captured.block_on(tracing::Level::WARN, async {
        let locker = || slow_poller(url).build().expect("valid test locker");
        let (holder, waiter) = (locker(), locker());
        let key = crate::unique_key("hand-offs");
        for _ in 0..2 {
            let held = holder.acquire(&key, LockOptions::new()).await.unwrap();
            let waiting = tokio::spawn({
                let (waiter, key) = (waiter.clone(), key.clone());
                async move { waiter.acquire(&key, LockOptions::new()).await }
            });
            // Its first attempt refused, the waiter waits (and listens) by now.
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert!(!waiting.is_finished(), "the waiter did not wait");
            let released = tokio::time::Instant::now();
            held.release().await.unwrap();
            let next = waiting.await.unwrap().expect("the waiter got the lock");
            assert!(
                released.elapsed() < Duration::from_secs(1),
                "the waiter got the lock {:?} after the release: it polled",
                released.elapsed()
            );
            next.release().await.unwrap();
        }
    });
    let log = captured.text();
    assert!(!log.contains(ACL_PASSWORD), "the password in a log:\n{log}");
    log
}

/// Acquires `key` and returns the error, checking that it came `within` (a refusal that asking
/// again cannot cure ends the wait at once, not at its timeout) as a `Backend` refusal.
///
/// # Panics
/// When the acquisition succeeds, comes later, or fails another way.
pub async fn refused_within(locker: &Locker, key: &str, within: Duration) -> LockError {
    let started = tokio::time::Instant::now();
    let err = locker
        .acquire(key, LockOptions::new())
        .await
        .expect_err("the acquisition was refused");
    assert!(
        started.elapsed() < within,
        "retried for {:?} instead of failing at once: {err}",
        started.elapsed()
    );
    let LockError::Backend(backend) = &err else {
        panic!("expected a Backend error, got {err:?}");
    };
    assert!(backend.is_refused(), "{backend:?}");
    err
}

/// Renews `guard` (to 30s) until the answer is not a backend error, for up to 15s: after a
/// failover the client is still finding the new master or slot owner for a while.
///
/// # Errors
/// The first answer that is not a backend error (or the last one after 15s).
pub async fn extend_once_reachable(guard: &LockGuard) -> Result<(), LockError> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        match guard.extend(Duration::from_secs(30)).await {
            Err(e) if e.is_backend() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            outcome => return outcome,
        }
    }
}

/// Acquires through a locker on `url` that waits 1s with 200ms requests, and returns the
/// error, checking that it came within 5s (a dead or wrong engine must never hang a caller),
/// and that a ping fails with a backend error too.
///
/// # Panics
/// When the acquisition succeeds, or its error comes later than that.
pub async fn error_within_the_wait(url: &str) -> LockError {
    let locker = Locker::builder()
        .url(url)
        .timeout(Duration::from_secs(1))
        .request_timeout(Duration::from_millis(200))
        .build()
        .expect("a valid URL");
    let started = tokio::time::Instant::now();
    let err = locker
        .acquire(&crate::unique_key("nowhere"), LockOptions::new())
        .await
        .expect_err("nothing to lock on");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{url}: the error took {:?}",
        started.elapsed()
    );
    // A readiness check says the same, within its bound.
    let started = tokio::time::Instant::now();
    let ping = locker.ping().await;
    assert!(
        ping.as_ref().is_err_and(LockError::is_backend),
        "{url}: ping {ping:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{url}: the ping took {:?}",
        started.elapsed()
    );
    err
}

/// A client for the failover tests on `url`: waits 20s (a failover takes seconds), 30s lease,
/// 300ms requests, and `DLOCK_REDIS_WAIT=replicas`.
///
/// # Panics
/// When the URL is invalid.
#[must_use]
pub fn failover_locker(url: &str, replicas: u32) -> Locker {
    Locker::builder()
        .url(url)
        .redis_wait(replicas)
        .timeout(Duration::from_secs(20))
        .expire(Duration::from_secs(30))
        .request_timeout(Duration::from_millis(300))
        .build()
        .expect("a valid URL")
}

/// After a failover that lost `first`'s lock: `other` takes the key, its fence is higher, and a
/// resource keeping the highest fence it has seen refuses `first`'s write after the new holder's.
///
/// # Panics
/// When the key cannot be taken, or the fences do not fence.
pub async fn taken_over_and_fenced(other: &Locker, key: &str, first: &LockGuard) -> LockGuard {
    let second = other
        .acquire(key, LockOptions::new())
        .await
        .expect("the promoted replica never had the lock");
    assert!(
        second.fencing_token() > first.fencing_token(),
        "fence {} after {}: the failover re-issued a fence",
        second.fencing_token(),
        first.fencing_token()
    );
    let mut highest = 0;
    let mut write = |fence: u64| {
        let accepted = fence >= highest;
        highest = highest.max(fence);
        accepted
    };
    assert!(write(second.fencing_token()));
    assert!(
        !write(first.fencing_token()),
        "the old holder's write got through"
    );
    second
}

/// Checks that a short hold counts its lease from the grant, not from before the session the
/// first acquisition opens: `proxy` (between `locker`, not connected yet, and its server)
/// holds the bytes back for 1.6s, so opening the session takes that long; the hold, with a
/// 1s lease, must be held when `acquire` returns, and extend.
///
/// # Panics
/// When the hold is born lapsed, or the acquisition or extension fails.
pub async fn short_hold_after_a_slow_session(locker: &Locker, proxy: &crate::proxy::Proxy) {
    let key = crate::unique_key("slow-session");
    proxy.cut();
    let acquiring = locker.acquire(
        &key,
        LockOptions::new()
            .expire(Duration::from_secs(1))
            .timeout(Duration::from_secs(10)),
    );
    let started = tokio::time::Instant::now();
    let (guard, ()) = tokio::join!(acquiring, async {
        tokio::time::sleep(Duration::from_millis(1_600)).await;
        proxy.heal();
    });
    let guard = guard.expect("acquired once the session opened");
    assert!(
        started.elapsed() >= Duration::from_millis(1_600),
        "the session opened through the cut"
    );
    assert!(guard.is_held(), "the short hold was born lapsed");
    guard
        .extend(Duration::from_secs(5))
        .await
        .expect("a held hold extends");
    guard.release().await.expect("released");
}
