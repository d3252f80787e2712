//! Throwaway etcd: one member, or a cluster of local member processes.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use dlock_runtime::Locker;

use super::free_port;

/// How to install etcd, said when it is missing.
pub const INSTALL_ETCD: &str = "etcd not found on PATH: install it with `sudo apt-get install -y etcd-server etcd-client` (or run .ci/run, which does)";

/// An etcd cluster of `n` member processes owned by this program, each on free loopback ports
/// (client and peer) with its own data directory; one member is a plain single server.
///
/// # Behavior
/// - **Start**: every member is started with the whole cluster in `--initial-cluster`, short
///   raft timers (`--heartbeat-interval 50 --election-timeout 500` for one member, 100/1000
///   for a cluster, so a failover takes about a second), and the start returns once every
///   member reports a leader. Ports taken between the probe and the bind make it try again,
///   up to 3 times.
/// - **Faults**: [`kill`](Self::kill) a member (SIGKILL), [`restart`](Self::restart) it on
///   the same ports and data (it rejoins), [`pause`](Self::pause) and [`resume`](Self::resume)
///   (SIGSTOP/SIGCONT), [`leader`](Self::leader) to find whom to kill.
/// - **Drop**: every member is killed and waited for, and the data directories removed.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Member>,
    dir: PathBuf,
    /// `--heartbeat-interval` and `--election-timeout`, in milliseconds.
    timers: (u32, u32),
    /// A TLS client port of the first member (see [`EtcdCluster::single_tls`]).
    tls_port: Option<u16>,
}

#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

impl EtcdCluster {
    /// `true` when an `etcd` binary is on `PATH`.
    #[must_use]
    pub fn available() -> bool {
        super::installed("etcd")
    }

    /// One member on free loopback ports.
    ///
    /// # Panics
    /// When `etcd` is not installed (with the install command) or does not come up.
    #[must_use]
    pub fn single() -> Self {
        Self::start(1)
    }

    /// `n` members forming one cluster.
    ///
    /// # Panics
    /// When `etcd` is not installed (with the install command) or the cluster does not come up.
    #[must_use]
    pub fn start(n: usize) -> Self {
        Self::start_in(n, &std::env::temp_dir())
    }

    /// `n` members keeping their data under `root` (the benchmark's: a tmpfs, where `fsync`
    /// costs nothing, as the other throwaway servers keep nothing on a disk's clock; etcd 3.4
    /// has no `--unsafe-no-fsync`).
    ///
    /// # Panics
    /// When `etcd` is not installed (with the install command) or the cluster does not come up.
    #[must_use]
    pub fn start_in(n: usize, root: &std::path::Path) -> Self {
        let mut last = None;
        for _ in 0..3 {
            match Self::start_once(n, root) {
                Ok(cluster) => return cluster,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!("{e}"),
                Err(e) => last = Some(e),
            }
        }
        panic!("etcd did not start: {last:?}");
    }

    fn start_once(n: usize, root: &std::path::Path) -> std::io::Result<Self> {
        let first = free_port();
        let dir = root.join(format!("dlock-etcd-{}-{first}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let members = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: if i == 0 { first } else { free_port() },
                peer_port: free_port(),
                child: None,
            })
            .collect();
        let timers = if n == 1 { (50, 500) } else { (100, 1000) };
        let mut cluster = Self {
            members,
            dir,
            timers,
            tls_port: None,
        };
        for i in 0..n {
            cluster.spawn(i)?;
        }
        cluster.wait_ready(Duration::from_secs(20))?;
        Ok(cluster)
    }

