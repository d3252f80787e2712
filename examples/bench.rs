//! The benchmark: dlock against the raw Redis commands, measured side by side in one run.
//!
//! ```sh
//! cargo run --release --example bench                 # full run (under a minute)
//! cargo run --release --example bench -- --quick      # tiny counts: a correctness smoke test
//! cargo run --release --example bench -- --json bench.jsonl --plot w3.svg
//! cargo run --release --example bench -- --engine redis-cluster   # on a throwaway Redis Cluster
//! cargo run --release --example bench -- --engine redis-sentinel  # on a throwaway Sentinel setup
//! cargo run --release --example bench -- --engine redlock  # RedLock on 5 throwaway masters
//! cargo run --release --example bench -- --engine postgres        # on a throwaway PostgreSQL
//! cargo run --release --example bench -- --engine etcd            # on a throwaway etcd member
//! cargo run --release --example bench -- --engine zookeeper       # on a throwaway ZooKeeper
//! ```
//!
//! `--engine etcd` runs the same workloads against a floor made of etcd's own lock service
//! (see `bench_etcd.rs`).
//!
//! Every variant runs `--rounds` times (5 by default), taking turns with the others so that a
//! drift of the machine hits them alike; each figure is the median round. In W1 the variants
//! take turns cycle by cycle.
//!
//! Without `--engine` it uses `DLOCK_URL` when that names a Redis engine (or, kept for
//! compatibility, `DLOCK_REDIS_URL` or `REDIS_URL`), or else starts its own `redis-server` on a
//! free loopback port; `--engine redis` always starts one. `--engine redis-cluster` starts a
//! throwaway Redis Cluster (3 masters, 3 replicas), `--engine redis-sentinel` a throwaway master
//! with 2 replicas and 3 sentinels, `--engine redlock` 5 independent masters
//! ([`dlock_testkit`]); the lockers get the
//! engine's URL. Every figure is also given as a ratio to the **floor**: the same work done with
//! raw commands by hand (`SET key token NX PX`, then an `EVALSHA` compare-and-delete), the
//! two-round-trip limit of any Redis lock; on a Cluster they go through a redis-rs cluster
//! connection on the same keys, on Sentinel to the master, on RedLock to the first master (so
//! RedLock's ratios are to the raw lock on one server). RedLock has no fair mode: its W3 runs
//! without it.
//!
//! On a Cluster every key carries the hash tag `{bench}`, so the workloads run on one master
//! like on one server, and W2 runs once more without it, its keys spread over the 3 masters.
//! Server figures (CPU, commands) add up the masters; the server CPU column also gives each
//! master's share.
//!
//! - **W1**: one client, a fresh key per cycle: cycles/s and latency p50/p99.
//! - **W2**: 16 clients with their own connections, distinct keys: cycles/s, and the CPU time
//!   per cycle of the Redis server (`INFO cpu`) and of this program (Linux), which tell what
//!   limits it when clients and server share a small machine.
//! - **W3**: 8 clients with their own connections on ONE key; the body is a non-atomic GET/SET of
//!   a counter. Critical sections/s, whether the counter is exact, wait p50/p99/max, hand-off
//!   p50/p99 (release by one client to acquisition by another), and the share of hand-offs that
//!   went to another client — for the default mode, fair mode and notifications off. The floor
//!   here retries `SET NX` every 1ms.
//! - Commands Redis executed per acquisition (`INFO commandstats` deltas; commands run inside a
//!   script count too), and in W1 the heap allocations this program made per cycle (all its
//!   threads, the connection's tasks included: a counting allocator wraps the system's).
//!
//! With `--engine postgres` the workloads run on a throwaway PostgreSQL cluster against the floor
//! of `pg_try_advisory_lock`/`pg_advisory_unlock` on one connection per client, with statements
//! per acquisition from `pg_stat_statements` (see `bench_postgres.rs`). With `--engine zookeeper`
//! they run on a throwaway ZooKeeper server against the floor of `zookeeper-client`'s own lock
//! recipe (see `bench_zookeeper.rs`).
//!
//! All loops are bounded by count and by time. The exit code is non-zero when a counter is wrong.

use std::{
    fmt::Write as _,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use dlock_runtime::{LockError, LockOptions, Locker, dlock};
use dlock_testkit::deployment::{Connection, Deployment, Engine};
use redis::AsyncCommands as _;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

/// Counts this program's heap allocations (W1's allocations per cycle).
#[global_allocator]
static ALLOCATOR: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

#[cfg(feature = "etcd")]
#[path = "bench_etcd.rs"]
mod etcd;

const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0";

type Error = Box<dyn std::error::Error + Send + Sync>;

/// `--engine postgres`: the same workloads against PostgreSQL's advisory locks.
#[path = "bench_postgres.rs"]
mod postgres;

/// `--engine zookeeper`: the same workloads against `zookeeper-client`'s own lock recipe.
#[path = "bench_zookeeper.rs"]
mod zookeeper;

#[derive(Clone, Copy)]
struct Sizes {
    w1_cycles: usize,
    w2_clients: usize,
    w2_cycles: usize,
    w3_clients: usize,
    w3_sections: usize,
    w4_sections: usize,
    w4_waiters: &'static [usize],
    time_cap: Duration,
}

impl Sizes {
    fn full() -> Self {
        Self {
            w1_cycles: 5000,
            w2_clients: 16,
            w2_cycles: 2000,
            w3_clients: 8,
            w3_sections: 2000,
            w4_sections: 2048,
            w4_waiters: &[1, 16, 64, 256],
            time_cap: Duration::from_secs(20),
        }
    }

    fn quick() -> Self {
        Self {
            w1_cycles: 100,
            w2_clients: 4,
            w2_cycles: 50,
            w3_clients: 4,
            w3_sections: 80,
            w4_sections: 64,
            w4_waiters: &[8],
            time_cap: Duration::from_secs(10),
        }
    }
}

struct Args {
    sizes: Sizes,
    rounds: usize,
    json: Option<String>,
    plot: Option<String>,
    engine: Engine,
    /// No `--engine` was given: the environment's deployment, if it names one.
    from_env: bool,
    /// Which workloads to run (`--only w1,w4`): all by default.
    only: Option<Vec<String>>,
}

impl Args {
    fn runs(&self, workload: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|w| w == workload))
    }
}

