//! Throwaway ZooKeeper: one standalone server, or an ensemble of local JVMs.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use super::free_port;

/// How to install ZooKeeper, said when it is missing.
pub const INSTALL_ZOOKEEPER: &str = "ZooKeeper not found (/usr/share/java/zookeeper.jar and `java`): install it with `sudo apt-get install -y zookeeper default-jre-headless` (or run .ci/run, which does)";

/// Where Debian's `zookeeper` package puts the server's jar (its manifest names the others).
const JAR: &str = "/usr/share/java/zookeeper.jar";

/// ZooKeeper's tick in these deployments (ms): sessions may be as short as two ticks, so the
/// tests' session timeouts can be short.
pub const TICK_MS: u64 = 100;

/// A ZooKeeper ensemble of `n` server JVMs owned by this program (one: a standalone server), each
/// on free loopback ports (client, quorum, election) with its own data directory.
///
/// # Behavior
/// - **Start**: `tickTime` of [`TICK_MS`] (sessions from 200ms to 60s), no admin server, the
///   four-letter words on (the harness asks `srvr` who leads), container nodes checked every
///   500ms (all empty ones removed at each check), and the start returns once every server
///   serves (a quorum formed). Ports taken between the probe and the bind make it try again,
///   up to 3 times.
/// - **Faults**: [`kill`](Self::kill) a server (SIGKILL), [`restart`](Self::restart) it on the
///   same ports and data (it rejoins), [`pause`](Self::pause) and [`resume`](Self::resume)
///   (SIGSTOP/SIGCONT), [`leader`](Self::leader) to find whom to kill.
/// - **Drop**: every server is killed and waited for, and the data directories removed.
#[derive(Debug)]
pub struct ZkEnsemble {
    servers: Vec<Server>,
    dir: PathBuf,
}

#[derive(Debug)]
struct Server {
    client_port: u16,
    quorum_port: u16,
    election_port: u16,
    child: Option<Child>,
}

impl ZkEnsemble {
    /// `true` when the server's jar and `java` are installed.
    #[must_use]
    pub fn available() -> bool {
        Path::new(JAR).exists() && Command::new("java").arg("-version").output().is_ok()
    }

    /// One standalone server.
    ///
    /// # Panics
    /// When ZooKeeper is not installed (with the install command) or does not come up.
    #[must_use]
    pub fn single() -> Self {
        Self::start(1)
    }

    /// `n` servers forming one ensemble.
    ///
    /// # Panics
    /// When ZooKeeper is not installed (with the install command) or the ensemble does not form.
    #[must_use]
    pub fn start(n: usize) -> Self {
        assert!(Self::available(), "{INSTALL_ZOOKEEPER}");
        let mut last = None;
        for _ in 0..3 {
            match Self::start_once(n) {
                Ok(ensemble) => return ensemble,
                Err(e) => last = Some(e),
            }
        }
        panic!("ZooKeeper did not start: {last:?}");
    }

