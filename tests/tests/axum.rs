//! The axum order service (`examples/axum_orders.rs`, router in `dlock_examples::orders`) run as
//! three separate OS processes on one Redis, called over real TCP: the `#[dlock]` handlers sell
//! exactly the stock, and the try-lock endpoint answers `409 Conflict` with `Retry-After` and a
//! body that gives nothing internal away.
#![cfg(feature = "axum")]

use std::{
    io::{BufRead as _, BufReader},
    process::{Child, Command, Stdio},
    time::Duration,
};

use dlock_examples::orders::orders_key;
use dlock_runtime::LockOptions;
use dlock_testkit::http::{Response, request};
use dlock_tests::{RedisServer, unique_key};
use redis::Commands as _;

/// One `dlock-orders` process, killed on drop.
struct Service {
    child: Child,
    addr: String,
}

impl Service {
    /// Starts the service on a free port against `redis`, with no other `DLOCK_*` setting from
    /// the test's environment, and waits until it listens.
    fn start(redis: &RedisServer) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_dlock-orders"));
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("DLOCK_") {
                command.env_remove(&name);
            }
        }
        let mut child = command
            .env_remove("REDIS_URL")
            .env("DLOCK_REDIS_URL", redis.url())
            .env("PORT", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start dlock-orders");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped stdout"))
            .read_line(&mut line)
            .expect("read dlock-orders' first line");
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("dlock-orders did not start: first line {line:?}"))
            .to_owned();
        Self { child, addr }
    }

    async fn call(&self, method: &str, path: &str) -> Response {
        request(&self.addr, method, path)
            .await
            .unwrap_or_else(|e| panic!("{method} {path} on {}: {e}", self.addr))
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A sku no other test uses, fit for a URL path.
fn sku() -> String {
    unique_key("tee").replace(':', "-")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_sell_exactly_the_stock_to_a_hundred_concurrent_orders() {
    let redis = RedisServer::start();
    let services: Vec<Service> = (0..3).map(|_| Service::start(&redis)).collect();
    let sku = sku();
    let seeded = services[0].call("PUT", &format!("/stock/{sku}/20")).await;
    assert_eq!(seeded.status, 200, "seeding: {seeded:?}");

    let mut orders = tokio::task::JoinSet::new();
    for i in 0..100 {
        let addr = services[i % 3].addr.clone();
        let path = format!("/orders/{sku}");
        orders.spawn(async move { request(&addr, "POST", &path).await });
    }
    let (mut created, mut sold_out, mut other) = (0, 0, Vec::new());
    for response in orders.join_all().await {
        let response = response.expect("an order request");
        match response.status {
            201 => created += 1,
            422 if response.body.trim() == "sold out" => sold_out += 1,
            _ => other.push(response),
        }
    }
    assert!(other.is_empty(), "unexpected answers: {other:?}");
    assert_eq!((created, sold_out), (20, 80));

    let stock = services[1].call("GET", &format!("/stock/{sku}")).await;
    assert_eq!((stock.status, stock.body.trim()), (200, "0"));
    let recorded: u64 = redis.client().llen(orders_key(&sku)).expect("LLEN");
    assert_eq!(recorded, 20, "orders recorded in the store");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_endpoint_answers_409_with_retry_after_while_the_lock_is_held() {
    let redis = RedisServer::start();
    let service = Service::start(&redis);
    let sku = sku();
    assert_eq!(
        service.call("PUT", &format!("/stock/{sku}/5")).await.status,
        200
    );

    // Another client of the same Redis holds the very lock the handlers take.
    let locker = redis.locker();
    let guard = locker
        .acquire(
            &format!("stock:{sku}"),
            LockOptions::new()
                .timeout(Duration::from_secs(2))
                .expire(Duration::from_secs(30)),
        )
        .await
        .expect("hold the lock");
    assert_eq!(guard.key(), format!("dlock:stock:{sku}"));

    let busy = service.call("POST", &format!("/orders/{sku}/now")).await;
    assert_eq!(busy.status, 409, "{busy:?}");
    let retry_after: u64 = busy
        .header("retry-after")
        .unwrap_or_else(|| panic!("no Retry-After: {busy:?}"))
        .parse()
        .expect("Retry-After in seconds");
    assert!(retry_after >= 1);
    for secret in [
        sku.as_str(),
        "dlock",
        "stock:",
        "redis",
        "127.0.0.1",
        &redis.port().to_string(),
    ] {
        assert!(
            !busy.body.contains(secret),
            "the 409 body gives away {secret:?}: {:?}",
            busy.body
        );
    }
    for (name, value) in &busy.headers {
        assert!(
            !value.contains(&sku) && !value.contains("dlock:"),
            "header {name}: {value}"
        );
    }

    // The waiting endpoint waits for the holder instead, then sells.
    let waiting = {
        let (addr, path) = (service.addr.clone(), format!("/orders/{sku}"));
        tokio::spawn(async move { request(&addr, "POST", &path).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "the order did not wait for the lock"
    );
    let stock = service.call("GET", &format!("/stock/{sku}")).await;
    assert_eq!(
        stock.body.trim(),
        "5",
        "nothing sold while the lock was held"
    );

    guard.release().await.expect("release");
    let sold = waiting.await.expect("join").expect("order");
    assert_eq!(sold.status, 201, "{sold:?}");
    let now = service.call("POST", &format!("/orders/{sku}/now")).await;
    assert_eq!(now.status, 201, "{now:?}");
    let stock = service.call("GET", &format!("/stock/{sku}")).await;
    assert_eq!(stock.body.trim(), "3");

    // What the service recorded, as Prometheus reads it: labelled by the template, never the sku.
    let metrics = service.call("GET", "/metrics").await;
    assert_eq!(metrics.status, 200, "{metrics:?}");
    let body = &metrics.body;
    assert!(!body.contains(&sku), "a sku in the metrics:\n{body}");
    let series = |line: &str| {
        body.lines()
            .find_map(|l| l.strip_prefix(line)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no `{line}` in:\n{body}"))
            .to_owned()
    };
    let lock = r#"lock="stock:<sku>""#;
    // The seed, the order that waited, the order that came after: acquired; the 409: timeout.
    assert_eq!(
        series(&format!(
            r#"dlock_acquisitions_total{{{lock},outcome="acquired"}}"#
        )),
        "3"
    );
    assert_eq!(
        series(&format!(
            r#"dlock_acquisitions_total{{{lock},outcome="timeout"}}"#
        )),
        "1"
    );
    assert_eq!(series(&format!("dlock_held{{{lock}}}")), "0");
    assert_eq!(series(&format!("dlock_waiting{{{lock}}}")), "0");
    assert_eq!(series(&format!("dlock_hold_seconds_count{{{lock}}}")), "3");
    // The order that waited for the test's lock waited 300ms or more; the other two did not.
    let waited = |le: &str| {
        series(&format!(
            r#"dlock_wait_seconds_bucket{{{lock},outcome="acquired",le="{le}"}}"#
        ))
    };
    assert_eq!((waited("0.25"), waited("+Inf")), ("2".into(), "3".into()));
    assert!(body.contains("# HELP dlock_acquisitions_total "), "{body}");
}
