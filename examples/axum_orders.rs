//! An HTTP order service whose handlers are locked with `#[dlock]`: run several instances on one
//! Redis and no item is ever sold twice.
//!
//! ```text
//! redis-server --port 6379 --save "" &              # or point DLOCK_REDIS_URL at yours
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
//! Configuration: the lock client is `Locker::from_env()` (`DLOCK_REDIS_URL` or `REDIS_URL`,
//! `DLOCK_KEY_PREFIX`, …, see dlock-runtime's docs), the stock is kept in the same Redis. The
//! port comes from `--port` or `PORT` (default 3000; `0` picks a free one); the program prints
//! `listening on 127.0.0.1:<port>` once it accepts connections. Logs go to stderr
//! (`RUST_LOG=debug` shows each lock acquisition).

use std::process::ExitCode;

use dlock_examples::orders::{self, AppState};
use tracing_subscriber::EnvFilter;

const USAGE: &str = "usage: axum_orders [--port <port>]   (or PORT=<port>; default 3000)";

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();

    let port = match port() {
        Ok(port) => port,
        Err(message) => {
            eprintln!("axum_orders: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
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

/// `--port N` (or `--port=N`), else `PORT`, else 3000.
fn port() -> Result<u16, String> {
    let mut args = std::env::args().skip(1);
    let mut port = std::env::var("PORT").ok();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--port" => port = Some(args.next().ok_or("--port needs a value")?),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            _ => match arg.strip_prefix("--port=") {
                Some(value) => port = Some(value.to_owned()),
                None => return Err(format!("unknown argument `{arg}`")),
            },
        }
    }
    port.map_or(Ok(3000), |p| {
        p.parse().map_err(|_| format!("invalid port `{p}`"))
    })
}