/// The benchmark's arguments (`--help` prints them).
#[derive(Debug, clap::Parser)]
#[command(
    name = "bench",
    about = "dlock against each engine's own lock (the floor), measured side by side in one run.",
    after_help = "Without --engine it runs on DLOCK_URL when that names a Redis engine (one \
                  server, Cluster, Sentinel or RedLock), else (kept for compatibility) on \
                  DLOCK_REDIS_URL / REDIS_URL, else on a throwaway redis-server."
)]
struct Cli {
    /// Tiny counts and one round: a correctness smoke test.
    #[arg(long)]
    quick: bool,
    /// Rounds of every variant (the figures are the median round).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    rounds: Option<u64>,
    /// Only these workloads.
    #[arg(long, value_delimiter = ',', value_parser = ["w1", "w2", "w3", "w4"])]
    only: Option<Vec<String>>,
    /// Append each row as a JSON line to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<String>,
    /// Write W3's wait-time plot (SVG) to this file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<String>,
    /// Run on a throwaway deployment of this engine.
    #[arg(long, value_enum)]
    engine: Option<Engine>,
}

fn parse_args() -> Result<Args, String> {
    let cli = <Cli as clap::Parser>::parse();
    let engine = match cli.engine {
        Some(Engine::Memory) => {
            return Err(
                "--engine memory: the embedded table has no floor to measure against (it runs \
                 in the suite and the demo)"
                    .to_owned(),
            );
        }
        Some(engine) => engine,
        None => Engine::Redis,
    };
    let rounds = cli.rounds.map_or(if cli.quick { 1 } else { 5 }, |r| {
        usize::try_from(r).unwrap_or(usize::MAX)
    });
    Ok(Args {
        sizes: if cli.quick {
            Sizes::quick()
        } else {
            Sizes::full()
        },
        rounds,
        json: cli.json,
        plot: cli.plot,
        engine,
        from_env: cli.engine.is_none(),
        only: cli.only,
    })
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One measured row.
#[derive(Default, Clone)]
struct Row {
    workload: &'static str,
    variant: &'static str,
    ops: usize,
    per_sec: f64,
    p50: Option<Duration>,
    p99: Option<Duration>,
    wait_max: Option<Duration>,
    handoff_p50: Option<Duration>,
    handoff_p99: Option<Duration>,
    other_share: Option<f64>,
    exact: Option<bool>,
    commands_per_acquire: Option<f64>,
    /// Heap allocations (and reallocations) of this program per cycle, W1 only.
    allocations: Option<f64>,
    /// Requests the lock clients sent per acquisition (scripts, subscriptions), W4 only.
    requests_per_acquire: Option<f64>,
    /// CPU time per operation: the Redis server's (`INFO cpu`, the masters' added up) and this
    /// program's.
    server_cpu: Option<Duration>,
    client_cpu: Option<Duration>,
    /// Each master's share of `server_cpu`, when there are several.
    server_cpu_per_master: Vec<Duration>,
}

impl Row {
    fn json(&self, engine: Engine, floor: f64) -> String {
        let opt = |d: Option<Duration>| d.map_or("null".to_owned(), |d| format!("{:.3}", ms(d)));
        let us = |d: Option<Duration>| {
            d.map_or("null".to_owned(), |d| {
                format!("{:.2}", d.as_secs_f64() * 1e6)
            })
        };
        format!(
            "{{\"engine\":\"{engine}\",\"workload\":\"{}\",\"variant\":\"{}\",\"ops\":{},\"per_sec\":{:.1},\"ratio_to_floor\":{:.3},\"p50_ms\":{},\"p99_ms\":{},\"wait_max_ms\":{},\"handoff_p50_ms\":{},\"handoff_p99_ms\":{},\"other_share\":{},\"exact\":{},\"commands_per_acquire\":{},\"allocations_per_op\":{},\"requests_per_acquire\":{},\"server_cpu_us\":{},\"client_cpu_us\":{},\"server_cpu_per_master_us\":[{}]}}",
            self.workload,
            self.variant,
            self.ops,
            self.per_sec,
            self.per_sec / floor,
            opt(self.p50),
            opt(self.p99),
            opt(self.wait_max),
            opt(self.handoff_p50),
            opt(self.handoff_p99),
            self.other_share
                .map_or("null".to_owned(), |s| format!("{s:.3}")),
            self.exact.map_or("null".to_owned(), |e| e.to_string()),
            self.commands_per_acquire
                .map_or("null".to_owned(), |c| format!("{c:.2}")),
            self.allocations
                .map_or("null".to_owned(), |c| format!("{c:.2}")),
            self.requests_per_acquire
                .map_or("null".to_owned(), |c| format!("{c:.2}")),
            us(self.server_cpu),
            us(self.client_cpu),
            self.server_cpu_per_master
                .iter()
                .map(|d| us(Some(*d)))
                .collect::<Vec<_>>()
                .join(","),
        )
    }
}

fn token() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("OS random generator");
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Where the workloads run.
struct Target {
    engine: Engine,
    /// What the lockers and the data connections take: the engine's URL.
    url: String,
    /// `redis://` URLs of the servers that take writes (one, or a Cluster's masters), asked for
    /// `INFO` directly.
    masters: Vec<String>,
}

/// What every key of a workload starts with, the lockers' `key_prefix` and the floor's alike.
#[derive(Clone, Copy)]
struct Prefix(&'static str);

impl Prefix {
    /// Keys on one server: `bench:`; on a Cluster `{bench}:`, whose hash tag puts every key in
    /// one slot, so on one master.
    fn one_server(target: &Target) -> Self {
        if target.engine == Engine::RedisCluster {
            Self("{bench}:")
        } else {
            Self("bench:")
        }
    }

    /// Keys spread over a Cluster's masters by their hash.
    const SPREAD: Self = Self("bench:");
}

/// A data connection on the engine: the floor's raw commands and the W3 body go through it.
async fn connection(target: &Target) -> Result<Connection, Error> {
    Ok(Connection::open(&target.url).await?)
}

/// One plain connection per master, for `INFO`.
struct Stats(Vec<redis::aio::MultiplexedConnection>);

impl Stats {
    async fn open(target: &Target) -> Result<Self, Error> {
        let mut connections = Vec::new();
        for url in &target.masters {
            connections.push(
                redis::Client::open(url.as_str())?
                    .get_multiplexed_async_connection()
                    .await?,
            );
        }
        Ok(Self(connections))
    }

    /// Commands the masters have executed so far.
    async fn commands(&mut self) -> Result<u64, Error> {
        let mut sum = 0;
        for redis in &mut self.0 {
            sum += commands_so_far(redis).await?;
        }
        Ok(sum)
    }

    /// Each master's CPU time so far.
    async fn cpu(&mut self) -> Result<Vec<Duration>, Error> {
        let mut cpu = Vec::with_capacity(self.0.len());
        for redis in &mut self.0 {
            cpu.push(server_cpu_so_far(redis).await?);
        }
        Ok(cpu)
    }
}

/// The floor: SET NX PX, then EVALSHA compare-and-delete. `retry` is the pause after a refusal.
async fn raw_cycle(
    redis: &mut Connection,
    release: &redis::Script,
    key: &str,
    retry: Option<Duration>,
    body: impl AsyncFnOnce(&mut Connection) -> Result<(), Error>,
) -> Result<(), Error> {
    let token = token();
    loop {
        let set: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(redis)
            .await?;
        if set.is_some() {
            break;
        }
        match retry {
            Some(pause) => tokio::time::sleep(pause).await,
            None => return Err("floor W1/W2 keys are never contended".into()),
        }
    }
    body(redis).await?;
    let _: i64 = release.key(key).arg(&token).invoke_async(redis).await?;
    Ok(())
}

#[dlock(key = "bench:attr:<n>", client = locker, timeout = "5s", expire = "30s")]
async fn locked_noop(locker: &Locker, n: usize) -> Result<(), LockError> {
    let _ = n;
    Ok(())
}

fn sum_commands(server_info: &str) -> u64 {
    server_info
        .lines()
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
}

/// The server's CPU time so far (`used_cpu_sys` + `used_cpu_user`).
async fn server_cpu_so_far(
    redis: &mut redis::aio::MultiplexedConnection,
) -> Result<Duration, Error> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(redis).await?;
    let seconds: f64 = info
        .lines()
        .filter(|l| l.starts_with("used_cpu_sys:") || l.starts_with("used_cpu_user:"))
        .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
        .sum();
    Ok(Duration::from_secs_f64(seconds))
}

/// This process's CPU time so far, summed over its threads (Linux; `None` elsewhere).
fn client_cpu_so_far() -> Option<Duration> {
    let mut nanos = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        nanos += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(Duration::from_nanos(nanos))
}

async fn commands_so_far(redis: &mut redis::aio::MultiplexedConnection) -> Result<u64, Error> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(redis)
        .await?;
    Ok(sum_commands(&info))
}

