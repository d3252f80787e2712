//! The `--engine` of the oversell demo and the benchmark: which deployment they run on
//! ([`Engine`]), its throwaway deployment ([`Deployment`]), and a redis-rs connection for data
//! that is not a lock (the demo's stock, the benchmark's raw commands) on any Redis engine URL
//! ([`Connection`]). On etcd the data stays on a throwaway `redis-server` beside it
//! ([`Deployment::data_url`]).

use std::fmt;

use redis::{
    IntoConnectionInfo as _, RedisResult,
    aio::{ConnectionLike, MultiplexedConnection},
    cluster_async::ClusterConnection,
};

use crate::{
    RedisServer,
    cluster::RedisCluster,
    etcd::EtcdCluster,
    postgres::{INSTALL_POSTGRES, PostgresServer},
    redlock::RedLockServers,
    sentinel::INSTALL_SENTINEL,
    sentinel::RedisSentinels,
    zookeeper::{INSTALL_ZOOKEEPER, ZkEnsemble},
};

/// An engine the examples can run on: `--engine <name>` starts its throwaway deployment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
#[non_exhaustive]
pub enum Engine {
    /// One `redis-server` (`redis://`).
    Redis,
    /// A Redis Cluster of 3 masters and 3 replicas (`redis+cluster://`).
    RedisCluster,
    /// A master and 2 replicas watched by 3 sentinels (`redis+sentinel://`).
    RedisSentinel,
    /// RedLock over 5 independent masters (`redis+redlock://`).
    #[value(name = "redlock")]
    RedLock,
    /// One etcd member (`etcd://`; the examples' `etcd` feature).
    Etcd,
    /// A standalone ZooKeeper server (`zk://`): Curator's lock recipe.
    #[value(name = "zookeeper")]
    ZooKeeper,
    /// A PostgreSQL cluster (`postgres://`): the lock table in its database.
    Postgres,
    /// The embedded table of this process (`memory://`): nothing to start.
    Memory,
}

impl Engine {
    /// The flag's value: `redis`, `redis-cluster`, `redis-sentinel`, `redlock`, `etcd`,
    /// `zookeeper`, `postgres` or `memory`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Redis => "redis",
            Self::RedisCluster => "redis-cluster",
            Self::RedisSentinel => "redis-sentinel",
            Self::RedLock => "redlock",
            Self::Postgres => "postgres",
            Self::Etcd => "etcd",
            Self::ZooKeeper => "zookeeper",
            Self::Memory => "memory",
        }
    }

    /// The engine of a URL's engine name (as `dlock_runtime::EngineUrl::engine` says it).
    #[must_use]
    pub fn of_url_engine(name: &str) -> Option<Self> {
        <Self as clap::ValueEnum>::value_variants()
            .iter()
            .copied()
            .find(|e| e.name() == name)
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why `--engine etcd` cannot run: the examples were built without their `etcd` feature.
pub const ETCD_FEATURE: &str = "the examples were built without the etcd engine: run them with \
    `--features etcd` (e.g. `cargo run --example oversell --features etcd -- --engine etcd`); \
    building etcd-client needs `protoc` (`sudo apt-get install -y protobuf-compiler`)";

/// The throwaway deployment of an [`Engine`], stopped when dropped.
///
/// # Behavior
/// - **Start**: [`start`](Self::start) starts it on a blocking thread and returns once it is
///   healthy: a Cluster takes a few seconds (its nodes must agree), Sentinels a few more (the
///   sentinels must find each other).
/// - **Drop**: every process is killed and its directory removed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Deployment {
    /// One `redis-server`.
    Server(RedisServer),
    /// A Redis Cluster.
    Cluster(RedisCluster),
    /// A master, its replicas and the sentinels.
    Sentinels(RedisSentinels),
    /// RedLock's independent masters.
    RedLock(RedLockServers),
    /// A PostgreSQL cluster.
    Postgres(PostgresServer),
    /// One etcd member for the locks, and a `redis-server` for the data.
    Etcd {
        /// The locks' engine.
        etcd: EtcdCluster,
        /// Where the examples keep their data (the demo's stock, the benchmark's counter).
        data: RedisServer,
    },
    /// A standalone ZooKeeper server.
    ZooKeeper(ZkEnsemble),
    /// Nothing: the embedded table of the process.
    Memory,
}