    fn start_once(n: usize) -> std::io::Result<Self> {
        let first = free_port();
        let dir = std::env::temp_dir().join(format!("dlock-zk-{}-{first}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let servers = (0..n)
            .map(|i| Server {
                client_port: if i == 0 { first } else { free_port() },
                quorum_port: free_port(),
                election_port: free_port(),
                child: None,
            })
            .collect();
        let mut ensemble = Self { servers, dir };
        for i in 0..n {
            ensemble.write_config(i)?;
        }
        for i in 0..n {
            ensemble.spawn(i)?;
        }
        ensemble.wait_ready(Duration::from_secs(30))?;
        Ok(ensemble)
    }

    fn server_dir(&self, i: usize) -> PathBuf {
        self.dir.join(format!("s{i}"))
    }

    fn write_config(&self, i: usize) -> std::io::Result<()> {
        let dir = self.server_dir(i);
        std::fs::create_dir_all(dir.join("data"))?;
        let me = &self.servers[i];
        // `forceSync=no`: the transaction log is written but not `fsync`ed, as the throwaway
        // PostgreSQL runs with `fsync` off: a killed server keeps what it wrote (the page
        // cache survives the process), and a loaded VM's disk stalls (a write taking over
        // 500ms) no longer decide the tests' and the benchmark's timings.
        let mut cfg = format!(
            "tickTime={TICK_MS}\ninitLimit=50\nsyncLimit=20\ndataDir={}\nclientPort={}\n\
             clientPortAddress=127.0.0.1\nadmin.enableServer=false\n4lw.commands.whitelist=*\n\
             minSessionTimeout={}\nmaxSessionTimeout=60000\n\
             snapCount=100000\npreAllocSize=1024\nforceSync=no\n",
            dir.join("data").display(),
            me.client_port,
            2 * TICK_MS,
        );
        if self.servers.len() > 1 {
            std::fs::write(dir.join("data").join("myid"), format!("{}\n", i + 1))?;
            for (j, s) in self.servers.iter().enumerate() {
                cfg.push_str(&format!(
                    "server.{}=127.0.0.1:{}:{}\n",
                    j + 1,
                    s.quorum_port,
                    s.election_port
                ));
            }
        }
        std::fs::write(dir.join("zoo.cfg"), cfg)
    }

    fn spawn(&mut self, i: usize) -> std::io::Result<()> {
        let dir = self.server_dir(i);
        let log = std::fs::File::create(dir.join("server.log"))?;
        let child = Command::new("java")
            .args([
                "-Xms32m",
                "-Xmx256m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
            ])
            .arg("-Dzookeeper.admin.enableServer=false")
            .arg("-Dzookeeper.fsync.warningthresholdms=100000")
            // System properties, not zoo.cfg keys: empty lock nodes go within a second, all of
            // them (at the default of 10000 a minute, the benchmark's fresh keys leave empty
            // lock nodes faster than they go, and they fill the heap).
            .arg("-Dznode.container.checkIntervalMs=500")
            .arg("-Dznode.container.maxPerMinute=1000000")
            .args([
                "-cp",
                JAR,
                "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            ])
            .arg(dir.join("zoo.cfg"))
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| std::io::Error::other(format!("{INSTALL_ZOOKEEPER}: {e}")))?;
        self.servers[i].child = Some(child);
        Ok(())
    }

    /// Waits until every running server serves requests (reports a mode in `srvr`).
    fn wait_ready(&mut self, within: Duration) -> std::io::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let mut all = true;
            for (i, s) in self.servers.iter_mut().enumerate() {
                let Some(child) = s.child.as_mut() else {
                    continue;
                };
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(std::io::Error::other(format!(
                        "ZooKeeper server {i} exited at start ({status}); a port may be taken"
                    )));
                }
                all &= mode(s.client_port).is_some();
            }
            if all {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(std::io::Error::other(format!(
                    "ZooKeeper did not serve within {within:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `zk://127.0.0.1:p1,127.0.0.1:p2,…` naming every server.
    #[must_use]
    pub fn url(&self) -> String {
        format!("zk://{}", self.hosts())
    }

    /// `127.0.0.1:p1,127.0.0.1:p2,…`, `zookeeper-client`'s connection string.
    #[must_use]
    pub fn hosts(&self) -> String {
        self.servers
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The client port of server `i`.
    #[must_use]
    pub fn port(&self, i: usize) -> u16 {
        self.servers[i].client_port
    }

    /// How many servers the ensemble has.
    #[must_use]
    pub fn len(&self) -> usize {
        self.servers.len()
    }

    /// `true` for an ensemble without servers (never: one is the least).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// The index of the server that leads now (the standalone server for one).
    #[must_use]
    pub fn leader(&self) -> Option<usize> {
        self.servers.iter().position(|s| {
            s.child.is_some()
                && mode(s.client_port).is_some_and(|m| m == "leader" || m == "standalone")
        })
    }

    /// The process ids of the running servers.
    #[must_use]
    pub fn pids(&self) -> Vec<u32> {
        self.servers
            .iter()
            .filter_map(|s| s.child.as_ref().map(Child::id))
            .collect()
    }

    /// Requests (packets, pings included) server `i` has received since it started, from
    /// `srvr`'s `Received:`.
    #[must_use]
    pub fn received(&self, i: usize) -> Option<u64> {
        received_at(self.servers[i].client_port)
    }

    /// The version the first running server reports (`3.8.0`).
    #[must_use]
    pub fn version(&self) -> Option<String> {
        let port = self.servers.iter().find(|s| s.child.is_some())?.client_port;
        let reply = srvr(port)?;
        let line = reply
            .lines()
            .find_map(|l| l.strip_prefix("Zookeeper version: "))?;
        Some(line.split(['-', ',']).next()?.trim().to_owned())
    }

    /// Kills server `i` (SIGKILL) and waits for it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.servers[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills every server.
    pub fn kill_all(&mut self) {
        for i in 0..self.servers.len() {
            self.kill(i);
        }
    }

    /// Starts server `i` again on its ports and data, and waits until it serves.
    ///
    /// # Panics
    /// When it does not come back within 30s.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i).expect("restart a ZooKeeper server");
        self.wait_ready(Duration::from_secs(30))
            .expect("the restarted ZooKeeper server serves");
    }

    /// Starts every stopped server again and waits until all serve.
    ///
    /// # Panics
    /// When they do not come back within 30s.
    pub fn restart_all(&mut self) {
        for i in 0..self.servers.len() {
            if self.servers[i].child.is_none() {
                self.spawn(i).expect("restart a ZooKeeper server");
            }
        }
        self.wait_ready(Duration::from_secs(30))
            .expect("the restarted ZooKeeper servers serve");
    }

    /// Freezes server `i` (SIGSTOP).
    pub fn pause(&self, i: usize) {
        self.signal(i, "-STOP");
    }

    /// Resumes server `i` (SIGCONT).
    pub fn resume(&self, i: usize) {
        self.signal(i, "-CONT");
    }

    fn signal(&self, i: usize, signal: &str) {
        if let Some(child) = &self.servers[i].child {
            let _ = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status();
        }
    }
}

impl Drop for ZkEnsemble {
    fn drop(&mut self) {
        for s in &mut self.servers {
            if let Some(mut child) = s.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Requests (packets, pings included) the server on 127.0.0.1:`port` has received since it
/// started, from `srvr`'s `Received:`.
#[must_use]
pub fn received_at(port: u16) -> Option<u64> {
    srvr(port)?
        .lines()
        .find_map(|l| l.strip_prefix("Received: "))?
        .trim()
        .parse()
        .ok()
}

/// What a server on `port` answers to `srvr`, or `None` when it does not answer.
fn srvr(port: u16) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    stream.write_all(b"srvr").ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).ok()?;
    Some(reply)
}

/// The `Mode:` a server on `port` reports to `srvr` (`standalone`, `leader`, `follower`), or
/// `None` when it does not serve now.
#[must_use]
pub fn mode(port: u16) -> Option<String> {
    srvr(port)?
        .lines()
        .find_map(|l| l.strip_prefix("Mode: "))
        .map(|m| m.trim().to_owned())
}
