//! The `metrics` feature against a real Redis: every outcome of an acquisition is counted under
//! the lock's name (never its key), the held and waiting gauges come back to zero, the wait and
//! hold histograms get one value per acquisition and hold, and losses, failed renewals and
//! passes are counted. (The Prometheus text of the axum example is read by `tests/axum.rs`.)

use std::{
    collections::HashMap,
    sync::{Mutex, OnceLock},
    time::Duration,
};

use dlock_runtime::{LockError, LockOptions, Locker};
use dlock_tests::{RedisServer, free_port, proxy::Proxy, unique_key};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// The process's recorder (installed once), what its snapshots added up to, and the turn of
/// the tests that read it.
struct Recorder {
    snapshotter: Snapshotter,
    /// A snapshot drains the counters, gauges and histograms it reads: their sums, by series.
    totals: Mutex<HashMap<SeriesKey, Total>>,
    turn: tokio::sync::Mutex<()>,
}

/// A series' name and labels.
type SeriesKey = (String, Vec<(String, String)>);

/// A series so far: a counter's or a gauge's sum, or a histogram's values.
#[derive(Clone, Debug)]
enum Total {
    Sum(f64),
    Values(Vec<f64>),
}

fn recorder() -> &'static Recorder {
    static RECORDER: OnceLock<Recorder> = OnceLock::new();
    RECORDER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this test binary");
        Recorder {
            snapshotter,
            totals: Mutex::default(),
            turn: tokio::sync::Mutex::new(()),
        }
    })
}

type Series = Vec<(String, Vec<String>, Total)>;

/// The series of `lock` so far: `(name, other labels as "k=v", total)`; panics when any series
/// carries `key` in a label.
fn series(lock: &str, key: &str) -> Series {
    let recorder = recorder();
    let mut totals = recorder.totals.lock().unwrap();
    for (composite, _, _, value) in recorder.snapshotter.snapshot().into_vec() {
        let metric = composite.key();
        let labels: Vec<(String, String)> = metric
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        for (_, v) in &labels {
            assert!(
                !v.contains(key),
                "{} has the key in a label: {v}",
                metric.name()
            );
        }
        let total = totals
            .entry((metric.name().to_owned(), labels))
            .or_insert_with(|| match value {
                DebugValue::Histogram(_) => Total::Values(Vec::new()),
                _ => Total::Sum(0.0),
            });
        match (total, value) {
            (Total::Sum(sum), DebugValue::Counter(n)) => *sum += n as f64,
            (Total::Sum(sum), DebugValue::Gauge(g)) => *sum += g.into_inner(),
            (Total::Values(all), DebugValue::Histogram(values)) => {
                all.extend(values.into_iter().map(|v| v.into_inner()));
            }
            (total, value) => panic!("{total:?} then {value:?}"),
        }
    }
    totals
        .iter()
        .filter(|((_, labels), _)| labels.iter().any(|(k, v)| k == "lock" && v == lock))
        .map(|((name, labels), total)| {
            let others = labels
                .iter()
                .filter(|(k, _)| k != "lock")
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            (name.clone(), others, total.clone())
        })
        .collect()
}

/// The total of `name` with `labels` in `all` (a histogram: its count).
fn value(all: &Series, name: &str, labels: &[&str]) -> f64 {
    match histogram_or_sum(all, name, labels) {
        Some(Total::Sum(sum)) => sum,
        Some(Total::Values(values)) => values.len() as f64,
        None => 0.0,
    }
}

/// The values a histogram got, in seconds.
fn histogram(all: &Series, name: &str, labels: &[&str]) -> Vec<f64> {
    match histogram_or_sum(all, name, labels) {
        Some(Total::Values(values)) => values,
        _ => Vec::new(),
    }
}

fn histogram_or_sum(all: &Series, name: &str, labels: &[&str]) -> Option<Total> {
    all.iter()
        .find(|(n, l, _)| n == name && l.iter().map(String::as_str).eq(labels.iter().copied()))
        .map(|(_, _, total)| total.clone())
}

