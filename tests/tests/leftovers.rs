//! Nothing left behind: an acquisition that returns an error has removed what it put in the
//! engine (its place in line, its etcd key and lease, its ZooKeeper node, its queue row), so a
//! process that exits right after it (a cron job's "try the lock, else exit") leaves no ghost
//! in line; and a process that closes its locker before it exits leaves nothing at all, though
//! it held a lock and had a waiter in line. Read from the engine with its own tools
//! ([`Engine::leftovers`]), on every engine; the embedded engine, whose table lives in the
//! process, checks the same through the next acquisitions.

use std::{
    io::{BufRead as _, Write as _},
    process::{Command, Stdio},
    time::Duration,
};

use dlock_runtime::{LockOptions, Locker};
use dlock_tests::{Engine, unique_key};
use tokio::time::Instant;

dlock_tests::engine_suite!(failed_and_closed_acquisitions_leave_nothing);

/// The longest a hand-off may take here: far below what a ghost in line costs the next waiter
/// (a 30s lease on etcd, the 10s session on ZooKeeper).
const HAND_OFF: Duration = Duration::from_secs(3);

async fn failed_and_closed_acquisitions_leave_nothing(engine: Engine) {
    match engine.url() {
        Some(url) => across_processes(&engine, url).await,
        None => in_process().await,
    }
}

/// The probe binary with `DLOCK_URL=url`, 30s leases, and none of this process's `DLOCK_*`.
fn probe(url: &str, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_dlock-probe"));
    for (name, _) in std::env::vars() {
        if name.starts_with("DLOCK_") || name == "REDIS_URL" {
            command.env_remove(name);
        }
    }
    command
        .env("DLOCK_URL", url)
        .env("DLOCK_EXPIRE", "30s")
        .args(args);
    command
}

/// Runs a probe to its end; what it printed.
fn probe_says(url: &str, args: &[&str]) -> String {
    let out = probe(url, args).output().expect("run dlock-probe");
    assert!(out.status.success(), "dlock-probe {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

async fn across_processes(engine: &Engine, url: &str) {
    // RedLock keeps no line; everywhere else fair waiters hold places in the engine's queue.
    let fair = !url.starts_with("redis+redlock");
    let mode = if fair { "fair" } else { "default" };
    let options = if fair {
        LockOptions::new().fair()
    } else {
        LockOptions::new()
    };
    let key = unique_key("ghosts");
    let full = format!("dlock:{key}");
    let locker = engine.locker_with_expire(Duration::from_secs(30));
    let held = locker.acquire(&key, options.clone()).await.unwrap();
    let holders_own = engine.leftovers(&full).await;
    assert!(
        !holders_own.is_empty(),
        "{url}: the holder's entry is not seen"
    );

    for args in [
        ["try", &key, mode, ""],
        ["try", &key, "default", ""],
        ["wait", &key, "300", mode],
        ["wait", &key, "300", "default"],
    ] {
        let args: Vec<&str> = args.into_iter().filter(|a| !a.is_empty()).collect();
        let expected = if args[0] == "try" { "busy" } else { "timeout" };
        assert_eq!(probe_says(url, &args), expected, "{url}: {args:?}");
    }
    assert_eq!(
        engine.leftovers(&full).await,
        holders_own,
        "{url}: failed attempts of processes that exited left entries behind"
    );

    // The next waiter is not held up by ghosts: it gets the lock within a hand-off.
    let other = engine.locker_with_expire(Duration::from_secs(30));
    let waiter = tokio::spawn({
        let (key, options) = (key.clone(), options.clone());
        async move {
            let guard = other
                .acquire(&key, options.timeout(Duration::from_secs(20)))
                .await;
            (guard, Instant::now())
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (guard, got) = waiter.await.unwrap();
    let guard = guard.unwrap_or_else(|e| panic!("{url}: the next waiter: {e}"));
    assert!(
        got - released < HAND_OFF,
        "{url}: the next waiter got the lock {:?} after the release",
        got - released
    );
    guard.release().await.unwrap();

    // A process holding a lock, with a waiter in line, closes its locker and exits.
    let key = unique_key("closed");
    let full = format!("dlock:{key}");
    let mut child = probe(url, &["close", &key, mode])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start dlock-probe");
    let mut out = std::io::BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    out.read_line(&mut line).expect("the probe's first line");
    assert_eq!(line.trim(), "ready", "{url}");
    let in_line = engine.leftovers(&full).await;
    assert!(
        in_line.len() >= 2,
        "{url}: a holder and a waiter, yet the engine shows {in_line:?}"
    );
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(b"go\n")
        .unwrap();
    line.clear();
    out.read_line(&mut line).expect("the probe's last line");
    assert_eq!(line.trim(), "closed closed", "{url}");
    assert!(child.wait().unwrap().success());
    assert_eq!(
        engine.leftovers(&full).await,
        Vec::<String>::new(),
        "{url}: a process that closed its locker left entries behind"
    );
}

/// The embedded engine: lockers of the process's table (`memory://`), each dropped right after
/// its failed acquisition as a process would exit; a ghost place would keep the next fair
/// acquisition out.
async fn in_process() {
    let locker = || {
        Locker::builder()
            .url("memory://")
            .expire(Duration::from_secs(30))
            .build()
            .unwrap()
    };
    let fair = LockOptions::new().fair();
    let key = unique_key("ghosts");
    let holder = locker();
    let held = holder.acquire(&key, fair.clone()).await.unwrap();
    for timeout in [Duration::ZERO, Duration::ZERO, Duration::from_millis(300)] {
        let failed = locker()
            .acquire(&key, fair.clone().timeout(timeout))
            .await
            .unwrap_err();
        assert!(failed.is_timeout(), "{failed}");
    }
    held.release().await.unwrap();
    // A fair single attempt gets the lock only at the head of the queue: a ghost place ahead
    // of it would refuse it.
    let next = locker()
        .acquire(&key, fair.clone().timeout(Duration::ZERO))
        .await
        .expect("a ghost place kept the next fair attempt out");
    next.release().await.unwrap();

    let key = unique_key("closed");
    let closing = locker();
    let held = closing.acquire(&key, fair.clone()).await.unwrap();
    let waiter = tokio::spawn({
        let (closing, key, fair) = (closing.clone(), key.clone(), fair.clone());
        async move { closing.acquire(&key, fair).await.map(drop) }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    closing.close().await.unwrap();
    assert!(waiter.await.unwrap().unwrap_err().is_closed());
    assert!(held.release().await.unwrap_err().is_lost());
    let after = locker()
        .acquire(&key, fair.timeout(Duration::ZERO))
        .await
        .expect("the closed locker left its lock or its place behind");
    after.release().await.unwrap();
}
