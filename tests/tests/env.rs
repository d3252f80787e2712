//! Configuration from the environment, checked in child processes (the environment is
//! per process, so each case runs `dlock-env-check` with its own variables).

use std::process::Command;

use dlock_tests::RedisServer;

fn run(vars: &[(&str, &str)]) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_dlock-env-check"));
    for (name, _) in std::env::vars() {
        if name.starts_with("DLOCK_") || name == "REDIS_URL" {
            command.env_remove(name);
        }
    }
    command.envs(vars.iter().copied());
    let output = command.output().expect("run dlock-env-check");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn memory_backend_from_the_environment_serves_the_attribute() {
    let out = run(&[("DLOCK_BACKEND", "memory"), ("DLOCK_KEY_PREFIX", "app:")]);
    assert!(out.starts_with("ok "), "{out}");
    assert!(
        out.contains("engine: Some(\"memory\")") && out.contains("\"app:\""),
        "{out}"
    );
    assert!(
        out.contains("fence=Some("),
        "the body saw no fencing token: {out}"
    );
}

/// Hosting platforms set a `REDIS_URL` of their own (often `rediss://`, which needs the `tls`
/// feature): beside `DLOCK_URL` it is not read at all, nor are the other older variables.
#[test]
fn with_dlock_url_a_broken_redis_url_is_not_read() {
    let out = run(&[
        ("DLOCK_URL", "memory://"),
        ("REDIS_URL", "rediss://default:pw@cache.example:6380"),
        ("DLOCK_REDIS_URL", "http://not-redis"),
        ("DLOCK_BACKEND", "zookeeper"),
    ]);
    assert!(
        out.starts_with("ok ") && out.contains("engine: Some(\"memory\")"),
        "{out}"
    );
    // Without DLOCK_URL the same REDIS_URL is read, and refused.
    let out = run(&[("REDIS_URL", "http://not-redis")]);
    assert!(
        out.starts_with("error ") && out.contains("REDIS_URL"),
        "{out}"
    );
}

#[test]
fn redis_backend_from_the_environment_serves_the_attribute() {
    let server = RedisServer::start();
    let out = run(&[("DLOCK_REDIS_URL", &server.url())]);
    assert!(out.starts_with("ok "), "{out}");
    let out = run(&[("REDIS_URL", &server.url())]);
    assert!(out.starts_with("ok "), "REDIS_URL is the fallback: {out}");
}

#[test]
fn every_bad_value_is_a_config_error_naming_the_variable() {
    for (var, value) in [
        ("DLOCK_BACKEND", "zookeeper"),
        ("DLOCK_REDIS_URL", "http://localhost"),
        ("DLOCK_TIMEOUT", "soon"),
        ("DLOCK_EXPIRE", "0s"),
        ("DLOCK_RETRY", "50ms"),
        ("DLOCK_RETRY", "9ms..3ms"),
        ("DLOCK_MAX_KEY_LEN", "-1"),
        ("DLOCK_REQUEST_TIMEOUT", "fast"),
    ] {
        let out = run(&[
            (var, value),
            (
                "DLOCK_BACKEND",
                if var == "DLOCK_BACKEND" {
                    value
                } else {
                    "memory"
                },
            ),
        ]);
        assert!(
            out.starts_with("error invalid dlock configuration"),
            "{var}={value}: {out}"
        );
        assert!(
            out.contains(var),
            "{var}={value}: the message does not name it: {out}"
        );
    }
}

#[test]
fn the_password_in_the_url_is_never_printed() {
    let out = run(&[
        ("DLOCK_REDIS_URL", "redis://user:hunter2@127.0.0.1:1/0"),
        ("DLOCK_REQUEST_TIMEOUT", "100ms"),
        ("DLOCK_TIMEOUT", "200ms"),
    ]);
    assert!(out.starts_with("error "), "{out}");
    assert!(!out.contains("hunter2"), "{out}");
    let out = run(&[
        ("DLOCK_REDIS_URL", "rediss://user:hunter2@127.0.0.1:1/0"),
        ("DLOCK_REQUEST_TIMEOUT", "100ms"),
        ("DLOCK_TIMEOUT", "200ms"),
    ]);
    assert!(
        out.starts_with("error ") && !out.contains("hunter2"),
        "{out}"
    );
}
