//! The order service of `examples/axum_orders.rs`: axum handlers locked with `#[dlock]`.
//!
//! | route | what it does |
//! | --- | --- |
//! | `POST /orders/{sku}` | waits up to 5s for the lock on `stock:<sku>`, then sells one: `201`, or `422 sold out`, or `404` for an unknown sku |
//! | `POST /orders/{sku}/now` | the same with a single attempt: `409 Conflict` + `Retry-After` while another order holds the lock |
//! | `GET /stock/{sku}` | the stock left |
//! | `PUT /stock/{sku}/{n}` | sets the stock to `n` and forgets the orders (under the same lock) |
//! | `GET /health` | readiness: `200 ok` when the lock engine answers a ping, else `503` |
//! | `GET /metrics` | the process's metrics in Prometheus' text format: dlock's (acquisitions by outcome, wait and hold times, held and waiting locks, losses, …), labelled by the key template `stock:<sku>`, never by a sku |
//!
//! The stock lives in Redis and is updated with a plain `GET` then `SET` — not atomic on purpose:
//! the lock is what keeps two instances of the service from selling the same item twice. A lock
//! failure is answered by `LockError`'s own `IntoResponse` (feature `axum` of dlock-runtime):
//! `409` with `Retry-After` when busy, `503` when the lock service is down, with bodies that carry
//! no key, prefix or URL.

use std::{fmt, sync::OnceLock, time::Duration};

use axum::{
    Router,
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post, put},
};
use dlock_runtime::{LockError, Locker, dlock};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use redis::AsyncCommands as _;

/// What every handler gets: the lock client and the stock store.
#[derive(Clone)]
#[non_exhaustive]
pub struct AppState {
    /// The lock client (`Locker::from_env()`: `DLOCK_URL`, `DLOCK_KEY_PREFIX`, …).
    pub locks: Locker,
    /// The stock store: a Redis connection, re-established by itself when dropped.
    pub store: redis::aio::ConnectionManager,
}

impl fmt::Debug for AppState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AppState")
            .field("locks", &self.locks)
            .finish_non_exhaustive()
    }
}

/// Why building the state failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum StartError {
    /// The `DLOCK_*` configuration is invalid.
    Lock(LockError),
    /// The stock store could not be reached.
    Store(redis::RedisError),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Lock(e) => write!(f, "{e}"),
            Self::Store(e) => write!(f, "cannot reach the stock store (Redis): {e}"),
        }
    }
}

impl std::error::Error for StartError {}

impl AppState {
    /// The lock client from the environment (`Locker::from_env()`, no I/O) and a connection to
    /// the stock store at [`store_url`]; installs the process's metrics recorder
    /// ([`metrics_handle`]) first, so that the locks' metrics are recorded from the start.
    ///
    /// # Errors
    /// An invalid `DLOCK_*` variable, or a stock store that cannot be reached.
    pub async fn from_env() -> Result<Self, StartError> {
        metrics_handle();
        let locks = Locker::from_env().map_err(StartError::Lock)?;
        let url = store_url();
        let client = redis::Client::open(url.as_str()).map_err(StartError::Store)?;
        let store = client
            .get_connection_manager()
            .await
            .map_err(StartError::Store)?;
        Ok(Self { locks, store })
    }
}

/// Where the stock lives: `STOCK_URL`, else the `DLOCK_URL` when it names one Redis server,
/// else `DLOCK_REDIS_URL`, else `REDIS_URL`, else `redis://127.0.0.1:6379`.
#[must_use]
pub fn store_url() -> String {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let lock_url = var("DLOCK_URL").filter(|url| {
        url.parse::<dlock_runtime::EngineUrl>()
            .is_ok_and(|u| u.engine() == "redis")
    });
    var("STOCK_URL")
        .or(lock_url)
        .or_else(|| var("DLOCK_REDIS_URL"))
        .or_else(|| var("REDIS_URL"))
        .unwrap_or_else(|| dlock_runtime::DEFAULT_REDIS_URL.to_owned())
}

/// The service's routes.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/orders/{sku}", post(order))
        .route("/orders/{sku}/now", post(order_now))
        .route("/stock/{sku}", get(stock))
        .route("/stock/{sku}/{n}", put(seed))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .with_state(state)
}

/// Prints `listening on <addr>` once the listener is bound, then serves until Ctrl-C or SIGTERM.
///
/// # Errors
/// When accepting connections fails.
pub async fn serve(listener: tokio::net::TcpListener, state: AppState) -> std::io::Result<()> {
    let addr = listener.local_addr()?;
    println!("listening on {addr}");
    tracing::info!(%addr, "order service ready");
    let locks = state.locks.clone();
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    // The requests have drained: release what is left and end the engine's session or leases,
    // so this instance leaves nothing behind.
    locks.close().await.map_err(std::io::Error::other)
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("install a SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutting down");
}

/// Sells one `sku`, waiting up to 5s for the lock. Every instance of the service that orders the
/// same `sku` runs this body one at a time; other skus run beside it.
#[dlock(key = "stock:<sku>", client = &state.locks, timeout = "5s", expire = "10s")]
async fn order(
    State(state): State<AppState>,
    Path(sku): Path<String>,
) -> Result<Response, OrderError> {
    sell_one(&state, &sku).await
}

