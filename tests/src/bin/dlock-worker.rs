//! The worker process of the multi-process and fault tests, on every engine: it locks through
//! the URL it is given (with the other `DLOCK_*` variables of its environment) and keeps its
//! data on the same engine ([`dlock_tests::store`]), with a connection of its own.
//!
//! `dlock-worker <URL> <KEY> <ARG> <MODE>`, `ARG` as the mode reads it:
//!
//! - `api` / `attr` (`ARG` iterations): increments `KEY`'s counter non-atomically (read, pause,
//!   write) under the lock, through the API or a `#[dlock]` function, and records each hold
//!   with its fence.
//! - `fair-waiter` (`ARG` a name): waits for the lock in fair mode, appends the name to the
//!   fair order, holds 20ms and releases.
//! - `take` (`ARG` the wait in ms): prints `acquired <unix time in µs>` once it holds the lock,
//!   holds 50ms and releases.
//! - `hot` / `hot-fair` (`ARG` waiters): that many tasks on one locker each increment the
//!   counter 4 times under the lock (default or fair mode); every fourth task gives up
//!   somewhere in its second wait. Two such workers start together (a gate on Redis). Prints
//!   `done <increments made>`.
//! - `permits` (`ARG` `<permits>:<iterations>`), `read` / `write` (`ARG` iterations): takes a
//!   permit of the semaphore `KEY`, or a read or write hold of the read/write lock `KEY`, holds
//!   it 20ms, releases, that many times, printing `hold <start µs> <end µs> <fence>` for each
//!   (a span inside the hold, by the system clock the processes share).
//! - `kill-holder` (`ARG` the lease in ms, as `pause-holder` takes it): takes the only permit of
//!   the semaphore `KEY`, prints `acquired <fence>` and waits to be killed.
//! - `pause-holder` (`ARG` the lease in ms: the `expire`, and on ZooKeeper and etcd the
//!   session's timeout or TTL, their lease): takes the lock, prints `acquired <fence>`, waits for a line on
//!   stdin (the test freezes it meanwhile), then waits up to 10s for the loss to be known, tries
//!   a fenced write and a release, and prints `held=… lost_resolved=… write_accepted=…
//!   release=…`.

use std::time::Duration;

use clap::Parser as _;
use dlock_runtime::{LockOptions, Locker, LockerBuilder, dlock};
use dlock_tests::store::{Error, Store};

/// What the worker does (see the crate docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Mode {
    Api,
    Attr,
    FairWaiter,
    Take,
    Hot,
    HotFair,
    PauseHolder,
    Permits,
    Read,
    Write,
    KillHolder,
}

/// A worker process of the dlock tests, on any engine.
#[derive(Debug, clap::Parser)]
#[command(name = "dlock-worker")]
struct Args {
    /// The lock URL (`redis://…`, `postgres://…`, `etcd://…`, `zk://…`, …).
    url: String,
    /// The lock key.
    key: String,
    /// Iterations, a name, milliseconds or waiters, as the mode reads it.
    arg: String,
    /// What to do.
    #[arg(value_enum)]
    mode: Mode,
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args).await {
        eprintln!("dlock-worker: {e}");
        std::process::exit(1);
    }
}

