//! An HTTP order service whose handlers are locked with `#[dlock]`: run several instances on one
//! Redis and no item is ever sold twice.
//!
//! ```text
//! redis-server --port 6379 --save "" &              # or point DLOCK_URL at yours
//! cargo run --example axum_orders -- --port 3000    # start more on 3001, 3002, …
//! curl -X PUT  localhost:3000/stock/tee/3           # seed: 3 left
//! curl -X POST localhost:3000/orders/tee            # 201 order 1: 1 x tee, 2 left
//! curl -X POST localhost:3001/orders/tee/now        # try-lock: 409 + Retry-After when busy
//! curl         localhost:3000/stock/tee             # 2
//! ```
//!
//! The handlers live in `examples/src/orders.rs` (`dlock_examples::orders`), so the integration
//! test `tests/tests/axum.rs` can run this same router in three separate processes; the one
//! that takes the order is:
//!
//! ```ignore
//! #[dlock(key = "stock:<sku>", client = &state.locks, timeout = "5s", expire = "10s")]
//! async fn order(State(state): State<AppState>, Path(sku): Path<String>)
//!     -> Result<Response, OrderError> { … }
//! ```
//!
//! Configuration: the lock client is `Locker::from_env()` (`DLOCK_URL`, any engine, and
//! `DLOCK_KEY_PREFIX`, …; see dlock-runtime's docs); the stock is kept in Redis: `STOCK_URL`,
//! else the `DLOCK_URL` when it names one Redis server, else `DLOCK_REDIS_URL` / `REDIS_URL`, else
//! `redis://127.0.0.1:6379`. `GET /health` is the readiness probe: it pings the lock engine
//! (`Locker::ping`). The port comes from `--port` or `PORT` (default 3000; `0` picks a free one);
//! the program prints `listening on 127.0.0.1:<port>` once it accepts connections. Logs go to
//! stderr (`RUST_LOG=debug` shows each lock acquisition). On Ctrl-C or SIGTERM it drains its
//! requests and closes the locker, leaving nothing in the engine.

use std::process::ExitCode;

use dlock_examples::orders::{self, AppState};
use tracing_subscriber::EnvFilter;

/// The service's arguments (`--help` prints them).
#[derive(Debug, clap::Parser)]
#[command(
    name = "axum_orders",
    about = "An HTTP order service whose handlers are locked with #[dlock]."
)]
struct Args {
    /// The port to listen on, on 127.0.0.1 (0 picks a free one).
    #[arg(long, env = "PORT", default_value_t = 3000)]
    port: u16,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();

    let port = <Args as clap::Parser>::parse().port;
    let state = match AppState::from_env().await {
        Ok(state) => state,
        Err(e) => {
            eprintln!(
                "axum_orders: {e}\n(stock store: {})",
                dlock_examples::redact_url(&orders::store_url())
            );
            return ExitCode::FAILURE;
        }
    };
    let listener = match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("axum_orders: cannot listen on 127.0.0.1:{port}: {e}");
            return ExitCode::FAILURE;
        }
    };
    match orders::serve(listener, state).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("axum_orders: {e}");
            ExitCode::FAILURE
        }
    }
}
