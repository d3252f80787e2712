//! `bench --engine postgres`: the same workloads on a throwaway PostgreSQL cluster, against the
//! floor of PostgreSQL's own session locks: `pg_try_advisory_lock` then `pg_advisory_unlock` on
//! one connection per client (two round trips, like dlock's acquire and release, but nothing
//! written and no lease: an advisory lock lives and dies with its session).
//!
//! Statements per acquisition come from `pg_stat_statements` (the server is started with it
//! preloaded); the server's CPU time is the sum over its processes (`/proc/<pid>/stat`).

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use dlock_runtime::{LockOptions, Locker};
use dlock_testkit::postgres::PostgresServer;
use tokio_postgres::{Client, NoTls, Statement};

use super::{
    Args, Error, Rounds, Row, Section, Sizes, client_cpu_so_far, contended_row, locked_noop,
    medians, percentile, report,
};

const ENGINE: dlock_testkit::deployment::Engine = dlock_testkit::deployment::Engine::Postgres;

struct Target {
    server: PostgresServer,
    url: String,
    /// Clock ticks per second of `/proc/<pid>/stat` times.
    ticks: u64,
}

impl Target {
    async fn client(&self) -> Result<Client, Error> {
        let (client, connection) = tokio_postgres::connect(&self.url, NoTls).await?;
        tokio::spawn(connection);
        Ok(client)
    }

    fn locker(&self, notify: bool) -> Result<Locker, Error> {
        Ok(Locker::builder()
            .url(self.url.as_str())
            .key_prefix("bench:")
            .timeout(Duration::from_secs(30))
            .notify(notify)
            .build()?)
    }

    /// Statements the server has executed so far (`pg_stat_statements`); the query that reads
    /// it counts once in the next reading.
    async fn statements(&self, db: &Client) -> Result<u64, Error> {
        let n: i64 = db
            .query_one(
                "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements",
                &[],
            )
            .await?
            .get(0);
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// CPU time of the server's live processes so far.
    fn cpu(&self) -> Duration {
        let ticks: u64 = self
            .server
            .pids()
            .iter()
            .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
            .filter_map(|stat| {
                let rest = stat.rsplit_once(')')?.1;
                let fields: Vec<&str> = rest.split_whitespace().collect();
                // After `)`: state is field 0, utime 11, stime 12.
                Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
            })
            .sum();
        Duration::from_secs_f64(ticks as f64 / self.ticks as f64)
    }
}

/// The floor's two statements, prepared on one connection.
struct Advisory {
    db: Client,
    lock: Statement,
    unlock: Statement,
}

impl Advisory {
    async fn new(target: &Target) -> Result<Self, Error> {
        let db = target.client().await?;
        let lock = db
            .prepare("SELECT pg_try_advisory_lock(hashtextextended($1, 0))")
            .await?;
        let unlock = db
            .prepare("SELECT pg_advisory_unlock(hashtextextended($1, 0))")
            .await?;
        Ok(Self { db, lock, unlock })
    }

    async fn try_lock(&self, key: &str) -> Result<bool, Error> {
        Ok(self.db.query_one(&self.lock, &[&key]).await?.get(0))
    }

    async fn unlock(&self, key: &str) -> Result<(), Error> {
        let released: bool = self.db.query_one(&self.unlock, &[&key]).await?.get(0);
        if released {
            Ok(())
        } else {
            Err("pg_advisory_unlock found no lock".into())
        }
    }
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
            Self::Floor => "floor (pg_try_advisory_lock + pg_advisory_unlock)",
            Self::Api => "dlock API",
            Self::Attribute => "dlock attribute",
        }
    }
}

async fn cycle(
    floor: &Advisory,
    locker: &Locker,
    variant: Variant,
    key: &str,
    n: usize,
) -> Result<(), Error> {
    match variant {
        Variant::Floor => {
            if !floor.try_lock(key).await? {
                return Err("floor W1/W2 keys are never contended".into());
            }
            floor.unlock(key).await
        }
        Variant::Api => Ok(locker
            .acquire(key, LockOptions::new())
            .await?
            .release()
            .await?),
        Variant::Attribute => Ok(locked_noop(locker, n).await?),
    }
}

const VARIANTS: [Variant; 3] = [Variant::Floor, Variant::Api, Variant::Attribute];

