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
use dlock_tests::{RedisServer, acquire_and_release, racy_increment, unique_key};

const WAITERS: u64 = 64;

/// 64 tasks of one locker contend for one key, each incrementing a non-atomic counter under the
/// lock; returns the counter.
async fn contend(locker: &Locker, key: &str, options: LockOptions) -> u64 {
    let counter = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (locker, key, counter, options) = (
                locker.clone(),
                key.to_owned(),
                counter.clone(),
                options.clone(),
            );
            tokio::spawn(async move {
                let guard = locker.acquire(&key, options).await.unwrap();
                racy_increment(&counter).await;
                guard.release().await.unwrap();
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    counter.load(Ordering::SeqCst)
}

/// Without the in-process line, each release woke all 64 waiters and each asked Redis again:
/// 35 script calls per acquisition (measured). With it, about three: a refused attempt, the
/// winning one, the release; the bound leaves room for the fallback poll racing the 10ms body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_one_waiter_per_process() {
    let server = RedisServer::start();
    let locker = Locker::builder()
        .redis_url(server.url())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    for (mode, options) in [
        ("default", LockOptions::new()),
        ("fair", LockOptions::new().fair()),
    ] {
        let key = unique_key("hot");
        acquire_and_release(&locker, &key).await;
        let before = server.calls("evalsha");
        assert_eq!(
            contend(&locker, &key, options).await,
            WAITERS,
            "{mode}: holders overlapped"
        );
        let per_acquisition = (server.calls("evalsha") - before) as f64 / WAITERS as f64;
        assert!(
            per_acquisition <= 6.0,
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
    assert_eq!(contend(&locker, &key, LockOptions::new()).await, WAITERS);
    assert_eq!(
        contend(&locker, &key, LockOptions::new().fair()).await,
        WAITERS
    );
}

/// Waiters dropped at random points (while first in line, while behind others, while asking
/// the server) leave their place at once and never a lock behind: the rest get through in
/// turn, the counter is exact, and the key is free at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiters_leave_their_place_and_no_lock() {
    let server = RedisServer::start();
    let locker = Locker::builder()
        .redis_url(server.url())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    for options in [LockOptions::new(), LockOptions::new().fair()] {
        let key = unique_key("cancelled");
        let counter = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = (0..WAITERS)
            .map(|i| {
                let (locker, key, options) = (locker.clone(), key.clone(), options.clone());
                let (counter, done) = (counter.clone(), done.clone());
                tokio::spawn(async move {
                    let work = async {
                        let guard = locker.acquire(&key, options).await.unwrap();
                        racy_increment(&counter).await;
                        guard.release().await.unwrap();
                        done.fetch_add(1, Ordering::SeqCst);
                    };
                    if i % 3 == 0 {
                        // Gives up somewhere in its wait: 0 to 189ms in.
                        let _ = tokio::time::timeout(Duration::from_millis(i * 3), work).await;
                    } else {
                        work.await;
                    }
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
