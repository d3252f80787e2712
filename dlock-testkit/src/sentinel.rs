//! A local Redis Sentinel deployment for the `redis+sentinel://` engine: one master, two
//! replicas and three `redis-sentinel` processes on free loopback ports, with the faults the
//! tests need (a server killed, a failover forced).

use std::{
    path::PathBuf,
    process::{Child, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use super::{
    RedisServer, free_port,
    resp::{self, RedisResult, Value, command_at, info_field},
};

/// How to install `redis-sentinel`, printed when it is missing.
pub const INSTALL_SENTINEL: &str = "redis-sentinel not found on PATH: install it with `sudo apt-get install -y redis-sentinel` (or run .ci/run, which does)";

/// The name the sentinels monitor the master under.
const MASTER_NAME: &str = "mymaster";

/// How long [`RedisSentinels::start`] may take before it gives up.
const START_WITHIN: Duration = Duration::from_secs(30);

/// How long [`RedisSentinels::failover`] retries while a failover cannot start yet.
const FAILOVER_WITHIN: Duration = Duration::from_secs(10);

/// The pause between two polls.
const POLL: Duration = Duration::from_millis(50);

/// Arguments of every data server: full syncs start at once instead of waiting 5s for more
/// replicas.
const SERVER_ARGS: [&str; 2] = ["--repl-diskless-sync-delay", "0"];

/// A master, two replicas and three sentinels owned by this program (a test, an example),
/// stopped on drop.
///
/// # Behavior
/// - **Start**: a `redis-server` master (no persistence), two `--replicaof` it, then three
///   `redis-sentinel`s, each with its own writable config monitoring `mymaster` with quorum 2,
///   `down-after-milliseconds` 1000 and `failover-timeout` 5000. [`start`](Self::start)
///   returns once the replicas' links are up and every sentinel knows the master, both replicas
///   and the two other sentinels.
/// - **Failover**: [`failover`](Self::failover) forces one (`SENTINEL FAILOVER`); a killed
///   master is failed over by the sentinels about 1–2s after [`kill`](Self::kill).
///   [`wait_new_master`](Self::wait_new_master) waits until it is done. Killed processes stay
///   dead.
/// - **Drop**: every process is killed and its directory removed, also when
///   [`start`](Self::start) panics half-way.
#[derive(Debug)]
pub struct RedisSentinels {
    /// The master at start, then the replicas.
    servers: Vec<RedisServer>,
    sentinels: Vec<Sentinel>,
    killed: Vec<u16>,
}

/// One `redis-sentinel` process and the directory of its config file.
#[derive(Debug)]
struct Sentinel {
    port: u16,
    child: Option<Child>,
    dir: PathBuf,
}

impl RedisSentinels {
    /// `true` when `redis-server` and `redis-sentinel` are on `PATH`.
    #[must_use]
    pub fn available() -> bool {
        super::installed("redis-server") && super::installed("redis-sentinel")
    }

    /// Starts the master, its two replicas and three sentinels, and waits (up to 30s in all)
    /// until they all know each other.
    ///
    /// # Panics
    /// When `redis-server` or `redis-sentinel` is not installed (with the install command), or
    /// the deployment is not healthy in time (with what was still wrong).
    #[must_use]
    pub fn start() -> Self {
        let deadline = Instant::now() + START_WITHIN;
        let master = RedisServer::start_with_args(&SERVER_ARGS);
        let master_port = master.port().to_string();
        // Filled one by one: a panic below drops `deployment`, which stops what was started.
        let mut deployment = Self {
            servers: vec![master],
            sentinels: Vec::with_capacity(3),
            killed: Vec::new(),
        };
        let replica_args = [
            SERVER_ARGS[0],
            SERVER_ARGS[1],
            "--replicaof",
            "127.0.0.1",
            &master_port,
            "--replica-announce-ip",
            "127.0.0.1",
        ];
        for _ in 0..2 {
            deployment
                .servers
                .push(RedisServer::start_with_args(&replica_args));
        }
        // Sentinels learn replicas from the master's INFO, asked every 10s: linked replicas
        // are seen at the first one.
        wait_healthy(deadline, || deployment.replicas_linked());
        for _ in 0..3 {
            let sentinel = Sentinel::start(deployment.servers[0].port());
            deployment.sentinels.push(sentinel);
        }
        wait_healthy(deadline, || deployment.sentinels_ready());
        deployment
    }

    /// `Ok` when the master has two replicas whose links are up.
    fn replicas_linked(&self) -> Result<(), String> {
        let master = self.servers[0].port();
        let info = text(master, &["INFO", "replication"]).ok_or("master did not answer INFO")?;
        let connected = info_field(&info, "connected_slaves");
        if connected != Some("2") {
            return Err(format!(
                "master {master}: connected_slaves is {connected:?}"
            ));
        }
        for replica in &self.servers[1..] {
            let port = replica.port();
            let info = text(port, &["INFO", "replication"])
                .ok_or_else(|| format!("replica {port} did not answer INFO"))?;
            let link = info_field(&info, "master_link_status");
            if link != Some("up") {
                return Err(format!("replica {port}: master_link_status is {link:?}"));
            }
        }
        Ok(())
    }

    /// `Ok` when every sentinel knows the master, the two replicas (connected, links up) and the
    /// two other sentinels.
    fn sentinels_ready(&self) -> Result<(), String> {
        for sentinel in &self.sentinels {
            let port = sentinel.port;
            let master = master_fields(port)
                .ok_or_else(|| format!("sentinel {port}: no SENTINEL MASTER"))?;
            for (field, want) in [
                ("flags", "master"),
                ("num-slaves", "2"),
                ("num-other-sentinels", "2"),
            ] {
                let got = lookup(&master, field);
                if got != Some(want) {
                    return Err(format!("sentinel {port}: {field} is {got:?}, not {want}"));
                }
            }
            let replicas = replica_fields(port)
                .ok_or_else(|| format!("sentinel {port}: no SENTINEL REPLICAS"))?;
            for replica in &replicas {
                let flags = lookup(replica, "flags");
                let link = lookup(replica, "master-link-status");
                if flags != Some("slave") || link != Some("ok") {
                    return Err(format!(
                        "sentinel {port}: replica {:?} has flags {flags:?}, link {link:?}",
                        lookup(replica, "port")
                    ));
                }
            }
        }
        Ok(())
    }

    /// `redis+sentinel://127.0.0.1:s1,127.0.0.1:s2,127.0.0.1:s3/mymaster`.
    #[must_use]
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis+sentinel://{}/{MASTER_NAME}", hosts.join(","))
    }

    /// `mymaster`, the name the sentinels monitor the master under.
    #[must_use]
    pub fn master_name(&self) -> &'static str {
        MASTER_NAME
    }

    /// The sentinels' ports, killed ones included.
    #[must_use]
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }

    /// The data servers (master and replicas, killed ones included), in start order: the
    /// master at start first.
    #[must_use]
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// The data server on `port`.
    ///
    /// # Panics
    /// When no data server of this deployment listens on `port`.
    #[must_use]
    pub fn server(&self, port: u16) -> &RedisServer {
        self.servers
            .iter()
            .find(|s| s.port() == port)
            .unwrap_or_else(|| panic!("no data server on port {port}"))
    }

    /// The current master's port, as a live sentinel names it (`SENTINEL
    /// get-master-addr-by-name mymaster`).
    ///
    /// # Panics
    /// When no live sentinel answers.
    #[must_use]
    pub fn master_port(&self) -> u16 {
        self.live_sentinels()
            .into_iter()
            .find_map(master_addr)
            .expect("a live sentinel names the master")
    }

    /// The data servers that are neither the current master nor killed.
    #[must_use]
    pub fn replica_ports(&self) -> Vec<u16> {
        let master = self.master_port();
        self.servers
            .iter()
            .map(RedisServer::port)
            .filter(|&p| p != master && !self.killed.contains(&p))
            .collect()
    }

    /// Kills the data server or sentinel on `port` (SIGKILL) and waits for it to exit. It stays
    /// dead.
    ///
    /// # Panics
    /// When nothing of this deployment listens on `port`.
    pub fn kill(&mut self, port: u16) {
        if let Some(server) = self.servers.iter_mut().find(|s| s.port() == port) {
            server.kill();
        } else if let Some(sentinel) = self.sentinels.iter_mut().find(|s| s.port == port) {
            sentinel.kill();
        } else {
            panic!("no server or sentinel on port {port}");
        }
        if !self.killed.contains(&port) {
            self.killed.push(port);
        }
    }

    /// Forces a failover (`SENTINEL FAILOVER mymaster` on a live sentinel) without waiting for
    /// it to end; see [`wait_new_master`](Self::wait_new_master). Retries for up to 10s while
    /// the sentinel answers that one is in progress or no replica is fit yet.
    ///
    /// # Panics
    /// When it cannot be started.
    pub fn failover(&self) {
        let deadline = Instant::now() + FAILOVER_WITHIN;
        let sentinel = *self.live_sentinels().first().expect("a live sentinel");
        loop {
            let reply = command_at(sentinel, &["SENTINEL", "FAILOVER", MASTER_NAME]);
            let transient = match &reply {
                Ok(Value::Okay) => return,
                Err(e) => matches!(e.code(), Some("INPROG" | "NOGOODSLAVE")),
                _ => false,
            };
            assert!(
                transient && Instant::now() < deadline,
                "SENTINEL FAILOVER {MASTER_NAME} on {sentinel}: {reply:?}"
            );
            sleep(POLL);
        }
    }

    /// Waits until every live sentinel names the same master other than `old` and that server
    /// reports `role:master`, polling for up to `within`; its port, or `None` if not by then.
    #[must_use]
    pub fn wait_new_master(&self, old: u16, within: Duration) -> Option<u16> {
        let deadline = Instant::now() + within;
        loop {
            let named: Vec<Option<u16>> =
                self.live_sentinels().into_iter().map(master_addr).collect();
            if let Some(&Some(new)) = named.first() {
                let agreed = named.iter().all(|&p| p == Some(new));
                if agreed && new != old && role(new).as_deref() == Some("master") {
                    return Some(new);
                }
            }
            if Instant::now() >= deadline {
                return None;
            }
            sleep(POLL);
        }
    }

    /// Sends one command to the server or sentinel on `port` over a fresh connection (see
    /// [`RedisServer::command`]).
    ///
    /// # Errors
    /// Its error reply, or the connection's failure.
    pub fn command(&self, port: u16, args: &[&str]) -> RedisResult<Value> {
        command_at(port, args)
    }

    fn live_sentinels(&self) -> Vec<u16> {
        self.sentinels
            .iter()
            .map(|s| s.port)
            .filter(|p| !self.killed.contains(p))
            .collect()
    }
}

