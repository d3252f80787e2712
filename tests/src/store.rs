//! The data a worker process keeps under its lock, on the same engine as the lock (outside every
//! lock's entries), so that one `dlock-worker` serves every engine and a test reads what the
//! workers wrote with [`Store`] too.
//!
//! Per engine, for the lock key `k`:
//!
//! | | counter | holds (fences) | fair order | fenced resource |
//! | --- | --- | --- | --- | --- |
//! | Redis, Cluster, Sentinel, RedLock | `k:counter` | list `k:holders` (`<pid> <fence>`) | list `k:order` | `{k}:resource`, its highest fence in `{k}:resource:fence` (one slot) |
//! | PostgreSQL | `dlock_test_counter` | `dlock_test_history` (`n`, `fence`) | `dlock_test_order` | `dlock_test_resource` |
//! | etcd | `counter/k` | `history/k/<n>` | – | `resource/k`, its highest fence in `resource/k/fence` |
//! | ZooKeeper | `/dlock-test/k` | `/dlock-test/k.history/<n>` | – | `/dlock-test/k.resource` (`<fence> <value>`) |
//!
//! RedLock's masters share no data: its store is the first master's. A lock URL whose user may
//! touch only lock keys (the ACL engines) keeps its data at [`Engine::data_url`](crate::Engine::data_url).

use std::{sync::Arc, time::Duration};

use dlock_testkit::deployment::Connection;
use redis::AsyncCommands as _;

use crate::pg;

/// The Redis resource's fenced write (`KEYS[1]` the value, `KEYS[2]` its highest fence; `ARGV[1]`
/// the fence, `ARGV[2]` the value): 1 when accepted.
const REDIS_FENCED_WRITE: &str = r"
local highest = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) < highest then return 0 end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2])
return 1";

/// What a store operation fails with.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// A connection to the data of the engine a lock URL names.
#[derive(Clone)]
#[non_exhaustive]
pub enum Store {
    /// A Redis deployment (one server, Cluster, Sentinel's master, a RedLock master).
    Redis(Connection),
    /// PostgreSQL, with the tables of [`pg::TABLES`] and [`pg::ORDER_TABLE`].
    Postgres(Arc<tokio_postgres::Client>),
    /// etcd (its client is large: boxed).
    Etcd(Box<etcd_client::Client>),
    /// ZooKeeper, on a session of its own (30s, so that it outlives a frozen lock session).
    ZooKeeper(zookeeper_client::Client),
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Redis(_) => "Store::Redis",
            Self::Postgres(_) => "Store::Postgres",
            Self::Etcd(_) => "Store::Etcd",
            Self::ZooKeeper(_) => "Store::ZooKeeper",
        })
    }
}

/// The hosts of a multi-host URL (`scheme://[userinfo@]h1:p1,h2:p2[/path][?query]`), and its
/// path.
fn hosts_and_path(url: &str) -> (&str, &str) {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.split('?').next().unwrap_or_default();
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split_once('/')
        .map_or((rest, ""), |(hosts, path)| (hosts, path))
}

impl Store {
    /// Connects to the data of the engine `url` names ([`Engine::data_url`](crate::Engine::data_url)).
    ///
    /// # Errors
    /// When the URL names no engine with data (`memory://`), or the connection fails.
    pub async fn open(url: &str) -> Result<Self, Error> {
        let scheme = url.split_once("://").map_or("", |(s, _)| s);
        match scheme {
            "postgres" | "postgresql" => {
                let (client, connection) =
                    tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
                tokio::spawn(connection);
                Ok(Self::Postgres(Arc::new(client)))
            }
            "etcd" => {
                let (hosts, _) = hosts_and_path(url);
                let endpoints: Vec<&str> = hosts.split(',').collect();
                let client = etcd_client::Client::connect(endpoints, None).await?;
                Ok(Self::Etcd(Box::new(client)))
            }
            "zk" => {
                let (hosts, chroot) = hosts_and_path(url);
                let hosts = if chroot.is_empty() {
                    hosts.to_owned()
                } else {
                    format!("{hosts}/{chroot}")
                };
                let client = zookeeper_client::Client::connector()
                    .with_session_timeout(Duration::from_secs(30))
                    .connect(&hosts)
                    .await?;
                let persistent = zookeeper_client::CreateMode::Persistent
                    .with_acls(zookeeper_client::Acls::anyone_all());
                client.mkdir("/dlock-test", &persistent).await?;
                Ok(Self::ZooKeeper(client))
            }
            s if s.starts_with("redis") => Ok(Self::Redis(Connection::open(url).await?)),
            _ => Err(format!("no data store on a `{scheme}` URL").into()),
        }
    }

