//! `sslmode=require` on the PostgreSQL engine (feature `tls`): a throwaway cluster with TLS on
//! and a certificate from a fresh CA. The client runs as a child process (`dlock-env-check`) so
//! that `SSL_CERT_FILE` (how rustls' native roots learn of a private CA) and `DLOCK_URL` are its
//! own.
#![cfg(feature = "tls")]

use dlock_tests::PostgresServer;

fn env_check(url: &str, ca: Option<&std::path::Path>) -> String {
    dlock_tests::env_check(
        env!("CARGO_BIN_EXE_dlock-env-check"),
        &[
            ("DLOCK_URL", url),
            ("DLOCK_TIMEOUT", "2s"),
            ("DLOCK_REQUEST_TIMEOUT", "1s"),
        ],
        ca,
    )
}

/// With the CA trusted, the lock is taken over TLS: the server logged the connections as SSL.
#[test]
fn locks_over_verified_tls_with_a_trusted_ca() {
    let server = PostgresServer::start_tls();
    let url = format!(
        "postgres://dlock@localhost:{}/postgres?sslmode=require&application_name=dlock_tls",
        server.port()
    );
    let out = env_check(&url, Some(&server.ca_file()));
    assert!(out.starts_with("ok "), "{out}");
    assert!(out.contains("fence=Some("), "{out}");
    let log = server.log_text();
    let ours: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("connection authorized") && l.contains("application_name=dlock_tls"))
        .collect();
    assert!(
        !ours.is_empty(),
        "no connection of the locker was logged:\n{log}"
    );
    assert!(
        ours.iter().all(|l| l.contains("SSL enabled")),
        "a connection went without TLS:\n{}",
        ours.join("\n")
    );
}

/// A certificate from a CA the client does not trust: a `Backend` error, no password shown.
#[test]
fn an_untrusted_certificate_is_a_backend_error_without_secrets() {
    let server = PostgresServer::start_tls();
    let url = format!(
        "postgres://dlock:hunter2@localhost:{}/postgres?sslmode=require",
        server.port()
    );
    let out = env_check(&url, None);
    assert!(out.starts_with("error lock backend error"), "{out}");
    assert!(!out.contains("hunter2"), "{out}");
}
