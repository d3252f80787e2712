//! Each engine's [`Setup`]: its deployment, its floor (its own lock primitive, or the same
//! algorithm written by hand with the same round trips), the other libraries people use on it,
//! W3's counter on its own data, and what its servers tell of their load.

use std::time::Duration;

use dlock_testkit::{
    deployment::{Connection, Deployment, Engine},
    postgres::PostgresServer,
    zookeeper::ZkEnsemble,
};
use redis::AsyncCommands as _;

use crate::harness::{
    Body, BoxFuture, Client, Contender, Counter, CounterHandle, Error, ServerStats, Setup, token,
    wall_us,
};

/// A throwaway deployment of `engine`, set up for measuring.
pub(crate) async fn throwaway(engine: Engine) -> Result<Setup, Error> {
    match engine {
        Engine::Postgres => postgres().await,
        Engine::ZooKeeper => zookeeper().await,
        #[cfg(feature = "etcd")]
        Engine::Etcd => etcd::setup().await,
        #[cfg(not(feature = "etcd"))]
        Engine::Etcd => Err(dlock_testkit::deployment::ETCD_FEATURE.into()),
        Engine::Memory => Err(
            "--engine memory: the embedded table has no floor to measure against (the suite and \
             the demo run it)"
                .into(),
        ),
        _ => {
            let deployment = Deployment::start(engine).await?;
            let masters = deployment
                .masters()
                .into_iter()
                .map(|port| format!("redis://127.0.0.1:{port}"))
                .collect();
            let about = deployment.describe();
            redis_family(
                engine,
                deployment.url(),
                masters,
                about,
                Some(Box::new(deployment)),
            )
        }
    }
}

/// A deployment named by a URL (`DLOCK_URL`), any engine but the embedded one. The servers'
/// load is read where they let a client read it (Redis `INFO`, etcd's `/metrics`, ZooKeeper's
/// `srvr` when whitelisted, `pg_stat_statements` when loaded); their CPU time only on this
/// machine's throwaway servers.
pub(crate) async fn from_url(engine: Engine, url: &str, about: String) -> Result<Setup, Error> {
    match engine {
        Engine::Postgres => postgres_at(url.to_owned(), about, Vec::new(), None).await,
        Engine::ZooKeeper => {
            let hosts = zk_hosts(url)?;
            let ports = hosts
                .split(',')
                .filter_map(|h| h.rsplit_once(':')?.1.parse().ok())
                .collect();
            Ok(zookeeper_at(
                url.to_owned(),
                hosts,
                about,
                ports,
                Vec::new(),
                None,
            ))
        }
        #[cfg(feature = "etcd")]
        Engine::Etcd => etcd::at(url, about),
        #[cfg(not(feature = "etcd"))]
        Engine::Etcd => Err(dlock_testkit::deployment::ETCD_FEATURE.into()),
        Engine::Memory => Err("the embedded engine has no floor to measure against".into()),
        Engine::RedLock => redis_family(engine, url.to_owned(), redis_hosts(url), about, None),
        Engine::Redis => redis_family(engine, url.to_owned(), vec![url.to_owned()], about, None),
        _ => redis_family(engine, url.to_owned(), Vec::new(), about, None),
    }
}

/// The `h1:p1,h2:p2[/chroot]` of a `zk://` URL, for the floor's own client.
fn zk_hosts(url: &str) -> Result<String, Error> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.split('?').next().unwrap_or_default();
    if rest.contains('@') {
        return Err(
            "the benchmark's ZooKeeper floor takes no credentials in the URL: measure \
                    a throwaway ensemble with --engine zookeeper"
                .into(),
        );
    }
    Ok(rest.to_owned())
}

/// `redis://h:p` for each host of a multi-host URL.
fn redis_hosts(url: &str) -> Vec<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let hosts = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let hosts = hosts.split(['/', '?']).next().unwrap_or_default();
    hosts.split(',').map(|h| format!("redis://{h}")).collect()
}

// ---------------------------------------------------------------------------------------------
// Redis, Cluster, Sentinel, RedLock.
// ---------------------------------------------------------------------------------------------

/// The compare-and-delete of the floor's release.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0";

/// The fenced floor's acquisition: the floor's `SET NX PX` and a fencing token in one script,
/// from the hybrid counter dlock keeps (`GETSET` of the client's clock in µs; one more than the
/// counter when that was ahead): the least a lock costs whose fences follow the order holds
/// begin in. No holder's record, no queue, no wake-up. Replies the fence, or 0 when refused.
const FENCED_ACQUIRE: &str = r"
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', 30000) then return 0 end
local f = tonumber(ARGV[2])
local before = tonumber(redis.call('GETSET', KEYS[2], ARGV[2]))
if before and before >= f then
  f = before + 1
  redis.call('SET', KEYS[2], string.format('%.0f', f))
end
return f";

/// RedLock's fenced floor on one master: the floor's `SET NX PX` and the fence the client
/// proposes, granted only above this master's counter (which then holds it), in one script, as
/// dlock's RedLock engine grants it. Replies the proposal when granted; 0 when the key is
/// held; the counter, negated, when it is at or above the proposal (the lock is then let go
/// again in the same script).
const FENCED_GRANT: &str = r"
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', 30000) then return 0 end
local current = redis.call('GETSET', KEYS[2], ARGV[2])
local n = tonumber(current)
if n and n >= tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], current)
  redis.call('DEL', KEYS[1])
  return -n
end
return tonumber(ARGV[2])";