impl Deployment {
    /// Starts the throwaway deployment of `engine` on free loopback ports.
    ///
    /// # Errors
    /// When a binary it needs is not installed (saying how to install it), or it does not come
    /// up healthy in time.
    pub async fn start(engine: Engine) -> Result<Self, String> {
        let missing = match engine {
            Engine::Redis | Engine::RedLock if !RedisServer::available() => {
                Some(crate::INSTALL_REDIS)
            }
            Engine::RedisCluster if !RedisCluster::available() => Some(
                "redis-server or redis-cli not found on PATH: install them with `sudo apt-get install -y redis-server`",
            ),
            Engine::RedisSentinel if !RedisSentinels::available() => Some(INSTALL_SENTINEL),
            Engine::Postgres if !PostgresServer::available() => Some(INSTALL_POSTGRES),
            Engine::Etcd if !cfg!(feature = "etcd") => Some(ETCD_FEATURE),
            Engine::Etcd if !EtcdCluster::available() => Some(crate::etcd::INSTALL_ETCD),
            Engine::Etcd if !RedisServer::available() => Some(crate::INSTALL_REDIS),
            Engine::ZooKeeper if !ZkEnsemble::available() => Some(INSTALL_ZOOKEEPER),
            _ => None,
        };
        if let Some(missing) = missing {
            return Err(missing.to_owned());
        }
        // The deployments wait with blocking sleeps, and say what went wrong by panicking.
        let started = tokio::task::spawn_blocking(move || match engine {
            Engine::Redis => RedisServer::try_start()
                .map(Self::Server)
                .map_err(|e| e.to_string()),
            Engine::RedisCluster => Ok(Self::Cluster(RedisCluster::start())),
            Engine::RedisSentinel => Ok(Self::Sentinels(RedisSentinels::start())),
            Engine::RedLock => RedLockServers::try_start_n(5)
                .map(Self::RedLock)
                .map_err(|e| e.to_string()),
            Engine::Postgres => PostgresServer::try_start()
                .map(Self::Postgres)
                .map_err(|e| e.to_string()),
            Engine::Etcd => RedisServer::try_start()
                .map(|data| Self::Etcd {
                    etcd: EtcdCluster::single(),
                    data,
                })
                .map_err(|e| e.to_string()),
            Engine::ZooKeeper => Ok(Self::ZooKeeper(ZkEnsemble::single())),
            Engine::Memory => Ok(Self::Memory),
        })
        .await;
        match started {
            Ok(deployment) => deployment,
            Err(e) => {
                let why = e.try_into_panic().ok().and_then(|panic| {
                    panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                });
                Err(why.unwrap_or_else(|| "the start was cancelled".to_owned()))
            }
        }
    }

    /// Its engine.
    #[must_use]
    pub fn engine(&self) -> Engine {
        match self {
            Self::Server(_) => Engine::Redis,
            Self::Cluster(_) => Engine::RedisCluster,
            Self::Sentinels(_) => Engine::RedisSentinel,
            Self::RedLock(_) => Engine::RedLock,
            Self::Postgres(_) => Engine::Postgres,
            Self::Etcd { .. } => Engine::Etcd,
            Self::ZooKeeper(_) => Engine::ZooKeeper,
            Self::Memory => Engine::Memory,
        }
    }

    /// The URL lockers (and [`Connection::open`]) take: `redis://127.0.0.1:p`,
    /// `redis+cluster://127.0.0.1:p1,…` (the masters), `redis+sentinel://127.0.0.1:s1,…/mymaster`
    /// `redis+redlock://127.0.0.1:p1,…` (the 5 masters), `postgres://dlock@127.0.0.1:p/postgres`
    /// or `zk://127.0.0.1:p`.
    #[must_use]
    pub fn url(&self) -> String {
        match self {
            Self::Server(server) => server.url(),
            Self::Cluster(cluster) => cluster.url(),
            Self::Sentinels(sentinels) => sentinels.url(),
            Self::RedLock(masters) => masters.url(),
            Self::Postgres(server) => server.url(),
            Self::Etcd { etcd, .. } => etcd.url(),
            Self::ZooKeeper(server) => server.url(),
            Self::Memory => "memory://".to_owned(),
        }
    }

    /// The URL of the data (the demo's stock, the benchmark's counter): [`url`](Self::url),
    /// except on etcd, whose data stays on a `redis-server` beside it.
    #[must_use]
    pub fn data_url(&self) -> String {
        match self {
            Self::Etcd { data, .. } => data.url(),
            _ => self.url(),
        }
    }

