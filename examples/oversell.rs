//! The oversell demo: a shop sells an item with a limited stock; many buyers hit several
//! instances of the service at once. Each purchase reads the stock, does a little work (a 1ms
//! "payment check"), writes the stock back minus one and records the sale — a real race, not a
//! simulated one. The demo runs it twice, without a lock and with
//! `#[dlock(key = "stock:<sku>", …)]`, and prints both runs side by side.
//!
//! ```text
//! cargo run --example oversell                      # 4 instances, 200 buyers, 50 in stock
//! cargo run --example oversell -- --instances 3 --buyers 60 --stock 20
//! cargo run --example oversell -- --engine redis-cluster   # on a throwaway deployment
//! DLOCK_URL=postgres://app@db/shop cargo run --example oversell   # on your own deployment
//! cargo run --example oversell -- --help
//! ```
//!
//! Where it runs, said in the output:
//! - `--engine <name>`: a throwaway deployment of that engine on free loopback ports
//!   ([`dlock_testkit`]), stopped at the end, on error and on Ctrl-C: `redis`, `redis-cluster`
//!   (3 masters, 3 replicas), `redis-sentinel` (a master, 2 replicas, 3 sentinels), `redlock`
//!   (5 independent masters), `etcd` (one member; build with `--features etcd`), `zookeeper`
//!   (a standalone server: a JVM), `postgres` (`initdb` into a temporary directory), or
//!   `memory` (the embedded table, the instances being tasks of this process);
//! - else `DLOCK_URL`, any engine's URL: your deployment;
//! - else (kept for compatibility) `DLOCK_BACKEND=memory`, or `DLOCK_REDIS_URL` / `REDIS_URL`;
//! - else, with `redis-server` on `PATH`: a throwaway Redis server;
//! - else the embedded table.
//!
//! The stock lives on the engine of the locks: in Redis (plain `GET` then `SET`, not atomic on
//! purpose; on RedLock on the first master), a PostgreSQL row (`SELECT` then `UPDATE`), a
//! ZooKeeper znode, or etcd keys (read, then write back). Each instance is a separate OS
//! process — this program started again with a hidden `--worker` mode — configured from the
//! environment (`DLOCK_URL`) with its own connections, reporting every purchase and its lock
//! wait on stdout.
//!
//! The locked run also fences the stock (see docs/operations.md, *Fencing the resource*): each
//! write carries the lock's fencing token and the stock it read, and the store refuses it when a
//! higher token has written or the stock changed since, in one atomic step (a script on Redis,
//! `UPDATE … WHERE fence <= $3 AND stock = $4` on PostgreSQL, a versioned write on ZooKeeper and
//! etcd), so a holder whose lease ended while it was paused can neither overwrite a later
//! holder's stock nor sell from a stock it read before them.
//!
//! Exit code 0 only when the locked run is exact (sold == stock, oversold 0, nothing failed).

use std::{
    fmt,
    process::{ExitCode, Stdio},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use dlock_examples::redact_url;
use dlock_runtime::{EngineUrl, LockError, Locker, dlock};
use dlock_testkit::deployment::{Connection, Deployment, Engine};
use redis::AsyncCommands as _;
use tokio::{
    io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader},
    process::{Child, Command},
    sync::mpsc,
    time::Instant,
};

/// The demo's arguments (`--help` prints them).
#[derive(Clone, Copy, Debug, clap::Parser)]
#[command(
    name = "oversell",
    about = "Sells a small stock to many buyers through several instances of a shop, without a \
             lock and with #[dlock], and shows the difference.",
    after_help = "Where it runs: --engine starts a throwaway deployment; else DLOCK_URL (any \
                  engine); else DLOCK_BACKEND=memory or DLOCK_REDIS_URL / REDIS_URL; else a \
                  throwaway redis-server when one is on PATH; else the embedded table."
)]
struct Config {
    /// Instances of the shop service.
    #[arg(long, default_value_t = 4, value_parser = at_least_one)]
    instances: usize,
    /// Buyers, each trying to buy one item at the same moment.
    #[arg(long, default_value_t = 200, value_parser = at_least_one)]
    buyers: usize,
    /// Items in stock.
    #[arg(long, default_value_t = 50)]
    stock: u64,
    /// The embedded table, the instances being tasks of this process (`--engine memory`).
    #[arg(long, conflicts_with = "engine")]
    embedded: bool,
    /// Run on a throwaway deployment of this engine.
    #[arg(long, value_enum)]
    engine: Option<Engine>,
}

