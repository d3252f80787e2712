//! One throwaway `redis-server`.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use dlock_runtime::Locker;

use super::{
    INSTALL_REDIS, free_port,
    resp::{RedisResult, Value, command_at},
};

/// A `redis-server` owned by this program (a test, an example): no persistence, loopback only,
/// on a free port.
///
/// # Behavior
/// - **Start**: [`throwaway::command`](super::command) (`--save "" --appendonly no --bind
///   127.0.0.1`) in a fresh temporary directory, plus any extra arguments; the start returns
///   once it answers `PING`. A port taken between the probe and the bind makes it try another,
///   up to 3 times.
/// - **Faults**: [`kill`](Self::kill) (SIGKILL), [`restart`](Self::restart) (a new empty server
///   on the same port, with the same arguments), [`pause`](Self::pause) and
///   [`resume`](Self::resume) (SIGSTOP/SIGCONT).
/// - **Drop**: the server is killed and waited for, and its directory removed. A program that
///   is killed itself (SIGKILL) cannot do this; the server then outlives it.
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
    /// `true` when a `redis-server` binary is on `PATH`.
    #[must_use]
    pub fn available() -> bool {
        super::installed("redis-server")
    }

    /// The installed server's version, as `redis-server --version` prints it (`7.0.15`), if it
    /// can tell.
    #[must_use]
    pub fn version() -> Option<String> {
        let out = Command::new("redis-server")
            .arg("--version")
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let v = text.split_whitespace().find_map(|w| w.strip_prefix("v="))?;
        Some(v.to_owned())
    }

    /// Starts a server on a free loopback port and waits until it answers PING.
    ///
    /// # Panics
    /// When `redis-server` is not installed (with the install command) or does not come up;
    /// [`try_start`](Self::try_start) returns the error instead.
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
        Self::try_start_with_args(args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`start`](Self::start), returning why the server did not come up instead of panicking.
    ///
    /// # Errors
    /// When `redis-server` is not installed (kind `NotFound`, the message says how to install
    /// it), cannot be run, or does not answer within 10s, 3 times.
    pub fn try_start() -> std::io::Result<Self> {
        Self::try_start_with_args(&[])
    }

    /// [`start_with_args`](Self::start_with_args), returning why the server did not come up
    /// instead of panicking.
    ///
    /// # Errors
    /// As [`try_start`](Self::try_start).
    pub fn try_start_with_args(args: &[&str]) -> std::io::Result<Self> {
        on_other_ports(|| Self::start_once(args))
    }

    /// One attempt on one free port: the error says why the server did not come up (the port,
    /// or a port in `args`, may have been taken).
    pub(crate) fn start_once(args: &[&str]) -> std::io::Result<Self> {
        let port = free_port();
        let mut server = Self {
            port,
            child: None,
            dir: Self::make_dir(port)?,
            extra_args: args.iter().map(|&a| a.to_owned()).collect(),
            tls_port: None,
        };
        server.try_spawn()?;
        Ok(server)
    }

    /// A fresh directory for the server on `port`.
    fn make_dir(port: u16) -> std::io::Result<PathBuf> {
        let dir = std::env::temp_dir().join(format!("dlock-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }

    /// Like [`start`](Self::start), plus a TLS port whose certificate (for `localhost` and
    /// `127.0.0.1`) is signed by a fresh CA, made with the `openssl` command.
    ///
    /// # Panics
    /// When `openssl` or `redis-server` is missing or fails.
    #[must_use]
    pub fn start_tls() -> Self {
        let port = free_port();
        let dir = Self::make_dir(port).expect("create a directory for redis-server");
        make_certificates(&dir);
        let file = |name: &str| dir.join(name).to_string_lossy().into_owned();
        let mut server = Self {
            port,
            child: None,
            extra_args: Vec::new(),
            tls_port: None,
            dir: dir.clone(),
        };
        // Both ports fresh at each try (the first names the directory only).
        let started = on_other_ports(|| {
            server.port = free_port();
            let tls_port = free_port();
            server.tls_port = Some(tls_port);
            server.extra_args = vec![
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
            ];
            server.try_spawn()
        });
        if let Err(e) = started {
            panic!("{e}");
        }
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
    fn try_spawn(&mut self) -> std::io::Result<()> {
        let child = super::command(self.port, &self.dir)
            .args(&self.extra_args)
            .spawn();
        let mut child = match child {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(std::io::Error::new(e.kind(), INSTALL_REDIS));
            }
            Err(e) => {
                return Err(std::io::Error::other(format!(
                    "could not start redis-server: {e}"
                )));
            }
        };
        let ready = super::wait_ready(self.port, &mut child);
        self.child = Some(child);
        ready.inspect_err(|_| self.kill())
    }

    /// `true` when the server answers PING now.
    #[must_use]
    pub fn ping(&self) -> bool {
        super::ping(self.port)
    }

    /// Sends one command over a fresh plain connection (redis-rs's synchronous client, each
    /// step bounded by a second) and returns the server's reply.
    ///
    /// # Errors
    /// The server's error reply (`NOAUTH …`, `WRONGTYPE …`), or the connection's failure.
    pub fn command(&self, args: &[&str]) -> RedisResult<Value> {
        command_at(self.port, args)
    }

    /// `true` when `key` exists on the server now (`EXISTS key`, over a fresh connection).
    ///
    /// # Panics
    /// When the server does not answer.
    #[must_use]
    pub fn exists(&self, key: &str) -> bool {
        match self.command(&["EXISTS", key]) {
            Ok(Value::Int(1)) => true,
            Ok(Value::Int(0)) => false,
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
            .ok()
            .as_ref()
            .and_then(super::resp::text)
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

    /// A new locker (its own connection) on this server with short defaults for tests (5s
    /// wait, 10s lease).
    ///
    /// # Panics
    /// When the locker cannot be built.
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
    ///
    /// # Panics
    /// Never in practice: the URL is well formed.
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
    ///
    /// # Panics
    /// When the new server does not come up (the port may have been taken meanwhile).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing is answered.
    ///
    /// # Panics
    /// When the server is not running or the signal cannot be sent.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Resumes a paused server (SIGCONT).
    ///
    /// # Panics
    /// When the server is not running or the signal cannot be sent.
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

/// `start` until it succeeds, 3 times at most: a port free when probed can be taken before the
/// server binds it (another test starting a server at the same moment), and `start` takes
/// other ports each time. A missing binary (`NotFound`) is not tried again.
fn on_other_ports<T>(mut start: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    let mut last = None;
    for _ in 0..3 {
        match start() {
            Ok(started) => return Ok(started),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(e),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("redis-server did not start")))
}

/// A CA and a server certificate for `localhost` / `127.0.0.1`, written into `dir` (`ca.crt`,
/// `server.crt`, `server.key`).
pub(super) fn make_certificates(dir: &std::path::Path) {
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