/// Sells one `sku` if nobody else is ordering it right now: one attempt (`timeout = "0s"`), and a
/// busy lock becomes `409 Conflict` with `Retry-After` through `LockError: IntoResponse`.
#[dlock(key = "stock:<sku>", client = &state.locks, timeout = "0s", expire = "10s")]
async fn order_now(
    State(state): State<AppState>,
    Path(sku): Path<String>,
) -> Result<Response, OrderError> {
    sell_one(&state, &sku).await
}

/// Sets the stock of `sku` to `n` and forgets its orders, under the same lock as the orders so
/// it never lands in the middle of one.
#[dlock(key = "stock:<sku>", client = &state.locks)]
async fn seed(
    State(state): State<AppState>,
    Path((sku, n)): Path<(String, u64)>,
) -> Result<Response, OrderError> {
    let mut store = state.store.clone();
    let () = store.set(stock_key(&sku), n).await?;
    let _: u64 = store.del(orders_key(&sku)).await?;
    tracing::info!(sku, stock = n, "stock set");
    Ok((StatusCode::OK, format!("stock of {sku} set to {n}\n")).into_response())
}

/// The stock left (a plain read: no lock needed to look).
async fn stock(
    State(state): State<AppState>,
    Path(sku): Path<String>,
) -> Result<Response, OrderError> {
    let left: Option<u64> = state.store.clone().get(stock_key(&sku)).await?;
    Ok(match left {
        Some(n) => (StatusCode::OK, format!("{n}\n")).into_response(),
        None => unknown_sku(),
    })
}

/// The Prometheus recorder of this process, installed on first use (dlock records through the
/// `metrics` facade with dlock-runtime's `metrics` feature; the exporter renders what it got).
/// Wait and hold times are histograms with buckets from 1ms to 30s.
///
/// # Panics
/// When another global `metrics` recorder was installed first.
pub fn metrics_handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let handle = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Suffix("_seconds".to_owned()),
                &[
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    30.0,
                ],
            )
            .expect("non-empty buckets")
            .install_recorder()
            .expect("no other metrics recorder installed");
        dlock_runtime::describe_metrics();
        handle
    })
}

/// `GET /metrics`: Prometheus' text format.
async fn metrics() -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        metrics_handle().render(),
    )
        .into_response()
}

/// Readiness: the lock engine answers a ping (with these credentials), within two request
/// timeouts. The body says nothing of the engine.
async fn health(State(state): State<AppState>) -> Response {
    match state.locks.ping().await {
        Ok(_) => (StatusCode::OK, "ok\n").into_response(),
        Err(error) => {
            tracing::warn!(error = %error, "readiness: the lock engine did not answer");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "lock service unavailable\n",
            )
                .into_response()
        }
    }
}

/// Read, think, write: a lost update waiting to happen without the lock.
async fn sell_one(state: &AppState, sku: &str) -> Result<Response, OrderError> {
    let mut store = state.store.clone();
    let left: Option<u64> = store.get(stock_key(sku)).await?;
    let Some(left) = left else {
        return Ok(unknown_sku());
    };
    if left == 0 {
        return Ok((StatusCode::UNPROCESSABLE_ENTITY, "sold out\n").into_response());
    }
    // The payment check: while it runs, another request could read the same stock.
    tokio::time::sleep(Duration::from_millis(2)).await;
    let () = store.set(stock_key(sku), left - 1).await?;
    let id: u64 = store.incr(ORDER_SEQ, 1).await?;
    let _: u64 = store.rpush(orders_key(sku), id).await?;
    tracing::info!(
        sku,
        order = id,
        left = left - 1,
        fencing_token = dlock_runtime::fencing_token(),
        "order placed"
    );
    Ok((
        StatusCode::CREATED,
        format!("order {id}: 1 x {sku}, {} left\n", left - 1),
    )
        .into_response())
}

fn unknown_sku() -> Response {
    (StatusCode::NOT_FOUND, "unknown sku\n").into_response()
}

const ORDER_SEQ: &str = "shop:order-seq";

/// The Redis key holding the stock of `sku`.
#[must_use]
pub fn stock_key(sku: &str) -> String {
    format!("shop:stock:{sku}")
}

/// The Redis list of the order ids placed for `sku`.
#[must_use]
pub fn orders_key(sku: &str) -> String {
    format!("shop:orders:{sku}")
}

/// A handler's failure.
#[derive(Debug)]
#[non_exhaustive]
pub enum OrderError {
    /// The lock could not be had (busy, or the lock service is down).
    Lock(LockError),
    /// The stock store failed.
    Store(redis::RedisError),
}

impl From<LockError> for OrderError {
    fn from(e: LockError) -> Self {
        Self::Lock(e)
    }
}

impl From<redis::RedisError> for OrderError {
    fn from(e: redis::RedisError) -> Self {
        Self::Store(e)
    }
}

impl IntoResponse for OrderError {
    fn into_response(self) -> Response {
        match self {
            Self::Lock(e) => {
                // The detail goes to the log; the answer carries none.
                if e.is_timeout() {
                    tracing::info!(error = %e, "order refused: busy");
                } else {
                    tracing::error!(error = %e, "order refused");
                }
                e.into_response()
            }
            Self::Store(e) => {
                tracing::error!(error = %e, "stock store failed");
                (StatusCode::SERVICE_UNAVAILABLE, "stock store unavailable\n").into_response()
            }
        }
    }
}
