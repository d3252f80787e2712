//! A worker process for the etcd tests, locking through an `etcd://` URL and keeping its data in
//! that same etcd (outside every lock's line).
//!
//! `dlock-etcd-worker <etcd-url> <key> <iterations> <api|attr>`: increments the counter
//! `counter/<key>` non-atomically (get, pause, put) under the lock, `iterations` times.
//!
//! `dlock-etcd-worker <etcd-url> <key> 1 pause-holder`: the paused-holder test's child. It takes
//! the lock with a 1s lease (the server may grant more), prints `acquired <fence>`, waits for a
//! line on stdin (the test freezes it meanwhile), then tries a fenced write to
//! `resource/<key>` and a release, and prints what happened.

use std::time::Duration;

use dlock_runtime::{LockError, LockOptions, Locker, dlock};
use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};

#[derive(Debug)]
enum WorkerError {
    Lock(LockError),
    Etcd(etcd_client::Error),
}

impl From<LockError> for WorkerError {
    fn from(e: LockError) -> Self {
        Self::Lock(e)
    }
}

impl From<etcd_client::Error> for WorkerError {
    fn from(e: etcd_client::Error) -> Self {
        Self::Etcd(e)
    }
}

impl std::fmt::Display for WorkerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Lock(e) => write!(f, "lock: {e}"),
            Self::Etcd(e) => write!(f, "etcd: {e}"),
        }
    }
}

/// Get, pause, put: loses updates unless the lock excludes the other processes.
async fn increment(etcd: &mut Client, counter: &str) -> Result<(), WorkerError> {
    let got = etcd.get(counter, None).await?;
    let value: u64 = got
        .kvs()
        .first()
        .and_then(|kv| kv.value_str().ok()?.parse().ok())
        .unwrap_or(0);
    tokio::time::sleep(Duration::from_micros(200)).await;
    etcd.put(counter, (value + 1).to_string(), None).await?;
    Ok(())
}

#[dlock(key = "<key>", client = locker, timeout = "30s", expire = "10s")]
async fn locked_increment(
    locker: &Locker,
    key: &str,
    etcd: &mut Client,
) -> Result<(), WorkerError> {
    increment(etcd, &format!("counter/{key}")).await
}

/// The endpoints of an `etcd://h1:p1,h2:p2` URL.
fn endpoints(url: &str) -> Vec<String> {
    let hosts = url.strip_prefix("etcd://").unwrap_or(url);
    hosts.split(',').map(str::to_owned).collect()
}

/// A fence as text that sorts as the number does.
fn padded(fence: u64) -> String {
    format!("{fence:020}")
}

/// The fenced resource: `resource/<key>` is written only with a fence at least as high as every
/// fence it has seen (kept in `resource/<key>/fence`, which the test sets to zero first).
async fn fenced_write(
    etcd: &mut Client,
    key: &str,
    fence: u64,
    value: &str,
) -> Result<bool, WorkerError> {
    let fence_key = format!("resource/{key}/fence");
    let txn = Txn::new()
        .when([Compare::value(
            fence_key.as_str(),
            CompareOp::Less,
            padded(fence + 1),
        )])
        .and_then([
            TxnOp::put(fence_key.as_str(), padded(fence), None),
            TxnOp::put(format!("resource/{key}"), value, None),
        ]);
    Ok(etcd.txn(txn).await?.succeeded())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("dlock-etcd-worker: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), WorkerError> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, key, iterations, mode] = args.as_slice() else {
        eprintln!("usage: dlock-etcd-worker <etcd-url> <key> <iterations> <api|attr|pause-holder>");
        std::process::exit(2);
    };
    let locker = Locker::builder()
        .url(url.as_str())
        .request_timeout(Duration::from_secs(2))
        .build()?;
    let mut etcd = Client::connect(endpoints(url), None).await?;
    if mode == "pause-holder" {
        return pause_holder(&locker, key, &mut etcd).await;
    }
    let iterations: u32 = iterations.parse().expect("iterations is a number");
    for _ in 0..iterations {
        if mode == "api" {
            let guard = locker
                .acquire(key, LockOptions::new().timeout(Duration::from_secs(30)))
                .await?;
            increment(&mut etcd, &format!("counter/{key}")).await?;
            guard.release().await?;
        } else {
            locked_increment(&locker, key, &mut etcd).await?;
        }
    }
    Ok(())
}

async fn pause_holder(locker: &Locker, key: &str, etcd: &mut Client) -> Result<(), WorkerError> {
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
    let accepted = fenced_write(
        etcd,
        key,
        guard.fencing_token(),
        "written by the paused holder",
    )
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
