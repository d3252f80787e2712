//! The order service of `examples/axum_orders.rs` (`dlock_examples::orders`) as a binary of this
//! crate, so `tests/axum.rs` can run it as separate processes (`CARGO_BIN_EXE_dlock-orders`).
//!
//! `dlock-orders`: configured from the environment (`DLOCK_REDIS_URL`, …), listens on
//! `127.0.0.1:$PORT` (`0`, the default here, picks a free port) and prints
//! `listening on 127.0.0.1:<port>` once it accepts connections.

use std::process::ExitCode;

use dlock_examples::orders::{AppState, serve};

#[tokio::main]
async fn main() -> ExitCode {
    let port: u16 = match std::env::var("PORT").map(|p| p.parse()) {
        Ok(Ok(port)) => port,
        Ok(Err(_)) => {
            eprintln!("dlock-orders: PORT is not a port number");
            return ExitCode::from(2);
        }
        Err(_) => 0,
    };
    let result = async {
        let state = AppState::from_env().await?;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        serve(listener, state).await?;
        Ok::<(), Box<dyn std::error::Error>>(())
    };
    match result.await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dlock-orders: {e}");
            ExitCode::FAILURE
        }
    }
}
