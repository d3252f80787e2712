//! Shared pieces of the example programs, kept in a library so the integration tests can run the
//! very same code in separate processes:
//!
//! - [`orders`]: the axum order service of `examples/axum_orders.rs` (its `#[dlock]` handlers);
//! - [`throwaway`]: a `redis-server` on a free loopback port, stopped when dropped;
//! - [`http`]: a tiny HTTP/1.1 client over a `TcpStream`, enough to call that service.
//!
//! Run the programs with `cargo run --example oversell`, `--example axum_orders` and
//! `--example service`; `scripts/run-examples` runs each once.
#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

pub mod http;
pub mod orders;
pub mod throwaway;

/// A Redis URL fit for printing: any `user:password@` part is replaced by `***@`
/// ([`dlock_runtime::RedisUrl`]'s `Display`); a URL that is not a Redis URL is not shown at all.
///
/// ```
/// assert_eq!(
///     dlock_examples::redact_url("redis://app:s3cret@cache:6379/0"),
///     "redis://***@cache:6379/0"
/// );
/// assert_eq!(dlock_examples::redact_url("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
/// ```
#[must_use]
pub fn redact_url(url: &str) -> String {
    url.parse::<dlock_runtime::RedisUrl>()
        .map_or_else(|_| "***".to_owned(), |url| url.to_string())
}