/// A count from 1 to `u32::MAX` (buyers are numbered with `u32`).
fn at_least_one(value: &str) -> Result<usize, String> {
    match value.parse::<u32>() {
        Ok(n) if n > 0 => Ok(n as usize),
        _ => Err(format!(
            "`{value}` is not a whole number from 1 to {}",
            u32::MAX
        )),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "--worker") {
        return match worker(&args[1..]).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("oversell worker: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let config = <Config as clap::Parser>::parse();
    // Dropping the demo (Ctrl-C) kills the workers and stops the throwaway server it owns.
    tokio::select! {
        result = demo(config) => match result {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("\noversell: {e}");
                ExitCode::FAILURE
            }
        },
        _ = tokio::signal::ctrl_c() => {
            eprintln!("\noversell: interrupted; workers and the throwaway servers stopped");
            ExitCode::from(130)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The shop: the code that races.
// ---------------------------------------------------------------------------------------------

/// One instance's view of the shop: its lock client and its stock store.
struct Shop {
    locks: Locker,
    store: Store,
    sku: String,
}

enum Store {
    /// The stock in Redis, `GET`/`SET` on `oversell:<sku>:stock`, sales in a list.
    Redis(Connection),
    /// The stock in PostgreSQL (`--engine postgres`), in the database of the locks: a row of
    /// `oversell_stock` read with `SELECT` and written with `UPDATE` (not atomic on purpose),
    /// sales in `oversell_sales`.
    Postgres(tokio_postgres::Client),
    /// The stock in ZooKeeper (`--engine zookeeper`): the znode `/oversell/<sku>/stock` read
    /// and written back (not atomic on purpose), sales as sequential children of
    /// `/oversell/<sku>/sales`.
    ZooKeeper(zookeeper_client::Client),
    /// The stock in etcd (`DLOCK_URL=etcd://…`): the key `oversell/<sku>/stock` read and written
    /// back (not atomic on purpose), sales as keys under `oversell/<sku>/sales/`.
    #[cfg(feature = "etcd")]
    Etcd(Box<etcd_client::Client>),
    /// The stock in this process, read and written with separate loads and stores.
    Memory(Arc<MemoryStore>),
}

/// The znodes of the stock on ZooKeeper.
mod zk_stock {
    use zookeeper_client::{Acls, Client, CreateMode, Error};

    fn dir(sku: &str) -> String {
        format!("/oversell/{sku}")
    }

    /// The stock and the highest fence written with it: the node's data, `<stock> <fence>`.
    fn parse(data: &[u8]) -> (u64, u64) {
        let text = String::from_utf8_lossy(data);
        let mut words = text.split(' ').map(|w| w.parse().unwrap_or(0));
        (words.next().unwrap_or(0), words.next().unwrap_or(0))
    }

    pub(super) async fn stock(zk: &Client, sku: &str) -> Result<u64, Error> {
        let (data, _) = zk.get_data(&format!("{}/stock", dir(sku))).await?;
        Ok(parse(&data).0)
    }

    /// Writes the stock with `fence` unless a higher fence wrote it or the stock is no longer
    /// `read`: a versioned write, so no other write comes between the check and this one.
    /// `false` when refused.
    pub(super) async fn set_stock_fenced(
        zk: &Client,
        sku: &str,
        n: u64,
        fence: u64,
        read: u64,
    ) -> Result<bool, Error> {
        let path = format!("{}/stock", dir(sku));
        loop {
            let (data, stat) = zk.get_data(&path).await?;
            let (stock, highest) = parse(&data);
            if fence < highest || stock != read {
                return Ok(false);
            }
            let data = format!("{n} {fence}");
            match zk
                .set_data(&path, data.as_bytes(), Some(stat.version))
                .await
            {
                Ok(_) => return Ok(true),
                Err(Error::BadVersion) => {}
                Err(e) => return Err(e),
            }
        }
    }

    pub(super) async fn set_stock(zk: &Client, sku: &str, n: u64) -> Result<(), Error> {
        let path = format!("{}/stock", dir(sku));
        let data = n.to_string();
        match zk.set_data(&path, data.as_bytes(), None).await {
            Err(Error::NoNode) => {
                let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
                zk.mkdir(&format!("{}/sales", dir(sku)), &persistent)
                    .await?;
                zk.create(&path, data.as_bytes(), &persistent).await?;
                Ok(())
            }
            other => other.map(drop),
        }
    }

    pub(super) async fn record_sale(zk: &Client, sku: &str, buyer: u32) -> Result<(), Error> {
        let sequential = CreateMode::PersistentSequential.with_acls(Acls::anyone_all());
        let path = format!("{}/sales/s-", dir(sku));
        zk.create(&path, buyer.to_string().as_bytes(), &sequential)
            .await?;
        Ok(())
    }

    pub(super) async fn sales(zk: &Client, sku: &str) -> Result<u64, Error> {
        match zk.check_stat(&format!("{}/sales", dir(sku))).await? {
            Some(stat) => Ok(u64::try_from(stat.num_children).unwrap_or(0)),
            None => Ok(0),
        }
    }

    pub(super) async fn remove(zk: &Client, sku: &str) -> Result<(), Error> {
        let sales = format!("{}/sales", dir(sku));
        for child in zk.list_children(&sales).await.unwrap_or_default() {
            zk.delete(&format!("{sales}/{child}"), None).await?;
        }
        for path in [sales, format!("{}/stock", dir(sku)), dir(sku)] {
            match zk.delete(&path, None).await {
                Ok(()) | Err(Error::NoNode) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The keys of the stock on etcd.
#[cfg(feature = "etcd")]
mod etcd_stock {
    use etcd_client::{Client, DeleteOptions, Error, GetOptions};

    /// `h1:p1,h2:p2` of `[user:password@]h1:p1,h2:p2[/…][?…]` (the demo's store connects
    /// without credentials).
    pub(super) fn endpoints(hosts: &str) -> Vec<String> {
        let hosts = hosts.rsplit_once('@').map_or(hosts, |(_, h)| h);
        let hosts = hosts.split(['/', '?']).next().unwrap_or_default();
        hosts.split(',').map(str::to_owned).collect()
    }

    fn stock_key(sku: &str) -> String {
        format!("oversell/{sku}/stock")
    }

    fn sales_prefix(sku: &str) -> String {
        format!("oversell/{sku}/sales/")
    }

    /// The stock and the highest fence written with it: the key's value, `<stock> <fence>`.
    fn parse(value: &str) -> (u64, u64) {
        let mut words = value.split(' ').map(|w| w.parse().unwrap_or(0));
        (words.next().unwrap_or(0), words.next().unwrap_or(0))
    }

    pub(super) async fn stock(etcd: &Client, sku: &str) -> Result<u64, Error> {
        let got = etcd.clone().get(stock_key(sku), None).await?;
        Ok(got
            .kvs()
            .first()
            .and_then(|kv| kv.value_str().ok())
            .map_or(0, |v| parse(v).0))
    }

    /// Writes the stock with `fence` unless a higher fence wrote it or the stock is no longer
    /// `read`: a transaction on the key's revision, so no other write comes between the check
    /// and this one. `false` when refused.
    pub(super) async fn set_stock_fenced(
        etcd: &Client,
        sku: &str,
        n: u64,
        fence: u64,
        read: u64,
    ) -> Result<bool, Error> {
        use etcd_client::{Compare, CompareOp, Txn, TxnOp};
        loop {
            let got = etcd.clone().get(stock_key(sku), None).await?;
            let ((stock, highest), revision) = got.kvs().first().map_or(((0, 0), 0), |kv| {
                (parse(kv.value_str().unwrap_or("")), kv.mod_revision())
            });
            if fence < highest || stock != read {
                return Ok(false);
            }
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    stock_key(sku),
                    CompareOp::Equal,
                    revision,
                )])
                .and_then([TxnOp::put(stock_key(sku), format!("{n} {fence}"), None)]);
            if etcd.clone().txn(txn).await?.succeeded() {
                return Ok(true);
            }
        }
    }

    pub(super) async fn set_stock(etcd: &Client, sku: &str, n: u64) -> Result<(), Error> {
        etcd.clone()
            .put(stock_key(sku), n.to_string(), None)
            .await?;
        Ok(())
    }

    pub(super) async fn record_sale(etcd: &Client, sku: &str, buyer: u32) -> Result<(), Error> {
        let key = format!("{}{buyer}", sales_prefix(sku));
        etcd.clone().put(key, buyer.to_string(), None).await?;
        Ok(())
    }

    pub(super) async fn sales(etcd: &Client, sku: &str) -> Result<u64, Error> {
        let options = GetOptions::new().with_prefix().with_count_only();
        let got = etcd.clone().get(sales_prefix(sku), Some(options)).await?;
        Ok(u64::try_from(got.count()).unwrap_or(0))
    }

    pub(super) async fn remove(etcd: &Client, sku: &str) -> Result<(), Error> {
        let options = DeleteOptions::new().with_prefix();
        etcd.clone()
            .delete(format!("oversell/{sku}/"), Some(options))
            .await?;
        Ok(())
    }
}

#[derive(Default)]
struct MemoryStore {
    stock: AtomicU64,
    sales: AtomicU64,
    /// The highest fence a stock write carried; held while a fenced write checks and writes.
    fence: std::sync::Mutex<u64>,
}

/// The stock's key on Redis, in its fence's Cluster slot (`{<sku>}`).
fn stock_key(sku: &str) -> String {
    format!("oversell:{{{sku}}}:stock")
}

/// The highest fence a stock write carried, on Redis.
fn stock_fence_key(sku: &str) -> String {
    format!("oversell:{{{sku}}}:fence")
}

/// A fenced stock write on Redis (`KEYS[1]` the stock, `KEYS[2]` its highest fence, one slot;
/// `ARGV[1]` the fence, `ARGV[2]` the new stock, `ARGV[3]` the stock read): refused (0) when a
/// higher fence wrote it or the stock changed since it was read.
const REDIS_FENCED_SET: &str = r"
local highest = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) < highest then return 0 end
if tonumber(redis.call('GET', KEYS[1]) or '0') ~= tonumber(ARGV[3]) then return 0 end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2])
return 1";

fn sales_key(sku: &str) -> String {
    format!("oversell:{sku}:sales")
}

/// The demo's tables in PostgreSQL; created by the coordinator before any worker starts.
const POSTGRES_TABLES: &str = "\
CREATE TABLE IF NOT EXISTS oversell_stock (sku text PRIMARY KEY, stock bigint NOT NULL);
ALTER TABLE oversell_stock ADD COLUMN IF NOT EXISTS fence bigint NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS oversell_sales (sku text NOT NULL, buyer integer NOT NULL);";

impl Store {
    /// The store on the engine `url` names: its PostgreSQL database, or Redis.
    async fn open(url: &str) -> Result<Self, ShopError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
            tokio::spawn(connection);
            Ok(Self::Postgres(client))
        } else if let Some(hosts) = url.strip_prefix("zk://") {
            Ok(Self::ZooKeeper(
                zookeeper_client::Client::connect(hosts).await?,
            ))
        } else if let Some(hosts) = url.strip_prefix("etcd://") {
            #[cfg(feature = "etcd")]
            return Ok(Self::Etcd(Box::new(
                etcd_client::Client::connect(etcd_stock::endpoints(hosts), None).await?,
            )));
            #[cfg(not(feature = "etcd"))]
            return Err(ShopError::Config(format!(
                "{hosts}: {}",
                dlock_testkit::deployment::ETCD_FEATURE
            )));
        } else {
            Ok(Self::Redis(Connection::open(url).await?))
        }
    }

    async fn stock(&self, sku: &str) -> Result<u64, ShopError> {
        Ok(match self {
            Self::Redis(redis) => redis
                .clone()
                .get::<_, Option<u64>>(stock_key(sku))
                .await?
                .unwrap_or(0),
            Self::Postgres(db) => db
                .query_opt("SELECT stock FROM oversell_stock WHERE sku = $1", &[&sku])
                .await?
                .map_or(0, |row| u64::try_from(row.get::<_, i64>(0)).unwrap_or(0)),
            Self::ZooKeeper(zk) => zk_stock::stock(zk, sku).await?,
            #[cfg(feature = "etcd")]
            Self::Etcd(etcd) => etcd_stock::stock(etcd, sku).await?,
            Self::Memory(m) => m.stock.load(Ordering::SeqCst),
        })
    }

    /// Writes the stock; with a fence (inside the lock) and the stock it was computed from,
    /// only when no higher fence wrote it and the stock is still `read` (else
    /// [`ShopError::Fenced`]).
    async fn set_stock(
        &self,
        sku: &str,
        n: u64,
        fenced: Option<(u64, u64)>,
    ) -> Result<(), ShopError> {
        let Some((fence, read)) = fenced else {
            return self.set_stock_unfenced(sku, n).await;
        };
        let written = match self {
            Self::Redis(redis) => {
                let written: i64 = redis::Script::new(REDIS_FENCED_SET)
                    .key(stock_key(sku))
                    .key(stock_fence_key(sku))
                    .arg(fence)
                    .arg(n)
                    .arg(read)
                    .invoke_async(&mut redis.clone())
                    .await?;
                written == 1
            }
            Self::Postgres(db) => {
                let (n, f, read) = (
                    i64::try_from(n).unwrap_or(i64::MAX),
                    i64::try_from(fence).unwrap_or(i64::MAX),
                    i64::try_from(read).unwrap_or(i64::MAX),
                );
                let updated = db
                    .execute(
                        "UPDATE oversell_stock SET stock = $2, fence = $3
                          WHERE sku = $1 AND fence <= $3 AND stock = $4",
                        &[&sku, &n, &f, &read],
                    )
                    .await?;
                updated == 1
            }
            Self::ZooKeeper(zk) => zk_stock::set_stock_fenced(zk, sku, n, fence, read).await?,
            #[cfg(feature = "etcd")]
            Self::Etcd(etcd) => etcd_stock::set_stock_fenced(etcd, sku, n, fence, read).await?,
            Self::Memory(m) => {
                let mut highest = m
                    .fence
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if fence < *highest || m.stock.load(Ordering::SeqCst) != read {
                    false
                } else {
                    *highest = fence;
                    m.stock.store(n, Ordering::SeqCst);
                    true
                }
            }
        };
        if written {
            Ok(())
        } else {
            Err(ShopError::Fenced(fence))
        }
    }

    /// Writes the stock, and forgets every fence (a reset, or the run without a lock).
    async fn set_stock_unfenced(&self, sku: &str, n: u64) -> Result<(), ShopError> {
        match self {
            Self::Redis(redis) => {
                let _: u64 = redis.clone().del(stock_fence_key(sku)).await?;
                let () = redis.clone().set(stock_key(sku), n).await?;
            }
            Self::Postgres(db) => {
                let n = i64::try_from(n).unwrap_or(i64::MAX);
                db.execute(
                    "INSERT INTO oversell_stock (sku, stock, fence) VALUES ($1, $2, 0)
                     ON CONFLICT (sku) DO UPDATE SET stock = EXCLUDED.stock, fence = 0",
                    &[&sku, &n],
                )
                .await?;
            }
            Self::ZooKeeper(zk) => zk_stock::set_stock(zk, sku, n).await?,
            #[cfg(feature = "etcd")]
            Self::Etcd(etcd) => etcd_stock::set_stock(etcd, sku, n).await?,
            Self::Memory(m) => {
                *m.fence
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = 0;
                m.stock.store(n, Ordering::SeqCst);
            }
        }
        Ok(())
    }

    async fn record_sale(&self, sku: &str, buyer: u32) -> Result<(), ShopError> {
        match self {
            Self::Redis(redis) => {
                let _: u64 = redis.clone().rpush(sales_key(sku), buyer).await?;
            }
            Self::Postgres(db) => {
                let buyer = i32::try_from(buyer).unwrap_or(i32::MAX);
                db.execute(
                    "INSERT INTO oversell_sales (sku, buyer) VALUES ($1, $2)",
                    &[&sku, &buyer],
                )
                .await?;
            }
            Self::ZooKeeper(zk) => zk_stock::record_sale(zk, sku, buyer).await?,
            #[cfg(feature = "etcd")]
            Self::Etcd(etcd) => etcd_stock::record_sale(etcd, sku, buyer).await?,
            Self::Memory(m) => {
                m.sales.fetch_add(1, Ordering::SeqCst);
            }
        }
        Ok(())
    }

    async fn sales(&self, sku: &str) -> Result<u64, ShopError> {
        Ok(match self {
            Self::Redis(redis) => redis.clone().llen(sales_key(sku)).await?,
            Self::Postgres(db) => {
                let n: i64 = db
                    .query_one(
                        "SELECT count(*) FROM oversell_sales WHERE sku = $1",
                        &[&sku],
                    )
                    .await?
                    .get(0);
                u64::try_from(n).unwrap_or(0)
            }
            Self::ZooKeeper(zk) => zk_stock::sales(zk, sku).await?,
            #[cfg(feature = "etcd")]
            Self::Etcd(etcd) => etcd_stock::sales(etcd, sku).await?,
            Self::Memory(m) => m.sales.load(Ordering::SeqCst),
        })
    }

    async fn reset(&self, sku: &str, stock: u64) -> Result<(), ShopError> {
        match self {
            Self::Redis(redis) => {
                let _: u64 = redis.clone().del(sales_key(sku)).await?;
            }
            Self::Postgres(db) => {
                db.batch_execute(POSTGRES_TABLES).await?;
                db.execute("DELETE FROM oversell_sales WHERE sku = $1", &[&sku])
                    .await?;
            }
            #[cfg(feature = "etcd")]
            Self::Etcd(etcd) => etcd_stock::remove(etcd, sku).await?,
            Self::ZooKeeper(_) | Self::Memory(_) => {}
        }
        self.set_stock(sku, stock, None).await
    }

    async fn remove(&self, sku: &str) -> Result<(), ShopError> {
        match self {
            Self::Redis(redis) => {
                // One key per command: on a Cluster they may live on different masters.
                for key in [stock_key(sku), stock_fence_key(sku), sales_key(sku)] {
                    let _: u64 = redis.clone().del(key).await?;
                }
            }
            Self::Postgres(db) => {
                db.execute("DELETE FROM oversell_sales WHERE sku = $1", &[&sku])
                    .await?;
                db.execute("DELETE FROM oversell_stock WHERE sku = $1", &[&sku])
                    .await?;
            }
            Self::ZooKeeper(zk) => zk_stock::remove(zk, sku).await?,
            #[cfg(feature = "etcd")]
            Self::Etcd(etcd) => etcd_stock::remove(etcd, sku).await?,
            Self::Memory(_) => {}
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Sold,
    SoldOut,
}

/// Read the stock, check the payment, write the stock back minus one, record the sale.
/// Two buyers that read the same stock both sell: the lost update the lock prevents.
async fn purchase(shop: &Shop, buyer: u32) -> Result<Outcome, ShopError> {
    let left = shop.store.stock(&shop.sku).await?;
    if left == 0 {
        return Ok(Outcome::SoldOut);
    }
    // The payment check. Any await here lets another buyer read the same stock.
    tokio::time::sleep(Duration::from_millis(1)).await;
    // Inside the lock the write carries its fencing token and the stock it read (outside, there
    // is no token, and the write is plain).
    let fenced = dlock_runtime::fencing_token().map(|fence| (fence, left));
    shop.store.set_stock(&shop.sku, left - 1, fenced).await?;
    shop.store.record_sale(&shop.sku, buyer).await?;
    Ok(Outcome::Sold)
}

/// The same purchase, one buyer at a time per sku across every instance. Returns how long the
/// buyer waited for the lock (from the call to the start of the body).
#[dlock(key = "stock:<sku>", client = &shop.locks, timeout = "1m", expire = "10s")]
async fn purchase_locked(
    shop: &Shop,
    sku: &str,
    buyer: u32,
    called_at: Instant,
) -> Result<(Outcome, Duration), ShopError> {
    let waited = called_at.elapsed();
    Ok((purchase(shop, buyer).await?, waited))
}

#[derive(Debug)]
enum ShopError {
    Lock(LockError),
    Store(redis::RedisError),
    Postgres(tokio_postgres::Error),
    ZooKeeper(zookeeper_client::Error),
    #[cfg(feature = "etcd")]
    Etcd(etcd_client::Error),
    #[cfg_attr(
        feature = "etcd",
        allow(dead_code, reason = "only without the etcd engine")
    )]
    Config(String),
    /// A stock write under this fence was refused: a later holder of the lock wrote the stock,
    /// or it changed since it was read.
    Fenced(u64),
}

