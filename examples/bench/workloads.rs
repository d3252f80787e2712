//! W1–W3, written once over the contenders of any engine.
//!
//! - **W1**: one client per contender, a fresh key per cycle; the contenders take turns cycle by
//!   cycle (in a rotating order) on one task, so that a change in how the machine schedules the
//!   client, the connection tasks and the server hits them alike.
//! - **W2**: many clients per contender, each with its own connection, distinct keys: the rate,
//!   and the CPU time per cycle of the servers and of this program.
//! - **W3**: clients contending for ONE key; the body is a non-atomic increment of a counter on
//!   the engine's own data (read, then write back: two requests). The rate of critical
//!   sections, whether the counter is exact, the waits, and the hand-offs from one client to
//!   another.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use stats_alloc::Region;

use crate::{
    ALLOCATOR, Sizes,
    harness::{Client, Contender, Error, Setup},
    report::{Row, Stat, contended_row},
};

/// Requests per acquisition: the delta over `n` acquisitions, less what the counting and the
/// body cost (`body` requests per acquisition).
#[allow(clippy::cast_precision_loss)]
fn per_acquisition(setup: &Setup, delta: Option<u64>, n: usize, body: f64) -> Option<f64> {
    let delta = delta?.saturating_sub(setup.stats.own_requests());
    Some((delta as f64 / n.max(1) as f64 - body).max(0.0))
}

async fn requests(setup: &Setup) -> Option<u64> {
    setup.stats.requests().await
}

/// W1: the rows of every contender.
pub(crate) async fn w1(
    setup: &Setup,
    contenders: &[&dyn Contender],
    sizes: Sizes,
    run: usize,
) -> Result<Vec<Row>, Error> {
    let mut clients: Vec<Box<dyn Client>> = Vec::new();
    for contender in contenders {
        clients.push(contender.client().await?);
    }
    // Warm up: connections made, scripts loaded.
    for i in 0..20 {
        for (v, client) in clients.iter_mut().enumerate() {
            cycle(client.as_mut(), &format!("w1warm:{run}:{v}:{i}")).await?;
        }
    }
    let mut latencies: Vec<Vec<Duration>> =
        vec![Vec::with_capacity(sizes.w1_cycles); clients.len()];
    let started = Instant::now();
    for i in 0..sizes.w1_cycles {
        if started.elapsed() > sizes.time_cap {
            break;
        }
        for turn in 0..clients.len() {
            let v = (i + turn) % clients.len();
            let t = Instant::now();
            cycle(clients[v].as_mut(), &format!("w1:{run}:{v}:{i}")).await?;
            latencies[v].push(t.elapsed());
        }
    }
    let mut rows = Vec::new();
    for (v, latencies) in latencies.into_iter().enumerate() {
        // Requests and allocations per acquisition, counted on a short run of this one alone.
        let counted = 50;
        let before = requests(setup).await;
        let allocations = Region::new(ALLOCATOR);
        for i in 0..counted {
            cycle(clients[v].as_mut(), &format!("w1count:{run}:{v}:{i}")).await?;
        }
        let allocated = allocations.change();
        let after = requests(setup).await;
        let spent: Duration = latencies.iter().sum();
        let stat = Stat::of(&latencies);
        #[allow(clippy::cast_precision_loss)]
        rows.push(Row {
            workload: "W1 1 client, fresh keys".to_owned(),
            variant: contenders[v].name(),
            ops: latencies.len(),
            per_sec: latencies.len() as f64 / spent.as_secs_f64().max(1e-9),
            p50_ms: stat.p50_ms,
            p99_ms: stat.p99_ms,
            requests_per_acquire: per_acquisition(
                setup,
                after.zip(before).map(|(a, b)| a - b),
                counted,
                0.0,
            ),
            allocations_per_op: Some(
                (allocated.allocations + allocated.reallocations) as f64 / counted as f64,
            ),
            ..Row::default()
        });
    }
    Ok(rows)
}

/// One uncontended cycle: take `key`, let it go.
async fn cycle(client: &mut dyn Client, key: &str) -> Result<(), Error> {
    client.hold(key, Box::pin(async { Ok(()) })).await
}

