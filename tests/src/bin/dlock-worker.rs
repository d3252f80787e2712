//! A worker process for the multi-process tests: increments a Redis counter non-atomically
//! (GET, pause, SET) under a lock, `iterations` times, with its own connection.
//!
//! `dlock-worker <redis-url> <key> <iterations> <api|attr>`
//!
//! The counter and lists live on `<redis-url>`, or on `DLOCK_WORKER_DATA_URL` when the lock's
//! URL is no single server's (`redis+redlock://…`).
//!
//! `dlock-worker <redis-url> <key> <name> fair-waiter`: waits for the lock in fair mode, then
//! appends its name to the list `<key>:order`, holds 20ms and releases.
//!
//! `dlock-worker <redis-url> <key> <wait-ms> take`: waits up to `wait-ms` for the lock, prints
//! `acquired <unix time in µs>` once it holds it, holds 50ms and releases.
//!
//! `dlock-worker <redis-url> <key> <waiters> <hot|hot-fair>`: `waiters` tasks on one locker each
//! increment the counter 4 times under the lock (default or fair mode); every fourth task gives
//! up somewhere in its second wait; each hold appends `<pid> <fencing token>` to the list
//! `<key>:holders`. Two such workers start together: each counts itself in `<key>:ready` and
//! waits for the other. Prints `done <increments made>`.
//!
//! `dlock-worker <redis-url> <key> 1 pause-holder`: the paused-holder fault test's child. It
//! takes the lock with a 1s lease, prints `acquired <fence>`, waits for a line on stdin (the test
//! freezes it meanwhile), then tries a fenced write and a release and prints what happened.

use std::time::Duration;

use dlock_runtime::{LockError, LockOptions, Locker, dlock};
use redis::AsyncCommands as _;

#[derive(Debug)]
enum WorkerError {
    Lock(LockError),
    Redis(redis::RedisError),
}

impl From<LockError> for WorkerError {
    fn from(e: LockError) -> Self {
        Self::Lock(e)
    }
}

impl From<redis::RedisError> for WorkerError {
    fn from(e: redis::RedisError) -> Self {
        Self::Redis(e)
    }
}

/// GET, yield, SET: loses updates unless the lock excludes the other processes.
async fn increment(
    redis: &mut redis::aio::MultiplexedConnection,
    counter: &str,
) -> Result<(), WorkerError> {
    let value: Option<u64> = redis.get(counter).await?;
    tokio::time::sleep(Duration::from_micros(200)).await;
    let () = redis.set(counter, value.unwrap_or(0) + 1).await?;
    Ok(())
}

#[dlock(key = "<key>", client = locker, timeout = "30s", expire = "10s")]
async fn locked_increment(
    locker: &Locker,
    key: &str,
    redis: &mut redis::aio::MultiplexedConnection,
) -> Result<(), WorkerError> {
    increment(redis, &format!("{key}:counter")).await
}