    /// One member that also serves clients over TLS on a second port, with a certificate for
    /// `localhost` and `127.0.0.1` from a fresh CA ([`ca_file`](Self::ca_file)), made with the
    /// `openssl` command. The plain port stays, for the harness.
    ///
    /// # Panics
    /// When `openssl` or `etcd` is missing or fails.
    #[must_use]
    pub fn single_tls() -> Self {
        let first = free_port();
        let dir = std::env::temp_dir().join(format!("dlock-etcd-{}-{first}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create a directory for etcd");
        super::server::make_certificates(&dir);
        let mut cluster = Self {
            members: vec![Member {
                name: "m0".into(),
                client_port: first,
                peer_port: free_port(),
                child: None,
            }],
            dir,
            timers: (50, 500),
            tls_port: Some(free_port()),
        };
        if let Err(e) = cluster.spawn(0) {
            panic!("{e}");
        }
        cluster.wait_for_leader(Duration::from_secs(20));
        cluster
    }

    /// `etcds://localhost:<TLS port>` of a cluster started with [`single_tls`](Self::single_tls).
    ///
    /// # Panics
    /// When it has no TLS port.
    #[must_use]
    pub fn tls_url(&self) -> String {
        format!(
            "etcds://localhost:{}",
            self.tls_port.expect("started with single_tls")
        )
    }

    /// The CA certificate (PEM file) that signed the TLS port's certificate.
    #[must_use]
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&mut self, i: usize) -> std::io::Result<()> {
        let initial = self.initial_cluster();
        let token = format!("dlock-{}", self.dir.display());
        let (heartbeat, election) = self.timers;
        let m = &self.members[i];
        let client = format!("http://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let mut tls = Vec::new();
        let mut listen = client.clone();
        if let (0, Some(port)) = (i, self.tls_port) {
            let file = |name: &str| self.dir.join(name).to_string_lossy().into_owned();
            listen = format!("{client},https://127.0.0.1:{port}");
            tls = vec![
                "--cert-file".to_owned(),
                file("server.crt"),
                "--key-file".to_owned(),
                file("server.key"),
            ];
        }
        let child = Command::new("etcd")
            .args(["--name", &m.name, "--data-dir"])
            .arg(self.dir.join(&m.name))
            .args(["--listen-client-urls", &listen])
            .args(&tls)
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &token])
            .args(["--heartbeat-interval", &heartbeat.to_string()])
            .args(["--election-timeout", &election.to_string()])
            .args(["--logger", "zap", "--log-level", "error"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        match child {
            Ok(child) => {
                self.members[i].child = Some(child);
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(std::io::Error::new(e.kind(), INSTALL_ETCD))
            }
            Err(e) => Err(std::io::Error::other(format!("could not start etcd: {e}"))),
        }
    }

    /// Waits until every running member answers and knows a leader.
    fn wait_ready(&mut self, within: Duration) -> std::io::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let mut ready = true;
            for m in &mut self.members {
                let Some(child) = m.child.as_mut() else {
                    continue;
                };
                if let Ok(Some(status)) = child.try_wait() {
                    m.child = None;
                    return Err(std::io::Error::other(format!(
                        "etcd member {} exited at start ({status}); a port may be taken",
                        m.name
                    )));
                }
                ready &= status(m.client_port).is_some_and(|s| s.leader != 0);
            }
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(std::io::Error::other(format!(
                    "etcd did not elect a leader within {within:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `etcd://127.0.0.1:<client port>,…` for every member.
    #[must_use]
    pub fn url(&self) -> String {
        format!("etcd://{}", self.endpoints().join(","))
    }

    /// `127.0.0.1:<client port>` of every member.
    #[must_use]
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// How many members it has.
    #[must_use]
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// `false`: a cluster has at least one member.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// A new locker on every member with short defaults for tests (5s wait, 10s lease).
    ///
    /// # Panics
    /// When the locker cannot be built.
    #[must_use]
    pub fn locker(&self) -> Locker {
        Locker::builder()
            .url(self.url())
            .timeout(Duration::from_secs(5))
            .expire(Duration::from_secs(10))
            .build()
            .expect("valid test locker")
    }

    /// The index of the member that is leader now, as a running member reports it.
    #[must_use]
    pub fn leader(&self) -> Option<usize> {
        self.members
            .iter()
            .filter(|m| m.child.is_some())
            .find_map(|m| {
                let s = status(m.client_port)?;
                (s.leader != 0).then_some(s.leader)
            })
            .and_then(|leader| {
                self.members.iter().position(|m| {
                    m.child.is_some() && status(m.client_port).is_some_and(|s| s.member == leader)
                })
            })
    }

    /// Waits (up to `within`) until the running members agree on a leader.
    ///
    /// # Panics
    /// When they do not.
    pub fn wait_for_leader(&mut self, within: Duration) {
        if let Err(e) = self.wait_ready(within) {
            panic!("{e}");
        }
    }

    /// `etcdctl` (API v3) on every member's endpoint; add the subcommand's arguments.
    ///
    /// # Panics
    /// Never: the command is only built.
    #[must_use]
    pub fn etcdctl(&self) -> Command {
        let mut command = Command::new("etcdctl");
        command
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoints().join(",")));
        command
    }

    /// Kills member `i` (SIGKILL) and waits for it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills member `i` and starts it again on the same ports and data; it rejoins the cluster.
    ///
    /// # Panics
    /// When it cannot be started.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        if let Err(e) = self.spawn(i) {
            panic!("{e}");
        }
    }

    /// Kills every member, starts them all again on their data and waits for a leader.
    ///
    /// # Panics
    /// When the cluster does not come back.
    pub fn restart_all(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        for i in 0..self.members.len() {
            if let Err(e) = self.spawn(i) {
                panic!("{e}");
            }
        }
        self.wait_for_leader(Duration::from_secs(30));
    }

    /// Freezes member `i` (SIGSTOP).
    ///
    /// # Panics
    /// When it is not running or the signal cannot be sent.
    pub fn pause(&self, i: usize) {
        self.signal(i, "-STOP");
    }

    /// Resumes a paused member (SIGCONT).
    ///
    /// # Panics
    /// When it is not running or the signal cannot be sent.
    pub fn resume(&self, i: usize) {
        self.signal(i, "-CONT");
    }

    fn signal(&self, i: usize, signal: &str) {
        let pid = self.members[i].child.as_ref().expect("member running").id();
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid} failed");
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What a member says of itself and its leader (raft member ids).
struct Status {
    member: u64,
    leader: u64,
}

/// `POST /v3/maintenance/status` on the member's gRPC gateway.
fn status(port: u16) -> Option<Status> {
    let reply = crate::http::blocking(
        &format!("127.0.0.1:{port}"),
        "POST",
        "/v3/maintenance/status",
        "{}",
    )
    .ok()?
    .body;
    let field = |name: &str| -> Option<u64> {
        let at = reply.find(&format!("\"{name}\":\""))? + name.len() + 4;
        reply[at..].split('"').next()?.parse().ok()
    };
    Some(Status {
        member: field("member_id")?,
        leader: field("leader").unwrap_or(0),
    })
}