#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Floor,
    Api,
    Attribute,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Self::Floor => "floor (raw SET NX PX + EVALSHA)",
            Self::Api => "dlock API",
            Self::Attribute => "dlock attribute",
        }
    }
}

/// A client on the engine whose keys all start with `prefix`.
fn locker(target: &Target, prefix: &str, notify: bool) -> Result<Locker, LockError> {
    Locker::builder()
        .url(target.url.as_str())
        .key_prefix(prefix)
        .timeout(Duration::from_secs(30))
        .notify(notify)
        .build()
}

/// W1: one client, fresh key per cycle. The three variants take turns cycle by cycle (in a
/// rotating order) on one task, so that a change in how the machine schedules the client, the
/// connection tasks and the server, which moves a cycle's latency by up to 2× between runs on
/// a 2-core VM, hits them alike. Each variant's rate is its cycles over the time spent in them.
async fn w1(target: &Target, sizes: Sizes, run: usize) -> Result<Vec<Row>, Error> {
    let variants = [Variant::Floor, Variant::Api, Variant::Attribute];
    let prefix = Prefix::one_server(target);
    let mut redis = connection(target).await?;
    let mut stats = Stats::open(target).await?;
    let release = redis::Script::new(RELEASE);
    let locker = locker(target, prefix.0, true)?;
    // Warm up: connections made, scripts loaded.
    for i in 0..20 {
        for variant in variants {
            let key = format!("w1warm:{run}:{}:{i}", variant as usize);
            one_w1(&mut redis, &release, &locker, prefix, variant, &key, i).await?;
        }
    }
    let mut latencies: Vec<Vec<Duration>> = (0..variants.len())
        .map(|_| Vec::with_capacity(sizes.w1_cycles))
        .collect();
    let started = Instant::now();
    for i in 0..sizes.w1_cycles {
        if started.elapsed() > sizes.time_cap {
            break;
        }
        for turn in 0..variants.len() {
            let v = (i + turn) % variants.len();
            let key = format!("w1:{run}:{v}:{i}");
            let t = Instant::now();
            one_w1(
                &mut redis,
                &release,
                &locker,
                prefix,
                variants[v],
                &key,
                i + run * 1_000_000,
            )
            .await?;
            latencies[v].push(t.elapsed());
        }
    }
    let mut rows = Vec::new();
    for (v, mut latencies) in latencies.into_iter().enumerate() {
        // Commands per acquisition, counted on a short run of this variant alone.
        let before = stats.commands().await?;
        let counted = 50;
        let allocations = Region::new(ALLOCATOR);
        for i in 0..counted {
            let key = format!("w1count:{run}:{v}:{i}");
            one_w1(
                &mut redis,
                &release,
                &locker,
                prefix,
                variants[v],
                &key,
                usize::MAX / 2 - i,
            )
            .await?;
        }
        let allocated = allocations.change();
        let after = stats.commands().await?;
        let spent: Duration = latencies.iter().sum();
        latencies.sort();
        #[allow(clippy::cast_precision_loss)]
        let n = latencies.len() as f64;
        rows.push(Row {
            workload: "W1 1 client, fresh keys",
            variant: variants[v].name(),
            ops: latencies.len(),
            per_sec: n / spent.as_secs_f64(),
            p50: Some(percentile(&latencies, 0.5)),
            p99: Some(percentile(&latencies, 0.99)),
            #[allow(clippy::cast_precision_loss)]
            commands_per_acquire: Some((after - before).saturating_sub(1) as f64 / counted as f64),
            #[allow(clippy::cast_precision_loss)]
            allocations: Some(
                (allocated.allocations + allocated.reallocations) as f64 / counted as f64,
            ),
            ..Row::default()
        });
    }
    Ok(rows)
}