fn redis_family(
    engine: Engine,
    url: String,
    masters: Vec<String>,
    about: String,
    deployment: Option<Box<dyn std::any::Any + Send + Sync>>,
) -> Result<Setup, Error> {
    // On a Cluster every key carries the hash tag `{bench}`: one slot, one master, as on one
    // server; W2 runs once more with its keys spread over the masters.
    let (prefix, spread_prefix) = if engine == Engine::RedisCluster {
        ("{bench}:", Some("bench:"))
    } else {
        ("bench:", None)
    };
    let floor: Box<dyn Contender> = if engine == Engine::RedLock {
        Box::new(RedLockByHand {
            masters: masters.clone(),
            prefix,
            fenced: false,
        })
    } else {
        Box::new(RawRedis {
            url: url.clone(),
            prefix,
            fenced: false,
        })
    };
    // RedLock keeps its data on the first master: its masters share no data.
    let data_url = if engine == Engine::RedLock {
        masters.first().cloned().unwrap_or_else(|| url.clone())
    } else {
        url.clone()
    };
    Ok(Setup {
        engine,
        about,
        floor,
        others: if engine == Engine::RedLock {
            vec![
                Box::new(RedLockByHand {
                    masters: masters.clone(),
                    prefix,
                    fenced: true,
                }) as Box<dyn Contender>,
                Box::new(Rslock {
                    masters: masters.clone(),
                    prefix,
                }),
            ]
        } else {
            vec![Box::new(RawRedis {
                url: url.clone(),
                prefix,
                fenced: true,
            }) as Box<dyn Contender>]
        },
        counter: Box::new(RedisCounter {
            url: data_url,
            prefix,
        }),
        stats: Box::new(RedisStats {
            masters: masters.clone(),
        }),
        masters,
        requests_are: "commands",
        prefix,
        spread: spread_prefix.map(|prefix| {
            // The floor over the same spread keys: both rows pay for three masters.
            let floor: Box<dyn Contender> = Box::new(RawRedis {
                url: url.clone(),
                prefix,
                fenced: false,
            });
            (prefix, floor)
        }),
        url,
        _deployment: deployment,
    })
}

/// The floor on one server (or Cluster, or Sentinel master): `SET key token NX PX`, retried
/// every millisecond while refused, then a compare-and-delete script: the two round trips any
/// Redis lock needs. Fenced (one of the others): the `SET NX PX` is [`FENCED_ACQUIRE`], which
/// issues a fencing token with it, so the table shows what that guarantee alone costs.
struct RawRedis {
    url: String,
    prefix: &'static str,
    fenced: bool,
}

impl Contender for RawRedis {
    fn name(&self) -> String {
        if self.fenced {
            "floor + fence (SET NX PX and a fence counter in one script)".to_owned()
        } else {
            "floor (SET NX PX + compare-and-delete)".to_owned()
        }
    }

    fn client(&self) -> BoxFuture<'_, Result<Box<dyn Client>, Error>> {
        Box::pin(async move {
            Ok(Box::new(RawRedisClient {
                redis: Connection::open(&self.url).await?,
                release: redis::Script::new(RELEASE),
                fenced: self.fenced.then(|| {
                    (
                        redis::Script::new(FENCED_ACQUIRE),
                        format!("{}__fence", self.prefix),
                    )
                }),
                prefix: self.prefix,
            }) as Box<dyn Client>)
        })
    }
}

struct RawRedisClient {
    redis: Connection,
    release: redis::Script,
    /// The fenced floor's acquisition and its counter's key (in the lock keys' slot).
    fenced: Option<(redis::Script, String)>,
    prefix: &'static str,
}

impl RawRedisClient {
    /// One attempt at `key`: whether it was taken.
    async fn take(&mut self, key: &str, token: &str) -> Result<bool, Error> {
        let Some((acquire, counter)) = &self.fenced else {
            return set_nx(&mut self.redis, key, token).await;
        };
        let fence: u64 = acquire
            .key(key)
            .key(counter)
            .arg(token)
            .arg(wall_us())
            .invoke_async(&mut self.redis)
            .await?;
        Ok(fence > 0)
    }
}

/// `SET key token NX PX 30000` on `redis`: whether it was set.
async fn set_nx(redis: &mut Connection, key: &str, token: &str) -> Result<bool, Error> {
    let set: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(redis)
        .await?;
    Ok(set.is_some())
}

impl Client for RawRedisClient {
    fn hold<'a>(&'a mut self, key: &'a str, body: Body<'a>) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let (key, token) = (format!("{}{key}", self.prefix), token());
            while !self.take(&key, &token).await? {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            body.await?;
            let _: i64 = self
                .release
                .key(&key)
                .arg(&token)
                .invoke_async(&mut self.redis)
                .await?;
            Ok(())
        })
    }
}

/// The floor on RedLock: the algorithm by hand, one round to every master at once (`SET NX PX`),
/// held with a majority, undone on every master otherwise and retried every millisecond; the
/// release one round of compare-and-delete. No fence. Fenced (one of the others): each
/// master's `SET NX PX` is [`FENCED_GRANT`], with the client's proposal (its clock in µs, or
/// above the highest counter a master answered), so the table shows what fences that increase
/// across majorities cost by themselves.
struct RedLockByHand {
    masters: Vec<String>,
    prefix: &'static str,
    fenced: bool,
}

impl Contender for RedLockByHand {
    fn name(&self) -> String {
        if self.fenced {
            "RedLock by hand + fence (SET NX PX and a fence grant in one script per master)"
                .to_owned()
        } else {
            "floor (RedLock by hand: SET NX PX on every master, a majority)".to_owned()
        }
    }

    fn client(&self) -> BoxFuture<'_, Result<Box<dyn Client>, Error>> {
        Box::pin(async move {
            let mut masters = Vec::new();
            for url in &self.masters {
                masters.push(Connection::open(url).await?);
            }
            Ok(Box::new(RedLockClient {
                masters,
                release: redis::Script::new(RELEASE),
                grant: self.fenced.then(|| {
                    (
                        redis::Script::new(FENCED_GRANT),
                        format!("{}__fence", self.prefix),
                    )
                }),
                prefix: self.prefix,
            }) as Box<dyn Client>)
        })
    }
}

