//! Shared pieces of the example programs, kept in a library so the integration tests can run the
//! very same code in separate processes:
//!
//! - [`orders`]: the axum order service of `examples/axum_orders.rs` (its `#[dlock]` handlers);
//! - [`throwaway`]: throwaway Redis deployments on free loopback ports, stopped when dropped: a
//!   `redis-server`, a Redis Cluster, a master with replicas and sentinels (the test harness
//!   starts its servers with them too);
//! - [`engine`]: the `--engine` flag of `oversell` and `bench`, the deployment it starts, and a
//!   data connection on any engine URL;
//! - [`http`]: a tiny HTTP/1.1 client over a `TcpStream`, enough to call that service.
//!
//! Run the programs with `cargo run --example oversell`, `--example axum_orders`,
//! `--example service` and `--example bench`; `scripts/run-examples` runs each once.
#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

pub mod engine;
pub mod http;
pub mod orders;
pub mod throwaway;

/// A Redis URL fit for printing: any `user:password@` part is replaced by `***@`
/// ([`dlock_runtime::RedisUrl`]'s `Display`, and the same for the multi-host
/// `redis+cluster://`, `redis+sentinel://`, `redis+redlock://`, `etcd://` and `zk://` forms, and
/// [`dlock_runtime::PostgresUrl`]'s for
/// `postgres://`); a URL that is none of these is not shown
/// at all.
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
/// assert_eq!(
///     dlock_examples::redact_url("etcds://app:s3cret@h1:2379,h2:2379"),
///     "etcds://***@h1:2379,h2:2379"
/// );
/// assert_eq!(dlock_examples::redact_url("http://app:s3cret@h1"), "***");
/// ```
#[must_use]
pub fn redact_url(url: &str) -> String {
    let multi_host = [
        "redis+cluster://",
        "redis+sentinel://",
        "redis+redlock://",
        "rediss+cluster://",
        "rediss+sentinel://",
        "rediss+redlock://",
        "etcd://",
        "etcds://",
        "zk://",
    ]
    .iter()
    .find_map(|scheme| Some((*scheme, url.strip_prefix(scheme)?)));
    match multi_host {
        // The password may hold `@`: the hosts start after the last one. A query may hold
        // credentials too: it is left out.
        Some((scheme, rest)) => {
            let (userinfo, hosts) = match rest.rfind('@') {
                Some(at) => ("***@", &rest[at + 1..]),
                None => ("", rest),
            };
            let hosts = hosts.split('?').next().unwrap_or_default();
            format!("{scheme}{userinfo}{hosts}")
        }
        None => url
            .parse::<dlock_runtime::RedisUrl>()
            .map(|url| url.to_string())
            .or_else(|_| {
                url.parse::<dlock_runtime::PostgresUrl>()
                    .map(|url| url.to_string())
            })
            .unwrap_or_else(|_| "***".to_owned()),
    }
}