impl Sentinel {
    /// A sentinel on a free port monitoring the master on `master_port`, retried when the port
    /// was taken before it bound it.
    fn start(master_port: u16) -> Self {
        let mut last = String::new();
        for _ in 0..3 {
            let port = free_port();
            let dir =
                std::env::temp_dir().join(format!("dlock-sentinel-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("create a directory for redis-sentinel");
            let mut sentinel = Self {
                port,
                child: None,
                dir,
            };
            match sentinel.try_spawn(master_port) {
                Ok(()) => return sentinel,
                Err(e) => last = e,
            }
        }
        panic!("{last}");
    }

    fn try_spawn(&mut self, master_port: u16) -> Result<(), String> {
        // Sentinel rewrites its config file (what it learns, its id): it must be writable.
        let config = self.dir.join("sentinel.conf");
        let dir = self.dir.to_string_lossy();
        let text = format!(
            "port {port}\n\
             bind 127.0.0.1\n\
             protected-mode no\n\
             daemonize no\n\
             loglevel warning\n\
             logfile \"\"\n\
             dir \"{dir}\"\n\
             sentinel resolve-hostnames no\n\
             sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
             sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
             sentinel failover-timeout {MASTER_NAME} 5000\n\
             sentinel parallel-syncs {MASTER_NAME} 1\n",
            port = self.port,
        );
        std::fs::write(&config, text).expect("write sentinel.conf");
        let child = std::process::Command::new("redis-sentinel")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn();
        let mut child = match child {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!("{INSTALL_SENTINEL}"),
            Err(e) => panic!("could not start redis-sentinel: {e}"),
        };
        let ready = super::wait_ready(self.port, &mut child);
        self.child = Some(child);
        ready.map_err(|e| {
            self.kill();
            format!("redis-sentinel on {}: {e}", self.port)
        })
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Calls `check` every [`POLL`] until it is `Ok`, panicking with its last error at `deadline`.
fn wait_healthy(deadline: Instant, mut check: impl FnMut() -> Result<(), String>) {
    loop {
        let Err(e) = check() else { return };
        assert!(
            Instant::now() < deadline,
            "Redis Sentinel deployment not healthy within {START_WITHIN:?}: {e}"
        );
        sleep(POLL);
    }
}

/// The master's port as the sentinel on `sentinel` names it.
fn master_addr(sentinel: u16) -> Option<u16> {
    let reply = command_at(
        sentinel,
        &["SENTINEL", "get-master-addr-by-name", MASTER_NAME],
    )
    .ok()?;
    resp::text(resp::items(&reply)?.get(1)?)?.parse().ok()
}

/// `role` of `INFO replication` of the server on `port`.
fn role(port: u16) -> Option<String> {
    let info = text(port, &["INFO", "replication"])?;
    info_field(&info, "role").map(str::to_owned)
}

/// `SENTINEL MASTER mymaster` of the sentinel on `port`, as field-value pairs.
fn master_fields(port: u16) -> Option<Vec<(String, String)>> {
    pairs(resp::items(
        &command_at(port, &["SENTINEL", "MASTER", MASTER_NAME]).ok()?,
    )?)
}

/// `SENTINEL REPLICAS mymaster` of the sentinel on `port`: field-value pairs per replica.
fn replica_fields(port: u16) -> Option<Vec<Vec<(String, String)>>> {
    let reply = command_at(port, &["SENTINEL", "REPLICAS", MASTER_NAME]).ok()?;
    resp::items(&reply)?
        .iter()
        .map(|r| pairs(resp::items(r)?))
        .collect()
}

/// A flat field-value array as pairs.
fn pairs(flat: &[Value]) -> Option<Vec<(String, String)>> {
    flat.chunks(2)
        .map(|kv| Some((resp::text(kv.first()?)?, resp::text(kv.get(1)?)?)))
        .collect()
}

fn lookup<'a>(pairs: &'a [(String, String)], field: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == field)
        .map(|(_, v)| v.as_str())
}

fn text(port: u16, args: &[&str]) -> Option<String> {
    resp::text(&command_at(port, args).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_and_fails_over() {
        let started = Instant::now();
        let sentinels = RedisSentinels::start();
        eprintln!("sentinels started in {:?}", started.elapsed());

        let old = sentinels.master_port();
        assert_eq!(old, sentinels.servers()[0].port());
        assert_eq!(role(old).as_deref(), Some("master"));
        let replicas = sentinels.replica_ports();
        assert_eq!(replicas.len(), 2);
        for &replica in &replicas {
            assert_eq!(role(replica).as_deref(), Some("slave"));
        }
        let ports = sentinels.sentinel_ports();
        assert_eq!(
            sentinels.url(),
            format!(
                "redis+sentinel://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}/mymaster",
                ports[0], ports[1], ports[2]
            )
        );
        assert_eq!(
            sentinels.command(old, &["SET", "k", "v"]).ok(),
            Some(Value::Okay)
        );

        let started = Instant::now();
        sentinels.failover();
        let new = sentinels
            .wait_new_master(old, Duration::from_secs(15))
            .expect("a new master within 15s");
        eprintln!("failed over in {:?}", started.elapsed());
        assert!(replicas.contains(&new));
        assert_eq!(sentinels.master_port(), new);
        assert_eq!(
            sentinels.server(new).command(&["GET", "k"]).ok(),
            Some(Value::BulkString(b"v".to_vec()))
        );
        assert_eq!(
            sentinels.command(new, &["SET", "k", "w"]).ok(),
            Some(Value::Okay)
        );

        let mut all = ports;
        all.extend(sentinels.servers().iter().map(RedisServer::port));
        drop(sentinels);
        assert!(all.iter().all(|&p| !crate::ping(p)));
    }
}
