//! Tests' own `redis-server`s (notifications, RedLock's scripts).

use std::time::Duration;

/// A `redis-server` of the test's own on a loopback port, stopped when dropped; its working
/// directory is its own (a replica writes what its master sends, an RDB file, whatever `--save`
/// says: into the crate's directory otherwise), removed with it.
pub(crate) struct Server(
    pub(crate) std::process::Child,
    pub(crate) u16,
    std::path::PathBuf,
);

impl Server {
    /// On a free port below the ephemeral range (32768 and up on Linux), so that no other
    /// test's `bind(0)` nor a connection's own port takes it while the server restarts; another
    /// port when another test's server took this one first.
    pub(crate) fn start() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
            ^ std::process::id();
        (0..1000)
            .map(|i| 20_000 + u16::try_from((seed.wrapping_add(i * 7919)) % 10_000).unwrap())
            .filter(|&port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok())
            .take(5)
            .find_map(Self::try_start_on)
            .expect("a free port in 20000-29999")
    }

    /// On `port` (a restart on the same port).
    pub(crate) fn start_on(port: u16) -> Self {
        Self::try_start_on(port)
            .unwrap_or_else(|| panic!("another redis-server answers on port {port}"))
    }

    /// `None` when another server answers on `port` (it took the port first).
    fn try_start_on(port: u16) -> Option<Self> {
        // This server's alone: another test's server may take the port, and a directory left by
        // a killed test run must not hand its data to a new server.
        static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "dlock-test-redis-{}-{made}-{port}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("a directory for the test's redis-server");
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("redis-server could not be started ({e}): apt-get install redis-server")
            });
        let server = Self(child, port, dir);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "redis-server did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // Ours, not another test's that took the port between the check and the start.
        let info: String = redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(5)))
            .and_then(|mut c| redis::cmd("INFO").arg("server").query(&mut c))
            .unwrap_or_default();
        info.contains(&format!("process_id:{}\r\n", server.0.id()))
            .then_some(server)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_dir_all(&self.2);
    }
}
