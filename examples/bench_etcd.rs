//! `bench --engine etcd`: the workloads on a throwaway etcd member, next to a floor made of
//! etcd's own lock service (`Lock`/`Unlock` of `v3lockpb`, through etcd-client) in the same run.
//!
//! - Floor: `Lock` then `Unlock` under one session lease per client, granted once, the way
//!   `etcdctl lock` and Go's `concurrency` package hold it (2 RPCs per cycle). A second floor
//!   row grants and revokes a lease per cycle (4 RPCs), as dlock does for each acquisition.
//! - RPCs per acquisition: the server's `grpc_server_started_total` (`/metrics`, every method
//!   but the harness's `Status`), so a stream opened (a watch, a keep-alive) counts once.
//! - Server CPU: etcd's `process_cpu_seconds_total`.
//! - W3's counter (the body) lives on the throwaway `redis-server` beside etcd, as with the other
//!   engines; its two commands are not counted (they are not etcd's).

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use dlock_runtime::{LockOptions, Locker};
use dlock_testkit::deployment::{Connection, Deployment, Engine};
use etcd_client::{Client, LockOptions as EtcdLockOptions};
use redis::AsyncCommands as _;

use super::{
    Args, Error, Rounds, Row, client_cpu_so_far, locked_noop, medians, percentile, report,
};

struct Target {
    /// `etcd://127.0.0.1:p`.
    url: String,
    endpoint: String,
    /// The W3 counter's Redis.
    data_url: String,
}

/// etcd's `/metrics`: RPCs started so far, and the server's CPU time.
fn metrics(endpoint: &str) -> Result<(u64, Duration), Error> {
    let mut stream = TcpStream::connect(endpoint)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {endpoint}\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    let mut rpcs = 0u64;
    let mut cpu = 0f64;
    for line in text.lines() {
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
    Ok((rpcs, Duration::from_secs_f64(cpu)))
}

#[derive(Clone, Copy, PartialEq)]
enum Variant {
    /// `Lock`/`Unlock` under the client's session lease.
    Floor,
    /// Lease grant, `Lock`, `Unlock`, lease revoke.
    FloorLeasePerCycle,
    Api,
    Attribute,
}

impl Variant {
    const ALL: [Self; 4] = [
        Self::Floor,
        Self::FloorLeasePerCycle,
        Self::Api,
        Self::Attribute,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::Floor => "floor (etcd Lock/Unlock, one session lease)",
            Self::FloorLeasePerCycle => "etcd Lock/Unlock, a lease per cycle",
            Self::Api => "dlock API",
            Self::Attribute => "dlock attribute",
        }
    }
}

/// One client: an etcd-client connection with its session lease, and a locker.
struct Bencher {
    etcd: Client,
    session: i64,
    locker: Locker,
}

impl Bencher {
    async fn new(target: &Target, notify: bool) -> Result<Self, Error> {
        let mut etcd = Client::connect([target.endpoint.as_str()], None).await?;
        let session = etcd.lease_grant(60, None).await?.id();
        let locker = Locker::builder()
            .url(target.url.as_str())
            .key_prefix("bench:")
            .timeout(Duration::from_secs(30))
            .notify(notify)
            .build()?;
        Ok(Self {
            etcd,
            session,
            locker,
        })
    }

    async fn cycle(&mut self, variant: Variant, key: &str, n: usize) -> Result<(), Error> {
        let name = format!("bench:{key}");
        match variant {
            Variant::Floor => {
                let held = self
                    .etcd
                    .lock(name, Some(EtcdLockOptions::new().with_lease(self.session)))
                    .await?;
                self.etcd.unlock(held.key()).await?;
            }
            Variant::FloorLeasePerCycle => {
                let lease = self.etcd.lease_grant(30, None).await?.id();
                let held = self
                    .etcd
                    .lock(name, Some(EtcdLockOptions::new().with_lease(lease)))
                    .await?;
                self.etcd.unlock(held.key()).await?;
                self.etcd.lease_revoke(lease).await?;
            }
            Variant::Api => {
                self.locker
                    .acquire(key, LockOptions::new())
                    .await?
                    .release()
                    .await?
            }
            Variant::Attribute => locked_noop(&self.locker, n).await?,
        }
        Ok(())
    }
}

