//! What the tests, the examples and the benchmark share: throwaway deployments of every engine
//! on free loopback ports, stopped when dropped (one [`RedisServer`], a
//! [`RedisCluster`](cluster::RedisCluster) of 3 masters and 3 replicas, a master with 2 replicas
//! watched by 3 sentinels ([`RedisSentinels`](sentinel::RedisSentinels)), independent masters for
//! RedLock ([`RedLockServers`](redlock::RedLockServers)), a PostgreSQL cluster
//! ([`PostgresServer`](postgres::PostgresServer)), etcd members
//! ([`EtcdCluster`](etcd::EtcdCluster)) and ZooKeeper servers of local JVMs
//! ([`ZkEnsemble`](zookeeper::ZkEnsemble))), the `--engine` of the examples
//! ([`deployment`]), and a TCP proxy that cuts and heals the link to a server
//! ([`proxy::Proxy`]). No persistence, loopback only, with the faults the tests need (kill,
//! restart on the same port, SIGSTOP/SIGCONT, a failover, a slot migrated).
//!
//! A missing binary is reported with the command that installs it ([`INSTALL_REDIS`]).
#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

use std::{
    net::TcpListener,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

pub mod cluster;
pub mod deployment;
pub mod etcd;
pub mod http;
pub mod postgres;
pub mod proxy;
pub mod redlock;
pub mod resp;
pub mod sentinel;
mod server;
pub mod zookeeper;

pub use server::RedisServer;

/// How to install `redis-server`, said when it is missing.
pub const INSTALL_REDIS: &str = "redis-server not found on PATH: install it with `sudo apt-get install -y redis-server` (or run .ci/run, which does)";

/// Waits (up to 10s) until the server on `port`, started as `child`, answers, and is `child`
/// (`INFO server` names its process): a port free when probed may have gone to another server
/// started at the same moment, whose answer would otherwise pass for this one's.
///
/// # Errors
/// When the server exits first (the port may be taken), another process answers on `port`, or
/// nothing answers in time.
pub fn wait_ready(port: u16, child: &mut Child) -> std::io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(pid) = serving_process(port) {
            if pid == child.id() {
                return Ok(());
            }
            return Err(std::io::Error::other(format!(
                "port {port} is served by another process (pid {pid}): taken before redis-server bound it"
            )));
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(std::io::Error::other(format!(
                "redis-server exited at start ({status}); port {port} may be taken"
            )));
        }
        if Instant::now() > deadline {
            return Err(std::io::Error::other(
                "redis-server did not answer PING within 10s",
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The process id of the server (or sentinel) answering on 127.0.0.1:`port` now, if one does.
fn serving_process(port: u16) -> Option<u32> {
    let info = resp::command_at(port, &["INFO", "server"]).ok()?;
    resp::info_field(&resp::text(&info)?, "process_id")?
        .parse()
        .ok()
}

/// `true` when a server on 127.0.0.1:`port` answers `PING` now (within a second).
#[must_use]
pub fn ping(port: u16) -> bool {
    matches!(resp::command_at(port, &["PING"]), Ok(resp::Value::SimpleString(s)) if s == "PONG")
}

/// The command line of a throwaway server: `port` on 127.0.0.1 only, no persistence (no RDB
/// snapshots, no AOF), working directory `dir`, warnings only on stderr, stdin and stdout closed.
#[must_use]
pub fn command(port: u16, dir: &std::path::Path) -> Command {
    let mut command = Command::new("redis-server");
    command
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .args(["--protected-mode", "no", "--loglevel", "warning", "--dir"])
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    command
}

/// A free TCP port on 127.0.0.1 (bound, then released for the server to take).
///
/// # Panics
/// When no loopback port can be bound.
#[must_use]
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a free loopback port")
}

/// `true` when `program --version` runs and succeeds: the binary is installed.
fn installed(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that is not the child being waited for does not pass for it: two servers
    /// started at once can probe the same free port, and the one that lost the bind must not
    /// report the winner as itself (a RedLock deployment then listed one master twice).
    #[test]
    fn another_process_on_the_port_is_not_the_child_ready() {
        let server = RedisServer::start();
        let mut child = Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("run `sleep`");
        let ready = wait_ready(server.port(), &mut child);
        child.kill().ok();
        child.wait().ok();
        let error = ready.expect_err("another server's answer taken for the child's");
        assert!(error.to_string().contains("another process"), "{error}");
        // Its own server, waited for the same way, is ready.
        let port = free_port();
        let mut own = command(port, &std::env::temp_dir())
            .spawn()
            .expect("run redis-server");
        let ready = wait_ready(port, &mut own);
        own.kill().ok();
        own.wait().ok();
        ready.expect("its own server is ready");
    }
}