    /// The counter of `key` (0 before the first write).
    ///
    /// # Errors
    /// When the engine refuses.
    pub async fn counter(&self, key: &str) -> Result<u64, Error> {
        Ok(match self {
            Self::Redis(redis) => {
                let n: Option<u64> = redis.clone().get(format!("{key}:counter")).await?;
                n.unwrap_or(0)
            }
            Self::Postgres(db) => {
                let n: Option<i64> = db
                    .query_opt("SELECT n FROM dlock_test_counter WHERE key = $1", &[&key])
                    .await?
                    .map(|row| row.get(0));
                u64::try_from(n.unwrap_or(0))?
            }
            Self::Etcd(etcd) => {
                let got = etcd.clone().get(format!("counter/{key}"), None).await?;
                got.kvs()
                    .first()
                    .and_then(|kv| kv.value_str().ok()?.parse().ok())
                    .unwrap_or(0)
            }
            Self::ZooKeeper(zk) => match zk.get_data(&format!("/dlock-test/{key}")).await {
                Ok((data, _)) => String::from_utf8_lossy(&data).parse().unwrap_or(0),
                Err(zookeeper_client::Error::NoNode) => 0,
                Err(e) => return Err(e.into()),
            },
        })
    }

    /// Sets the counter of `key` to `n`, unconditionally.
    ///
    /// # Errors
    /// When the engine refuses.
    pub async fn set_counter(&self, key: &str, n: u64) -> Result<(), Error> {
        match self {
            Self::Redis(redis) => redis.clone().set(format!("{key}:counter"), n).await?,
            Self::Postgres(db) => {
                db.execute(
                    "INSERT INTO dlock_test_counter (key, n) VALUES ($1, $2)
                     ON CONFLICT (key) DO UPDATE SET n = EXCLUDED.n",
                    &[&key, &i64::try_from(n)?],
                )
                .await?;
            }
            Self::Etcd(etcd) => {
                etcd.clone()
                    .put(format!("counter/{key}"), n.to_string(), None)
                    .await?;
            }
            Self::ZooKeeper(zk) => {
                let path = format!("/dlock-test/{key}");
                let data = n.to_string();
                match zk.set_data(&path, data.as_bytes(), None).await {
                    Ok(_) => {}
                    Err(zookeeper_client::Error::NoNode) => {
                        let persistent = zookeeper_client::CreateMode::Persistent
                            .with_acls(zookeeper_client::Acls::anyone_all());
                        zk.create(&path, data.as_bytes(), &persistent).await?;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }

    /// Read, pause 200µs, write plus one: loses updates unless the lock excludes every other
    /// holder. Returns the new value.
    ///
    /// # Errors
    /// When the engine refuses.
    pub async fn increment(&self, key: &str) -> Result<u64, Error> {
        let n = self.counter(key).await? + 1;
        tokio::time::sleep(Duration::from_micros(200)).await;
        self.set_counter(key, n).await?;
        Ok(n)
    }

    /// Records that the holder with `fence` wrote `n`: `<pid> <fence>` appended to a list on
    /// Redis, a history row on PostgreSQL, `history/k/<n>` on etcd, a child `<n>` of
    /// `/dlock-test/k.history` on ZooKeeper.
    ///
    /// # Errors
    /// When the engine refuses.
    pub async fn record_hold(&self, key: &str, n: u64, fence: u64) -> Result<(), Error> {
        match self {
            Self::Redis(redis) => {
                let hold = format!("{} {fence}", std::process::id());
                let _: i64 = redis.clone().rpush(format!("{key}:holders"), hold).await?;
            }
            Self::Postgres(db) => {
                db.execute(
                    "INSERT INTO dlock_test_history (key, n, fence) VALUES ($1, $2, $3)",
                    &[&key, &i64::try_from(n)?, &i64::try_from(fence)?],
                )
                .await?;
            }
            Self::Etcd(etcd) => {
                etcd.clone()
                    .put(
                        format!("history/{key}/{}", padded(n)),
                        fence.to_string(),
                        None,
                    )
                    .await?;
            }
            Self::ZooKeeper(zk) => {
                let persistent = zookeeper_client::CreateMode::Persistent
                    .with_acls(zookeeper_client::Acls::anyone_all());
                let dir = format!("/dlock-test/{key}.history");
                zk.mkdir(&dir, &persistent).await?;
                let node = format!("{dir}/{}", padded(n));
                zk.create(&node, fence.to_string().as_bytes(), &persistent)
                    .await?;
            }
        }
        Ok(())
    }

    /// The fences of [`record_hold`](Self::record_hold), in the order of the values written
    /// (on Redis, in the order the holds were recorded).
    ///
    /// # Errors
    /// When the engine refuses.
    pub async fn holds(&self, key: &str) -> Result<Vec<u64>, Error> {
        let fences: Vec<String> = match self {
            Self::Redis(redis) => {
                let holds: Vec<String> = redis
                    .clone()
                    .lrange(format!("{key}:holders"), 0, -1)
                    .await?;
                holds
                    .iter()
                    .filter_map(|h| Some(h.split_once(' ')?.1.to_owned()))
                    .collect()
            }
            Self::Postgres(db) => db
                .query(
                    "SELECT fence FROM dlock_test_history WHERE key = $1 ORDER BY n",
                    &[&key],
                )
                .await?
                .iter()
                .map(|row| row.get::<_, i64>(0).to_string())
                .collect(),
            Self::Etcd(etcd) => {
                let prefix = format!("history/{key}/");
                let options = etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_sort(etcd_client::SortTarget::Key, etcd_client::SortOrder::Ascend);
                let got = etcd.clone().get(prefix, Some(options)).await?;
                got.kvs()
                    .iter()
                    .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
                    .collect()
            }
            Self::ZooKeeper(zk) => {
                let dir = format!("/dlock-test/{key}.history");
                let mut children = match zk.list_children(&dir).await {
                    Ok(children) => children,
                    Err(zookeeper_client::Error::NoNode) => Vec::new(),
                    Err(e) => return Err(e.into()),
                };
                children.sort();
                let mut fences = Vec::new();
                for child in children {
                    let (data, _) = zk.get_data(&format!("{dir}/{child}")).await?;
                    fences.push(String::from_utf8_lossy(&data).into_owned());
                }
                fences
            }
        };
        Ok(fences.iter().map(|f| f.parse()).collect::<Result<_, _>>()?)
    }

    /// Appends `name` to the order in which fair waiters of `key` got the lock (Redis and
    /// PostgreSQL).
    ///
    /// # Errors
    /// When the engine refuses, or keeps no such list.
    pub async fn push_order(&self, key: &str, name: &str) -> Result<(), Error> {
        match self {
            Self::Redis(redis) => {
                let _: i64 = redis.clone().rpush(format!("{key}:order"), name).await?;
            }
            Self::Postgres(db) => {
                db.execute(
                    "INSERT INTO dlock_test_order (key, name) VALUES ($1, $2)",
                    &[&key, &name],
                )
                .await?;
            }
            other => return Err(format!("{other:?} keeps no fair order").into()),
        }
        Ok(())
    }

    /// Counts this process in `key`'s gate and returns once `parties` processes have (Redis).
    ///
    /// # Errors
    /// When the engine refuses, or is not Redis.
    pub async fn meet(&self, key: &str, parties: i64) -> Result<(), Error> {
        let Self::Redis(redis) = self else {
            return Err(format!("{self:?} has no gate").into());
        };
        let mut redis = redis.clone();
        let ready = format!("{key}:ready");
        let _: i64 = redis.incr(&ready, 1).await?;
        while redis.get::<_, i64>(&ready).await? < parties {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }

    /// Writes `value` to `key`'s resource only if `fence` is not below the highest fence the
    /// resource has seen, atomically; whether it was accepted.
    ///
    /// # Errors
    /// When the engine refuses.
    pub async fn fenced_write(&self, key: &str, fence: u64, value: &str) -> Result<bool, Error> {
        match self {
            Self::Redis(redis) => {
                let accepted: i64 = redis::Script::new(REDIS_FENCED_WRITE)
                    .key(format!("{{{key}}}:resource"))
                    .key(format!("{{{key}}}:resource:fence"))
                    .arg(fence)
                    .arg(value)
                    .invoke_async(&mut redis.clone())
                    .await?;
                Ok(accepted == 1)
            }
            Self::Postgres(db) => Ok(db
                .execute(pg::FENCED_WRITE, &[&key, &i64::try_from(fence)?, &value])
                .await?
                == 1),
            Self::Etcd(etcd) => etcd_fenced_write((**etcd).clone(), key, fence, value).await,
            Self::ZooKeeper(zk) => zk_fenced_write(zk, key, fence, value).await,
        }
    }

    /// The value last accepted by `key`'s resource.
    ///
    /// # Errors
    /// When the engine refuses.
    pub async fn resource(&self, key: &str) -> Result<Option<String>, Error> {
        Ok(match self {
            Self::Redis(redis) => redis.clone().get(format!("{{{key}}}:resource")).await?,
            Self::Postgres(db) => db
                .query_opt(
                    "SELECT value FROM dlock_test_resource WHERE key = $1",
                    &[&key],
                )
                .await?
                .map(|row| row.get(0)),
            Self::Etcd(etcd) => {
                let got = etcd.clone().get(format!("resource/{key}"), None).await?;
                got.kvs()
                    .first()
                    .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
            }
            Self::ZooKeeper(zk) => {
                match zk.get_data(&format!("/dlock-test/{key}.resource")).await {
                    Ok((data, _)) => String::from_utf8_lossy(&data)
                        .split_once(' ')
                        .map(|(_, value)| value.to_owned()),
                    Err(zookeeper_client::Error::NoNode) => None,
                    Err(e) => return Err(e.into()),
                }
            }
        })
    }
}

/// A fence as text that sorts as the number does.
fn padded(fence: u64) -> String {
    format!("{fence:020}")
}

/// One transaction: the fence key is compared (created at zero first when missing), then the
/// fence and the value are put.
async fn etcd_fenced_write(
    mut etcd: etcd_client::Client,
    key: &str,
    fence: u64,
    value: &str,
) -> Result<bool, Error> {
    use etcd_client::{Compare, CompareOp, Txn, TxnOp};
    let fence_key = format!("resource/{key}/fence");
    let create = Txn::new()
        .when([Compare::version(fence_key.as_str(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(fence_key.as_str(), padded(0), None)]);
    etcd.txn(create).await?;
    let write = Txn::new()
        .when([Compare::value(
            fence_key.as_str(),
            CompareOp::Less,
            padded(fence + 1),
        )])
        .and_then([
            TxnOp::put(fence_key.as_str(), padded(fence), None),
            TxnOp::put(format!("resource/{key}"), value, None),
        ]);
    Ok(etcd.txn(write).await?.succeeded())
}

/// A compare-and-set on the node's version: its data is `<highest fence> <value>`.
async fn zk_fenced_write(
    zk: &zookeeper_client::Client,
    key: &str,
    fence: u64,
    value: &str,
) -> Result<bool, Error> {
    let path = format!("/dlock-test/{key}.resource");
    let persistent =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    match zk.create(&path, b"0 ", &persistent).await {
        Ok(_) | Err(zookeeper_client::Error::NodeExists) => {}
        Err(e) => return Err(e.into()),
    }
    loop {
        let (data, stat) = zk.get_data(&path).await?;
        let highest: u64 = String::from_utf8_lossy(&data)
            .split_whitespace()
            .next()
            .and_then(|f| f.parse().ok())
            .unwrap_or(0);
        if fence < highest {
            return Ok(false);
        }
        let data = format!("{fence} {value}");
        match zk
            .set_data(&path, data.as_bytes(), Some(stat.version))
            .await
        {
            Ok(_) => return Ok(true),
            Err(zookeeper_client::Error::BadVersion) => {}
            Err(e) => return Err(e.into()),
        }
    }
}