struct RedLockClient {
    masters: Vec<Connection>,
    release: redis::Script,
    /// The fenced variant's grant and its counter's key.
    grant: Option<(redis::Script, String)>,
    prefix: &'static str,
}

impl RedLockClient {
    async fn release_everywhere(&mut self, key: &str, token: &str) {
        let release = &self.release;
        let rounds = self.masters.iter_mut().map(|m| async move {
            let _: Result<i64, _> = release.key(key).arg(token).invoke_async(m).await;
        });
        futures_util::future::join_all(rounds).await;
    }
}

impl Client for RedLockClient {
    fn hold<'a>(&'a mut self, key: &'a str, body: Body<'a>) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let (key, token) = (format!("{}{key}", self.prefix), token());
            let quorum = self.masters.len() / 2 + 1;
            // The fenced variant's next proposal: above every counter a master answered.
            let mut above = 0;
            loop {
                let (k, t) = (&key, &token);
                let proposal = wall_us().max(above + 1);
                let grant = self.grant.as_ref();
                let sets = self.masters.iter_mut().map(|m| async move {
                    let Some((grant, counter)) = grant else {
                        return i64::from(set_nx(m, k, t).await.unwrap_or(false));
                    };
                    let reply: Result<i64, _> = grant
                        .key(k)
                        .key(counter)
                        .arg(t)
                        .arg(proposal)
                        .invoke_async(m)
                        .await;
                    reply.unwrap_or(0)
                });
                let replies = futures_util::future::join_all(sets).await;
                if replies.iter().filter(|r| **r > 0).count() >= quorum {
                    break;
                }
                for r in replies.into_iter().filter(|r| *r < 0) {
                    above = above.max(r.unsigned_abs());
                }
                self.release_everywhere(&key, &token).await;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            body.await?;
            self.release_everywhere(&key, &token).await;
            Ok(())
        })
    }
}

/// `rslock`, RedLock for redis-rs: `lock` with a TTL (`SET NX PX` on every master, its own
/// connections), retried while refused after its own random pause of up to 2ms (the floor's is
/// 1ms), then `unlock` on every master. No fence, no wake-up, no renewal.
struct Rslock {
    masters: Vec<String>,
    prefix: &'static str,
}

impl Contender for Rslock {
    fn name(&self) -> String {
        "rslock 0.7 (RedLock, no fence)".to_owned()
    }

    fn client(&self) -> BoxFuture<'_, Result<Box<dyn Client>, Error>> {
        Box::pin(async move {
            let mut manager = rslock::LockManager::new(self.masters.clone());
            manager.set_retry(u32::MAX, Duration::from_millis(2));
            Ok(Box::new(RslockClient {
                manager,
                prefix: self.prefix,
            }) as Box<dyn Client>)
        })
    }
}

struct RslockClient {
    manager: rslock::LockManager,
    prefix: &'static str,
}

impl Client for RslockClient {
    fn hold<'a>(&'a mut self, key: &'a str, body: Body<'a>) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let key = format!("{}{key}", self.prefix);
            let lock = self
                .manager
                .lock(key.as_bytes(), Duration::from_secs(30))
                .await
                .map_err(|e| format!("rslock: {e}"))?;
            body.await?;
            self.manager.unlock(&lock).await;
            Ok(())
        })
    }
}

struct RedisCounter {
    url: String,
    prefix: &'static str,
}

impl Counter for RedisCounter {
    fn handle<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Box<dyn CounterHandle>, Error>> {
        Box::pin(async move {
            Ok(Box::new(RedisCounterHandle {
                redis: Connection::open(&self.url).await?,
                key: format!("{}counter:{name}", self.prefix),
            }) as Box<dyn CounterHandle>)
        })
    }
}

struct RedisCounterHandle {
    redis: Connection,
    key: String,
}

impl CounterHandle for RedisCounterHandle {
    fn get(&mut self) -> BoxFuture<'_, Result<u64, Error>> {
        Box::pin(async move {
            let n: Option<u64> = self.redis.get(&self.key).await?;
            Ok(n.unwrap_or(0))
        })
    }

    fn set(&mut self, n: u64) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async move {
            let () = self.redis.set(&self.key, n).await?;
            Ok(())
        })
    }
}

/// `INFO` on every server that takes writes: commands run (inside scripts too; `INFO` itself
/// left out) and CPU time.
struct RedisStats {
    masters: Vec<String>,
}

impl RedisStats {
    async fn info(&self, section: &str) -> Vec<String> {
        let mut out = Vec::new();
        for url in &self.masters {
            let Ok(client) = redis::Client::open(url.as_str()) else {
                continue;
            };
            let Ok(mut redis) = client.get_multiplexed_async_connection().await else {
                continue;
            };
            if let Ok(info) = redis::cmd("INFO")
                .arg(section)
                .query_async::<String>(&mut redis)
                .await
            {
                out.push(info);
            }
        }
        out
    }
}

impl ServerStats for RedisStats {
    fn requests(&self) -> BoxFuture<'_, Option<u64>> {
        Box::pin(async move {
            let infos = self.info("commandstats").await;
            (!infos.is_empty()).then(|| {
                infos
                    .iter()
                    .flat_map(|info| info.lines())
                    .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:"))
                    .filter_map(|l| {
                        l.split("calls=")
                            .nth(1)?
                            .split(',')
                            .next()?
                            .parse::<u64>()
                            .ok()
                    })
                    .sum()
            })
        })
    }

    fn cpu(&self) -> BoxFuture<'_, Vec<Duration>> {
        Box::pin(async move {
            self.info("cpu")
                .await
                .iter()
                .map(|info| {
                    let seconds: f64 = info
                        .lines()
                        .filter(|l| {
                            l.starts_with("used_cpu_sys:") || l.starts_with("used_cpu_user:")
                        })
                        .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
                        .sum();
                    Duration::from_secs_f64(seconds)
                })
                .collect()
        })
    }
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL.
// ---------------------------------------------------------------------------------------------