#[cfg(feature = "etcd")]
impl From<etcd_client::Error> for ShopError {
    fn from(e: etcd_client::Error) -> Self {
        Self::Etcd(e)
    }
}

impl From<zookeeper_client::Error> for ShopError {
    fn from(e: zookeeper_client::Error) -> Self {
        Self::ZooKeeper(e)
    }
}

impl From<LockError> for ShopError {
    fn from(e: LockError) -> Self {
        Self::Lock(e)
    }
}

impl From<tokio_postgres::Error> for ShopError {
    fn from(e: tokio_postgres::Error) -> Self {
        Self::Postgres(e)
    }
}

impl From<redis::RedisError> for ShopError {
    fn from(e: redis::RedisError) -> Self {
        Self::Store(e)
    }
}

impl fmt::Display for ShopError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Lock(e) => write!(f, "lock: {e}"),
            Self::Store(e) => write!(f, "stock store: {e}"),
            Self::Postgres(e) => write!(f, "stock store (PostgreSQL): {e}"),
            Self::ZooKeeper(e) => write!(f, "stock store (ZooKeeper): {e}"),
            #[cfg(feature = "etcd")]
            Self::Etcd(e) => write!(f, "stock store (etcd): {e}"),
            Self::Config(e) => write!(f, "{e}"),
            Self::Fenced(fence) => write!(
                f,
                "stock store: the write under fencing token {fence} was refused: a later holder \
                 of the lock wrote the stock, or it changed since it was read (this holder's \
                 lock had been lost)"
            ),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// One instance: its buyers, all at once.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Unlocked,
    Locked,
}

