//! Shared pieces of the example programs, kept in a library so the integration tests can run the
//! very same code in separate processes:
//!
//! - [`orders`]: the axum order service of `examples/axum_orders.rs` (its `#[dlock]` handlers);
//!
//! Run the programs with `cargo run --example oversell`, `--example axum_orders`,
//! `--example service` and `--example bench`; `scripts/run-examples` runs each once.
#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

pub mod orders;

/// An engine URL fit for printing ([`dlock_runtime::EngineUrl`]'s `Display`: the credentials
/// are replaced by `***`); a URL no engine of this build reads is not shown at all.
///
/// ```
/// assert_eq!(
///     dlock_examples::redact_url("redis://app:s3cret@cache:6379/0"),
///     "redis://***@cache:6379/0"
/// );
/// assert_eq!(dlock_examples::redact_url("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
/// assert_eq!(
///     dlock_examples::redact_url("redis+cluster://app:s3cret@h1:7000,h2:7001"),
///     "redis+cluster://***@h1:7000,h2:7001"
/// );
/// assert_eq!(
///     dlock_examples::redact_url("postgres://app:s3cret@db/shop"),
///     "postgres://***@db/shop"
/// );
/// assert_eq!(dlock_examples::redact_url("zk://h1:2181,h2:2181/app"), "zk://h1:2181,h2:2181/app");
/// assert_eq!(dlock_examples::redact_url("http://app:s3cret@h1"), "***");
/// ```
#[must_use]
pub fn redact_url(url: &str) -> String {
    url.parse::<dlock_runtime::EngineUrl>()
        .map_or_else(|_| "***".to_owned(), |url| url.to_string())
}