/// W1: one client, fresh keys; the variants take turns cycle by cycle.
async fn w1(target: &Target, args: &Args, run: usize) -> Result<Vec<Row>, Error> {
    let sizes = args.sizes;
    let mut client = Bencher::new(target, true).await?;
    for i in 0..10 {
        for (v, variant) in Variant::ALL.into_iter().enumerate() {
            client
                .cycle(variant, &format!("w1warm:{run}:{v}:{i}"), usize::MAX - i)
                .await?;
        }
    }
    let mut latencies: Vec<Vec<Duration>> = vec![Vec::new(); Variant::ALL.len()];
    let started = Instant::now();
    for i in 0..sizes.w1_cycles {
        if started.elapsed() > sizes.time_cap {
            break;
        }
        for turn in 0..Variant::ALL.len() {
            let v = (i + turn) % Variant::ALL.len();
            let t = Instant::now();
            client
                .cycle(
                    Variant::ALL[v],
                    &format!("w1:{run}:{v}:{i}"),
                    i + run * 1_000_000,
                )
                .await?;
            latencies[v].push(t.elapsed());
        }
    }
    let mut rows = Vec::new();
    for (v, mut latencies) in latencies.into_iter().enumerate() {
        // RPCs per acquisition, on a short run of this variant alone; released leases are
        // revoked in the background by dlock: let those land first.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (before, _) = metrics(&target.endpoint)?;
        let counted: u32 = 50;
        for i in 0..counted {
            client
                .cycle(
                    Variant::ALL[v],
                    &format!("w1count:{run}:{v}:{i}"),
                    usize::MAX / 2 - i as usize,
                )
                .await?;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (after, _) = metrics(&target.endpoint)?;
        let spent: Duration = latencies.iter().sum();
        latencies.sort();
        #[allow(clippy::cast_precision_loss)]
        rows.push(Row {
            workload: "W1 1 client, fresh keys",
            variant: Variant::ALL[v].name(),
            ops: latencies.len(),
            per_sec: latencies.len() as f64 / spent.as_secs_f64(),
            p50: Some(percentile(&latencies, 0.5)),
            p99: Some(percentile(&latencies, 0.99)),
            commands_per_acquire: Some((after - before) as f64 / f64::from(counted)),
            ..Row::default()
        });
    }
    Ok(rows)
}

/// W2: many clients with their own connections, distinct keys.
async fn w2(target: &Target, args: &Args, variant: Variant, run: usize) -> Result<Row, Error> {
    let sizes = args.sizes;
    let mut clients = Vec::new();
    for c in 0..sizes.w2_clients {
        let mut client = Bencher::new(target, true).await?;
        client
            .cycle(variant, &format!("w2warm:{run}:{c}"), usize::MAX - c)
            .await?;
        clients.push(client);
    }
    let (_, server_before) = metrics(&target.endpoint)?;
    let client_before = client_cpu_so_far();
    let started = Instant::now();
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(c, mut client)| {
            tokio::spawn(async move {
                let mut done = 0usize;
                for i in 0..sizes.w2_cycles {
                    if started.elapsed() > sizes.time_cap {
                        break;
                    }
                    client
                        .cycle(
                            variant,
                            &format!("w2:{run}:{c}:{i}"),
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
    let (_, server_after) = metrics(&target.endpoint)?;
    let client = client_cpu_so_far().zip(client_before).map(|(a, b)| a - b);
    let per_op = |d: Duration| d / u32::try_from(ops.max(1)).unwrap_or(u32::MAX);
    #[allow(clippy::cast_precision_loss)]
    Ok(Row {
        workload: "W2 16 clients, distinct keys",
        variant: variant.name(),
        ops,
        per_sec: ops as f64 / elapsed.as_secs_f64(),
        server_cpu: Some(per_op(server_after.saturating_sub(server_before))),
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
            Self::Floor => "floor (etcd Lock/Unlock, one session lease)",
            Self::Default => "dlock default",
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

/// W3: clients contend for one key; the body is a non-atomic increment on Redis.
async fn w3(
    target: &Target,
    args: &Args,
    mode: Mode,
    run: usize,
) -> Result<(Row, Vec<Duration>), Error> {
    let sizes = args.sizes;
    let key = format!("w3:{run}");
    let counter = format!("bench:w3:{run}:counter");
    let log: Arc<Mutex<Vec<Section>>> = Arc::default();
    let per_client = sizes.w3_sections / sizes.w3_clients;
    let mut clients = Vec::new();
    for c in 0..sizes.w3_clients {
        let mut client = Bencher::new(target, mode != Mode::NoNotify).await?;
        client
            .cycle(Variant::Api, &format!("{key}:warm"), c)
            .await?;
        clients.push((client, Connection::open(&target.data_url).await?));
    }
    let (rpcs_before, _) = metrics(&target.endpoint)?;
    let started = Instant::now();
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(c, (mut client, mut redis))| {
            let (key, counter, log) = (key.clone(), counter.clone(), log.clone());
            tokio::spawn(async move {
                for _ in 0..per_client {
                    if started.elapsed() > sizes.time_cap {
                        break;
                    }
                    let asked = Instant::now();
                    let body = async |redis: &mut Connection| -> Result<Instant, Error> {
                        let acquired = Instant::now();
                        let n: Option<u64> = redis.get(&counter).await?;
                        let () = redis.set(&counter, n.unwrap_or(0) + 1).await?;
                        Ok(acquired)
                    };
                    let times = if mode == Mode::Floor {
                        let held = client
                            .etcd
                            .lock(
                                format!("bench:{key}"),
                                Some(EtcdLockOptions::new().with_lease(client.session)),
                            )
                            .await?;
                        let acquired = body(&mut redis).await?;
                        let released = Instant::now();
                        client.etcd.unlock(held.key()).await?;
                        (acquired, released)
                    } else {
                        let guard = client.locker.acquire(&key, LockOptions::new()).await?;
                        let acquired = body(&mut redis).await?;
                        let released = Instant::now();
                        guard.release().await?;
                        (acquired, released)
                    };
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
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (rpcs_after, _) = metrics(&target.endpoint)?;
    let mut sections = std::mem::take(
        &mut *log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    sections.sort_by_key(|s| s.acquired);
    let counted: u64 = Connection::open(&target.data_url)
        .await?
        .get(&counter)
        .await?;
    let mut waits: Vec<Duration> = sections.iter().map(|s| s.acquired - s.asked).collect();
    waits.sort();
    let mut handoffs = Vec::new();
    let mut to_other = 0usize;
    for pair in sections.windows(2) {
        if pair[1].client != pair[0].client {
            to_other += 1;
            handoffs.push(pair[1].acquired.saturating_duration_since(pair[0].released));
        }
    }
    handoffs.sort();
    #[allow(clippy::cast_precision_loss)]
    let row = Row {
        workload: "W3 8 clients, one key",
        variant: mode.name(),
        ops: sections.len(),
        per_sec: sections.len() as f64 / elapsed.as_secs_f64(),
        p50: Some(percentile(&waits, 0.5)),
        p99: Some(percentile(&waits, 0.99)),
        wait_max: waits.last().copied(),
        handoff_p50: (!handoffs.is_empty()).then(|| percentile(&handoffs, 0.5)),
        handoff_p99: (!handoffs.is_empty()).then(|| percentile(&handoffs, 0.99)),
        other_share: Some(to_other as f64 / (sections.len().max(2) - 1) as f64),
        exact: Some(counted == sections.len() as u64),
        commands_per_acquire: Some(
            (rpcs_after - rpcs_before) as f64 / sections.len().max(1) as f64,
        ),
        ..Row::default()
    };
    Ok((row, waits))
}

/// The whole run on a throwaway etcd member; `true` when every W3 counter was exact.
pub(crate) async fn bench(args: &Args) -> Result<bool, Error> {
    let deployment = Deployment::start(Engine::Etcd).await?;
    println!("etcd: a {}", deployment.describe());
    let url = deployment.url();
    let target = Target {
        endpoint: url.trim_start_matches("etcd://").to_owned(),
        data_url: deployment.data_url(),
        url,
    };
    let modes = [Mode::Floor, Mode::Default, Mode::NoNotify];
    let mut w1s: Vec<Rounds> = vec![Vec::new(); Variant::ALL.len()];
    let mut w2s: Vec<Rounds> = vec![Vec::new(); Variant::ALL.len()];
    let mut w3s: Vec<Rounds> = vec![Vec::new(); modes.len()];
    for round in 0..args.rounds {
        eprint!(".");
        for (i, row) in w1(&target, args, round).await?.into_iter().enumerate() {
            w1s[i].push((row, Vec::new()));
        }
        for (i, variant) in Variant::ALL.into_iter().enumerate() {
            eprint!(".");
            w2s[i].push((
                w2(&target, args, variant, round * 10 + i).await?,
                Vec::new(),
            ));
        }
        for (i, mode) in modes.into_iter().enumerate() {
            eprint!(".");
            w3s[i].push(w3(&target, args, mode, round * 10 + i).await?);
        }
    }
    let (rows, floors, series) = medians([w1s, w2s, w3s]);
    eprintln!();
    report(args, Engine::Etcd, &rows, &floors, &series, None)
}
