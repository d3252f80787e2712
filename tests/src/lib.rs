//! Test harness for dlock: starts real `redis-server` processes on free loopback ports and stops
//! them when dropped, with the faults the fault tests need (kill, restart on the same port,
//! SIGSTOP/SIGCONT).
//!
//! A missing `redis-server` binary fails the test with the command that installs it.
#![warn(unreachable_pub, missing_debug_implementations)]

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use dlock_runtime::Locker;

pub mod cluster;
pub mod engines;
pub mod sentinel;
pub use engines::Engine;

/// How to install what the tests need, printed when it is missing.
pub const INSTALL_REDIS: &str = "redis-server not found on PATH: install it with `sudo apt-get install -y redis-server` (or run .ci/run, which does)";

/// A `redis-server` owned by one test: no persistence, loopback only, stopped on drop.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    dir: PathBuf,
    /// Arguments after the throwaway command line: `--tls-port` and the files it needs (see
    /// [`RedisServer::start_tls`]), or those given to [`RedisServer::start_with_args`].
    extra_args: Vec<String>,
    /// The TLS port, when started with [`RedisServer::start_tls`].
    tls_port: Option<u16>,
}

impl RedisServer {
    /// Starts a server on a free loopback port and waits until it answers PING.
    ///
    /// # Panics
    /// When `redis-server` is not installed (with the install command) or does not come up.
    #[must_use]
    pub fn start() -> Self {
        Self::start_with_args(&[])
    }

    /// Like [`start`](Self::start), with `args` appended to the server's command line (e.g.
    /// `["--cluster-enabled", "yes"]` or `["--replicaof", "127.0.0.1", "6379"]`); they are used
    /// again by [`restart`](Self::restart).
    ///
    /// # Panics
    /// When `redis-server` is not installed (with the install command) or does not come up.
    #[must_use]
    pub fn start_with_args(args: &[&str]) -> Self {
        // A port free when probed can be taken before the server binds it: try another.
        let mut last = String::new();
        for _ in 0..3 {
            match Self::try_start_with_args(args) {
                Ok(server) => return server,
                Err(e) => last = e,
            }
        }
        panic!("{last}");
    }

    /// One attempt of [`start_with_args`](Self::start_with_args) on one free port: the error
    /// says why the server did not come up (the port, or a port in `args`, may have been taken).
    pub(crate) fn try_start_with_args(args: &[&str]) -> Result<Self, String> {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("dlock-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create a directory for redis-server");
        let mut server = Self {
            port,
            child: None,
            dir,
            extra_args: args.iter().map(|&a| a.to_owned()).collect(),
            tls_port: None,
        };
        server.try_spawn()?;
        Ok(server)
    }