    /// The ports of the servers that take writes: the server, the Cluster's masters (sorted),
    /// the master the sentinels name, RedLock's masters, the PostgreSQL server, or etcd's data
    /// server.
    #[must_use]
    pub fn masters(&self) -> Vec<u16> {
        match self {
            Self::Server(server) => vec![server.port()],
            Self::Cluster(cluster) => cluster.masters(),
            Self::Sentinels(sentinels) => vec![sentinels.master_port()],
            Self::RedLock(masters) => masters.ports(),
            Self::Postgres(server) => vec![server.port()],
            Self::Etcd { data, .. } => vec![data.port()],
            Self::ZooKeeper(server) => vec![server.port(0)],
            Self::Memory => Vec::new(),
        }
    }

    /// One line on what runs, for the output:
    /// `throwaway redis-server 7.0.15 on 127.0.0.1:40793`,
    /// `throwaway Redis Cluster (redis-server 7.0.15): 3 masters on 127.0.0.1:p1,p2,p3, 3 replicas`,
    /// `throwaway PostgreSQL 15.14 on 127.0.0.1:40795 (…)`.
    #[must_use]
    pub fn describe(&self) -> String {
        let version = match self {
            Self::Postgres(_) => PostgresServer::version(),
            Self::ZooKeeper(server) => server.version(),
            _ => RedisServer::version(),
        }
        .map_or_else(String::new, |v| format!(" {v}"));
        let ports = |ports: &[u16]| {
            ports
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        match self {
            Self::Server(server) => {
                format!(
                    "throwaway redis-server{version} on 127.0.0.1:{}",
                    server.port()
                )
            }
            Self::Cluster(cluster) => format!(
                "throwaway Redis Cluster (redis-server{version}): 3 masters on 127.0.0.1:{}, 3 replicas",
                ports(&cluster.masters())
            ),
            Self::Postgres(server) => format!(
                "throwaway PostgreSQL{version} on 127.0.0.1:{} (initdb in a temporary directory, \
                 fsync off)",
                server.port()
            ),
            Self::Sentinels(sentinels) => format!(
                "throwaway Redis Sentinel (redis-server{version}): master 127.0.0.1:{}, 2 replicas, \
                 3 sentinels on 127.0.0.1:{}",
                sentinels.master_port(),
                ports(&sentinels.sentinel_ports())
            ),
            Self::ZooKeeper(server) => format!(
                "throwaway ZooKeeper{version} standalone server on 127.0.0.1:{} (a JVM; data in a \
                 temporary directory)",
                server.port(0)
            ),
            Self::RedLock(masters) => format!(
                "{} throwaway redis-server{version} as independent RedLock masters on 127.0.0.1:{}",
                masters.len(),
                ports(&masters.ports())
            ),
            Self::Etcd { etcd, data } => format!(
                "throwaway etcd{} (one member) on {}; the data on a throwaway redis-server{version} on 127.0.0.1:{}",
                etcd_version().map_or_else(String::new, |v| format!(" {v}")),
                etcd.endpoints().join(","),
                data.port()
            ),
            Self::Memory => "the embedded table of this process (memory://)".to_owned(),
        }
    }
}

/// The installed etcd's version, as `etcd --version` prints it (`3.4.23`), if it can tell.
fn etcd_version() -> Option<String> {
    let out = std::process::Command::new("etcd")
        .arg("--version")
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("etcd Version:"))?;
    Some(line.trim_start_matches("etcd Version:").trim().to_owned())
}

/// A redis-rs connection for data on any engine URL: `redis://` (one server),
/// `redis+cluster://h1:p1,h2:p2` (each command goes to the master of its key's slot),
/// `redis+sentinel://s1:p1,s2:p2/<master>` (the master the sentinels name when it connects) or
/// `redis+redlock://h1:p1,h2:p2,h3:p3` (the first master: RedLock's masters share no data, and
/// data that is not a lock lives on one server).
/// It implements redis-rs's [`ConnectionLike`], so [`redis::AsyncCommands`], [`redis::Cmd`] and
/// [`redis::Script`] work on it as on a [`MultiplexedConnection`].
///
/// # Behavior
/// - **Credentials**: those of a multi-host URL are used for every Cluster node, and for the
///   Sentinel master (the sentinels are asked without), as dlock's lockers do.
/// - **Failover**: a Cluster connection follows `MOVED` and `ASK`; a Sentinel one stays on the
///   master it found (the examples do not fail over while they run).
/// - **Clone**: clones share the connection.
#[derive(Clone)]
#[non_exhaustive]
pub enum Connection {
    /// One server: a `redis://` URL's, or the Sentinel master.
    Server(MultiplexedConnection),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
}

