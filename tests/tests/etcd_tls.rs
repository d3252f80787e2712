//! `etcds://` (features `etcd` and `tls`) with user and password from the URL: a real etcd
//! member with a TLS client port, a certificate from a fresh CA and etcd's auth enabled for a
//! user whose role may read and write `dlock:` only. The client runs as a child process
//! (`dlock-env-check`) so that `SSL_CERT_FILE` and the `DLOCK_*` variables are its own.
#![cfg(feature = "tls")]

use std::process::Command;

use dlock_tests::etcd::EtcdCluster;

fn env_check(url: &str, ca: Option<&std::path::Path>) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_dlock-env-check"));
    for (name, _) in std::env::vars() {
        if name.starts_with("DLOCK_") || name == "REDIS_URL" || name.starts_with("SSL_CERT") {
            command.env_remove(name);
        }
    }
    command
        .env("DLOCK_URL", url)
        .env("DLOCK_TIMEOUT", "2s")
        .env("DLOCK_REQUEST_TIMEOUT", "1s");
    if let Some(ca) = ca {
        command.env("SSL_CERT_FILE", ca);
    }
    let output = command.output().expect("run dlock-env-check");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).unwrap()
}

fn etcdctl(etcd: &EtcdCluster, args: &[&str]) {
    let out = etcd
        .etcdctl()
        .args(["--user", "root:root-pw"])
        .args(args)
        .output()
        .expect("etcdctl not found: install it with `sudo apt-get install -y etcd-client`");
    assert!(out.status.success(), "etcdctl {args:?}: {out:?}");
}

/// The member, with auth on: `root` (password `root-pw`) and `app` (password `app-pw`), whose role
/// reads and writes keys starting with `dlock:`.
fn with_auth() -> EtcdCluster {
    let etcd = EtcdCluster::single_tls();
    let plain = |args: &[&str]| {
        let out = etcd.etcdctl().args(args).output().expect("run etcdctl");
        assert!(out.status.success(), "etcdctl {args:?}: {out:?}");
    };
    plain(&["user", "add", "root:root-pw"]);
    plain(&["user", "grant-role", "root", "root"]);
    plain(&["user", "add", "app:app-pw"]);
    plain(&["role", "add", "locks"]);
    plain(&[
        "role",
        "grant-permission",
        "locks",
        "--prefix=true",
        "readwrite",
        "dlock:",
    ]);
    plain(&["user", "grant-role", "app", "locks"]);
    etcdctl(&etcd, &["auth", "enable"]);
    etcd
}

#[test]
fn locks_over_tls_as_an_etcd_user() {
    let etcd = with_auth();
    let url = etcd.tls_url().replace("etcds://", "etcds://app:app-pw@");
    let out = env_check(&url, Some(&etcd.ca_file()));
    assert!(out.starts_with("ok "), "{out}");
    assert!(out.contains("fence=Some("), "{out}");
    assert!(!out.contains("app-pw"), "{out}");
}

#[test]
fn a_wrong_password_or_an_untrusted_certificate_is_a_backend_error_without_secrets() {
    let etcd = with_auth();
    let wrong = etcd.tls_url().replace("etcds://", "etcds://app:hunter2@");
    let out = env_check(&wrong, Some(&etcd.ca_file()));
    assert!(out.starts_with("error lock backend error"), "{out}");
    assert!(!out.contains("hunter2"), "{out}");
    let untrusted = etcd.tls_url().replace("etcds://", "etcds://app:app-pw@");
    let out = env_check(&untrusted, None);
    assert!(out.starts_with("error lock backend error"), "{out}");
    assert!(!out.contains("app-pw"), "{out}");
}