/// The bench's own tables: the floor's lease rows, and W3's counter.
const POSTGRES_TABLES: &str = "
CREATE TABLE IF NOT EXISTS bench_locks (key text PRIMARY KEY, token text NOT NULL, expires_at timestamptz NOT NULL);
CREATE TABLE IF NOT EXISTS bench_fenced_locks (key text PRIMARY KEY, token text NOT NULL, fence bigint NOT NULL, expires_at timestamptz NOT NULL);
CREATE SEQUENCE IF NOT EXISTS bench_fence;
CREATE TABLE IF NOT EXISTS bench_counter (key text PRIMARY KEY, n bigint NOT NULL);";

async fn postgres() -> Result<Setup, Error> {
    let server = tokio::task::spawn_blocking(|| {
        PostgresServer::try_start_with(&[
            "shared_preload_libraries=pg_stat_statements",
            "pg_stat_statements.track=all",
            // As dlock's own sessions commit, so that the floor's commits wait as long.
            "synchronous_commit=on",
        ])
    })
    .await??;
    let about = format!(
        "a throwaway PostgreSQL{} on 127.0.0.1:{} (fsync off, synchronous commits, pg_stat_statements)",
        PostgresServer::version().map_or_else(String::new, |v| format!(" {v}")),
        server.port()
    );
    let pids = server.pids();
    postgres_at(server.url(), about, pids, Some(Box::new(server))).await
}

/// PostgreSQL at `url`: the floor's and the counter's tables created there (`bench_locks`,
/// `bench_counter`), and `pg_stat_statements` where the server lets it be.
async fn postgres_at(
    url: String,
    about: String,
    pids: Vec<u32>,
    deployment: Option<Box<dyn std::any::Any + Send + Sync>>,
) -> Result<Setup, Error> {
    let db = pg_client(&url).await?;
    db.batch_execute(POSTGRES_TABLES).await?;
    // Counting statements needs the extension; without it the report leaves the column empty.
    let _ = db
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await;
    Ok(Setup {
        engine: Engine::Postgres,
        about,
        floor: Box::new(PgByHand {
            url: url.clone(),
            fenced: false,
        }),
        others: vec![
            Box::new(PgByHand {
                url: url.clone(),
                fenced: true,
            }) as Box<dyn Contender>,
            Box::new(PgAdvisory { url: url.clone() }),
        ],
        counter: Box::new(PgCounter { url: url.clone() }),
        stats: Box::new(PgStats {
            url: url.clone(),
            pids,
        }),
        masters: Vec::new(),
        requests_are: "statements",
        prefix: "bench:",
        spread: None,
        url,
        _deployment: deployment,
    })
}

async fn pg_client(url: &str) -> Result<tokio_postgres::Client, Error> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// The floor on PostgreSQL: a lease row written by hand with the same writes as a lease lock
/// (an upsert that takes a free or expired row, then a delete by token), each prepared, retried
/// every millisecond while the row is held. No fence, no wake-up. Fenced (one of the others):
/// the upsert is [`PG_FENCED_ACQUIRE`], so the table shows what that guarantee alone costs.
struct PgByHand {
    url: String,
    fenced: bool,
}

/// The floor's upsert.
const PG_ACQUIRE: &str = "\
INSERT INTO bench_locks AS l (key, token, expires_at)
VALUES ($1, $2, clock_timestamp() + interval '30 seconds')
ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at
WHERE l.expires_at < clock_timestamp() RETURNING 1";

/// The fenced floor's upsert: the floor's, with a fence from a sequence in the row, drawn in
/// the key's turn (a transaction-scoped advisory lock on the key's hash). Without the turn, the
/// `nextval` in the row to insert runs before PostgreSQL looks for a conflicting row, and a
/// whole hold of another client (insert, fence, delete) fits between an acquisition's `nextval`
/// and its insert: that hold would begin earlier with the higher fence. The least a lease row
/// costs whose fences follow the order holds begin in; no holder's record, no wake-up mark.
/// The advisory lock's first key is not dlock's.
const PG_FENCED_ACQUIRE: &str = "\
WITH turn AS MATERIALIZED (SELECT pg_advisory_xact_lock(1650814563, hashtext($1)))
INSERT INTO bench_fenced_locks AS l (key, token, fence, expires_at)
SELECT $1, $2, nextval('bench_fence'), clock_timestamp() + interval '30 seconds' FROM turn
ON CONFLICT (key) DO UPDATE
    SET token = EXCLUDED.token, fence = EXCLUDED.fence, expires_at = EXCLUDED.expires_at
WHERE l.expires_at < clock_timestamp() RETURNING fence";

impl Contender for PgByHand {
    fn name(&self) -> String {
        if self.fenced {
            "floor + fence (nextval in the key's turn)".to_owned()
        } else {
            "floor (lease row by hand: upsert + delete)".to_owned()
        }
    }

    fn client(&self) -> BoxFuture<'_, Result<Box<dyn Client>, Error>> {
        Box::pin(async move {
            let db = pg_client(&self.url).await?;
            let (acquire, table) = if self.fenced {
                (PG_FENCED_ACQUIRE, "bench_fenced_locks")
            } else {
                (PG_ACQUIRE, "bench_locks")
            };
            let lock = db.prepare(acquire).await?;
            let unlock = db
                .prepare(&format!(
                    "DELETE FROM {table} WHERE key = $1 AND token = $2"
                ))
                .await?;
            Ok(Box::new(PgByHandClient { db, lock, unlock }) as Box<dyn Client>)
        })
    }
}