async fn run(args: &Args) -> Result<(), Error> {
    // The data lives where `DLOCK_WORKER_DATA_URL` says, else beside the locks.
    let data = std::env::var("DLOCK_WORKER_DATA_URL").unwrap_or_else(|_| args.url.clone());
    let store = Store::open(&data).await?;
    let key = args.key.as_str();
    let mut builder = LockerBuilder::from_env()?.url(args.url.as_str());
    if matches!(args.mode, Mode::PauseHolder | Mode::KillHolder) {
        let lease = Duration::from_millis(args.arg.parse()?);
        builder = builder.expire(lease).zk_session_timeout(lease);
        if args.url.starts_with("etcd") {
            // etcd's session TTL, in whole seconds.
            let ttl = lease.as_secs().max(1);
            let url = if args.url.contains('?') {
                format!("{}&session_ttl={ttl}s", args.url)
            } else {
                format!("{}?session_ttl={ttl}s", args.url)
            };
            builder = builder.url(url);
        }
        if args.url.contains("+redlock") {
            // RedLock refuses a request timeout above a fifth of the lease.
            builder = builder.request_timeout(lease / 5);
        }
        if args.mode == Mode::KillHolder {
            let locker = builder.build()?;
            let guard = locker.acquire_permit(key, 1, LockOptions::new()).await?;
            println!("acquired {}", guard.fencing_token());
            tokio::time::sleep(Duration::from_secs(120)).await;
            return Ok(());
        }
        return pause_holder(&builder.build()?, key, &store).await;
    }
    let locker = builder.build()?;
    let wait = LockOptions::new().timeout(Duration::from_secs(60));
    match args.mode {
        Mode::Api | Mode::Attr => {
            for _ in 0..args.arg.parse::<u32>()? {
                if args.mode == Mode::Api {
                    let guard = locker.acquire(key, wait.clone()).await?;
                    let n = store.increment(key).await?;
                    store.record_hold(key, n, guard.fencing_token()).await?;
                    guard.release().await?;
                } else {
                    locked_increment(&locker, key, &store).await?;
                }
            }
        }
        Mode::FairWaiter => {
            let guard = locker.acquire(key, wait.fair()).await?;
            store.push_order(key, &args.arg).await?;
            tokio::time::sleep(Duration::from_millis(20)).await;
            guard.release().await?;
        }
        Mode::Take => {
            let wait = Duration::from_millis(args.arg.parse()?);
            let guard = locker
                .acquire(key, LockOptions::new().timeout(wait))
                .await?;
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
            println!("acquired {}", now.as_micros());
            tokio::time::sleep(Duration::from_millis(50)).await;
            guard.release().await?;
        }
        Mode::Hot | Mode::HotFair => {
            let fair = args.mode == Mode::HotFair;
            hot(&locker, key, &store, args.arg.parse()?, fair).await?;
        }
        Mode::Permits | Mode::Read | Mode::Write => {
            let (options, iterations) = match args.mode {
                Mode::Permits => {
                    let (permits, iterations) = args
                        .arg
                        .split_once(':')
                        .ok_or("`permits` takes <permits>:<iterations>")?;
                    (wait.permits(permits.parse()?), iterations.parse()?)
                }
                Mode::Read => (wait.read(), args.arg.parse()?),
                _ => (wait.write(), args.arg.parse()?),
            };
            shared_holds(&locker, key, &options, iterations).await?;
        }
        Mode::PauseHolder | Mode::KillHolder => unreachable!("handled above"),
    }
    locker.close().await?;
    Ok(())
}

#[dlock(key = "<key>", client = locker, timeout = "60s", expire = "10s")]
async fn locked_increment(locker: &Locker, key: &str, store: &Store) -> Result<(), Error> {
    store.increment(key).await?;
    Ok(())
}

/// Many waiters of one key on one locker, some giving up part-way; prints the increments made.
async fn hot(
    locker: &Locker,
    key: &str,
    store: &Store,
    waiters: u64,
    fair: bool,
) -> Result<(), Error> {
    let options = if fair {
        LockOptions::new().fair()
    } else {
        LockOptions::new()
    };
    store.meet(key, 2).await?;
    let tasks: Vec<_> = (0..waiters)
        .map(|i| {
            let (locker, store, key) = (locker.clone(), store.clone(), key.to_owned());
            let options = options.clone().timeout(Duration::from_secs(30));
            tokio::spawn(async move {
                let mut made = 0u64;
                for round in 0..4 {
                    let wait = locker.acquire(&key, options.clone());
                    let guard = if i % 4 == 0 && round == 1 {
                        // Gives up somewhere in its wait (0 to 60ms in): first in line, behind
                        // others, or while asking the server.
                        match tokio::time::timeout(Duration::from_millis(i % 61), wait).await {
                            Ok(guard) => guard?,
                            Err(_) => continue,
                        }
                    } else {
                        wait.await?
                    };
                    let n = store.increment(&key).await?;
                    store.record_hold(&key, n, guard.fencing_token()).await?;
                    guard.release().await?;
                    made += 1;
                }
                Ok::<_, Error>(made)
            })
        })
        .collect();
    let mut made = 0;
    for task in tasks {
        made += task.await??;
    }
    println!("done {made}");
    Ok(())
}

/// Takes `key` with `options` (a permit, a read or a write hold) `iterations` times, holding
/// it 20ms; prints each hold's span and fence.
async fn shared_holds(
    locker: &Locker,
    key: &str,
    options: &LockOptions,
    iterations: u32,
) -> Result<(), Error> {
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros())
    };
    for _ in 0..iterations {
        let guard = locker.acquire(key, options.clone()).await?;
        let start = now()?;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let end = now()?;
        println!("hold {start} {end} {}", guard.fencing_token());
        guard.release().await?;
    }
    Ok(())
}

async fn pause_holder(locker: &Locker, key: &str, store: &Store) -> Result<(), Error> {
    let guard = locker.acquire(key, LockOptions::new()).await?;
    println!("acquired {}", guard.fencing_token());
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    // A lease engine knows at once; ZooKeeper once the client hears its session expired.
    let lost_resolved = tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .is_ok();
    let held = guard.is_held();
    let accepted = store
        .fenced_write(key, guard.fencing_token(), "written by the paused holder")
        .await?;
    let release = match guard.release().await {
        Ok(()) => "released".to_owned(),
        Err(e) if e.is_lost() => "lost".to_owned(),
        Err(e) => format!("error {e}"),
    };
    println!(
        "held={held} lost_resolved={lost_resolved} write_accepted={accepted} release={release}"
    );
    Ok(())
}