/// W1: one client, a fresh key per cycle, the variants taking turns cycle by cycle.
async fn w1(target: &Target, sizes: Sizes, run: usize) -> Result<Vec<Row>, Error> {
    let floor = Advisory::new(target).await?;
    let locker = target.locker(true)?;
    let stats = target.client().await?;
    for i in 0..20 {
        for (v, variant) in VARIANTS.into_iter().enumerate() {
            let key = format!("w1warm:{run}:{v}:{i}");
            cycle(&floor, &locker, variant, &key, usize::MAX - i).await?;
        }
    }
    let mut latencies: Vec<Vec<Duration>> = (0..VARIANTS.len())
        .map(|_| Vec::with_capacity(sizes.w1_cycles))
        .collect();
    let started = Instant::now();
    for i in 0..sizes.w1_cycles {
        if started.elapsed() > sizes.time_cap {
            break;
        }
        for turn in 0..VARIANTS.len() {
            let v = (i + turn) % VARIANTS.len();
            let key = format!("w1:{run}:{v}:{i}");
            let t = Instant::now();
            cycle(&floor, &locker, VARIANTS[v], &key, i + run * 1_000_000).await?;
            latencies[v].push(t.elapsed());
        }
    }
    let mut rows = Vec::new();
    for (v, mut latencies) in latencies.into_iter().enumerate() {
        // Statements per acquisition, counted on a short run of this variant alone.
        let before = target.statements(&stats).await?;
        let counted = 50;
        for i in 0..counted {
            let key = format!("w1count:{run}:{v}:{i}");
            cycle(&floor, &locker, VARIANTS[v], &key, usize::MAX / 2 - i).await?;
        }
        let after = target.statements(&stats).await?;
        let spent: Duration = latencies.iter().sum();
        latencies.sort();
        #[allow(clippy::cast_precision_loss)]
        rows.push(Row {
            workload: "W1 1 client, fresh keys",
            variant: VARIANTS[v].name(),
            ops: latencies.len(),
            per_sec: latencies.len() as f64 / spent.as_secs_f64(),
            p50: Some(percentile(&latencies, 0.5)),
            p99: Some(percentile(&latencies, 0.99)),
            commands_per_acquire: Some((after - before).saturating_sub(1) as f64 / counted as f64),
            ..Row::default()
        });
    }
    Ok(rows)
}

/// W2: many clients, each its own connections, distinct keys.
async fn w2(target: &Target, variant: Variant, sizes: Sizes, run: usize) -> Result<Row, Error> {
    let mut clients = Vec::new();
    for c in 0..sizes.w2_clients {
        let floor = Advisory::new(target).await?;
        let locker = target.locker(true)?;
        for i in 0..5 {
            let key = format!("w2warm:{run}:{c}:{i}");
            cycle(&floor, &locker, variant, &key, usize::MAX - i).await?;
        }
        clients.push((floor, locker));
    }
    let server_before = target.cpu();
    let client_before = client_cpu_so_far();
    let started = Instant::now();
    let cap = sizes.time_cap;
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(c, (floor, locker))| {
            tokio::spawn(async move {
                let mut done = 0usize;
                for i in 0..sizes.w2_cycles {
                    if started.elapsed() > cap {
                        break;
                    }
                    let key = format!("w2:{run}:{c}:{i}");
                    let n = (run * 1000 + c) * 100_000 + i;
                    cycle(&floor, &locker, variant, &key, n).await?;
                    done += 1;
                }
                Ok::<_, Error>((done, floor, locker))
            })
        })
        .collect();
    let mut ops = 0;
    // Kept until the CPU is read: a backend that exits takes its CPU time with it.
    let mut alive = Vec::new();
    for t in tasks {
        let (done, floor, locker) = t.await??;
        ops += done;
        alive.push((floor, locker));
    }
    let elapsed = started.elapsed();
    let server = target.cpu().saturating_sub(server_before);
    let client = client_cpu_so_far().zip(client_before).map(|(a, b)| a - b);
    drop(alive);
    let per_op = |d: Duration| d / u32::try_from(ops.max(1)).unwrap_or(u32::MAX);
    #[allow(clippy::cast_precision_loss)]
    Ok(Row {
        workload: "W2 16 clients, distinct keys",
        variant: variant.name(),
        ops,
        per_sec: ops as f64 / elapsed.as_secs_f64(),
        server_cpu: Some(per_op(server)),
        client_cpu: client.map(per_op),
        ..Row::default()
    })
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
            Self::Floor => "floor (pg_try_advisory_lock retry 1ms)",
            Self::Default => "dlock default",
            Self::Fair => "dlock fair",
            Self::NoNotify => "dlock DLOCK_NOTIFY=off",
        }
    }
}

