//! `bench --engine zookeeper`: the same workloads on a throwaway standalone ZooKeeper server,
//! against the floor of `zookeeper-client`'s own lock recipe (`Client::lock` with
//! `LockPrefix::new_curator(dir, "lock-")`, the same Curator layout: create, list the line,
//! watch the predecessor; then delete the node). Every client has its own session.
//!
//! Requests per acquisition come from the server's `srvr` (`Received:`, pings included); the
//! server's CPU time from `/proc/<pid>/stat` of its JVM.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use dlock_runtime::{LockOptions, Locker};
use dlock_testkit::zookeeper::ZkEnsemble;
use zookeeper_client::{Acls, Client, CreateMode, LockPrefix};

use super::{
    Args, Error, Rounds, Row, Section, Sizes, client_cpu_so_far, contended_row, locked_noop,
    medians, percentile, report,
};

const ENGINE: dlock_testkit::deployment::Engine = dlock_testkit::deployment::Engine::ZooKeeper;

struct Target {
    server: ZkEnsemble,
    url: String,
    /// Clock ticks per second of `/proc/<pid>/stat` times.
    ticks: u64,
}

impl Target {
    async fn client(&self) -> Result<Client, Error> {
        Ok(Client::connect(&self.server.hosts()).await?)
    }

    fn locker(&self, notify: bool) -> Result<Locker, Error> {
        Ok(Locker::builder()
            .url(self.url.as_str())
            .key_prefix("bench:")
            .timeout(Duration::from_secs(30))
            .notify(notify)
            .build()?)
    }

    /// Requests the server has received so far; the reading itself is not one.
    fn requests(&self) -> Result<u64, Error> {
        Ok(self
            .server
            .received(0)
            .ok_or("the server did not answer `srvr`")?)
    }

    /// CPU time of the server's JVM so far.
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

/// The floor: `zookeeper-client`'s lock recipe, then a delete of its node.
async fn floor_lock(zk: &Client, key: &str) -> Result<(), Error> {
    let dir = format!("/bench-floor/{key}");
    let prefix = LockPrefix::new_curator(&dir, "lock-")?;
    let options = zookeeper_client::LockOptions::new(Acls::anyone_all())
        .with_ancestor_options(CreateMode::Container.with_acls(Acls::anyone_all()))?;
    let lock = zk.lock(prefix, b"", options).await?;
    zk.delete(lock.lock_path(), None).await?;
    // Its `Drop` would delete the node again in the background (one more request, after the
    // cycle is timed): the cycle deleted it itself, so the guard is forgotten instead.
    std::mem::forget(lock);
    Ok(())
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
            Self::Floor => "floor (zookeeper-client lock + delete)",
            Self::Api => "dlock API",
            Self::Attribute => "dlock attribute",
        }
    }
}

async fn cycle(
    floor: &Client,
    locker: &Locker,
    variant: Variant,
    key: &str,
    n: usize,
) -> Result<(), Error> {
    match variant {
        Variant::Floor => floor_lock(floor, key).await,
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
    let floor = target.client().await?;
    let locker = target.locker(true)?;
    for i in 0..20 {
        for (v, variant) in VARIANTS.into_iter().enumerate() {
            let key = format!("w1warm-{run}-{v}-{i}");
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
            let key = format!("w1-{run}-{v}-{i}");
            let t = Instant::now();
            cycle(&floor, &locker, VARIANTS[v], &key, i + run * 1_000_000).await?;
            latencies[v].push(t.elapsed());
        }
    }
    let mut rows = Vec::new();
    for (v, mut latencies) in latencies.into_iter().enumerate() {
        // Requests per acquisition, counted on a short run of this variant alone.
        let before = target.requests()?;
        let counted = 50;
        for i in 0..counted {
            let key = format!("w1count-{run}-{v}-{i}");
            cycle(&floor, &locker, VARIANTS[v], &key, usize::MAX / 2 - i).await?;
        }
        let after = target.requests()?;
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
            commands_per_acquire: Some((after - before) as f64 / counted as f64),
            ..Row::default()
        });
    }
    Ok(rows)
}

/// W2: many clients, each its own session, distinct keys.
async fn w2(target: &Target, variant: Variant, sizes: Sizes, run: usize) -> Result<Row, Error> {
    let mut clients = Vec::new();
    for c in 0..sizes.w2_clients {
        let floor = target.client().await?;
        let locker = target.locker(true)?;
        for i in 0..5 {
            let key = format!("w2warm-{run}-{c}-{i}");
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
                    // The same few keys per client, over and over: the lock nodes stay (a fresh
                    // key per cycle would measure the container's creation too, as W1 does).
                    let key = format!("w2-{run}-{c}-{}", i % 4);
                    // The attribute's key is `bench:attr:<n>`: the same 4 per client too.
                    let n = (run * 1000 + c) * 100_000 + i % 4;
                    cycle(&floor, &locker, variant, &key, n).await?;
                    done += 1;
                }
                Ok::<_, Error>((done, floor, locker))
            })
        })
        .collect();
    let mut ops = 0;
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
    NoNotify,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Self::Floor => "floor (zookeeper-client lock)",
            Self::Default => "dlock default (= fair)",
            Self::NoNotify => "dlock DLOCK_NOTIFY=off",
        }
    }
}