struct PgByHandClient {
    db: tokio_postgres::Client,
    lock: tokio_postgres::Statement,
    unlock: tokio_postgres::Statement,
}

impl Client for PgByHandClient {
    fn hold<'a>(&'a mut self, key: &'a str, body: Body<'a>) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let (key, token) = (format!("bench:{key}"), token());
            while self
                .db
                .query_opt(&self.lock, &[&key, &token])
                .await?
                .is_none()
            {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            body.await?;
            self.db.execute(&self.unlock, &[&key, &token]).await?;
            Ok(())
        })
    }
}

/// PostgreSQL's own advisory locks (no lease: the lock lives as long as the session).
struct PgAdvisory {
    url: String,
}

impl Contender for PgAdvisory {
    fn name(&self) -> String {
        "advisory locks (pg_try_advisory_lock, no lease)".to_owned()
    }

    fn client(&self) -> BoxFuture<'_, Result<Box<dyn Client>, Error>> {
        Box::pin(async move {
            let db = pg_client(&self.url).await?;
            let lock = db
                .prepare("SELECT pg_try_advisory_lock(hashtextextended($1, 0))")
                .await?;
            let unlock = db
                .prepare("SELECT pg_advisory_unlock(hashtextextended($1, 0))")
                .await?;
            Ok(Box::new(PgAdvisoryClient { db, lock, unlock }) as Box<dyn Client>)
        })
    }
}

struct PgAdvisoryClient {
    db: tokio_postgres::Client,
    lock: tokio_postgres::Statement,
    unlock: tokio_postgres::Statement,
}

impl Client for PgAdvisoryClient {
    fn hold<'a>(&'a mut self, key: &'a str, body: Body<'a>) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let key = format!("bench:{key}");
            while !self
                .db
                .query_one(&self.lock, &[&key])
                .await?
                .get::<_, bool>(0)
            {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            body.await?;
            let released: bool = self.db.query_one(&self.unlock, &[&key]).await?.get(0);
            if released {
                Ok(())
            } else {
                Err("pg_advisory_unlock found no lock".into())
            }
        })
    }
}

struct PgCounter {
    url: String,
}

impl Counter for PgCounter {
    fn handle<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Box<dyn CounterHandle>, Error>> {
        Box::pin(async move {
            let db = pg_client(&self.url).await?;
            let get = db
                .prepare("SELECT coalesce((SELECT n FROM bench_counter WHERE key = $1), 0)")
                .await?;
            let set = db
                .prepare(
                    "INSERT INTO bench_counter (key, n) VALUES ($1, $2) \
                     ON CONFLICT (key) DO UPDATE SET n = EXCLUDED.n",
                )
                .await?;
            Ok(Box::new(PgCounterHandle {
                db,
                get,
                set,
                key: name.to_owned(),
            }) as Box<dyn CounterHandle>)
        })
    }
}

struct PgCounterHandle {
    db: tokio_postgres::Client,
    get: tokio_postgres::Statement,
    set: tokio_postgres::Statement,
    key: String,
}

impl CounterHandle for PgCounterHandle {
    fn get(&mut self) -> BoxFuture<'_, Result<u64, Error>> {
        Box::pin(async move {
            let n: i64 = self.db.query_one(&self.get, &[&self.key]).await?.get(0);
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    fn set(&mut self, n: u64) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async move {
            let n = i64::try_from(n).unwrap_or(i64::MAX);
            self.db.execute(&self.set, &[&self.key, &n]).await?;
            Ok(())
        })
    }
}

/// `pg_stat_statements` (statements executed; the reading counts once in the next), and the CPU
/// time of the server's processes.
struct PgStats {
    url: String,
    pids: Vec<u32>,
}

impl ServerStats for PgStats {
    fn requests(&self) -> BoxFuture<'_, Option<u64>> {
        Box::pin(async move {
            let db = pg_client(&self.url).await.ok()?;
            let n: i64 = db
                .query_one(
                    "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements",
                    &[],
                )
                .await
                .ok()?
                .get(0);
            u64::try_from(n).ok()
        })
    }

    fn cpu(&self) -> BoxFuture<'_, Vec<Duration>> {
        let pids = self.pids.clone();
        Box::pin(async move {
            // A backend is forked per connection, after `pids` was taken: the postmaster's
            // children now (the backends among them), and those it has reaped (its `cutime`).
            let Some(&postmaster) = pids.first() else {
                return Vec::new();
            };
            let now = dlock_testkit::postgres::cluster_pids(postmaster);
            vec![process_cpu(&now) + reaped_cpu(postmaster)]
        })
    }

    fn own_requests(&self) -> u64 {
        1
    }
}

/// The fields of `/proc/<pid>/stat` after the command's `)` and the state: the parent at 0,
/// utime 10, stime 11, cutime 12, cstime 13.
fn stat_fields(pid: u32) -> Option<Vec<u64>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    Some(
        rest.split_whitespace()
            .skip(1)
            .take(14)
            .map(|f| f.parse::<u64>().unwrap_or(0))
            .collect(),
    )
}

/// CPU time of the children `pid` has waited for (its `cutime` + `cstime`).
fn reaped_cpu(pid: u32) -> Duration {
    let ticks = stat_fields(pid).map_or(0, |f| f.get(12).unwrap_or(&0) + f.get(13).unwrap_or(&0));
    #[allow(clippy::cast_precision_loss)]
    Duration::from_secs_f64(ticks as f64 / ticks_per_second() as f64)
}