/// W3: clients contend for one key; the body is a non-atomic increment of a row (`SELECT`, then
/// `UPDATE` with the value read plus one).
async fn w3(
    target: &Target,
    mode: Mode,
    sizes: Sizes,
    run: usize,
) -> Result<(Row, Vec<Duration>), Error> {
    let key = format!("w3:{run}:{}", mode as u8);
    let setup = target.client().await?;
    setup
        .execute(
            "INSERT INTO bench_counter (key, n) VALUES ($1, 0) ON CONFLICT (key) DO UPDATE SET n = 0",
            &[&key],
        )
        .await?;
    let log: Arc<Mutex<Vec<Section>>> = Arc::default();
    let per_client = sizes.w3_sections / sizes.w3_clients;
    let mut clients = Vec::new();
    for _ in 0..sizes.w3_clients {
        let floor = Advisory::new(target).await?;
        let read = floor
            .db
            .prepare("SELECT n FROM bench_counter WHERE key = $1")
            .await?;
        let write = floor
            .db
            .prepare("UPDATE bench_counter SET n = $2 WHERE key = $1")
            .await?;
        let locker = target.locker(mode != Mode::NoNotify)?;
        locker
            .acquire(&format!("{key}:warm"), LockOptions::new())
            .await?
            .release()
            .await?;
        clients.push((floor, read, write, locker));
    }
    let statements_before = target.statements(&setup).await?;
    let started = Instant::now();
    let cap = sizes.time_cap;
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(c, (floor, read, write, locker))| {
            let (key, log) = (key.clone(), log.clone());
            tokio::spawn(async move {
                let body = async || -> Result<Instant, Error> {
                    let acquired = Instant::now();
                    let n: i64 = floor.db.query_one(&read, &[&key]).await?.get(0);
                    floor.db.execute(&write, &[&key, &(n + 1)]).await?;
                    Ok(acquired)
                };
                for _ in 0..per_client {
                    if started.elapsed() > cap {
                        break;
                    }
                    let asked = Instant::now();
                    let acquired;
                    match mode {
                        Mode::Floor => {
                            while !floor.try_lock(&key).await? {
                                tokio::time::sleep(Duration::from_millis(1)).await;
                            }
                            acquired = body().await?;
                            floor.unlock(&key).await?;
                        }
                        Mode::Default | Mode::Fair | Mode::NoNotify => {
                            let options = if mode == Mode::Fair {
                                LockOptions::new().fair()
                            } else {
                                LockOptions::new()
                            };
                            let guard = locker.acquire(&key, options).await?;
                            acquired = body().await?;
                            guard.release().await?;
                        }
                    }
                    let released = Instant::now();
                    log.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(Section {
                            client: c,
                            asked,
                            acquired,
                            released,
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
    let statements = target.statements(&setup).await? - statements_before;
    let sections = std::mem::take(
        &mut *log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    let counted: i64 = setup
        .query_one("SELECT n FROM bench_counter WHERE key = $1", &[&key])
        .await?
        .get(0);
    let exact = i64::try_from(sections.len()).is_ok_and(|n| n == counted);
    // The body's SELECT and UPDATE are not the lock's: 2 per section.
    #[allow(clippy::cast_precision_loss)]
    let statements_per_acquire =
        (statements.saturating_sub(1) as f64 / sections.len().max(1) as f64 - 2.0).max(0.0);
    let (row, waits) = contended_row(
        "W3 8 clients, one key",
        mode.name(),
        sections,
        elapsed,
        exact,
        statements_per_acquire,
    );
    Ok((row, waits))
}

async fn start() -> Result<Target, Error> {
    let server = tokio::task::spawn_blocking(|| {
        PostgresServer::try_start_with(&[
            "shared_preload_libraries=pg_stat_statements",
            "pg_stat_statements.track=all",
        ])
    })
    .await??;
    let url = server.url();
    let ticks = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100);
    let target = Target { server, url, ticks };
    let db = target.client().await?;
    db.batch_execute(
        "CREATE EXTENSION IF NOT EXISTS pg_stat_statements;
         CREATE TABLE IF NOT EXISTS bench_counter (key text PRIMARY KEY, n bigint NOT NULL);",
    )
    .await?;
    Ok(target)
}

/// The whole benchmark on a throwaway PostgreSQL cluster; `Ok(false)` when a W3 counter is
/// wrong.
pub(super) async fn bench(args: &Args) -> Result<bool, Error> {
    let target = start()
        .await
        .map_err(|e| format!("starting a throwaway PostgreSQL: {e}"))?;
    let version = PostgresServer::version().map_or_else(String::new, |v| format!(" {v}"));
    println!(
        "PostgreSQL: a throwaway PostgreSQL{version} on 127.0.0.1:{} (fsync off, \
         pg_stat_statements)\nengine postgres: {}",
        target.server.port(),
        target.url
    );
    let sizes = args.sizes;
    let modes = [Mode::Floor, Mode::Default, Mode::Fair, Mode::NoNotify];
    let mut w1s: Vec<Rounds> = vec![Vec::new(); VARIANTS.len()];
    let mut w2s: Vec<Rounds> = vec![Vec::new(); VARIANTS.len()];
    let mut w3s: Vec<Rounds> = vec![Vec::new(); modes.len()];
    for round in 0..args.rounds {
        eprint!(".");
        for (i, row) in w1(&target, sizes, round).await?.into_iter().enumerate() {
            w1s[i].push((row, Vec::new()));
        }
        for (i, variant) in VARIANTS.into_iter().enumerate() {
            eprint!(".");
            w2s[i].push((
                w2(&target, variant, sizes, round * 10 + i).await?,
                Vec::new(),
            ));
        }
        for (i, mode) in modes.into_iter().enumerate() {
            eprint!(".");
            w3s[i].push(w3(&target, mode, sizes, round * 10 + i).await?);
        }
    }
    let (rows, floors, series) = medians([w1s, w2s, w3s]);
    eprintln!();
    report(
        args,
        ENGINE,
        &rows,
        &floors,
        &series,
        Some("cmds/acq: statements PostgreSQL executed per acquisition (pg_stat_statements)."),
    )
}