/// W3: clients contend for one key; the body is a non-atomic increment of a znode (read its
/// data, then write it back plus one).
async fn w3(
    target: &Target,
    mode: Mode,
    sizes: Sizes,
    run: usize,
) -> Result<(Row, Vec<Duration>), Error> {
    let key = format!("w3-{run}-{}", mode as u8);
    let counter = format!("/bench-counter-{key}");
    let setup = target.client().await?;
    setup
        .create(
            &counter,
            b"0",
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        )
        .await?;
    let log: Arc<Mutex<Vec<Section>>> = Arc::default();
    let per_client = sizes.w3_sections / sizes.w3_clients;
    let mut clients = Vec::new();
    for _ in 0..sizes.w3_clients {
        let floor = target.client().await?;
        let locker = target.locker(mode != Mode::NoNotify)?;
        locker
            .acquire(&format!("{key}-warm"), LockOptions::new())
            .await?
            .release()
            .await?;
        clients.push((floor, locker));
    }
    let requests_before = target.requests()?;
    let started = Instant::now();
    let cap = sizes.time_cap;
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(c, (floor, locker))| {
            let (key, counter, log) = (key.clone(), counter.clone(), log.clone());
            tokio::spawn(async move {
                let body = async || -> Result<Instant, Error> {
                    let acquired = Instant::now();
                    let (data, _) = floor.get_data(&counter).await?;
                    let n: u64 = String::from_utf8_lossy(&data).parse().unwrap_or(0);
                    floor
                        .set_data(&counter, (n + 1).to_string().as_bytes(), None)
                        .await?;
                    Ok(acquired)
                };
                for _ in 0..per_client {
                    if started.elapsed() > cap {
                        break;
                    }
                    let asked = Instant::now();
                    let acquired;
                    if mode == Mode::Floor {
                        let dir = format!("/bench-floor/{key}");
                        let prefix = LockPrefix::new_curator(&dir, "lock-")?;
                        let options = zookeeper_client::LockOptions::new(Acls::anyone_all())
                            .with_ancestor_options(
                                CreateMode::Container.with_acls(Acls::anyone_all()),
                            )?;
                        let lock = floor.lock(prefix, b"", options).await?;
                        acquired = body().await?;
                        floor.delete(lock.lock_path(), None).await?;
                        std::mem::forget(lock);
                    } else {
                        let guard = locker.acquire(&key, LockOptions::new()).await?;
                        acquired = body().await?;
                        guard.release().await?;
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
    let requests = target.requests()? - requests_before;
    let sections = std::mem::take(
        &mut *log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    let (data, _) = setup.get_data(&counter).await?;
    let counted: u64 = String::from_utf8_lossy(&data).parse().unwrap_or(0);
    let exact = u64::try_from(sections.len()).is_ok_and(|n| n == counted);
    // The body's read and write are not the lock's: 2 per section.
    #[allow(clippy::cast_precision_loss)]
    let requests_per_acquire = (requests as f64 / sections.len().max(1) as f64 - 2.0).max(0.0);
    let (row, waits) = contended_row(
        "W3 8 clients, one key",
        mode.name(),
        sections,
        elapsed,
        exact,
        requests_per_acquire,
    );
    Ok((row, waits))
}

async fn start() -> Result<Target, Error> {
    let server = tokio::task::spawn_blocking(ZkEnsemble::single).await?;
    let url = server.url();
    let ticks = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100);
    Ok(Target { server, url, ticks })
}

/// The whole benchmark on a throwaway ZooKeeper server; `Ok(false)` when a W3 counter is
/// wrong.
pub(super) async fn bench(args: &Args) -> Result<bool, Error> {
    let target = start()
        .await
        .map_err(|e| format!("starting a throwaway ZooKeeper: {e}"))?;
    let version = target
        .server
        .version()
        .map_or_else(String::new, |v| format!(" {v}"));
    println!(
        "ZooKeeper: a throwaway standalone ZooKeeper{version} on 127.0.0.1:{} (a JVM, data in \
         a temporary directory)\nengine zookeeper: {}",
        target.server.port(0),
        target.url
    );
    let sizes = args.sizes;
    let modes = [Mode::Floor, Mode::Default, Mode::NoNotify];
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
        Some(
            "cmds/acq: requests ZooKeeper received per acquisition (`srvr`, pings included); in W1 \
             a fresh key also creates its lock node (a container).",
        ),
    )
}