impl Mode {
    fn flag(self) -> &'static str {
        match self {
            Self::Unlocked => "unlocked",
            Self::Locked => "locked",
        }
    }
}

/// What an instance reports, in-process or as a stdout line of a worker.
#[derive(Debug)]
enum Event {
    Ready,
    Bought {
        outcome: Outcome,
        waited: Option<Duration>,
    },
    Failed(String),
    /// A worker's stdout closed (it exited).
    Exited,
}

impl Event {
    /// `sold 1234` / `soldout -` (lock wait in µs) / `failed <why>` / `ready`.
    fn to_line(&self) -> String {
        match self {
            Self::Ready => "ready".to_owned(),
            Self::Bought { outcome, waited } => {
                let word = match outcome {
                    Outcome::Sold => "sold",
                    Outcome::SoldOut => "soldout",
                };
                match waited {
                    Some(w) => format!("{word} {}", w.as_micros()),
                    None => format!("{word} -"),
                }
            }
            Self::Failed(why) => format!("failed {}", why.replace('\n', " ")),
            Self::Exited => "exited".to_owned(),
        }
    }

    fn from_line(line: &str) -> Self {
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        let waited = rest.parse().ok().map(Duration::from_micros);
        match word {
            "ready" => Self::Ready,
            "sold" => Self::Bought {
                outcome: Outcome::Sold,
                waited,
            },
            "soldout" => Self::Bought {
                outcome: Outcome::SoldOut,
                waited,
            },
            "failed" => Self::Failed(rest.to_owned()),
            "exited" => Self::Exited,
            _ => Self::Failed(format!("unexpected worker output: {line}")),
        }
    }
}

