//! A worker process for the ZooKeeper tests, with its own session.
//!
//! `dlock-zk-worker <zk-url> <key> <iterations> <api|attr>`: increments a counter kept in the
//! znode `/dlock-test/<key>` non-atomically (read, pause, unconditional write) under the lock,
//! `iterations` times: an update is lost whenever two processes overlap.
//!
//! `dlock-zk-worker <zk-url> <key> <session-ms> pause-holder`: the paused-holder test's child.
//! With a session of `session-ms` and a 30s lease, it takes the lock, prints
//! `acquired <fence>`, waits for a line on stdin (the test freezes it past its session
//! meanwhile), then tries a fenced write to the znode `/dlock-test/<key>.resource` and a release
//! and prints what happened.

use std::time::Duration;

use dlock_runtime::{LockError, LockOptions, Locker, dlock};
use zookeeper_client::{Acls, Client, CreateMode};

#[derive(Debug)]
enum WorkerError {
    Lock(LockError),
    Zk(zookeeper_client::Error),
}

impl From<LockError> for WorkerError {
    fn from(e: LockError) -> Self {
        Self::Lock(e)
    }
}

impl From<zookeeper_client::Error> for WorkerError {
    fn from(e: zookeeper_client::Error) -> Self {
        Self::Zk(e)
    }
}

impl std::fmt::Display for WorkerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Lock(e) => write!(f, "lock: {e}"),
            Self::Zk(e) => write!(f, "zookeeper: {e}"),
        }
    }
}

/// Read, yield, write: loses updates unless the lock excludes the other processes.
async fn increment(zk: &Client, counter: &str) -> Result<(), WorkerError> {
    let (data, _) = zk.get_data(counter).await?;
    let value: u64 = String::from_utf8_lossy(&data).parse().unwrap_or(0);
    tokio::time::sleep(Duration::from_micros(200)).await;
    zk.set_data(counter, (value + 1).to_string().as_bytes(), None)
        .await?;
    Ok(())
}

#[dlock(key = "<key>", client = locker, timeout = "30s", expire = "10s")]
async fn locked_increment(
    locker: &Locker,
    key: &str,
    zk: &Client,
    counter: &str,
) -> Result<(), WorkerError> {
    increment(zk, counter).await
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("dlock-zk-worker: {e}");
        std::process::exit(1);
    }
}

/// The znode `/dlock-test/<name>`, created (holding `0`) when missing.
async fn test_node(zk: &Client, name: &str) -> Result<String, WorkerError> {
    let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
    zk.mkdir("/dlock-test", &persistent).await?;
    let path = format!("/dlock-test/{name}");
    match zk.create(&path, b"0", &persistent).await {
        Ok(_) | Err(zookeeper_client::Error::NodeExists) => Ok(path),
        Err(e) => Err(e.into()),
    }
}

async fn run() -> Result<(), WorkerError> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, key, n, mode] = args.as_slice() else {
        eprintln!("usage: dlock-zk-worker <zk-url> <key> <iterations> <api|attr|pause-holder>");
        std::process::exit(2);
    };
    let hosts = url.strip_prefix("zk://").expect("a zk:// URL");
    // Its own session outlives the pause of the paused-holder test.
    let zk = Client::connector()
        .with_session_timeout(Duration::from_secs(30))
        .connect(hosts)
        .await?;
    if mode == "pause-holder" {
        let session = Duration::from_millis(n.parse().expect("session-ms is a number"));
        let locker = Locker::builder()
            .url(url.as_str())
            .zk_session_timeout(session)
            .expire(Duration::from_secs(30))
            .build()?;
        return pause_holder(&locker, key, &zk).await;
    }
    let locker = Locker::builder().url(url.as_str()).build()?;
    let counter = test_node(&zk, key).await?;
    let iterations: u32 = n.parse().expect("iterations is a number");
    for _ in 0..iterations {
        if mode == "api" {
            let guard = locker
                .acquire(key, LockOptions::new().timeout(Duration::from_secs(30)))
                .await?;
            increment(&zk, &counter).await?;
            guard.release().await?;
        } else {
            locked_increment(&locker, key, &zk, &counter).await?;
        }
    }
    Ok(())
}

/// Writes `value` to the resource only if `fence` is not below the highest fence it has seen
/// (kept in its data as `<fence> <value>`, compare-and-set on its version).
async fn fenced_write(
    zk: &Client,
    path: &str,
    fence: u64,
    value: &str,
) -> Result<bool, WorkerError> {
    loop {
        let (data, stat) = zk.get_data(path).await?;
        let text = String::from_utf8_lossy(&data);
        let highest: u64 = text
            .split_whitespace()
            .next()
            .and_then(|f| f.parse().ok())
            .unwrap_or(0);
        if fence < highest {
            return Ok(false);
        }
        match zk
            .set_data(
                path,
                format!("{fence} {value}").as_bytes(),
                Some(stat.version),
            )
            .await
        {
            Ok(_) => return Ok(true),
            Err(zookeeper_client::Error::BadVersion) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

async fn pause_holder(locker: &Locker, key: &str, zk: &Client) -> Result<(), WorkerError> {
    let resource = test_node(zk, &format!("{key}.resource")).await?;
    let guard = locker.acquire(key, LockOptions::new()).await?;
    println!("acquired {}", guard.fencing_token());
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .expect("read the go-ahead");
    let lost_resolved = tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .is_ok();
    let held = guard.is_held();
    let accepted = fenced_write(
        zk,
        &resource,
        guard.fencing_token(),
        "written by the old holder",
    )
    .await?;
    let release = match guard.release().await {
        Ok(()) => "ok",
        Err(e) if e.is_lost() => "lost",
        Err(_) => "error",
    };
    println!(
        "held={held} lost_resolved={lost_resolved} write_accepted={accepted} release={release}"
    );
    Ok(())
}
