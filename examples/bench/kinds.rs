//! W5: the kinds of lock beside the mutex on the same engine. One client takes and lets go fresh
//! keys as a mutex, a permit (of 4), a read and a write hold (uncontended: acquisitions/s and
//! requests per acquisition); then W3's 8 clients (`--w3-clients`) with their own connections
//! contend for one key as a mutex, a semaphore of 4 permits, and a read/write lock where every
//! fourth client writes (acquisitions/s, waits, requests per acquisition). The rows' × is
//! against the mutex's row.
//! Bodies do no I/O: the figures are the lock's. An in-process count of holders checks the
//! kind's promise (at most 1, at most 4, writers alone): `exact` says it held.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use dlock_runtime::{LockOptions, Locker};

use crate::{
    Sizes,
    harness::{Error, Setup},
    report::{Row, Stat, contended_row},
    workloads::Section,
};

/// A kind measured under contention.
struct Kind {
    name: &'static str,
    /// The options of client `c`.
    options: fn(usize) -> LockOptions,
    /// How many may hold at once.
    most: usize,
    /// Whether client `c` writes (holds alone).
    writes: fn(usize) -> bool,
}

const KINDS: [Kind; 3] = [
    Kind {
        name: "mutex",
        options: |_| LockOptions::new(),
        most: 1,
        writes: |_| false,
    },
    Kind {
        name: "semaphore of 4",
        options: |_| LockOptions::new().permits(4),
        most: 4,
        writes: |_| false,
    },
    Kind {
        name: "read/write, 1 in 4 writes",
        options: |c| {
            if c % 4 == 0 {
                LockOptions::new().write()
            } else {
                LockOptions::new().read()
            }
        },
        most: usize::MAX,
        writes: |c| c % 4 == 0,
    },
];

fn locker(setup: &Setup, prefix: &str) -> Result<Locker, Error> {
    Ok(Locker::builder()
        .url(setup.url.as_str())
        .key_prefix(prefix)
        .timeout(Duration::from_secs(60))
        .build()?)
}

#[allow(clippy::cast_precision_loss)]
fn per_acquisition(setup: &Setup, delta: Option<u64>, n: usize) -> Option<f64> {
    let delta = delta?.saturating_sub(setup.stats.own_requests());
    Some(delta as f64 / n.max(1) as f64)
}

/// W5's rows: uncontended, then contended, for each kind (the mutex first).
pub(crate) async fn w5(setup: &Setup, sizes: Sizes, run: usize) -> Result<Vec<Row>, Error> {
    let mut rows = Vec::new();
    let one = locker(setup, setup.prefix)?;
    let uncontended = [
        ("mutex", LockOptions::new()),
        ("permit of 4", LockOptions::new().permits(4)),
        ("read", LockOptions::new().read()),
        ("write", LockOptions::new().write()),
    ];
    for (v, (name, options)) in uncontended.iter().enumerate() {
        for i in 0..20 {
            let guard = one
                .acquire(&format!("w5warm:{run}:{v}:{i}"), options.clone())
                .await?;
            guard.release().await?;
        }
        let cycles = sizes.w1_cycles / 2;
        let before = setup.stats.requests().await;
        let started = Instant::now();
        let mut latencies = Vec::with_capacity(cycles);
        for i in 0..cycles {
            if started.elapsed() > sizes.time_cap {
                break;
            }
            let t = Instant::now();
            let guard = one
                .acquire(&format!("w5:{run}:{v}:{i}"), options.clone())
                .await?;
            guard.release().await?;
            latencies.push(t.elapsed());
        }
        let after = setup.stats.requests().await;
        let stat = Stat::of(&latencies);
        #[allow(clippy::cast_precision_loss)]
        rows.push(Row {
            workload: "W5 1 client, fresh keys, by kind".to_owned(),
            variant: format!("dlock {name}"),
            ops: latencies.len(),
            per_sec: latencies.len() as f64 / started.elapsed().as_secs_f64().max(1e-9),
            p50_ms: stat.p50_ms,
            p99_ms: stat.p99_ms,
            requests_per_acquire: per_acquisition(
                setup,
                after.zip(before).map(|(a, b)| a - b),
                latencies.len(),
            ),
            ..Row::default()
        });
    }
    for (v, kind) in KINDS.iter().enumerate() {
        rows.push(contended(setup, sizes, &format!("w5:{run}:{v}"), kind).await?);
    }
    Ok(rows)
}

/// `w3_clients` clients with their own lockers on one key, each taking it with the options of
/// its number; holders counted in-process.
async fn contended(setup: &Setup, sizes: Sizes, key: &str, kind: &Kind) -> Result<Row, Error> {
    let clients = sizes.w3_clients;
    let per_client = sizes.w3_sections / clients;
    let holders = Arc::new(AtomicUsize::new(0));
    let writing = Arc::new(AtomicBool::new(false));
    let broke = Arc::new(AtomicBool::new(false));
    let log: Arc<Mutex<Vec<Section>>> = Arc::default();
    let mut lockers = Vec::new();
    for c in 0..clients {
        let locker = locker(setup, setup.prefix)?;
        let guard = locker
            .acquire(&format!("{key}:warm:{c}"), (kind.options)(c))
            .await?;
        guard.release().await?;
        lockers.push(locker);
    }
    let most = kind.most;
    let before = setup.stats.requests().await;
    let started = Instant::now();
    let tasks: Vec<_> = lockers
        .into_iter()
        .enumerate()
        .map(|(c, locker)| {
            let (key, holders, writing, broke, log) = (
                key.to_owned(),
                holders.clone(),
                writing.clone(),
                broke.clone(),
                log.clone(),
            );
            let (options, writer) = ((kind.options)(c), (kind.writes)(c));
            tokio::spawn(async move {
                for _ in 0..per_client {
                    if started.elapsed() > sizes.time_cap {
                        break;
                    }
                    let asked = Instant::now();
                    let guard = locker.acquire(&key, options.clone()).await?;
                    let acquired = Instant::now();
                    let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                    let alone = !writer || now == 1;
                    if now > most || !alone || writing.load(Ordering::SeqCst) {
                        broke.store(true, Ordering::SeqCst);
                    }
                    if writer {
                        writing.store(true, Ordering::SeqCst);
                    }
                    tokio::task::yield_now().await;
                    if writer {
                        writing.store(false, Ordering::SeqCst);
                    }
                    holders.fetch_sub(1, Ordering::SeqCst);
                    let released = Instant::now();
                    guard.release().await?;
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
    for task in tasks {
        task.await??;
    }
    let elapsed = started.elapsed();
    let after = setup.stats.requests().await;
    let sections = std::mem::take(
        &mut *log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    let n = sections.len();
    let (mut row, _) = contended_row(
        &format!("W5 {clients} clients, one key, by kind"),
        &format!("dlock {}", kind.name),
        sections,
        elapsed,
        !broke.load(Ordering::SeqCst),
    );
    row.requests_per_acquire = per_acquisition(setup, after.zip(before).map(|(a, b)| a - b), n);
    Ok(row)
}