#[tokio::test]
async fn every_outcome_is_counted_under_the_name_and_the_gauges_return_to_zero() {
    let _turn = recorder().turn.lock().await;
    let server = RedisServer::start();
    let (a, b) = (server.locker(), server.locker());
    let key = unique_key("metered");
    let named = |timeout: u64| {
        LockOptions::new()
            .name("metered:<id>")
            .timeout(Duration::from_millis(timeout))
    };

    let guard = a.acquire(&key, named(1000)).await.unwrap();
    let now = series("metered:<id>", &key);
    assert_eq!(value(&now, "dlock_held", &[]), 1.0, "{now:?}");
    // Busy: a wait of 200ms that times out, and one dropped while it waits.
    let err = b.acquire(&key, named(200)).await.unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    let waiting = tokio::spawn({
        let (b, key) = (b.clone(), key.clone());
        async move { b.acquire(&key, named(10_000)).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let now = series("metered:<id>", &key);
    assert_eq!(value(&now, "dlock_waiting", &[]), 1.0, "{now:?}");
    waiting.abort();
    let _ = waiting.await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    guard.release().await.unwrap();

    // An engine that is not there: an error at the deadline.
    let nowhere = Locker::builder()
        .redis_url(format!("redis://127.0.0.1:{}", free_port()))
        .build()
        .unwrap();
    assert!(nowhere.acquire(&key, named(300)).await.is_err());
    // A closed locker.
    a.close().await.unwrap();
    let err = a.acquire(&key, named(300)).await.unwrap_err();
    assert!(matches!(err, LockError::Closed { .. }), "{err}");
    // Unnamed: its own series.
    let guard = b.acquire(&key, LockOptions::new()).await.unwrap();
    guard.release().await.unwrap();

    let all = series("metered:<id>", &key);
    for (outcome, n) in [
        ("acquired", 1.0),
        ("timeout", 1.0),
        ("cancelled", 1.0),
        ("error", 1.0),
        ("closed", 1.0),
    ] {
        let label = format!("outcome={outcome}");
        assert_eq!(
            value(&all, "dlock_acquisitions_total", &[&label]),
            n,
            "{outcome}: {all:?}"
        );
        assert_eq!(value(&all, "dlock_wait_seconds", &[&label]), n, "{outcome}");
    }
    let timed_out = histogram(&all, "dlock_wait_seconds", &["outcome=timeout"]);
    assert!(timed_out[0] >= 0.2, "{timed_out:?}");
    assert_eq!(value(&all, "dlock_held", &[]), 0.0);
    assert_eq!(value(&all, "dlock_waiting", &[]), 0.0);
    // The hold lasted from its acquisition past the waits of 200ms and the 700ms of the drop.
    let held = histogram(&all, "dlock_hold_seconds", &[]);
    assert!(held.len() == 1 && held[0] >= 0.9, "{held:?}");
    let unnamed = series("unnamed", &key);
    assert_eq!(
        value(&unnamed, "dlock_acquisitions_total", &["outcome=acquired"]),
        1.0,
        "{unnamed:?}"
    );
    assert_eq!(value(&unnamed, "dlock_held", &[]), 0.0);
}

#[tokio::test]
async fn failed_renewals_losses_and_passes_are_counted() {
    let _turn = recorder().turn.lock().await;
    let server = RedisServer::start();

    // A renewed lease of 3s (renewed each second, each renewal bounded by the 500ms request
    // timeout) through a proxy that stops forwarding: the renewals fail, then
    // the lease runs out on the client's clock.
    let proxy = Proxy::start(server.port());
    let cut_off = Locker::builder()
        .redis_url(format!("redis://127.0.0.1:{}", proxy.port()))
        .expire(Duration::from_secs(3))
        .build()
        .unwrap();
    let key = unique_key("renewed");
    let options = LockOptions::new().name("renewed").expire_auto();
    let guard = cut_off.acquire(&key, options).await.unwrap();
    proxy.cut();
    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the hold was lost within 10s");
    let all = series("renewed", &key);
    assert!(
        value(&all, "dlock_renewals_failed_total", &[]) >= 1.0,
        "{all:?}"
    );
    assert_eq!(value(&all, "dlock_lost_total", &[]), 1.0, "{all:?}");
    drop(guard);
    proxy.heal();

    // Ten tasks of one locker on one key: releases pass the lock to the next of them.
    let locker = server.locker();
    let key = unique_key("passed");
    let options = LockOptions::new()
        .name("passed")
        .timeout(Duration::from_secs(10));
    assert_eq!(dlock_tests::contend(&locker, &key, &options, 10).await, 10);
    let all = series("passed", &key);
    assert_eq!(
        value(&all, "dlock_acquisitions_total", &["outcome=acquired"]),
        10.0,
        "{all:?}"
    );
    assert_eq!(value(&all, "dlock_hold_seconds", &[]), 10.0);
    assert!(value(&all, "dlock_passes_total", &[]) >= 1.0, "{all:?}");
    assert_eq!(value(&all, "dlock_held", &[]), 0.0);
}