impl std::fmt::Display for WorkerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Lock(e) => write!(f, "lock: {e}"),
            Self::Redis(e) => write!(f, "redis: {e}"),
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("dlock-worker: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), WorkerError> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, key, iterations, mode] = args.as_slice() else {
        eprintln!("usage: dlock-worker <redis-url> <key> <iterations> <api|attr>");
        std::process::exit(2);
    };
    let locker = Locker::builder().redis_url(url.as_str()).build()?;
    // A lock URL that is no single server's (RedLock's masters) keeps the counter elsewhere.
    let data_url = std::env::var("DLOCK_WORKER_DATA_URL").unwrap_or_else(|_| url.clone());
    let mut redis = redis::Client::open(data_url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    if mode == "fair-waiter" {
        // `iterations` is this waiter's name here.
        let guard = locker
            .acquire(
                key,
                LockOptions::new().fair().timeout(Duration::from_secs(30)),
            )
            .await?;
        let () = redis
            .rpush(format!("{key}:order"), iterations.as_str())
            .await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
        guard.release().await?;
        return Ok(());
    }
    if mode == "take" {
        let wait = Duration::from_millis(iterations.parse().expect("wait-ms is a number"));
        let guard = locker
            .acquire(key, LockOptions::new().timeout(wait))
            .await?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("a clock after 1970");
        println!("acquired {}", now.as_micros());
        tokio::time::sleep(Duration::from_millis(50)).await;
        guard.release().await?;
        return Ok(());
    }
    if let Some(mode) = mode.strip_prefix("hot") {
        let waiters: u64 = iterations.parse().expect("waiters is a number");
        return hot(&locker, key, &redis, waiters, mode == "-fair").await;
    }
    if mode == "pause-holder" {
        return pause_holder(&locker, key, &mut redis).await;
    }
    let iterations: u32 = iterations.parse().expect("iterations is a number");
    for _ in 0..iterations {
        match mode.as_str() {
            "api" => {
                let guard = locker
                    .acquire(key, LockOptions::new().timeout(Duration::from_secs(30)))
                    .await?;
                increment(&mut redis, &format!("{key}:counter")).await?;
                guard.release().await?;
            }
            _ => locked_increment(&locker, key, &mut redis).await?,
        }
    }
    Ok(())
}

/// Many waiters of one key on one locker, some giving up part-way; prints the increments made.
async fn hot(
    locker: &Locker,
    key: &str,
    redis: &redis::aio::MultiplexedConnection,
    waiters: u64,
    fair: bool,
) -> Result<(), WorkerError> {
    let options = if fair {
        LockOptions::new().fair()
    } else {
        LockOptions::new()
    };
    let ready = format!("{key}:ready");
    let mut gate = redis.clone();
    let _: i64 = gate.incr(&ready, 1).await?;
    while gate.get::<_, i64>(&ready).await? < 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let tasks: Vec<_> = (0..waiters)
        .map(|i| {
            let (locker, mut redis, key) = (locker.clone(), redis.clone(), key.to_owned());
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
                    increment(&mut redis, &format!("{key}:counter")).await?;
                    let held = format!("{} {}", std::process::id(), guard.fencing_token());
                    let _: i64 = redis.rpush(format!("{key}:holders"), held).await?;
                    guard.release().await?;
                    made += 1;
                }
                Ok::<_, WorkerError>(made)
            })
        })
        .collect();
    let mut made = 0;
    for task in tasks {
        made += task.await.expect("a hot waiter panicked")?;
    }
    println!("done {made}");
    Ok(())
}

/// The resource a fenced writer protects: it accepts a write only with a fence at least as high
/// as every fence it has seen.
pub const FENCED_WRITE: &str = r"
local highest = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) < highest then return 0 end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2])
return 1";

async fn pause_holder(
    locker: &Locker,
    key: &str,
    redis: &mut redis::aio::MultiplexedConnection,
) -> Result<(), WorkerError> {
    let guard = locker
        .acquire(key, LockOptions::new().expire(Duration::from_secs(1)))
        .await?;
    println!("acquired {}", guard.fencing_token());
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("read stdin");
    let held = guard.is_held();
    let lost_resolved = tokio::time::timeout(Duration::from_millis(100), guard.lost())
        .await
        .is_ok();
    let accepted: i64 = redis::Script::new(FENCED_WRITE)
        .key(format!("{key}:resource"))
        .key(format!("{key}:resource:fence"))
        .arg(guard.fencing_token())
        .arg("written by the paused holder")
        .invoke_async(redis)
        .await?;
    let release = match guard.release().await {
        Ok(()) => "released".to_owned(),
        Err(e) if e.is_lost() => "lost".to_owned(),
        Err(e) => format!("error {e}"),
    };
    println!(
        "held={held} lost_resolved={lost_resolved} write_accepted={} release={release}",
        accepted == 1
    );
    Ok(())
}