/// The buyers of instance `instance` (of `instances`): every `instances`-th of `0..buyers`.
fn buyers_of(instance: usize, instances: usize, buyers: usize) -> Vec<u32> {
    (instance..buyers)
        .step_by(instances)
        .map(|b| u32::try_from(b).unwrap_or(u32::MAX))
        .collect()
}

/// Starts every buyer of this instance at once and reports each purchase as it ends.
async fn run_instance(
    shop: Arc<Shop>,
    mode: Mode,
    buyers: Vec<u32>,
    events: mpsc::UnboundedSender<Event>,
) {
    let mut tasks = tokio::task::JoinSet::new();
    for buyer in buyers {
        let shop = shop.clone();
        tasks.spawn(async move {
            let result = match mode {
                Mode::Unlocked => purchase(&shop, buyer).await.map(|o| (o, None)),
                Mode::Locked => purchase_locked(&shop, &shop.sku, buyer, Instant::now())
                    .await
                    .map(|(o, w)| (o, Some(w))),
            };
            match result {
                Ok((outcome, waited)) => Event::Bought { outcome, waited },
                Err(e) => Event::Failed(e.to_string()),
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        let event = joined.unwrap_or_else(|e| Event::Failed(format!("buyer task: {e}")));
        if events.send(event).is_err() {
            return;
        }
    }
}

/// `--worker <unlocked|locked> <sku> <instance> <instances> <buyers>`: one instance as its own
/// process, configured from the environment (`DLOCK_URL`) like a real service instance.
/// Prints `ready`, waits for `go` on stdin, then one line per buyer.
async fn worker(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let [mode, sku, instance, instances, buyers] = args else {
        return Err(
            "usage: oversell --worker <unlocked|locked> <sku> <instance> <instances> <buyers>"
                .into(),
        );
    };
    let mode = if mode == "locked" {
        Mode::Locked
    } else {
        Mode::Unlocked
    };
    let buyers = buyers_of(instance.parse()?, instances.parse()?, buyers.parse()?);
    let url = std::env::var("DLOCK_URL")?;
    // The stock's Redis, when the locks' engine is not Redis (etcd).
    let data_url = std::env::var(DATA_URL).unwrap_or(url);

    let locks = Locker::from_env()?;
    let store = Store::open(&data_url).await.map_err(|e| e.to_string())?;
    if mode == Mode::Locked {
        // Connect the lock client now, so the first buyer's wait does not include it.
        let warm_up = format!("oversell-warm-up:{}", std::process::id());
        if let Some(guard) = locks.try_acquire(&warm_up, Duration::from_secs(1)).await? {
            guard.release().await?;
        }
    }
    let shop = Arc::new(Shop {
        locks,
        store,
        sku: sku.clone(),
    });

    let (tx, mut rx) = mpsc::unbounded_channel();
    emit(&Event::Ready).await?;
    let mut go = String::new();
    BufReader::new(tokio::io::stdin())
        .read_line(&mut go)
        .await?;
    if go.trim() != "go" {
        return Ok(()); // The coordinator is gone.
    }
    let instance = tokio::spawn(run_instance(shop.clone(), mode, buyers, tx));
    while let Some(event) = rx.recv().await {
        emit(&event).await?;
    }
    instance.await?;
    // A process that ends leaves nothing in the engine: releases still in the background and
    // the engine's session or leases end here.
    shop.locks.close().await?;
    Ok(())
}

async fn emit(event: &Event) -> std::io::Result<()> {
    let mut out = tokio::io::stdout();
    out.write_all(format!("{}\n", event.to_line()).as_bytes())
        .await?;
    out.flush().await
}

// ---------------------------------------------------------------------------------------------
// The coordinator.
// ---------------------------------------------------------------------------------------------

/// The variable that hands a worker the stock's Redis URL when it is not `DLOCK_URL` (etcd).
const DATA_URL: &str = "OVERSELL_DATA_URL";

/// Where the stock and the locks live.
enum Backend {
    Redis {
        engine: Engine,
        url: String,
        /// The stock's Redis: `url`, except on etcd.
        data_url: String,
        /// What to print about it.
        about: String,
        /// The throwaway deployment, stopped when this is dropped.
        _deployment: Option<Box<Deployment>>,
    },
    Embedded {
        why: &'static str,
    },
}

impl Backend {
    async fn choose(config: &Config) -> Result<Self, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        if config.embedded {
            return Ok(Self::Embedded { why: "--embedded" });
        }
        if let Some(engine) = config.engine {
            return Self::throwaway(engine).await;
        }
        if let Some(url) = var("DLOCK_URL") {
            let parsed: EngineUrl = url.parse().map_err(|e| format!("{e}"))?;
            if parsed.engine() == "memory" {
                return Ok(Self::Embedded {
                    why: "DLOCK_URL=memory://",
                });
            }
            let engine = Engine::of_url_engine(parsed.engine())
                .ok_or_else(|| format!("DLOCK_URL: no stock store for `{}`", parsed.engine()))?;
            return Ok(Self::Redis {
                engine,
                about: format!("{parsed} (from DLOCK_URL)"),
                data_url: url.clone(),
                url,
                _deployment: None,
            });
        }
        if var("DLOCK_BACKEND").is_some_and(|b| b.eq_ignore_ascii_case("memory")) {
            return Ok(Self::Embedded {
                why: "DLOCK_BACKEND=memory",
            });
        }
        for name in ["DLOCK_REDIS_URL", "REDIS_URL"] {
            if let Some(url) = var(name) {
                let about = format!("Redis at {} (from {name})", redact_url(&url));
                return Ok(Self::Redis {
                    engine: Engine::Redis,
                    data_url: url.clone(),
                    url,
                    about,
                    _deployment: None,
                });
            }
        }
        if !dlock_testkit::RedisServer::available() {
            return Ok(Self::Embedded {
                why: "no DLOCK_URL and no redis-server on PATH",
            });
        }
        Self::throwaway(Engine::Redis).await
    }

    /// The throwaway deployment of `engine`.
    async fn throwaway(engine: Engine) -> Result<Self, String> {
        if engine == Engine::Memory {
            return Ok(Self::Embedded {
                why: "--engine memory",
            });
        }
        let deployment = Deployment::start(engine)
            .await
            .map_err(|e| format!("starting a throwaway {engine}: {e}"))?;
        Ok(Self::Redis {
            engine,
            url: deployment.url(),
            data_url: deployment.data_url(),
            about: match engine {
                // A throwaway cluster: its directory goes with it.
                Engine::Postgres | Engine::ZooKeeper => {
                    format!("{} (removed at exit)", deployment.describe())
                }
                _ => format!(
                    "{} (no persistence; stopped at exit)",
                    deployment.describe()
                ),
            },
            _deployment: Some(Box::new(deployment)),
        })
    }

    /// The engine's name: `redis`, `redis-cluster`, `redis-sentinel` or `embedded`.
    fn short(&self) -> &'static str {
        match self {
            Self::Redis { engine, .. } => engine.name(),
            Self::Embedded { .. } => "embedded",
        }
    }
}

/// What one run measured.
struct Report {
    mode: Mode,
    elapsed: Duration,
    sold: u64,
    sold_out: u64,
    failures: Vec<String>,
    missing: u64,
    recorded_sales: u64,
    stock_left: u64,
    waits: Vec<Duration>,
}

impl Report {
    fn oversold(&self, stock: u64) -> u64 {
        self.sold.saturating_sub(stock)
    }

    fn failed(&self) -> u64 {
        self.failures.len() as u64 + self.missing
    }
}

async fn demo(config: Config) -> Result<bool, String> {
    let backend = Backend::choose(&config).await?;
    println!(
        "dlock oversell demo: {} buyers, {} in stock, {} instances",
        config.buyers, config.stock, config.instances
    );
    match &backend {
        Backend::Redis {
            about, engine, url, ..
        } => {
            println!("backend: {about}");
            if *engine != Engine::Redis {
                println!("         engine {engine}: DLOCK_URL={}", redact_url(url));
            }
            let stock = if *engine == Engine::Postgres {
                "stock in a PostgreSQL table (SELECT then UPDATE)"
            } else if *engine == Engine::ZooKeeper {
                "stock in a znode (read, then write back)"
            } else {
                "stock in Redis (GET then SET)"
            };
            println!(
                "         {stock}; {} worker processes, each with its own connections",
                config.instances
            );
        }
        Backend::Embedded { why } => {
            println!("backend: embedded (Locker::memory()), because {why}");
            println!(
                "         the instances are tasks of this one process; a real multi-process run needs"
            );
            println!("         Redis: install redis-server or set DLOCK_REDIS_URL");
        }
    }
    println!();

    let unlocked = run(&config, &backend, Mode::Unlocked).await?;
    let locked = run(&config, &backend, Mode::Locked).await?;
    println!();
    print_table(&config, &backend, &unlocked, &locked);
    println!();
    Ok(verdict(&config, &unlocked, &locked))
}

/// One run: fresh stock, every instance started, every buyer at once.
async fn run(config: &Config, backend: &Backend, mode: Mode) -> Result<Report, String> {
    let label = match mode {
        Mode::Unlocked => "without lock ",
        Mode::Locked => "with #[dlock]",
    };
    let sku = format!("tee-{}-{}", std::process::id(), mode.flag());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut workers: Vec<Child> = Vec::new();
    let mut embedded_go = None;
    let store = match backend {
        Backend::Redis { url, data_url, .. } => {
            let store = Store::open(data_url)
                .await
                .map_err(|e| format!("cannot reach the store at {}: {e}", redact_url(data_url)))?;
            store
                .reset(&sku, config.stock)
                .await
                .map_err(|e| e.to_string())?;
            for instance in 0..config.instances {
                workers.push(spawn_worker(
                    (url, data_url),
                    mode,
                    &sku,
                    instance,
                    config,
                    tx.clone(),
                )?);
            }
            store
        }
        Backend::Embedded { .. } => {
            let memory = Arc::new(MemoryStore::default());
            let store = Store::Memory(memory.clone());
            store
                .reset(&sku, config.stock)
                .await
                .map_err(|e| e.to_string())?;
            // One lock service (a shared embedded table), one client clone per instance.
            let locks = Locker::memory();
            let (go_tx, go_rx) = tokio::sync::watch::channel(false);
            for instance in 0..config.instances {
                let shop = Arc::new(Shop {
                    locks: locks.clone(),
                    store: Store::Memory(memory.clone()),
                    sku: sku.clone(),
                });
                let buyers = buyers_of(instance, config.instances, config.buyers);
                let (tx, mut go_rx) = (tx.clone(), go_rx.clone());
                tokio::spawn(async move {
                    let _ = tx.send(Event::Ready);
                    if go_rx.wait_for(|go| *go).await.is_ok() {
                        run_instance(shop, mode, buyers, tx).await;
                    }
                });
            }
            embedded_go = Some(go_tx);
            store
        }
    };
    drop(tx);

    // Everyone ready, then go.
    let mut ready = 0;
    while ready < config.instances {
        match tokio::time::timeout(Duration::from_secs(30), rx.recv()).await {
            Ok(Some(Event::Ready)) => ready += 1,
            Ok(Some(Event::Failed(why))) => {
                return Err(format!("an instance failed to start: {why}"));
            }
            Ok(Some(Event::Bought { .. })) => {
                return Err("an instance bought before `go`".to_owned());
            }
            Ok(Some(Event::Exited) | None) => {
                return Err(
                    "an instance exited before it was ready (see its error above)".to_owned(),
                );
            }
            Err(_) => return Err("instances not ready within 30s".to_owned()),
        }
    }
    let started = Instant::now();
    for worker in &mut workers {
        if let Some(stdin) = worker.stdin.as_mut() {
            stdin
                .write_all(b"go\n")
                .await
                .map_err(|e| format!("starting a worker: {e}"))?;
            stdin
                .flush()
                .await
                .map_err(|e| format!("starting a worker: {e}"))?;
        }
    }
    if let Some(go) = embedded_go {
        let _ = go.send(true);
    }

    print!("  {label}  ");
    flush();
    let dot_every = config.buyers.div_ceil(40).max(1);
    let mut report = Report {
        mode,
        elapsed: Duration::ZERO,
        sold: 0,
        sold_out: 0,
        failures: Vec::new(),
        missing: 0,
        recorded_sales: 0,
        stock_left: 0,
        waits: Vec::new(),
    };
    let mut seen = 0;
    while let Some(event) = rx.recv().await {
        match event {
            Event::Ready | Event::Exited => continue,
            Event::Bought { outcome, waited } => {
                match outcome {
                    Outcome::Sold => report.sold += 1,
                    Outcome::SoldOut => report.sold_out += 1,
                }
                report.waits.extend(waited);
            }
            Event::Failed(why) => report.failures.push(why),
        }
        seen += 1;
        if seen % dot_every == 0 {
            print!(".");
            flush();
        }
        if seen == config.buyers {
            break;
        }
    }
    report.elapsed = started.elapsed();
    report.missing = (config.buyers - seen) as u64;
    println!(" {}", format_duration(report.elapsed));

    for mut worker in workers {
        match tokio::time::timeout(Duration::from_secs(10), worker.wait()).await {
            Ok(Ok(status)) if status.success() => {}
            Ok(Ok(status)) => report
                .failures
                .push(format!("a worker exited with {status}")),
            Ok(Err(e)) => report.failures.push(format!("waiting for a worker: {e}")),
            Err(_) => report
                .failures
                .push("a worker did not exit within 10s".to_owned()),
        }
    }
    report.stock_left = store.stock(&sku).await.map_err(|e| e.to_string())?;
    report.recorded_sales = store.sales(&sku).await.map_err(|e| e.to_string())?;
    store.remove(&sku).await.map_err(|e| e.to_string())?;
    Ok(report)
}

/// Starts `oversell --worker …` with the engine URL in its environment as `DLOCK_URL` (not on
/// its command line, where `ps` would show a password) and forwards its stdout lines as events.
fn spawn_worker(
    (url, data_url): (&str, &str),
    mode: Mode,
    sku: &str,
    instance: usize,
    config: &Config,
    events: mpsc::UnboundedSender<Event>,
) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?;
    let mut child = Command::new(exe)
        .arg("--worker")
        .arg(mode.flag())
        .arg(sku)
        .arg(instance.to_string())
        .arg(config.instances.to_string())
        .arg(config.buyers.to_string())
        // DLOCK_URL names any engine, and wins over the variables of the Redis engine; those
        // are removed all the same, so that a value the worker would not need cannot fail it.
        .env("DLOCK_URL", url)
        .env(DATA_URL, data_url)
        .env_remove("DLOCK_REDIS_URL")
        .env_remove("REDIS_URL")
        .env_remove("DLOCK_BACKEND")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("starting a worker process: {e}"))?;
    let stdout = child.stdout.take().ok_or("worker stdout")?;
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if events.send(Event::from_line(&line)).is_err() {
                return;
            }
        }
        let _ = events.send(Event::Exited);
    });
    Ok(child)
}