/// W2: `contender` with many clients on distinct keys; `workload` names the row.
pub(crate) async fn w2(
    setup: &Setup,
    workload: &str,
    contender: &dyn Contender,
    sizes: Sizes,
    run: usize,
) -> Result<Row, Error> {
    let mut clients = Vec::new();
    for c in 0..sizes.w2_clients {
        let mut client = contender.client().await?;
        for i in 0..5 {
            cycle(client.as_mut(), &format!("w2warm:{run}:{c}:{i}")).await?;
        }
        clients.push(client);
    }
    let server_before = setup.stats.cpu().await;
    let client_before = client_cpu_so_far();
    let started = Instant::now();
    let cap = sizes.time_cap;
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(c, mut client)| {
            tokio::spawn(async move {
                let mut done = 0usize;
                for i in 0..sizes.w2_cycles {
                    if started.elapsed() > cap {
                        break;
                    }
                    cycle(client.as_mut(), &format!("w2:{run}:{c}:{i}")).await?;
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
    let client = client_cpu_so_far()
        .zip(client_before)
        .map(|(a, b)| a.saturating_sub(b));
    let per_op = |d: Duration| {
        d.as_secs_f64() * 1e6 / f64::from(u32::try_from(ops.max(1)).unwrap_or(u32::MAX))
    };
    let per_server: Vec<f64> = setup
        .stats
        .cpu()
        .await
        .into_iter()
        .zip(server_before)
        .map(|(after, before)| per_op(after.saturating_sub(before)))
        .collect();
    #[allow(clippy::cast_precision_loss)]
    Ok(Row {
        workload: workload.to_owned(),
        variant: contender.name(),
        ops,
        per_sec: ops as f64 / elapsed.as_secs_f64().max(1e-9),
        server_cpu_us: (!per_server.is_empty()).then(|| per_server.iter().sum()),
        client_cpu_us: client.map(per_op),
        server_cpu_per_server_us: if per_server.len() > 1 {
            per_server
        } else {
            Vec::new()
        },
        ..Row::default()
    })
}

/// One critical section of a contended workload: who, and when it asked, got and let go.
pub(crate) struct Section {
    pub(crate) client: usize,
    pub(crate) asked: Instant,
    pub(crate) acquired: Instant,
    pub(crate) released: Instant,
}

/// W3: `contender` with `w3_clients` clients on one key; the row and the sorted waits.
pub(crate) async fn w3(
    setup: &Setup,
    contender: &dyn Contender,
    sizes: Sizes,
    run: usize,
) -> Result<(Row, Vec<Duration>), Error> {
    let key = format!("w3:{run}");
    let counter = format!("w3-{run}");
    setup.counter.handle(&counter).await?.set(0).await?;
    let log: Arc<Mutex<Vec<Section>>> = Arc::default();
    let per_client = sizes.w3_sections / sizes.w3_clients;
    let mut clients = Vec::new();
    for c in 0..sizes.w3_clients {
        let mut client = contender.client().await?;
        cycle(client.as_mut(), &format!("{key}:warm:{c}")).await?;
        clients.push((client, setup.counter.handle(&counter).await?));
    }
    let before = requests(setup).await;
    let server_before = setup.stats.cpu().await;
    let client_before = client_cpu_so_far();
    let started = Instant::now();
    let cap = sizes.time_cap;
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(c, (mut client, mut count))| {
            let (key, log) = (key.clone(), log.clone());
            tokio::spawn(async move {
                for _ in 0..per_client {
                    if started.elapsed() > cap {
                        break;
                    }
                    let asked = Instant::now();
                    let times = Arc::new(Mutex::new(None));
                    let body = {
                        let (times, count) = (times.clone(), &mut count);
                        Box::pin(async move {
                            let acquired = Instant::now();
                            let n = count.get().await?;
                            count.set(n + 1).await?;
                            *times
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner) =
                                Some((acquired, Instant::now()));
                            Ok(())
                        })
                    };
                    client.hold(&key, body).await?;
                    let Some((acquired, released)) = *times
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                    else {
                        return Err::<(), Error>("the body did not run".into());
                    };
                    log.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(Section {
                            client: c,
                            asked,
                            acquired,
                            released,
                        });
                }
                Ok(())
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    let elapsed = started.elapsed();
    let client_cpu = client_cpu_so_far()
        .zip(client_before)
        .map(|(a, b)| a.saturating_sub(b));
    let server_cpu: Vec<Duration> = setup
        .stats
        .cpu()
        .await
        .into_iter()
        .zip(server_before)
        .map(|(after, before)| after.saturating_sub(before))
        .collect();
    let after = requests(setup).await;
    let sections = std::mem::take(
        &mut *log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    let counted = setup.counter.handle(&counter).await?.get().await?;
    let exact = counted == sections.len() as u64;
    // The body's read and write are not the lock's: 2 per section.
    let requests_per_acquire = per_acquisition(
        setup,
        after.zip(before).map(|(a, b)| a - b),
        sections.len(),
        2.0,
    );
    let (mut row, waits) = contended_row(
        &format!("W3 {} clients, one key", sizes.w3_clients),
        &contender.name(),
        sections,
        elapsed,
        exact,
    );
    row.requests_per_acquire = requests_per_acquire;
    // CPU per critical section, the body's two requests included (as the floor's).
    let per_section = |d: Duration| {
        d.as_secs_f64() * 1e6 / f64::from(u32::try_from(row.ops.max(1)).unwrap_or(u32::MAX))
    };
    row.server_cpu_us =
        (!server_cpu.is_empty()).then(|| server_cpu.iter().copied().map(per_section).sum());
    row.client_cpu_us = client_cpu.map(per_section);
    Ok((row, waits))
}

/// This process's CPU time so far, summed over its threads (Linux; `None` elsewhere).
pub(crate) fn client_cpu_so_far() -> Option<Duration> {
    let mut nanos = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        nanos += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(Duration::from_nanos(nanos))
}
