//! `rediss://` (feature `tls`): a real redis-server with a TLS port and a certificate from a
//! fresh CA. The client runs as a child process (`dlock-env-check`) so that `SSL_CERT_FILE` — how
//! rustls' native roots learn of a private CA — and the `DLOCK_*` variables are its own.
#![cfg(feature = "tls")]

use dlock_tests::RedisServer;
use dlock_tests::resp;

fn env_check(url: &str, ca: Option<&std::path::Path>) -> String {
    dlock_tests::env_check(
        env!("CARGO_BIN_EXE_dlock-env-check"),
        &[
            ("DLOCK_REDIS_URL", url),
            ("DLOCK_TIMEOUT", "2s"),
            ("DLOCK_REQUEST_TIMEOUT", "500ms"),
        ],
        ca,
    )
}

#[test]
fn locks_over_tls_with_a_trusted_ca() {
    let server = RedisServer::start_tls();
    let out = env_check(&server.tls_url(), Some(&server.ca_file()));
    assert!(out.starts_with("ok "), "{out}");
    assert!(out.contains("rediss://localhost:"), "{out}");
    // The lock went through the TLS port: the plain port's server holds the same keyspace.
    let fences: Vec<String> = server
        .command(&["KEYS", "dlock:__fence:*"])
        .ok()
        .as_ref()
        .and_then(resp::items)
        .map(|keys| keys.iter().filter_map(resp::text).collect())
        .unwrap_or_default();
    assert_eq!(fences.len(), 1, "no fencing counter was written over TLS");
}

#[test]
fn an_untrusted_certificate_is_a_backend_error_without_secrets() {
    let server = RedisServer::start_tls();
    let url = server
        .tls_url()
        .replace("rediss://", "rediss://user:hunter2@");
    let out = env_check(&url, None);
    assert!(out.starts_with("error lock backend error"), "{out}");
    assert!(!out.contains("hunter2"), "{out}");
}
