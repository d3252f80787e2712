//! Hot keys: many waiters of one key in one process queue in-process, and only the first of them
//! asks the server, so a release wakes one waiter per process rather than all of them. Checked by
//! a non-atomic counter and by the server's own count of script calls.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use dlock_runtime::{LockOptions, Locker};
use dlock_tests::{RedisServer, acquire_and_release, contend, racy_increment, unique_key};

const WAITERS: u64 = 64;

/// A locker on `server` whose waits outlast 64 holds in turn.
fn patient_locker(server: &RedisServer) -> Locker {
    Locker::builder()
        .redis_url(server.url())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Without the in-process line, each release woke all 64 waiters and each asked Redis again:
/// 35 script calls per acquisition (measured). With it, about two: the winning attempt and the
/// release, since the next waiter in line asks nothing until a release names its process's
/// place (without that it would ask at once and be refused: one more per acquisition). Default
/// mode adds the first attempts of the 64 tasks starting at once (measured: 3.0 and 2.0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_one_waiter_per_process() {
    let server = RedisServer::start();
    let locker = patient_locker(&server);
    for (mode, options, most) in [
        ("default", LockOptions::new(), 3.5),
        ("fair", LockOptions::new().fair(), 2.5),
    ] {
        let key = unique_key("hot");
        acquire_and_release(&locker, &key).await;
        let before = server.calls("evalsha");
        assert_eq!(
            contend(&locker, &key, &options, WAITERS).await,
            WAITERS,
            "{mode}: holders overlapped"
        );
        let per_acquisition = (server.calls("evalsha") - before) as f64 / WAITERS as f64;
        assert!(
            per_acquisition <= most,
            "{mode}: {per_acquisition:.1} script calls per acquisition: releases woke the herd"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_backend_serves_a_hot_key_in_line_too() {
    let locker = Locker::builder()
        .memory()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let key = unique_key("hot");
    assert_eq!(
        contend(&locker, &key, &LockOptions::new(), WAITERS).await,
        WAITERS
    );
    assert_eq!(
        contend(&locker, &key, &LockOptions::new().fair(), WAITERS).await,
        WAITERS
    );
}

/// Waiters dropped at random points (while first in line, while behind others, while asking
/// the server) leave their place at once and never a lock behind: the rest get through in
/// turn, the counter is exact, and the key is free at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiters_leave_their_place_and_no_lock() {
    let server = RedisServer::start();
    let locker = patient_locker(&server);
    for options in [LockOptions::new(), LockOptions::new().fair()] {
        let key = unique_key("cancelled");
        let counter = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = (0..WAITERS)
            .map(|i| {
                let (locker, key, options) = (locker.clone(), key.clone(), options.clone());
                let (counter, done) = (counter.clone(), done.clone());
                tokio::spawn(async move {
                    let wait = locker.acquire(&key, options);
                    let guard = if i % 3 == 0 {
                        // Gives up somewhere in its wait: 0 to 189ms in.
                        match tokio::time::timeout(Duration::from_millis(i * 3), wait).await {
                            Ok(guard) => guard.unwrap(),
                            Err(_) => return,
                        }
                    } else {
                        wait.await.unwrap()
                    };
                    racy_increment(&counter).await;
                    guard.release().await.unwrap();
                    done.fetch_add(1, Ordering::SeqCst);
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(
            counter.load(Ordering::SeqCst),
            done.load(Ordering::SeqCst),
            "holders overlapped"
        );
        assert!(done.load(Ordering::SeqCst) >= WAITERS * 2 / 3);
        assert!(
            server
                .gone_within(&format!("dlock:{key}"), Duration::from_secs(2))
                .await,
            "a cancelled waiter left a lock"
        );
        let again = locker
            .try_acquire(&key, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(again.is_some(), "the key is free once everyone left");
    }
}

/// Two processes, each one locker with 32 waiters of one key (a quarter of them giving up in
/// their second wait), in default and in fair mode: the counter is exact, the key and its queue
/// are empty at the end, and the server ran about two scripts per acquisition (the winning
/// attempt and the release, plus the polls that keep a place alive). A release that woke every
/// local waiter (or every process's) would cost several times as many.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn across_two_processes_a_release_wakes_one_waiter() {
    const PER_PROCESS: u64 = 32;
    let server = RedisServer::start();
    for mode in ["hot", "hot-fair"] {
        let key = unique_key("hot2");
        let before = server.calls("evalsha");
        let workers: Vec<_> = (0..2)
            .map(|_| {
                std::process::Command::new(env!("CARGO_BIN_EXE_dlock-worker"))
                    .args([&server.url(), &key, &PER_PROCESS.to_string(), mode])
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let mut made = 0u64;
        for worker in workers {
            let out = worker.wait_with_output().unwrap();
            assert!(out.status.success(), "{mode}: a worker failed");
            let out = String::from_utf8(out.stdout).unwrap();
            made += out
                .trim()
                .strip_prefix("done ")
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("{mode}: worker said {out:?}"));
        }
        let counted: u64 = redis::Commands::get(
            &mut server.client().get_connection().unwrap(),
            format!("{key}:counter"),
        )
        .unwrap();
        assert_eq!(counted, made, "{mode}: holders overlapped");
        // 3 of 4 rounds are never given up.
        assert!(
            made >= 2 * PER_PROCESS * 4 * 7 / 8,
            "{mode}: only {made} made"
        );
        #[allow(clippy::cast_precision_loss)]
        let per_acquisition = (server.calls("evalsha") - before) as f64 / made as f64;
        eprintln!("{mode}: {per_acquisition:.2} script calls per acquisition");
        assert!(
            per_acquisition <= 3.5,
            "{mode}: {per_acquisition:.2} script calls per acquisition: releases woke a herd"
        );
        for left in [
            format!("dlock:{key}"),
            format!("dlock:__fair:{{dlock:{key}}}:queue"),
        ] {
            assert!(
                server.gone_within(&left, Duration::from_secs(5)).await,
                "{mode}: {left} left behind"
            );
        }
    }
}