async fn one_w1(
    redis: &mut Connection,
    release: &redis::Script,
    locker: &Locker,
    prefix: Prefix,
    variant: Variant,
    key: &str,
    n: usize,
) -> Result<(), Error> {
    match variant {
        Variant::Floor => {
            let key = format!("{}{key}", prefix.0);
            raw_cycle(redis, release, &key, None, async |_| Ok(())).await
        }
        Variant::Api => Ok(locker
            .acquire(key, LockOptions::new())
            .await?
            .release()
            .await?),
        Variant::Attribute => Ok(locked_noop(locker, n).await?),
    }
}

/// W2: many clients, each its own connection, distinct keys starting with `prefix`.
async fn w2(
    target: &Target,
    workload: &'static str,
    prefix: Prefix,
    variant: Variant,
    sizes: Sizes,
    run: usize,
) -> Result<Row, Error> {
    let mut clients = Vec::new();
    for c in 0..sizes.w2_clients {
        let (mut redis, locker) = (connection(target).await?, locker(target, prefix.0, true)?);
        let release = redis::Script::new(RELEASE);
        one_w2_warm(&mut redis, &release, &locker, prefix, variant, run, c).await?;
        clients.push((redis, locker, release));
    }
    let mut stats = Stats::open(target).await?;
    let server_before = stats.cpu().await?;
    let client_before = client_cpu_so_far();
    let started = Instant::now();
    let cap = sizes.time_cap;
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(c, (mut redis, locker, release))| {
            tokio::spawn(async move {
                let mut done = 0usize;
                for i in 0..sizes.w2_cycles {
                    if started.elapsed() > cap {
                        break;
                    }
                    let key = format!("w2:{run}:{c}:{i}");
                    one_w1(
                        &mut redis,
                        &release,
                        &locker,
                        prefix,
                        variant,
                        &key,
                        (run * 1000 + c) * 100_000 + i,
                    )
                    .await?;
                    done += 1;
                }
                Ok::<usize, Error>(done)
            })
        })
        .collect();
    let mut ops = 0;
    for t in tasks {
        ops += t.await??;
    }
    let elapsed = started.elapsed();
    let client = client_cpu_so_far().zip(client_before).map(|(a, b)| a - b);
    let per_op = |d: Duration| d / u32::try_from(ops.max(1)).unwrap_or(u32::MAX);
    let per_master: Vec<Duration> = stats
        .cpu()
        .await?
        .into_iter()
        .zip(server_before)
        .map(|(after, before)| per_op(after.saturating_sub(before)))
        .collect();
    #[allow(clippy::cast_precision_loss)]
    Ok(Row {
        workload,
        variant: variant.name(),
        ops,
        per_sec: ops as f64 / elapsed.as_secs_f64(),
        server_cpu: Some(per_master.iter().sum()),
        client_cpu: client.map(per_op),
        server_cpu_per_master: if per_master.len() > 1 {
            per_master
        } else {
            Vec::new()
        },
        ..Row::default()
    })
}

async fn one_w2_warm(
    redis: &mut Connection,
    release: &redis::Script,
    locker: &Locker,
    prefix: Prefix,
    variant: Variant,
    run: usize,
    c: usize,
) -> Result<(), Error> {
    for i in 0..5 {
        one_w1(
            redis,
            release,
            locker,
            prefix,
            variant,
            &format!("w2warm:{run}:{c}:{i}"),
            usize::MAX - i,
        )
        .await?;
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Floor,
    Default,
    Fair,
    NoNotify,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Self::Floor => "floor (SET NX retry 1ms)",
            Self::Default => "dlock default",
            Self::Fair => "dlock fair",
            Self::NoNotify => "dlock DLOCK_NOTIFY=off",
        }
    }
}

struct Section {
    client: usize,
    asked: Instant,
    acquired: Instant,
    released: Instant,
}

/// The row of a contended workload (W3, W4) from its critical sections: their rate over
/// `elapsed`, the waits, and the hand-offs from one client (or process) to another. Returns the
/// row and the sorted waits.
#[allow(clippy::cast_precision_loss)]
fn contended_row(
    workload: &'static str,
    variant: &'static str,
    mut sections: Vec<Section>,
    elapsed: Duration,
    exact: bool,
    commands_per_acquire: f64,
) -> (Row, Vec<Duration>) {
    sections.sort_by_key(|s| s.acquired);
    let mut waits: Vec<Duration> = sections.iter().map(|s| s.acquired - s.asked).collect();
    waits.sort();
    let mut handoffs = Vec::new();
    for pair in sections.windows(2) {
        if pair[1].client != pair[0].client {
            handoffs.push(pair[1].acquired.saturating_duration_since(pair[0].released));
        }
    }
    let to_other = handoffs.len();
    handoffs.sort();
    let n = sections.len();
    let row = Row {
        workload,
        variant,
        ops: n,
        per_sec: n as f64 / elapsed.as_secs_f64().max(1e-9),
        p50: Some(percentile(&waits, 0.5)),
        p99: Some(percentile(&waits, 0.99)),
        wait_max: waits.last().copied(),
        handoff_p50: (!handoffs.is_empty()).then(|| percentile(&handoffs, 0.5)),
        handoff_p99: (!handoffs.is_empty()).then(|| percentile(&handoffs, 0.99)),
        other_share: Some(to_other as f64 / (n.max(2) - 1) as f64),
        exact: Some(exact),
        commands_per_acquire: Some(commands_per_acquire),
        ..Row::default()
    };
    (row, waits)
}