    /// Like [`start`](Self::start), plus a TLS port whose certificate (for `localhost` and
    /// `127.0.0.1`) is signed by a fresh CA, made with the `openssl` command.
    ///
    /// # Panics
    /// When `openssl` or `redis-server` is missing or fails.
    #[must_use]
    pub fn start_tls() -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("dlock-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create a directory for redis-server");
        make_certificates(&dir);
        let file = |name: &str| dir.join(name).to_string_lossy().into_owned();
        let tls_port = free_port();
        let mut server = Self {
            port,
            child: None,
            extra_args: vec![
                "--tls-port".into(),
                tls_port.to_string(),
                "--tls-cert-file".into(),
                file("server.crt"),
                "--tls-key-file".into(),
                file("server.key"),
                "--tls-ca-cert-file".into(),
                file("ca.crt"),
                "--tls-auth-clients".into(),
                "no".into(),
            ],
            tls_port: Some(tls_port),
            dir,
        };
        server.spawn();
        server
    }

    /// `rediss://localhost:<tls port>` for a server started with [`start_tls`](Self::start_tls).
    ///
    /// # Panics
    /// When the server has no TLS port.
    #[must_use]
    pub fn tls_url(&self) -> String {
        format!(
            "rediss://localhost:{}",
            self.tls_port.expect("started with start_tls")
        )
    }

    /// The CA certificate (PEM file) that signed the TLS port's certificate.
    #[must_use]
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    fn spawn(&mut self) {
        if let Err(e) = self.try_spawn() {
            panic!("{e}");
        }
    }

    /// Starts the process and waits until it answers; the error says why it did not.
    fn try_spawn(&mut self) -> Result<(), String> {
        let child = dlock_examples::throwaway::command(self.port, &self.dir)
            .args(&self.extra_args)
            .spawn();
        let mut child = match child {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!("{INSTALL_REDIS}"),
            Err(e) => panic!("could not start redis-server: {e}"),
        };
        let ready = dlock_examples::throwaway::wait_ready(self.port, &mut child);
        self.child = Some(child);
        ready.map_err(|e| {
            self.kill();
            e.to_string()
        })
    }

    /// `true` when the server answers PING now.
    #[must_use]
    pub fn ping(&self) -> bool {
        dlock_examples::throwaway::ping(self.port)
    }

    /// Sends one command over a fresh plain connection and returns the raw RESP reply, read
    /// whole however long it is (`None` when the server does not answer within a second).
    #[must_use]
    pub fn command(&self, args: &[&str]) -> Option<String> {
        command_at(self.port, args)
    }

    /// `true` when `key` exists on the server now (`EXISTS key`, over a fresh connection).
    ///
    /// # Panics
    /// When the server does not answer.
    #[must_use]
    pub fn exists(&self, key: &str) -> bool {
        match self.command(&["EXISTS", key]).as_deref() {
            Some(":1\r\n") => true,
            Some(":0\r\n") => false,
            other => panic!("EXISTS {key}: unexpected reply {other:?}"),
        }
    }

    /// Waits until `key` no longer exists, polling for up to `within`; `false` if it is still
    /// there then. Sleeps with tokio between polls, so a release handed to the runtime can run.
    pub async fn gone_within(&self, key: &str, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if !self.exists(key) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// How many times the server has run `command` (lower case, as `INFO commandstats` names it;
    /// commands run inside scripts count too).
    ///
    /// # Panics
    /// When the server does not answer.
    #[must_use]
    pub fn calls(&self, command: &str) -> u64 {
        let info = self
            .command(&["INFO", "commandstats"])
            .expect("INFO answered");
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().expect("a call count"))
    }

    /// The port it listens on (127.0.0.1).
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A new locker (its own connection) on this server with short defaults for tests.
    #[must_use]
    pub fn locker(&self) -> Locker {
        Locker::builder()
            .redis_url(self.url())
            .timeout(Duration::from_secs(5))
            .expire(Duration::from_secs(10))
            .build()
            .expect("valid test locker")
    }

    /// A blocking redis-rs client for assertions.
    #[must_use]
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("valid url")
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server and starts a new empty one on the same port.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing is answered.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Resumes a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("server running").id();
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid} failed");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A CA and a server certificate for `localhost` / `127.0.0.1`, written into `dir`.
fn make_certificates(dir: &std::path::Path) {
    let openssl = |args: &[&str]| {
        let status = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => panic!("openssl {args:?} failed: {s}"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                panic!("openssl not found: install it with `sudo apt-get install -y openssl`")
            }
            Err(e) => panic!("could not run openssl: {e}"),
        }
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=dlock test CA",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .expect("write san.ext");
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "san.ext",
    ]);
}

/// Sends one command to the server (or sentinel) on 127.0.0.1:`port` over a fresh plain
/// connection and returns the raw RESP reply, whole (`None` when nothing complete arrives, each
/// read waiting up to a second).
pub(crate) fn command_at(port: u16, args: &[&str]) -> Option<String> {
    exchange(port, args).map(|raw| String::from_utf8_lossy(&raw).into_owned())
}