impl Connection {
    /// Connects to the engine `url` names.
    ///
    /// # Errors
    /// When the URL is not one of the four forms, or the connection fails.
    pub async fn open(url: &str) -> RedisResult<Self> {
        let invalid = |why: &'static str| {
            redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, why))
        };
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(invalid("not a URL"));
        };
        match scheme {
            "redis+cluster" | "rediss+cluster" => {
                let hosts = HostList::parse(scheme, rest).ok_or_else(|| {
                    invalid("expected redis+cluster://[user:password@]h1:p1,h2:p2")
                })?;
                let client = redis::cluster::ClusterClient::new(hosts.node_urls(true, ""));
                Ok(Self::Cluster(client?.get_async_connection().await?))
            }
            "redis+sentinel" | "rediss+sentinel" => {
                let form = "expected redis+sentinel://[user:password@]s1:p1,s2:p2/<master>[/db]";
                let hosts = HostList::parse(scheme, rest).ok_or_else(|| invalid(form))?;
                let mut path = hosts.path.split('/');
                let name = path
                    .next()
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| invalid(form))?;
                let db = path.next().map_or_else(String::new, |db| format!("/{db}"));
                let master = HostList {
                    hosts: vec!["master:6379"],
                    ..hosts.clone()
                };
                let master = master.node_urls(true, &db)[0]
                    .as_str()
                    .into_connection_info()?;
                let mut node = redis::sentinel::SentinelNodeConnectionInfo::default()
                    .set_redis_connection_info(master.redis_settings().clone());
                if hosts.tls {
                    node = node.set_tls_mode(redis::TlsMode::Secure);
                }
                // An owned name: `build` takes a `String` unless redis-rs's rustls feature is on.
                let service: String = name.to_owned();
                let mut client = redis::sentinel::SentinelClient::build(
                    hosts.node_urls(false, ""),
                    service,
                    Some(node),
                    redis::sentinel::SentinelServerType::Master,
                )?;
                Ok(Self::Server(client.get_async_connection().await?))
            }
            "redis+redlock" | "rediss+redlock" => {
                let hosts = HostList::parse(scheme, rest).ok_or_else(|| {
                    invalid("expected redis+redlock://[user:password@]h1:p1,h2:p2,h3:p3")
                })?;
                let first = HostList {
                    hosts: hosts.hosts[..1].to_vec(),
                    ..hosts.clone()
                };
                let url = &first.node_urls(true, "")[0];
                Ok(Self::Server(
                    redis::Client::open(url.as_str())?
                        .get_multiplexed_async_connection()
                        .await?,
                ))
            }
            _ => Ok(Self::Server(
                redis::Client::open(url)?
                    .get_multiplexed_async_connection()
                    .await?,
            )),
        }
    }
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Server(_) => "Connection::Server",
            Self::Cluster(_) => "Connection::Cluster",
        })
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Self::Server(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Self::Server(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Server(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// The rest of a multi-host URL after `scheme://`: `[userinfo@]h1:p1,h2:p2[/path]`.
#[derive(Clone)]
struct HostList<'a> {
    tls: bool,
    userinfo: Option<&'a str>,
    hosts: Vec<&'a str>,
    path: &'a str,
}

impl<'a> HostList<'a> {
    fn parse(scheme: &str, rest: &'a str) -> Option<Self> {
        // A password may hold `/` or `@`: the hosts start after the last `@`.
        let (userinfo, rest) = match rest.rfind('@') {
            Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
            None => (None, rest),
        };
        let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
        let hosts: Vec<&str> = hosts.split(',').collect();
        hosts
            .iter()
            .all(|h| {
                h.rsplit_once(':')
                    .is_some_and(|(name, port)| !name.is_empty() && port.parse::<u16>().is_ok())
            })
            .then_some(Self {
                tls: scheme.starts_with("rediss"),
                userinfo,
                hosts,
                path,
            })
    }

    /// `redis://[userinfo@]host:port<path>` (or `rediss://`) per host, with the credentials
    /// when `credentials`.
    fn node_urls(&self, credentials: bool, path: &str) -> Vec<String> {
        let scheme = if self.tls { "rediss" } else { "redis" };
        let userinfo = match self.userinfo {
            Some(u) if credentials => format!("{u}@"),
            _ => String::new(),
        };
        self.hosts
            .iter()
            .map(|host| format!("{scheme}://{userinfo}{host}{path}"))
            .collect()
    }
}
