//! A throwaway `redis-server`: no persistence, loopback only, on a free port, killed on drop.

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// A `redis-server` child process owned by this program.
///
/// # Behavior
/// - **Start**: `redis-server --port <free> --bind 127.0.0.1 --save "" --appendonly no` in a
///   fresh temporary directory; [`start`](Self::start) returns once it answers `PING`.
/// - **Drop**: the server is killed and waited for, and its directory removed. A program that
///   is killed itself (SIGKILL) cannot do this; the server then outlives it.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    child: Child,
    dir: PathBuf,
}

impl RedisServer {
    /// `true` when a `redis-server` binary is on `PATH`.
    #[must_use]
    pub fn available() -> bool {
        Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Starts a server on a free loopback port and waits (up to 10s) until it answers `PING`.
    ///
    /// # Errors
    /// When `redis-server` cannot be run or does not come up.
    pub fn start() -> std::io::Result<Self> {
        // The port is free when probed but could be taken before the server binds it: retry.
        let mut last = None;
        for _ in 0..3 {
            match Self::try_start() {
                Ok(server) => return Ok(server),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("redis-server did not start")))
    }

    fn try_start() -> std::io::Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let dir =
            std::env::temp_dir().join(format!("dlock-example-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let child = command(port, &dir).spawn()?;
        let mut server = Self { port, child, dir };
        wait_ready(port, &mut server.child)?;
        Ok(server)
    }

    /// The loopback port it listens on.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's version, as `redis-server --version` prints it (`7.0.15`), if it can tell.
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
}

/// Waits (up to 10s) until the server on `port`, started as `child`, answers `PING`. The test
/// harness waits for its servers with it too.
///
/// # Errors
/// When the server exits first (the port may be taken) or does not answer in time.
pub fn wait_ready(port: u16, child: &mut Child) -> std::io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if ping(port) {
            return Ok(());
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

/// `true` when a server on 127.0.0.1:`port` answers `PING` now (within a second).
#[must_use]
pub fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let mut reply = [0u8; 7];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && &reply == b"+PONG\r\n"
}

/// The command line of a throwaway server: `port` on 127.0.0.1 only, no persistence (no RDB
/// snapshots, no AOF), working directory `dir`, warnings only on stderr, stdin and stdout closed.
/// The test harness starts its servers with it too.
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

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