/// [`command_at`], parsed.
pub(crate) fn query(port: u16, args: &[&str]) -> Option<Reply> {
    Reply::parse(&exchange(port, args)?).map(|(reply, _)| reply)
}

/// Writes one command and reads until one whole reply has arrived: a bulk reply such as
/// `CLUSTER NODES` can take more than one read.
fn exchange(port: u16, args: &[&str]) -> Option<Vec<u8>> {
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let mut request = format!("*{}\r\n", args.len());
    for a in args {
        request.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    stream.write_all(request.as_bytes()).ok()?;
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = stream.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if Reply::parse(&buf).is_some() {
            return Some(buf);
        }
    }
}

/// One RESP2 reply, as the harness's raw client reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Option<String>),
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The reply at the start of `buf` and the bytes it takes; `None` while it is incomplete
    /// (or is not RESP2).
    fn parse(buf: &[u8]) -> Option<(Self, usize)> {
        let end = buf.windows(2).position(|w| w == b"\r\n")?;
        let line = String::from_utf8_lossy(buf.get(1..end)?).into_owned();
        let next = end + 2;
        let reply = match buf[0] {
            b'+' => (Self::Status(line), next),
            b'-' => (Self::Error(line), next),
            b':' => (Self::Int(line.parse().ok()?), next),
            b'$' => match usize::try_from(line.parse::<i64>().ok()?) {
                Err(_) => (Self::Bulk(None), next),
                Ok(len) => {
                    let data = buf.get(next..next + len)?;
                    buf.get(next + len..next + len + 2)?;
                    let text = String::from_utf8_lossy(data).into_owned();
                    (Self::Bulk(Some(text)), next + len + 2)
                }
            },
            b'*' => match usize::try_from(line.parse::<i64>().ok()?) {
                Err(_) => (Self::Array(None), next),
                Ok(len) => {
                    let mut items = Vec::with_capacity(len.min(1024));
                    let mut at = next;
                    for _ in 0..len {
                        let (item, used) = Self::parse(buf.get(at..)?)?;
                        items.push(item);
                        at += used;
                    }
                    (Self::Array(Some(items)), at)
                }
            },
            _ => return None,
        };
        Some(reply)
    }

    /// The text of a status or bulk reply.
    pub(crate) fn text(&self) -> Option<&str> {
        match self {
            Self::Status(s) | Self::Bulk(Some(s)) => Some(s),
            _ => None,
        }
    }

    /// The items of an array reply.
    pub(crate) fn items(&self) -> Option<&[Reply]> {
        match self {
            Self::Array(Some(items)) => Some(items),
            _ => None,
        }
    }

    /// `true` for `+OK`.
    pub(crate) fn is_ok(&self) -> bool {
        matches!(self, Self::Status(s) if s == "OK")
    }
}

/// The value of `field` in an `INFO`-style text (`field:value` lines).
pub(crate) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(str::trim_end)
}

/// A free TCP port on 127.0.0.1 (bound, then released for the server to take).
#[must_use]
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a free loopback port")
}

/// Takes `key` with default options and releases it at once, panicking on any error: a warm-up
/// (connection made, scripts loaded) or a check that the key is free.
///
/// # Panics
/// When the lock cannot be taken or released.
pub async fn acquire_and_release(locker: &Locker, key: &str) {
    let guard = locker
        .acquire(key, dlock_runtime::LockOptions::new())
        .await
        .unwrap_or_else(|e| panic!("acquire `{key}`: {e}"));
    guard
        .release()
        .await
        .unwrap_or_else(|e| panic!("release `{key}`: {e}"));
}

/// A key no other test in this process uses.
#[must_use]
pub fn unique_key(name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{name}:{}:{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A non-atomic increment with an `.await` between the read and the write: callers that are not
/// excluded from each other lose updates (each writes back what it read, plus one).
pub async fn racy_increment(counter: &AtomicU64) {
    let seen = counter.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(10)).await;
    counter.store(seen + 1, Ordering::SeqCst);
}