fn flush() {
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
}

// ---------------------------------------------------------------------------------------------
// Output.
// ---------------------------------------------------------------------------------------------

fn print_table(config: &Config, backend: &Backend, unlocked: &Report, locked: &Report) {
    let kind = match backend {
        Backend::Redis { .. } => "processes",
        Backend::Embedded { .. } => "tasks",
    };
    let wait = |r: &Report, p: f64| {
        percentile(&r.waits, p).map_or_else(|| "-".to_owned(), format_duration)
    };
    let cells = |r: &Report| -> Vec<String> {
        vec![
            format!("{} {kind}", config.instances),
            config.buyers.to_string(),
            config.stock.to_string(),
            r.sold.to_string(),
            r.oversold(config.stock).to_string(),
            r.stock_left.to_string(),
            r.failed().to_string(),
            format_duration(r.elapsed),
            wait(r, 50.0),
            wait(r, 99.0),
            match r.mode {
                Mode::Unlocked => format!("{} (no lock)", backend.short()),
                Mode::Locked => format!("{} lock", backend.short()),
            },
        ]
    };
    let names = [
        "instances",
        "buyers",
        "stock",
        "sold",
        "oversold",
        "stock left",
        "failed",
        "elapsed",
        "lock wait p50",
        "lock wait p99",
        "backend",
    ];
    let (a, b) = (cells(unlocked), cells(locked));
    let heads = ["without lock", "with #[dlock]"];
    let w0 = names.iter().map(|n| n.len()).max().unwrap_or(0);
    let w1 = a
        .iter()
        .map(String::len)
        .chain([heads[0].len()])
        .max()
        .unwrap_or(0);
    let w2 = b
        .iter()
        .map(String::len)
        .chain([heads[1].len()])
        .max()
        .unwrap_or(0);
    let rule = format!(
        "  {}  {}  {}",
        "-".repeat(w0),
        "-".repeat(w1),
        "-".repeat(w2)
    );
    println!("  {:<w0$}  {:>w1$}  {:>w2$}", "", heads[0], heads[1]);
    println!("{rule}");
    for ((name, x), y) in names.iter().zip(&a).zip(&b) {
        let mark = if *name == "oversold" {
            "   <- items sold that did not exist"
        } else {
            ""
        };
        println!("  {name:<w0$}  {x:>w1$}  {y:>w2$}{mark}");
    }
    println!("{rule}");
}