/// W3: clients contend for one key; the body is a non-atomic increment.
async fn w3(
    target: &Target,
    mode: Mode,
    sizes: Sizes,
    run: usize,
) -> Result<(Row, Vec<Duration>), Error> {
    let prefix = Prefix::one_server(target);
    let key = format!("w3:{run}");
    let counter = format!("{}w3:{run}:counter", prefix.0);
    let log: Arc<Mutex<Vec<Section>>> = Arc::default();
    let per_client = sizes.w3_sections / sizes.w3_clients;
    let mut clients = Vec::new();
    for _ in 0..sizes.w3_clients {
        let redis = connection(target).await?;
        let locker = locker(target, prefix.0, mode != Mode::NoNotify)?;
        // Warm: connection made, scripts loaded.
        locker
            .acquire(&format!("{key}:warm"), LockOptions::new())
            .await?
            .release()
            .await?;
        clients.push((redis, locker));
    }
    let mut stats = Stats::open(target).await?;
    let commands_before = stats.commands().await?;
    let started = Instant::now();
    let cap = sizes.time_cap;
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(c, (mut redis, locker))| {
            let (key, counter, log) = (key.clone(), counter.clone(), log.clone());
            tokio::spawn(async move {
                let release = redis::Script::new(RELEASE);
                for _ in 0..per_client {
                    if started.elapsed() > cap {
                        break;
                    }
                    let asked = Instant::now();
                    let times;
                    let body = async |redis: &mut Connection| -> Result<Instant, Error> {
                        let acquired = Instant::now();
                        let n: Option<u64> = redis.get(&counter).await?;
                        let () = redis.set(&counter, n.unwrap_or(0) + 1).await?;
                        Ok(acquired)
                    };
                    match mode {
                        Mode::Floor => {
                            let raw_key = format!("{}{key}", prefix.0);
                            let token = token();
                            loop {
                                let set: Option<String> = redis::cmd("SET")
                                    .arg(&raw_key)
                                    .arg(&token)
                                    .arg("NX")
                                    .arg("PX")
                                    .arg(30_000)
                                    .query_async(&mut redis)
                                    .await?;
                                if set.is_some() {
                                    break;
                                }
                                tokio::time::sleep(Duration::from_millis(1)).await;
                            }
                            let acquired = body(&mut redis).await?;
                            times = (acquired, Instant::now());
                            let _: i64 = release
                                .key(&raw_key)
                                .arg(&token)
                                .invoke_async(&mut redis)
                                .await?;
                        }
                        Mode::Default | Mode::NoNotify | Mode::Fair => {
                            let options = if mode == Mode::Fair {
                                LockOptions::new().fair()
                            } else {
                                LockOptions::new()
                            };
                            let guard = locker.acquire(&key, options).await?;
                            let acquired = body(&mut redis).await?;
                            times = (acquired, Instant::now());
                            guard.release().await?;
                        }
                    }
                    log.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(Section {
                            client: c,
                            asked,
                            acquired: times.0,
                            released: times.1,
                        });
                }
                Ok::<(), Error>(())
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    let elapsed = started.elapsed();
    let commands = stats.commands().await? - commands_before;
    let sections = std::mem::take(
        &mut *log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    let mut redis = connection(target).await?;
    let counted: u64 = redis.get(&counter).await?;
    let exact = counted == sections.len() as u64;
    // The body's GET and SET are not the lock's: 2 per section.
    #[allow(clippy::cast_precision_loss)]
    let commands_per_acquire =
        (commands.saturating_sub(1) as f64 / sections.len().max(1) as f64 - 2.0).max(0.0);
    let (row, waits) = contended_row(
        "W3 8 clients, one key",
        mode.name(),
        sections,
        elapsed,
        exact,
        commands_per_acquire,
    );
    Ok((row, waits))
}

/// W4 "hot key": `W4_PROCESSES` OS processes (this program, re-run as `--w4-child`), each with
/// one `Locker` and `waiters` tasks, all on ONE key; the body is W3's non-atomic increment. The
/// row with 1 waiter per process is the baseline of a hand-off between processes: W3's clients
/// share one process, so its hand-offs never cross one.
const W4_PROCESSES: usize = 4;

/// How a W4 child is told what to do, on its command line.
struct W4Child {
    url: String,
    prefix: String,
    key: String,
    counter: String,
    waiters: usize,
    sections: usize,
    fair: bool,
}

impl W4Child {
    fn args(&self) -> Vec<String> {
        vec![
            "--w4-child".to_owned(),
            self.url.clone(),
            self.prefix.clone(),
            self.key.clone(),
            self.counter.clone(),
            self.waiters.to_string(),
            self.sections.to_string(),
            u8::from(self.fair).to_string(),
        ]
    }

    fn parse(mut it: impl Iterator<Item = String>) -> Option<Self> {
        Some(Self {
            url: it.next()?,
            prefix: it.next()?,
            key: it.next()?,
            counter: it.next()?,
            waiters: it.next()?.parse().ok()?,
            sections: it.next()?.parse().ok()?,
            fair: it.next()? == "1",
        })
    }
}

/// Microseconds on the system clock, which all processes of one machine share.
fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// One W4 process: warms up, says `ready`, waits for `go` on stdin, runs its waiters (each
/// `sections` critical sections), and prints one `asked acquired released` line (µs) per section.
async fn w4_child(child: W4Child) -> Result<(), Error> {
    use std::io::{BufRead as _, Write as _};
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let locker = Locker::builder()
        .url(child.url.as_str())
        .key_prefix(child.prefix.as_str())
        .timeout(Duration::from_secs(60))
        .build()?;
    let mut redis = Connection::open(&child.url).await?;
    locker
        .acquire(
            &format!("{}:warm:{}", child.key, std::process::id()),
            LockOptions::new(),
        )
        .await?
        .release()
        .await?;
    let _: Option<u64> = redis.get(&child.counter).await?;
    println!("ready");
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    let options = if child.fair {
        LockOptions::new().fair()
    } else {
        LockOptions::new()
    };
    let tasks: Vec<_> = (0..child.waiters)
        .map(|_| {
            let (locker, mut redis, options) = (locker.clone(), redis.clone(), options.clone());
            let (key, counter, sections) =
                (child.key.clone(), child.counter.clone(), child.sections);
            tokio::spawn(async move {
                let mut log = Vec::with_capacity(sections);
                for _ in 0..sections {
                    let asked = wall_us();
                    let guard = locker.acquire(&key, options.clone()).await?;
                    let acquired = wall_us();
                    let n: Option<u64> = redis.get(&counter).await?;
                    let () = redis.set(&counter, n.unwrap_or(0) + 1).await?;
                    let released = wall_us();
                    guard.release().await?;
                    log.push([asked, acquired, released]);
                }
                Ok::<_, Error>(log)
            })
        })
        .collect();
    let mut out = String::new();
    for task in tasks {
        for [asked, acquired, released] in task.await?? {
            let _ = writeln!(out, "{asked} {acquired} {released}");
        }
    }
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(out.as_bytes())?;
    stdout.flush()?;
    Ok(())
}

/// Commands the masters ran that a lock client sends itself (scripts, subscriptions), rather
/// than those scripts run inside.
async fn requests_so_far(stats: &mut Stats) -> Result<u64, Error> {
    const REQUESTS: &[&str] = &[
        "evalsha",
        "evalsha_ro",
        "eval",
        "eval_ro",
        "script",
        "subscribe",
        "unsubscribe",
        "ssubscribe",
        "sunsubscribe",
        "psubscribe",
        "punsubscribe",
    ];
    let mut sum = 0;
    for redis in &mut stats.0 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(redis)
            .await?;
        sum += info
            .lines()
            .filter_map(|l| {
                let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
                if !REQUESTS.contains(&name) {
                    return None;
                }
                rest.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum::<u64>();
    }
    Ok(sum)
}

/// W4: `W4_PROCESSES` processes × `waiters` tasks on one key, in default or fair mode.
async fn w4(
    target: &Target,
    waiters: usize,
    fair: bool,
    sizes: Sizes,
    run: usize,
) -> Result<Row, Error> {
    use std::io::BufRead as _;
    let prefix = Prefix::one_server(target);
    let key = format!("w4:{run}");
    let counter = format!("{}w4:{run}:counter", prefix.0);
    let sections = (sizes.w4_sections / (W4_PROCESSES * waiters)).max(1);
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for _ in 0..W4_PROCESSES {
        let args = W4Child {
            url: target.url.clone(),
            prefix: prefix.0.to_owned(),
            key: key.clone(),
            counter: counter.clone(),
            waiters,
            sections,
            fair,
        }
        .args();
        let mut child = std::process::Command::new(&exe)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let mut stdout = std::io::BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut ready = String::new();
        stdout.read_line(&mut ready)?;
        children.push((child, Some(ready.trim_end().to_owned()), stdout));
    }
    // Every process is connected and warm before any starts.
    let mut stats = Stats::open(target).await?;
    let (commands_before, requests_before) =
        (stats.commands().await?, requests_so_far(&mut stats).await?);
    for (child, ready, _) in &mut children {
        if ready.as_deref() != Some("ready") {
            let _ = child.kill();
            return Err("a W4 process did not start".into());
        }
    }
    for (child, _, _) in &mut children {
        stdin_go(child.stdin.as_mut().ok_or("no stdin")?)?;
    }
    let mut sections_log: Vec<(usize, [u64; 3])> = Vec::new();
    let readers: Vec<_> = children
        .into_iter()
        .map(|(mut child, _, stdout)| {
            tokio::task::spawn_blocking(move || {
                let lines: Vec<String> = stdout.lines().collect::<Result<_, _>>()?;
                let status = child.wait()?;
                Ok::<_, std::io::Error>((lines, status))
            })
        })
        .collect();
    for (p, reader) in readers.into_iter().enumerate() {
        let (lines, status) = reader.await??;
        if !status.success() {
            return Err(format!("a W4 process failed: {status}").into());
        }
        for line in lines {
            let v: Vec<u64> = line.split(' ').filter_map(|x| x.parse().ok()).collect();
            if let [a, b, c] = v[..] {
                sections_log.push((p, [a, b, c]));
            }
        }
    }
    let commands = stats.commands().await? - commands_before;
    let requests = requests_so_far(&mut stats).await? - requests_before;
    let mut redis = connection(target).await?;
    let counted: u64 = redis.get(&counter).await?;
    // The processes share the system clock: their µs become instants after one base.
    let first = sections_log.iter().map(|(_, s)| s[0]).min().unwrap_or(0);
    let last = sections_log
        .iter()
        .map(|(_, s)| s[2])
        .max()
        .unwrap_or(first);
    let base = Instant::now();
    let at = |us: u64| base + Duration::from_micros(us.saturating_sub(first));
    let sections: Vec<Section> = sections_log
        .iter()
        .map(|&(client, [asked, acquired, released])| Section {
            client,
            asked: at(asked),
            acquired: at(acquired),
            released: at(released),
        })
        .collect();
    let n = sections.len();
    let workload = match waiters {
        1 => "W4 4 processes × 1 waiter, one key",
        8 => "W4 4 processes × 8 waiters, one key",
        16 => "W4 4 processes × 16 waiters, one key",
        64 => "W4 4 processes × 64 waiters, one key",
        256 => "W4 4 processes × 256 waiters, one key",
        _ => "W4 4 processes, one key",
    };
    let variant = if fair {
        Mode::Fair.name()
    } else {
        Mode::Default.name()
    };
    // Stats' INFO calls are not the lock's, nor the body's GET and SET (2 per section).
    #[allow(clippy::cast_precision_loss)]
    let commands_per_acquire =
        (commands.saturating_sub(2 * stats.0.len() as u64) as f64 / n.max(1) as f64 - 2.0).max(0.0);
    let (mut row, _) = contended_row(
        workload,
        variant,
        sections,
        Duration::from_micros(last - first),
        counted == n as u64,
        commands_per_acquire,
    );
    #[allow(clippy::cast_precision_loss)]
    {
        row.requests_per_acquire = Some(requests as f64 / n.max(1) as f64);
    }
    Ok(row)
}

/// Tells a W4 process to start.
fn stdin_go(stdin: &mut std::process::ChildStdin) -> std::io::Result<()> {
    use std::io::Write as _;
    stdin.write_all(b"go\n")?;
    stdin.flush()
}

fn table(rows: &[Row], floors: &[(&'static str, f64)]) -> String {
    let mut out = String::from(
        "| workload | variant | ops | per s | × floor | p50 ms | p99 ms | wait max ms | hand-off p50 ms | hand-off p99 ms | to another client | exact | cmds/acq | requests/acq | server CPU µs/op | client CPU µs/op | client allocs/op |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|\n",
    );
    let cell = |d: Option<Duration>| d.map_or("–".to_owned(), |d| format!("{:.2}", ms(d)));
    let us = |d: Option<Duration>| {
        d.map_or("–".to_owned(), |d| {
            format!("{:.1}", d.as_secs_f64() * 1e6)
        })
    };
    // On a Cluster: the masters' sum, then each master's share.
    let server_cpu = |r: &Row| {
        let mut cell = us(r.server_cpu);
        if !r.server_cpu_per_master.is_empty() {
            let shares: Vec<String> = r
                .server_cpu_per_master
                .iter()
                .map(|d| us(Some(*d)))
                .collect();
            let _ = write!(cell, " ({})", shares.join(" + "));
        }
        cell
    };
    for r in rows {
        let floor = floors
            .iter()
            .find(|(w, _)| *w == r.workload)
            .map_or(1.0, |(_, f)| *f);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.0} | {:.2} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.workload,
            r.variant,
            r.ops,
            r.per_sec,
            r.per_sec / floor,
            cell(r.p50),
            cell(r.p99),
            cell(r.wait_max),
            cell(r.handoff_p50),
            cell(r.handoff_p99),
            r.other_share
                .map_or("–".to_owned(), |s| format!("{:.0}%", s * 100.0)),
            r.exact.map_or("–".to_owned(), |e| if e {
                "yes".to_owned()
            } else {
                "**NO**".to_owned()
            }),
            r.commands_per_acquire
                .map_or("–".to_owned(), |c| format!("{c:.1}")),
            r.requests_per_acquire
                .map_or("–".to_owned(), |c| format!("{c:.2}")),
            server_cpu(r),
            us(r.client_cpu),
            r.allocations.map_or("–".to_owned(), |a| format!("{a:.1}")),
        );
    }
    out
}

/// A small SVG: the distribution (CDF) of W3 wait times per mode, log-scaled time axis.
fn plot(series: &[(&'static str, Vec<Duration>)]) -> String {
    let (w, h, left, bottom) = (760.0_f64, 420.0_f64, 60.0_f64, 40.0_f64);
    let max_ms = series
        .iter()
        .filter_map(|(_, v)| v.last())
        .map(|d| ms(*d))
        .fold(1.0_f64, f64::max);
    let x = |v: f64| {
        left + (w - left - 20.0) * ((v.max(0.01) / 0.01).log10() / (max_ms / 0.01).log10())
    };
    let y = |q: f64| (h - bottom) - (h - bottom - 20.0) * q;
    let colors = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd"];
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{left}\" y=\"14\">W3: share of acquisitions that waited at most t (log t)</text>\n"
    );
    let _ = writeln!(
        svg,
        "<line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>",
        y(0.0),
        w - 20.0,
        y(0.0)
    );
    let _ = writeln!(
        svg,
        "<line x1=\"{left}\" y1=\"{}\" x2=\"{left}\" y2=\"{}\" stroke=\"black\"/>",
        y(0.0),
        y(1.0)
    );
    for q in [0.0, 0.5, 1.0] {
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{:.0}%</text>",
            left - 6.0,
            y(q) + 4.0,
            q * 100.0
        );
    }
    let mut tick = 0.01;
    while tick <= max_ms * 1.001 {
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{tick}ms</text>",
            x(tick),
            y(0.0) + 16.0
        );
        tick *= 10.0;
    }
    for (i, (name, waits)) in series.iter().enumerate() {
        if waits.is_empty() {
            continue;
        }
        let color = colors[i % colors.len()];
        #[allow(clippy::cast_precision_loss)]
        let points: String = waits
            .iter()
            .enumerate()
            .map(|(k, d)| {
                format!(
                    "{:.1},{:.1} ",
                    x(ms(*d)),
                    y((k + 1) as f64 / waits.len() as f64)
                )
            })
            .collect();
        let _ = writeln!(
            svg,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{points}\"/>"
        );
        #[allow(clippy::cast_precision_loss)]
        let ly = 40.0 + 16.0 * i as f64;
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{ly}\" fill=\"{color}\">{name}</text>",
            left + 20.0
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// The rounds of one variant: each round's row, and its W3 wait times.
type Rounds = Vec<(Row, Vec<Duration>)>;

/// The row with the median rate among the rounds of one variant; "exact" only if every round was.
fn median(mut rounds: Rounds) -> (Row, Vec<Duration>) {
    let exact = rounds.iter().all(|(r, _)| r.exact != Some(false));
    rounds.sort_by(|a, b| a.0.per_sec.total_cmp(&b.0.per_sec));
    let (mut row, waits) = rounds.swap_remove(rounds.len() / 2);
    if row.exact.is_some() {
        row.exact = Some(exact);
    }
    (row, waits)
}

async fn bench(target: &Target, args: &Args) -> Result<bool, Error> {
    let sizes = args.sizes;
    let variants = [Variant::Floor, Variant::Api, Variant::Attribute];
    // RedLock has no fair mode (a `Config` error): its W3 runs without it.
    let modes: Vec<Mode> = [Mode::Floor, Mode::Default, Mode::Fair, Mode::NoNotify]
        .into_iter()
        .filter(|&m| !(m == Mode::Fair && target.engine == Engine::RedLock))
        .collect();
    // W2 on one server (on a Cluster: one master), and on a Cluster once more over its masters.
    let mut w2_sets = vec![("W2 16 clients, distinct keys", Prefix::one_server(target))];
    if target.engine == Engine::RedisCluster {
        w2_sets = vec![
            (
                "W2 16 clients, distinct keys, one master",
                Prefix::one_server(target),
            ),
            (
                "W2 16 clients, distinct keys over 3 masters",
                Prefix::SPREAD,
            ),
        ];
    }
    // Variants take turns, round after round, so a drift of the machine hits them alike; each
    // figure is the median round.
    let mut w1s: Vec<Rounds> = vec![Vec::new(); variants.len()];
    let mut w2s: Vec<Vec<Rounds>> = vec![vec![Vec::new(); variants.len()]; w2_sets.len()];
    let mut w3s: Vec<Rounds> = vec![Vec::new(); modes.len()];
    let w4_runs: Vec<(usize, bool)> = sizes
        .w4_waiters
        .iter()
        .flat_map(|&w| [(w, false), (w, true)])
        .filter(|&(_, fair)| !fair || modes.contains(&Mode::Fair))
        .collect();
    let mut w4s: Vec<Rounds> = vec![Vec::new(); w4_runs.len()];
    for round in 0..args.rounds {
        eprint!(".");
        if args.runs("w1") {
            for (i, row) in w1(target, sizes, round).await?.into_iter().enumerate() {
                w1s[i].push((row, Vec::new()));
            }
        }
        for (set, &(workload, prefix)) in w2_sets.iter().enumerate().filter(|_| args.runs("w2")) {
            for (i, variant) in variants.into_iter().enumerate() {
                eprint!(".");
                let run = round * 10 + set * variants.len() + i;
                let row = w2(target, workload, prefix, variant, sizes, run).await?;
                w2s[set][i].push((row, Vec::new()));
            }
        }
        for (i, &mode) in modes.iter().enumerate().filter(|_| args.runs("w3")) {
            eprint!(".");
            w3s[i].push(w3(target, mode, sizes, round * 10 + i).await?);
        }
        for (i, &(waiters, fair)) in w4_runs.iter().enumerate().filter(|_| args.runs("w4")) {
            eprint!(".");
            let row = w4(target, waiters, fair, sizes, round * 10 + i).await?;
            w4s[i].push((row, Vec::new()));
        }
    }
    let (mut rows, mut floors, series) = medians(std::iter::once(w1s).chain(w2s).chain([w3s]));
    // W4 has no floor of its own: its × column is against W3's floor (one process per client,
    // retrying SET NX every 1ms), to compare the hot key with W3's contention.
    let w3_floor = floors
        .iter()
        .find(|(w, _)| w.starts_with("W3"))
        .map(|(_, f)| *f);
    for rounds in w4s {
        if rounds.is_empty() {
            continue;
        }
        let (row, _) = median(rounds);
        if let Some(floor) = w3_floor
            && !floors.iter().any(|(w, _)| *w == row.workload)
        {
            floors.push((row.workload, floor));
        }
        rows.push(row);
    }
    eprintln!();
    report(args, target.engine, &rows, &floors, &series, None)
}

/// What a group's rounds came to: each variant's median round, the first variant of every group
/// being its floor (`(workload, per second)`), and the wait times of the variants that have them
/// (W3, for the plot). Variants that did not run (`--only`) are left out.
#[allow(clippy::type_complexity)]
fn medians(
    groups: impl IntoIterator<Item = Vec<Rounds>>,
) -> (
    Vec<Row>,
    Vec<(&'static str, f64)>,
    Vec<(&'static str, Vec<Duration>)>,
) {
    let (mut rows, mut floors, mut series) = (Vec::new(), Vec::new(), Vec::new());
    for group in groups {
        for (i, rounds) in group.into_iter().enumerate() {
            if rounds.is_empty() {
                continue;
            }
            let (row, waits) = median(rounds);
            if i == 0 {
                floors.push((row.workload, row.per_sec));
            }
            if !waits.is_empty() {
                series.push((row.variant, waits));
            }
            rows.push(row);
        }
    }
    (rows, floors, series)
}

/// Prints the table (and `note` under it), writes `--json` and `--plot`; `true` when every
/// counter was exact.
fn report(
    args: &Args,
    engine: Engine,
    rows: &[Row],
    floors: &[(&'static str, f64)],
    series: &[(&'static str, Vec<Duration>)],
    note: Option<&str>,
) -> Result<bool, Error> {
    println!("{}", table(rows, floors));
    if let Some(note) = note {
        println!("{note}");
    }
    if let Some(path) = &args.json {
        let lines: String = rows
            .iter()
            .map(|r| {
                let floor = floors
                    .iter()
                    .find(|(w, _)| *w == r.workload)
                    .map_or(1.0, |(_, f)| *f);
                r.json(engine, floor) + "\n"
            })
            .collect();
        std::fs::write(path, lines)?;
        println!("JSON lines written to {path}");
    }
    if let Some(path) = &args.plot
        && !series.is_empty()
    {
        std::fs::write(path, plot(series))?;
        println!("W3 wait-time plot written to {path}");
    }
    Ok(rows.iter().all(|r| r.exact != Some(false)))
}

/// The Redis `engine` to measure, said on stdout, and the throwaway deployment to stop at the
/// end (none for a deployment named by `DLOCK_URL`, or the older `DLOCK_REDIS_URL` or
/// `REDIS_URL`, when no `--engine` was given).
async fn target(engine: Engine, from_env: bool) -> Result<(Target, Option<Deployment>), String> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let from_env = from_env
        .then(|| {
            var("DLOCK_URL")
                .map(|url| ("DLOCK_URL", url))
                .or_else(|| var("DLOCK_REDIS_URL").map(|url| ("DLOCK_REDIS_URL", url)))
                .or_else(|| var("REDIS_URL").map(|url| ("REDIS_URL", url)))
        })
        .flatten();
    if let Some((name, url)) = from_env {
        let parsed: dlock_runtime::EngineUrl = url.parse().map_err(|e| format!("{e}"))?;
        let engine = Engine::of_url_engine(parsed.engine())
            .filter(|e| {
                matches!(
                    e,
                    Engine::Redis | Engine::RedisCluster | Engine::RedisSentinel | Engine::RedLock
                )
            })
            .ok_or_else(|| {
                format!(
                    "{name} names a `{}` engine: measure it on a throwaway deployment \
                     (`--engine {}`), which the benchmark can read server figures from",
                    parsed.engine(),
                    parsed.engine()
                )
            })?;
        println!("{engine}: {parsed} (from {name})");
        let target = Target {
            engine,
            masters: vec![url.clone()],
            url,
        };
        return Ok((target, None));
    }
    let deployment = Deployment::start(engine).await.map_err(|e| match engine {
        Engine::Redis => format!("needs Redis: set DLOCK_URL, or install redis-server: {e}"),
        _ => format!("starting a throwaway {engine}: {e}"),
    })?;
    let target = Target {
        engine,
        url: deployment.url(),
        masters: deployment
            .masters()
            .into_iter()
            .map(|port| format!("redis://127.0.0.1:{port}"))
            .collect(),
    };
    match engine {
        Engine::Redis => println!("Redis: a {}", deployment.describe()),
        _ => println!(
            "Redis: a {}\nengine {engine}: {}",
            deployment.describe(),
            target.url
        ),
    }
    Ok((target, Some(deployment)))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let mut argv = std::env::args().skip(1);
    if argv.next().as_deref() == Some("--w4-child") {
        let Some(child) = W4Child::parse(argv) else {
            eprintln!("bench: --w4-child: bad arguments");
            return std::process::ExitCode::from(2);
        };
        return match w4_child(child).await {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("bench: W4 process: {e}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("bench: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let own_floor = match args.engine {
        Engine::Postgres => Some(postgres::bench(&args).await),
        #[cfg(feature = "etcd")]
        Engine::Etcd => Some(etcd::bench(&args).await),
        #[cfg(not(feature = "etcd"))]
        Engine::Etcd => Some(Err(dlock_testkit::deployment::ETCD_FEATURE.into())),
        Engine::ZooKeeper => Some(zookeeper::bench(&args).await),
        _ => None,
    };
    if let Some(outcome) = own_floor {
        return match outcome {
            Ok(true) => std::process::ExitCode::SUCCESS,
            Ok(false) => {
                eprintln!("bench: a W3 counter is wrong: the lock let two clients overlap");
                std::process::ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("bench: {e}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    let (target, _deployment) = match target(args.engine, args.from_env).await {
        Ok(target) => target,
        Err(e) => {
            eprintln!("bench: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match bench(&target, &args).await {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("bench: a W3 counter is wrong: the lock let two clients overlap");
            std::process::ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