fn ticks_per_second() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<u64>()
                .ok()
        })
        .unwrap_or(100)
}

/// CPU time of `pids` so far (Linux `/proc/<pid>/stat`: utime + stime).
fn process_cpu(pids: &[u32]) -> Duration {
    let ticks: u64 = pids
        .iter()
        .filter_map(|&pid| stat_fields(pid))
        .map(|f| f.get(10).unwrap_or(&0) + f.get(11).unwrap_or(&0))
        .sum();
    #[allow(clippy::cast_precision_loss)]
    Duration::from_secs_f64(ticks as f64 / ticks_per_second() as f64)
}

// ---------------------------------------------------------------------------------------------
// ZooKeeper.
// ---------------------------------------------------------------------------------------------

/// Servers of the throwaway ensemble (3, as a production ensemble; ZooKeeper on 2 cores is slow
/// to start, and so is this engine's run).
const ZK_SERVERS: usize = 3;

async fn zookeeper() -> Result<Setup, Error> {
    let ensemble = tokio::task::spawn_blocking(|| ZkEnsemble::start(ZK_SERVERS)).await?;
    let about = format!(
        "a throwaway ZooKeeper{} ensemble of {ZK_SERVERS} servers on {} (local JVMs, no fsync)",
        ensemble
            .version()
            .map_or_else(String::new, |v| format!(" {v}")),
        ensemble.hosts()
    );
    let ports = (0..ZK_SERVERS).map(|i| ensemble.port(i)).collect();
    let pids = ensemble.pids();
    Ok(zookeeper_at(
        ensemble.url(),
        ensemble.hosts(),
        about,
        ports,
        pids,
        Some(Box::new(ensemble)),
    ))
}

/// ZooKeeper at `url` (`hosts` for the floor's own client; `ports` asked for `srvr`).
fn zookeeper_at(
    url: String,
    hosts: String,
    about: String,
    ports: Vec<u16>,
    pids: Vec<u32>,
    deployment: Option<Box<dyn std::any::Any + Send + Sync>>,
) -> Setup {
    Setup {
        engine: Engine::ZooKeeper,
        about,
        floor: Box::new(ZkByHand {
            hosts: hosts.clone(),
        }),
        others: vec![Box::new(ZkRecipe {
            hosts: hosts.clone(),
        })],
        counter: Box::new(ZkCounter { hosts }),
        stats: Box::new(ZkStats { ports, pids }),
        masters: Vec::new(),
        requests_are: "requests",
        prefix: "bench:",
        spread: None,
        url,
        _deployment: deployment,
    }
}

fn persistent() -> zookeeper_client::CreateOptions<'static> {
    zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all())
}

/// The floor on ZooKeeper: the lock recipe by hand with the same round trips as dlock's (an
/// ephemeral sequential node under a container, `/bench-floor/<key>`, the line listed, a watch
/// on the predecessor; a delete to release), without Curator's protected names.
struct ZkByHand {
    hosts: String,
}

impl Contender for ZkByHand {
    fn name(&self) -> String {
        "floor (ephemeral sequential node by hand)".to_owned()
    }

    fn client(&self) -> BoxFuture<'_, Result<Box<dyn Client>, Error>> {
        Box::pin(async move {
            let zk = zookeeper_client::Client::connect(&self.hosts).await?;
            Ok(Box::new(ZkByHandClient { zk }) as Box<dyn Client>)
        })
    }
}

struct ZkByHandClient {
    zk: zookeeper_client::Client,
}

impl ZkByHandClient {
    /// Puts a node in `dir`'s line and waits until it is first; its path.
    async fn take(&self, dir: &str) -> Result<String, Error> {
        use zookeeper_client::{Acls, CreateMode};
        let ephemeral = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        let path = match self
            .zk
            .create(&format!("{dir}/lock-"), b"", &ephemeral)
            .await
        {
            Ok((_, sequence)) => format!("{dir}/lock-{sequence}"),
            Err(zookeeper_client::Error::NoNode) => {
                // The lock node and its parent, containers (as dlock makes them).
                let container = CreateMode::Container.with_acls(Acls::anyone_all());
                match self.zk.mkdir(dir, &container).await {
                    Ok(()) | Err(zookeeper_client::Error::NodeExists) => {}
                    Err(e) => return Err(e.into()),
                }
                let (_, sequence) = self
                    .zk
                    .create(&format!("{dir}/lock-"), b"", &ephemeral)
                    .await?;
                format!("{dir}/lock-{sequence}")
            }
            Err(e) => return Err(e.into()),
        };
        let name = path.rsplit('/').next().unwrap_or_default().to_owned();
        loop {
            let mut line = self.zk.list_children(dir).await?;
            line.sort();
            let at = line
                .iter()
                .position(|c| *c == name)
                .ok_or("the node left the line")?;
            if at == 0 {
                return Ok(path);
            }
            let ahead = format!("{dir}/{}", line[at - 1]);
            let (stat, watcher) = self.zk.check_and_watch_stat(&ahead).await?;
            if stat.is_some() {
                watcher.changed().await;
            }
        }
    }
}

impl Client for ZkByHandClient {
    fn hold<'a>(&'a mut self, key: &'a str, body: Body<'a>) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            // Under one parent, as dlock's (`/bench:/<key>`): ZooKeeper keeps metrics per
            // top-level node for good, and fresh keys at the root fill the servers' heaps.
            let path = self.take(&format!("/bench-floor/{key}")).await?;
            body.await?;
            self.zk.delete(&path, None).await?;
            Ok(())
        })
    }
}

/// `zookeeper-client`'s own lock recipe, in Curator's layout (`LockPrefix::new_curator`), then a
/// delete of its node.
struct ZkRecipe {
    hosts: String,
}

