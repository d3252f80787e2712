//! One throwaway PostgreSQL cluster: `initdb` into a fresh temporary directory, the server on a
//! free loopback port with its Unix socket in that directory, stopped and removed when dropped.
//! Never the machine's own PostgreSQL service.

use std::{
    fs::File,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use super::free_port;

/// How to install the PostgreSQL server, said when it is missing.
pub const INSTALL_POSTGRES: &str = "the PostgreSQL server (initdb, postgres) was not found in \
    /usr/lib/postgresql/<version>/bin, in `pg_config --bindir` nor in DLOCK_PG_BINDIR: install it \
    with `sudo apt-get install -y postgresql` (or run .ci/run, which does)";

/// The superuser of a throwaway cluster (trust authentication on loopback and its socket).
pub const SUPERUSER: &str = "dlock";

/// A PostgreSQL server owned by this program (a test, an example).
///
/// # Behavior
/// - **Start**: `initdb` (user [`SUPERUSER`], trust authentication, UTF8, locale C, no sync)
///   into a fresh temporary directory, then `postgres` on a free port of 127.0.0.1, its Unix
///   socket in that directory, with `fsync=off` and `synchronous_commit=off` (a test database,
///   not a durable one; a clean restart keeps every row). The start returns once the server
///   accepts connections. `initdb` and `postgres` refuse to run as root: run as root, the
///   harness runs them as the `postgres` system user (`setpriv`), which the Debian package
///   creates, and gives it the directory.
/// - **Faults**: [`restart`](Self::restart) (fast shutdown, then the same cluster on the same
///   port), [`pause`](Self::pause) and [`resume`](Self::resume) (SIGSTOP/SIGCONT to the
///   postmaster and every backend), [`sql`](Self::sql) for `pg_terminate_backend` and the like.
/// - **Drop**: the server is stopped (fast shutdown, SIGKILL after 5s) and its directory
///   removed. A program that is killed itself (SIGKILL) cannot do this; the server then
///   outlives it.
#[derive(Debug)]
pub struct PostgresServer {
    port: u16,
    dir: PathBuf,
    bin: PathBuf,
    /// `(uid, gid)` of the `postgres` user when this program runs as root.
    run_as: Option<(u32, u32)>,
    settings: Vec<String>,
    child: Option<Child>,
}

impl PostgresServer {
    /// The directory holding `initdb` and `postgres`: `DLOCK_PG_BINDIR`, else the newest
    /// `/usr/lib/postgresql/<version>/bin`, else `pg_config --bindir`.
    #[must_use]
    pub fn bindir() -> Option<PathBuf> {
        let usable = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
        if let Some(dir) = std::env::var_os("DLOCK_PG_BINDIR").map(PathBuf::from) {
            return usable(&dir).then_some(dir);
        }
        let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let version = e.file_name().to_str()?.parse().ok()?;
                Some((version, e.path().join("bin")))
            })
            .filter(|(_, bin)| usable(bin))
            .collect();
        versions.sort();
        if let Some((_, bin)) = versions.pop() {
            return Some(bin);
        }
        let out = Command::new("pg_config").arg("--bindir").output().ok()?;
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        usable(&dir).then_some(dir)
    }

    /// `true` when the server binaries are installed.
    #[must_use]
    pub fn available() -> bool {
        Self::bindir().is_some()
    }

    /// The server's version, as `postgres --version` prints it (`15.14`), if it can tell.
    #[must_use]
    pub fn version() -> Option<String> {
        let out = Command::new(Self::bindir()?.join("postgres"))
            .arg("--version")
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.split_whitespace().nth(2).map(str::to_owned)
    }

    /// Creates a cluster and starts it; see the type's docs.
    ///
    /// # Panics
    /// When PostgreSQL is not installed (with the install command) or does not come up;
    /// [`try_start`](Self::try_start) returns the error instead.
    #[must_use]
    pub fn start() -> Self {
        Self::try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`start`](Self::start), returning why the server did not come up.
    ///
    /// # Errors
    /// When PostgreSQL is not installed (kind `NotFound`, the message says how to install it),
    /// `initdb` fails, or the server does not accept connections within 30s.
    pub fn try_start() -> std::io::Result<Self> {
        Self::try_start_with(&[])
    }

    /// Like [`try_start`](Self::try_start), with server settings added (`name=value`, each
    /// passed as `-c name=value`), kept for [`restart`](Self::restart).
    ///
    /// # Errors
    /// As [`try_start`](Self::try_start).
    pub fn try_start_with(settings: &[&str]) -> std::io::Result<Self> {
        Self::try_start_inner(settings, false)
    }

    /// Like [`start`](Self::start), with TLS on (`ssl=on`): its certificate, for `localhost`
    /// and `127.0.0.1`, is signed by a fresh CA ([`ca_file`](Self::ca_file)), made with the
    /// `openssl` command; connections are logged, so the log tells which used TLS.
    ///
    /// # Panics
    /// When `openssl` or PostgreSQL is missing or fails.
    #[must_use]
    pub fn start_tls() -> Self {
        Self::try_start_inner(&[], true).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The CA certificate (PEM file) that signed the certificate of a server started with
    /// [`start_tls`](Self::start_tls).
    #[must_use]
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    fn try_start_inner(settings: &[&str], tls: bool) -> std::io::Result<Self> {
        let bin = Self::bindir()
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, INSTALL_POSTGRES))?;
        let run_as = if is_root() {
            Some(postgres_user().ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!(
                        "running as root, and there is no `postgres` system user to run the \
                         server as: {INSTALL_POSTGRES}"
                    ),
                )
            })?)
        } else {
            None
        };
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("dlock-pg-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))?;
        }
        let mut settings: Vec<String> = settings.iter().map(|&s| s.to_owned()).collect();
        if tls {
            super::server::make_certificates(&dir);
            for file in ["server.crt", "server.key", "ca.crt"] {
                let path = dir.join(file);
                if let Some((uid, gid)) = run_as {
                    std::os::unix::fs::chown(&path, Some(uid), Some(gid))?;
                }
                // The server refuses a key file others may read.
                std::fs::set_permissions(
                    &path,
                    std::os::unix::fs::PermissionsExt::from_mode(0o600),
                )?;
            }
            settings.extend([
                "ssl=on".to_owned(),
                format!("ssl_cert_file={}", dir.join("server.crt").display()),
                format!("ssl_key_file={}", dir.join("server.key").display()),
                "log_connections=on".to_owned(),
            ]);
        }
        let mut server = Self {
            port,
            dir,
            bin,
            run_as,
            settings,
            child: None,
        };
        server.initdb()?;
        // A port free when probed can be taken before the server binds it: try another.
        let mut last = None;
        for _ in 0..3 {
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(e) => {
                    last = Some(e);
                    server.port = free_port();
                }
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("postgres did not start")))
    }

    /// A command running `program` of the server's bin directory, as the `postgres` user when
    /// this program is root.
    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        let mut command = match self.run_as {
            Some((uid, gid)) => {
                let mut c = Command::new("setpriv");
                c.arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={gid}"))
                    .arg("--clear-groups")
                    .arg("--")
                    .arg(path);
                c
            }
            None => Command::new(path),
        };
        command.current_dir(&self.dir).stdin(Stdio::null());
        command
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn log(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    fn initdb(&self) -> std::io::Result<()> {
        let out = self
            .command("initdb")
            .arg("-D")
            .arg(self.data())
            .args(["-U", SUPERUSER, "-A", "trust", "-E", "UTF8", "--locale=C"])
            .args(["--no-sync", "--no-instructions"])
            .output()
            .map_err(|e| std::io::Error::other(format!("could not run initdb: {e}")))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(std::io::Error::other(format!(
                "initdb failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    }

    /// Starts the server on `self.port` and waits until it accepts connections.
    fn spawn(&mut self) -> std::io::Result<()> {
        let log = File::create(self.log())?;
        if let Some((uid, gid)) = self.run_as {
            std::os::unix::fs::chown(self.log(), Some(uid), Some(gid))?;
        }
        let mut command = self.command("postgres");
        command
            .arg("-D")
            .arg(self.data())
            .args(["-p", &self.port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", self.dir.display()))
            .args(["-c", "fsync=off", "-c", "synchronous_commit=off"])
            .args(["-c", "full_page_writes=off", "-c", "max_connections=300"])
            .args([
                "-c",
                "log_min_messages=warning",
                "-c",
                "logging_collector=off",
            ]);
        for setting in &self.settings {
            command.arg("-c").arg(setting);
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| std::io::Error::other(format!("could not start postgres: {e}")))?;
        self.child = Some(child);
        let ready = self.wait_ready();
        if ready.is_err() {
            self.stop();
        }
        ready
    }

    /// Waits (up to 30s) for `postmaster.pid` to say `ready`, and for the port to accept.
    fn wait_ready(&mut self) -> std::io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let pid_file = self.data().join("postmaster.pid");
        loop {
            let ready = std::fs::read_to_string(&pid_file)
                .is_ok_and(|s| s.lines().nth(7).is_some_and(|l| l.trim() == "ready"));
            if ready && std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            let child = self.child.as_mut().expect("started");
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Err(std::io::Error::other(format!(
                    "postgres exited at start ({status}); port {} may be taken: {}",
                    self.port,
                    self.log_tail()
                )));
            }
            if Instant::now() > deadline {
                return Err(std::io::Error::other(format!(
                    "postgres did not accept connections within 30s: {}",
                    self.log_tail()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Everything the server logged.
    #[must_use]
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.log()).unwrap_or_default()
    }

    /// The last lines the server logged.
    #[must_use]
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }

    /// The port it listens on (127.0.0.1).
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory holding its Unix socket (`.s.PGSQL.<port>`).
    #[must_use]
    pub fn socket_dir(&self) -> &Path {
        &self.dir
    }

    /// `postgres://dlock@127.0.0.1:<port>/postgres`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("postgres://{SUPERUSER}@127.0.0.1:{}/postgres", self.port)
    }

    /// The URL of `user` over TCP on database `postgres`.
    #[must_use]
    pub fn url_as(&self, user: &str) -> String {
        format!("postgres://{user}@127.0.0.1:{}/postgres", self.port)
    }

    /// The same database over the Unix socket: `postgresql://dlock@%2Ftmp%2F…:<port>/postgres`.
    #[must_use]
    pub fn socket_url(&self) -> String {
        let dir = self.dir.to_string_lossy().replace('/', "%2F");
        format!("postgresql://{SUPERUSER}@{dir}:{}/postgres", self.port)
    }

    /// Runs `sql` with `psql` as the superuser over TCP, and returns what it printed (unaligned,
    /// tuples only).
    ///
    /// # Errors
    /// When psql cannot run or the statement fails (with psql's message).
    pub fn sql(&self, sql: &str) -> std::io::Result<String> {
        self.sql_as(SUPERUSER, sql)
    }

    /// [`sql`](Self::sql) as `user`.
    ///
    /// # Errors
    /// As [`sql`](Self::sql).
    pub fn sql_as(&self, user: &str, sql: &str) -> std::io::Result<String> {
        let out = Command::new(self.bin.join("psql"))
            .args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", user, "-d", "postgres", "-c", sql])
            .env("PGCONNECT_TIMEOUT", "5")
            .stdin(Stdio::null())
            .output()?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        } else {
            Err(std::io::Error::other(format!(
                "psql: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    }

    /// Stops the server (fast shutdown: connections are closed, the cluster stays), waiting up
    /// to 5s before killing it.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = child.id();
        signal("-CONT", &cluster_pids(pid));
        signal("-INT", &[pid]);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let pids = cluster_pids(pid);
        signal("-KILL", &pids);
        let _ = child.wait();
    }

    /// Stops the server and starts the same cluster again on the same port: every committed
    /// row is kept, every connection is closed.
    ///
    /// # Panics
    /// When the server does not come back (the port may have been taken meanwhile).
    pub fn restart(&mut self) {
        self.stop();
        if let Err(e) = self.spawn() {
            panic!("postgres did not restart: {e}");
        }
    }

    /// Freezes the server (SIGSTOP to the postmaster and every backend): connections stay open,
    /// nothing is answered.
    ///
    /// # Panics
    /// When the server is not running.
    pub fn pause(&self) {
        let pid = self.child.as_ref().expect("server running").id();
        signal("-STOP", &cluster_pids(pid));
    }

    /// Resumes a paused server (SIGCONT).
    ///
    /// # Panics
    /// When the server is not running.
    pub fn resume(&self) {
        let pid = self.child.as_ref().expect("server running").id();
        signal("-CONT", &cluster_pids(pid));
    }

    /// The process ids of the running server: the postmaster and its children (backends and
    /// auxiliary processes), for measuring its CPU time. Empty when it is stopped.
    #[must_use]
    pub fn pids(&self) -> Vec<u32> {
        self.child
            .as_ref()
            .map_or_else(Vec::new, |c| cluster_pids(c.id()))
    }
}

/// The postmaster `pid` and its children now (the backends, forked per connection, and the
/// auxiliary processes).
#[must_use]
pub fn cluster_pids(pid: u32) -> Vec<u32> {
    let mut pids = vec![pid];
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`: the name may hold spaces, so read after the last `)`.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            pids.push(child);
        }
    }
    pids
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn signal(signal: &str, pids: &[u32]) {
    if pids.is_empty() {
        return;
    }
    let _ = Command::new("kill")
        .arg(signal)
        .args(pids.iter().map(u32::to_string))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

fn is_root() -> bool {
    // `/proc/self` belongs to the process's effective user.
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// The `postgres` system user's uid and gid, from `/etc/passwd`.
fn postgres_user() -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.first() == Some(&"postgres"))
            .then(|| Some((fields.get(2)?.parse().ok()?, fields.get(3)?.parse().ok()?)))?
    })
}