/// Prints what happened and says whether the locked run was exact.
fn verdict(config: &Config, unlocked: &Report, locked: &Report) -> bool {
    let expected = config.stock.min(config.buyers as u64);
    let oversold = unlocked.oversold(config.stock);
    if oversold > 0 {
        println!(
            "without a lock: {} sold for {} in stock, {oversold} oversold — buyers read the same stock before anyone wrote it back",
            unlocked.sold, config.stock
        );
    } else {
        println!(
            "without a lock: no oversell this time ({} sold); it needs more buyers than stock to show",
            unlocked.sold
        );
    }
    let lost = unlocked
        .sold
        .saturating_sub(config.stock.saturating_sub(unlocked.stock_left));
    if lost > 0 {
        println!(
            "without a lock: {} sales but the stock only went down by {}: {lost} updates lost",
            unlocked.sold,
            config.stock - unlocked.stock_left
        );
    }
    for (report, name) in [(unlocked, "without lock"), (locked, "with #[dlock]")] {
        for why in report.failures.iter().take(3) {
            println!("{name}: failed: {why}");
        }
        if report.missing > 0 {
            println!("{name}: {} buyers never reported", report.missing);
        }
        if report.recorded_sales != report.sold {
            println!(
                "{name}: the store recorded {} sales, the instances reported {}",
                report.recorded_sales, report.sold
            );
        }
    }
    let exact = locked.sold == expected
        && locked.oversold(config.stock) == 0
        && locked.stock_left == config.stock - expected
        && locked.recorded_sales == expected
        && locked.failed() == 0;
    if exact {
        println!(
            "with #[dlock]: exactly {expected} sold for {} in stock, oversold 0 — OK",
            config.stock
        );
    } else {
        println!(
            "with #[dlock]: NOT exact — sold {}, expected {expected}, stock left {}, failed {} — FAILED",
            locked.sold,
            locked.stock_left,
            locked.failed()
        );
    }
    exact
}

/// Nearest-rank percentile.
fn percentile(samples: &[Duration], p: f64) -> Option<Duration> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

fn format_duration(d: Duration) -> String {
    if d < Duration::from_millis(10) {
        format!("{:.1}ms", d.as_secs_f64() * 1000.0)
    } else if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{:.2}s", d.as_secs_f64())
    }
}