impl Contender for ZkRecipe {
    fn name(&self) -> String {
        "zookeeper-client's lock recipe".to_owned()
    }

    fn client(&self) -> BoxFuture<'_, Result<Box<dyn Client>, Error>> {
        Box::pin(async move {
            let zk = zookeeper_client::Client::connect(&self.hosts).await?;
            Ok(Box::new(ZkRecipeClient { zk }) as Box<dyn Client>)
        })
    }
}

struct ZkRecipeClient {
    zk: zookeeper_client::Client,
}

impl Client for ZkRecipeClient {
    fn hold<'a>(&'a mut self, key: &'a str, body: Body<'a>) -> BoxFuture<'a, Result<(), Error>> {
        use zookeeper_client::{Acls, CreateMode, LockPrefix};
        Box::pin(async move {
            let dir = format!("/bench-recipe/{key}");
            let prefix = LockPrefix::new_curator(&dir, "lock-")?;
            let options = zookeeper_client::LockOptions::new(Acls::anyone_all())
                .with_ancestor_options(CreateMode::Container.with_acls(Acls::anyone_all()))?;
            let lock = self.zk.lock(prefix, b"", options).await?;
            body.await?;
            self.zk.delete(lock.lock_path(), None).await?;
            // Its `Drop` would delete the node again in the background: the cycle did it.
            std::mem::forget(lock);
            Ok(())
        })
    }
}

struct ZkCounter {
    hosts: String,
}

impl Counter for ZkCounter {
    fn handle<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Box<dyn CounterHandle>, Error>> {
        Box::pin(async move {
            let zk = zookeeper_client::Client::connect(&self.hosts).await?;
            let path = format!("/bench-counter-{name}");
            match zk.create(&path, b"0", &persistent()).await {
                Ok(_) | Err(zookeeper_client::Error::NodeExists) => {}
                Err(e) => return Err(e.into()),
            }
            Ok(Box::new(ZkCounterHandle { zk, path }) as Box<dyn CounterHandle>)
        })
    }
}

struct ZkCounterHandle {
    zk: zookeeper_client::Client,
    path: String,
}

impl CounterHandle for ZkCounterHandle {
    fn get(&mut self) -> BoxFuture<'_, Result<u64, Error>> {
        Box::pin(async move {
            let (data, _) = self.zk.get_data(&self.path).await?;
            Ok(String::from_utf8_lossy(&data).parse().unwrap_or(0))
        })
    }

    fn set(&mut self, n: u64) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async move {
            self.zk
                .set_data(&self.path, n.to_string().as_bytes(), None)
                .await?;
            Ok(())
        })
    }
}

/// `srvr`'s `Received:` on every server (pings included), and the CPU time of their JVMs.
struct ZkStats {
    ports: Vec<u16>,
    pids: Vec<u32>,
}

impl ServerStats for ZkStats {
    fn requests(&self) -> BoxFuture<'_, Option<u64>> {
        let ports = self.ports.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                ports
                    .iter()
                    .map(|port| dlock_testkit::zookeeper::received_at(*port))
                    .sum::<Option<u64>>()
            })
            .await
            .ok()
            .flatten()
        })
    }

    fn cpu(&self) -> BoxFuture<'_, Vec<Duration>> {
        let pids = self.pids.clone();
        Box::pin(async move { pids.iter().map(|pid| process_cpu(&[*pid])).collect() })
    }
}

// ---------------------------------------------------------------------------------------------
// etcd.
// ---------------------------------------------------------------------------------------------

#[cfg(feature = "etcd")]
mod etcd {
    use std::time::Duration;

    use dlock_testkit::{deployment::Engine, etcd::EtcdCluster};
    use etcd_client::{Client as Etcd, LockOptions};

    use crate::harness::{
        Body, BoxFuture, Client, Contender, Counter, CounterHandle, Error, ServerStats, Setup,
    };

    /// Members of the throwaway cluster (3, as a production cluster).
    const MEMBERS: usize = 3;

    pub(super) async fn setup() -> Result<Setup, Error> {
        // The members' data on a tmpfs where there is one: `fsync` then costs nothing, as the
        // other throwaway servers keep nothing on a disk's clock (etcd 3.4, Debian's, has no
        // `--unsafe-no-fsync`).
        let shm = std::path::Path::new("/dev/shm");
        let (root, on) = if shm.is_dir() {
            (shm.to_path_buf(), "data on tmpfs, no fsync cost")
        } else {
            (std::env::temp_dir(), "data on disk")
        };
        let cluster =
            tokio::task::spawn_blocking(move || EtcdCluster::start_in(MEMBERS, &root)).await?;
        let endpoints = cluster.endpoints();
        let about = format!(
            "a throwaway etcd cluster of {MEMBERS} members on {} ({on})",
            endpoints.join(",")
        );
        Ok(setup_at(
            cluster.url(),
            endpoints,
            about,
            Some(Box::new(cluster)),
        ))
    }

    /// etcd at a plain `etcd://h1:p1,h2:p2` URL (the floor's client takes no TLS or
    /// credentials here).
    pub(super) fn at(url: &str, about: String) -> Result<Setup, Error> {
        let Some(rest) = url.strip_prefix("etcd://") else {
            return Err(
                "the benchmark's etcd floor needs a plain etcd:// URL: measure a \
                        throwaway cluster with --engine etcd"
                    .into(),
            );
        };
        let hosts = rest.split(['/', '?']).next().unwrap_or_default();
        if hosts.contains('@') {
            return Err(
                "the benchmark's etcd floor takes no credentials in the URL: measure a \
                        throwaway cluster with --engine etcd"
                    .into(),
            );
        }
        let endpoints = hosts.split(',').map(str::to_owned).collect();
        Ok(setup_at(url.to_owned(), endpoints, about, None))
    }

    fn setup_at(
        url: String,
        endpoints: Vec<String>,
        about: String,
        deployment: Option<Box<dyn std::any::Any + Send + Sync>>,
    ) -> Setup {
        Setup {
            engine: Engine::Etcd,
            about,
            floor: Box::new(EtcdLock {
                endpoints: endpoints.clone(),
                lease_per_cycle: false,
            }),
            others: vec![Box::new(EtcdLock {
                endpoints: endpoints.clone(),
                lease_per_cycle: true,
            })],
            counter: Box::new(EtcdCounter {
                endpoints: endpoints.clone(),
            }),
            stats: Box::new(EtcdStats { endpoints }),
            masters: Vec::new(),
            requests_are: "RPCs",
            prefix: "bench:",
            spread: None,
            url,
            _deployment: deployment,
        }
    }

    /// etcd's own lock service (`Lock`/`Unlock` of `v3lockpb`, what `etcdctl lock` and Go's
    /// `concurrency` package use), under one session lease per client, or a lease per cycle.
    struct EtcdLock {
        endpoints: Vec<String>,
        lease_per_cycle: bool,
    }

    impl Contender for EtcdLock {
        fn name(&self) -> String {
            if self.lease_per_cycle {
                "etcd Lock/Unlock, a lease per cycle".to_owned()
            } else {
                "floor (etcd Lock/Unlock, one session lease)".to_owned()
            }
        }

        fn client(&self) -> BoxFuture<'_, Result<Box<dyn Client>, Error>> {
            Box::pin(async move {
                let mut etcd = Etcd::connect(&self.endpoints, None).await?;
                let session = etcd.lease_grant(60, None).await?.id();
                Ok(Box::new(EtcdLockClient {
                    etcd,
                    session,
                    lease_per_cycle: self.lease_per_cycle,
                }) as Box<dyn Client>)
            })
        }
    }

    struct EtcdLockClient {
        etcd: Etcd,
        session: i64,
        lease_per_cycle: bool,
    }

    impl Client for EtcdLockClient {
        fn hold<'a>(
            &'a mut self,
            key: &'a str,
            body: Body<'a>,
        ) -> BoxFuture<'a, Result<(), Error>> {
            Box::pin(async move {
                let lease = if self.lease_per_cycle {
                    self.etcd.lease_grant(30, None).await?.id()
                } else {
                    self.session
                };
                let held = self
                    .etcd
                    .lock(
                        format!("bench:{key}"),
                        Some(LockOptions::new().with_lease(lease)),
                    )
                    .await?;
                body.await?;
                self.etcd.unlock(held.key()).await?;
                if self.lease_per_cycle {
                    self.etcd.lease_revoke(lease).await?;
                }
                Ok(())
            })
        }
    }

    struct EtcdCounter {
        endpoints: Vec<String>,
    }

    impl Counter for EtcdCounter {
        fn handle<'a>(
            &'a self,
            name: &'a str,
        ) -> BoxFuture<'a, Result<Box<dyn CounterHandle>, Error>> {
            Box::pin(async move {
                Ok(Box::new(EtcdCounterHandle {
                    etcd: Etcd::connect(&self.endpoints, None).await?,
                    key: format!("bench-counter/{name}"),
                }) as Box<dyn CounterHandle>)
            })
        }
    }

    struct EtcdCounterHandle {
        etcd: Etcd,
        key: String,
    }

    impl CounterHandle for EtcdCounterHandle {
        fn get(&mut self) -> BoxFuture<'_, Result<u64, Error>> {
            Box::pin(async move {
                let got = self.etcd.get(self.key.as_str(), None).await?;
                Ok(got
                    .kvs()
                    .first()
                    .and_then(|kv| kv.value_str().ok()?.parse().ok())
                    .unwrap_or(0))
            })
        }

        fn set(&mut self, n: u64) -> BoxFuture<'_, Result<(), Error>> {
            Box::pin(async move {
                self.etcd
                    .put(self.key.as_str(), n.to_string(), None)
                    .await?;
                Ok(())
            })
        }
    }

    /// Every member's `/metrics`: gRPC calls started (`Status` left out) and CPU time.
    struct EtcdStats {
        endpoints: Vec<String>,
    }

    impl EtcdStats {
        async fn metrics(&self) -> Vec<(u64, Duration)> {
            let mut out = Vec::new();
            for endpoint in &self.endpoints {
                let Ok(response) = dlock_testkit::http::request(endpoint, "GET", "/metrics").await
                else {
                    continue;
                };
                let mut rpcs = 0u64;
                let mut cpu = 0f64;
                for line in response.body.lines() {
                    if line.starts_with("grpc_server_started_total{")
                        && !line.contains("grpc_method=\"Status\"")
                    {
                        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                        let n = line
                            .rsplit(' ')
                            .next()
                            .and_then(|v| v.parse::<f64>().ok())
                            .unwrap_or(0.0) as u64;
                        rpcs += n;
                    } else if let Some(v) = line.strip_prefix("process_cpu_seconds_total ") {
                        cpu = v.trim().parse().unwrap_or(0.0);
                    }
                }
                out.push((rpcs, Duration::from_secs_f64(cpu)));
            }
            out
        }
    }

    impl ServerStats for EtcdStats {
        fn requests(&self) -> BoxFuture<'_, Option<u64>> {
            Box::pin(async move {
                let metrics = self.metrics().await;
                (!metrics.is_empty()).then(|| metrics.iter().map(|(rpcs, _)| rpcs).sum())
            })
        }

        fn cpu(&self) -> BoxFuture<'_, Vec<Duration>> {
            Box::pin(async move {
                self.metrics()
                    .await
                    .into_iter()
                    .map(|(_, cpu)| cpu)
                    .collect()
            })
        }
    }
}
