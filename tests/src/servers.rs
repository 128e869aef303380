//! Real servers for the remote backends' tests, started on loopback ports
//! by the tests themselves and stopped when dropped: `redis-server` (from
//! Debian's `redis-server` package) and `s3s-fs` (an S3 server that checks
//! SigV4 signatures; `scripts/test-servers.sh` builds it once outside the
//! clone and links it into `target/tools`).
//! For the event sources: `nats-server` (Debian's `nats-server`) and
//! `tests/scripts/kv_publisher.py`, a vLLM/SGLang-shaped KV event publisher
//! run by the venv `scripts/test-servers.sh` makes in `target/tools/pyenv`.
//!
//! A server that cannot start fails the test with its log: these tests
//! never skip.

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::tls::{CertFiles, Pki};

/// A free loopback port (bound, then released for the server to take),
/// never one handed out before in this process: the kernel may give a
/// released port to the next caller, and two tests running at once would
/// then start their servers on one port, the second test talking to the
/// first one's server until it is killed.
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().expect("local addr").port();
        let mut handed_out = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
        if handed_out.insert(port) {
            return port;
        }
    }
}

/// How long one `redis-cli` command may take (a query, not a cluster
/// operation) before the harness kills it and fails the test: a node that
/// accepts connections but answers nothing would otherwise hang the test.
pub const CLI_DEADLINE: Duration = Duration::from_secs(60);

/// A command the harness started, killed and reported if it runs past its
/// deadline. Its output goes to files (read when it ends), so a command
/// that writes a lot never blocks on a full pipe.
pub struct Bounded {
    child: Child,
    what: String,
    started: Instant,
    limit: Duration,
    stdout: std::fs::File,
    stderr: std::fs::File,
}

impl Bounded {
    /// Start `cmd` (stdin closed), described as `what` in failures, with
    /// `limit` to finish.
    pub fn start(cmd: &mut Command, what: &str, limit: Duration) -> Bounded {
        let stdout = tempfile::tempfile().expect("a temporary file for stdout");
        let stderr = tempfile::tempfile().expect("a temporary file for stderr");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(stdout.try_clone().expect("clone the stdout file"))
            .stderr(stderr.try_clone().expect("clone the stderr file"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        Bounded {
            child,
            what: what.to_owned(),
            started: Instant::now(),
            limit,
            stdout,
            stderr,
        }
    }

    /// Its output if it has ended; `None` while it runs. Past its deadline
    /// it is killed and the test fails, naming it, with what it wrote.
    pub fn try_finish(&mut self) -> Option<std::process::Output> {
        let status = self.child.try_wait().expect("poll a child process");
        let Some(status) = status else {
            if self.started.elapsed() > self.limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let (stdout, stderr) = self.written();
                panic!(
                    "{} did not finish within {:?} and was killed; stdout:\n{}\nstderr:\n{}",
                    self.what,
                    self.limit,
                    String::from_utf8_lossy(&stdout),
                    String::from_utf8_lossy(&stderr)
                );
            }
            return None;
        };
        let (stdout, stderr) = self.written();
        Some(std::process::Output {
            status,
            stdout,
            stderr,
        })
    }

    /// Wait for it to end (polling), within its deadline.
    pub fn finish(mut self) -> std::process::Output {
        loop {
            if let Some(out) = self.try_finish() {
                return out;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn written(&mut self) -> (Vec<u8>, Vec<u8>) {
        use std::io::{Read, Seek};
        let read = |file: &mut std::fs::File| {
            let mut bytes = Vec::new();
            file.seek(std::io::SeekFrom::Start(0))
                .and_then(|_| file.read_to_end(&mut bytes))
                .expect("read a command's output");
            bytes
        };
        (read(&mut self.stdout), read(&mut self.stderr))
    }
}

impl Drop for Bounded {
    /// A test that fails while the command runs does not leave it behind.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Wait until `addr` accepts connections, or panic with `log`'s content.
fn wait_listening(addr: SocketAddr, child: &mut Child, what: &str, log: &Path) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "{what} exited with {status} before listening on {addr}; log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "{what} did not listen on {addr} within 20 s; log:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

/// A `redis-server` on 127.0.0.1 with AOF persistence (`appendfsync
/// always`) in a temporary directory, requiring `password` if set.
pub struct RedisServer {
    pub addr: SocketAddr,
    pub password: Option<String>,
    /// `redis-cli`'s TLS options, for a server that speaks only TLS.
    cli_tls: Vec<String>,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl RedisServer {
    /// A server that requires a (random) password.
    pub fn start() -> RedisServer {
        RedisServer::launch(Some(format!("pw-{:016x}", rand_u64())))
    }

    /// A server open to any loopback client, for in-process tests (which
    /// cannot hand a secret to the guest without changing their own
    /// environment).
    pub fn without_password() -> RedisServer {
        RedisServer::launch(None)
    }

    /// A server that speaks only TLS (`port 0`: no plain-text listener)
    /// with `cert`, signed by `pki`'s CA, requiring a password if
    /// `password`, and a client certificate from `pki`'s CA if `mutual`.
    pub fn start_tls(pki: &Pki, cert: &CertFiles, password: bool, mutual: bool) -> RedisServer {
        let conf = format!(
            "tls-cert-file {}
tls-key-file {}
tls-ca-cert-file {}
tls-auth-clients {}
",
            cert.cert.display(),
            cert.key.display(),
            pki.ca.display(),
            if mutual { "yes" } else { "no" }
        );
        let cli_tls = [
            "--tls",
            "--cacert",
            &pki.ca.to_string_lossy(),
            "--cert",
            &pki.client.cert.to_string_lossy(),
            "--key",
            &pki.client.key.to_string_lossy(),
        ]
        .map(str::to_owned)
        .to_vec();
        let password = password.then(|| format!("pw-{:016x}", rand_u64()));
        RedisServer::launch_with(password, Some((conf, cli_tls)))
    }

    fn launch(password: Option<String>) -> RedisServer {
        RedisServer::launch_with(password, None)
    }

    fn launch_with(password: Option<String>, tls: Option<(String, Vec<String>)>) -> RedisServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let auth = password
            .as_ref()
            .map(|p| format!("requirepass {p}\n"))
            .unwrap_or_default();
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let (ports, cli_tls) = match tls {
            Some((conf, cli)) => (format!("port 0\ntls-port {}\n{conf}", addr.port()), cli),
            None => (format!("port {}\n", addr.port()), Vec::new()),
        };
        std::fs::write(
            dir.path().join("redis.conf"),
            format!(
                "bind 127.0.0.1\n{ports}protected-mode yes\ndir {}\n\
                 appendonly yes\nappendfsync always\nsave \"\"\n\
                 {auth}logfile {}\n",
                dir.path().display(),
                dir.path().join("redis.log").display()
            ),
        )
        .expect("write redis.conf");
        let mut server = RedisServer {
            addr,
            password,
            cli_tls,
            dir,
            child: None,
        };
        server.restart();
        server
    }

    /// Start (again) on the same port and data directory.
    pub fn restart(&mut self) {
        let binary = which("redis-server").unwrap_or_else(|| {
            panic!(
                "redis-server not found: run `bash scripts/test-servers.sh` (apt-get install redis-server)"
            )
        });
        let mut child = Command::new(binary)
            .arg(self.dir.path().join("redis.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        wait_listening(
            self.addr,
            &mut child,
            "redis-server",
            &self.dir.path().join("redis.log"),
        );
        self.child = Some(child);
    }

    /// SIGKILL the server: no shutdown, no final save.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stop the server process (SIGSTOP): it keeps its socket but answers
    /// nothing, like a hung or partitioned server.
    pub fn freeze(&self, frozen: bool) {
        let child = self.child.as_ref().expect("redis-server is running");
        let signal = if frozen { libc::SIGSTOP } else { libc::SIGCONT };
        let pid = i32::try_from(child.id()).expect("pid");
        // SAFETY: kill(2) with our own child's pid and a valid signal
        // number touches no memory of this process.
        let sent = unsafe { libc::kill(pid, signal) };
        assert_eq!(sent, 0, "kill({pid}, {signal})");
    }

    /// `redis-cli` output for `args`, authenticated.
    pub fn cli(&self, args: &[&str]) -> String {
        let mut cmd = Command::new("redis-cli");
        cmd.args(["-h", "127.0.0.1", "-p", &self.addr.port().to_string()]);
        cmd.args(&self.cli_tls);
        if let Some(password) = &self.password {
            cmd.env("REDISCLI_AUTH", password);
        }
        cmd.args(args);
        let what = format!("redis-cli {} against {}", args.join(" "), self.addr);
        let out = Bounded::start(&mut cmd, &what, CLI_DEADLINE).finish();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `SET key value` with a binary value of any size, over RESP on a
    /// connection of its own (`cli` passes values in argv).
    pub fn set(&self, key: &str, value: &[u8]) {
        use std::io::{Read, Write};
        let mut conn =
            TcpStream::connect_timeout(&self.addr, CLI_DEADLINE).expect("connect to redis-server");
        conn.set_read_timeout(Some(CLI_DEADLINE))
            .and_then(|()| conn.set_write_timeout(Some(CLI_DEADLINE)))
            .expect("set the connection's timeouts");
        let mut request = Vec::new();
        if let Some(password) = &self.password {
            request.extend(resp(&[b"AUTH", password.as_bytes()]));
        }
        request.extend(resp(&[b"SET", key.as_bytes(), value]));
        conn.write_all(&request).expect("send SET");
        let expected: &[u8] = if self.password.is_some() {
            b"+OK\r\n+OK\r\n"
        } else {
            b"+OK\r\n"
        };
        let mut reply = vec![0; expected.len()];
        conn.read_exact(&mut reply).expect("read SET reply");
        assert_eq!(reply, expected, "SET {key}");
    }

    /// A counter from `INFO stats`.
    pub fn info_stat(&self, name: &str) -> u64 {
        let info = self.cli(&["INFO", "stats"]);
        let prefix = format!("{name}:");
        info.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map(|n| n.trim().parse().expect("a counter"))
            .unwrap_or_else(|| panic!("no {name} in INFO stats"))
    }

    /// The server's call count for `command` (from `INFO commandstats`).
    pub fn calls(&self, command: &str) -> u64 {
        let info = self.cli(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{}:calls=", command.to_ascii_lowercase());
        info.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().expect("calls count"))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.freeze(false);
        }
        self.kill();
    }
}

/// A Redis Cluster on 127.0.0.1: `masters` masters with one replica each
/// (`redis-server --cluster-enabled yes` per node, joined by `redis-cli
/// --cluster create ... --cluster-replicas 1`), each node in a directory of
/// its own in one temporary directory. Every wait polls the cluster's own
/// state, with a generous deadline; none sleeps a fixed time.
pub struct RedisCluster {
    pub nodes: Vec<SocketAddr>,
    pub password: Option<String>,
    /// `redis-cli`'s TLS options, for a cluster that speaks only TLS.
    cli_tls: Vec<String>,
    dir: tempfile::TempDir,
    children: Vec<Option<Child>>,
}

/// How long a cluster may take to reach a state, or a cluster operation
/// (`redis-cli --cluster create`, `reshard`) to finish: a loaded 2-core
/// machine runs six servers and the tests at once.
pub const CLUSTER_DEADLINE: Duration = Duration::from_secs(180);

impl RedisCluster {
    /// `masters` × 2 nodes, requiring `password` if set.
    pub fn start(masters: usize, password: Option<String>) -> RedisCluster {
        RedisCluster::launch(masters, password, None)
    }

    /// `masters` × 2 nodes that speak only TLS (`port 0`), to clients and
    /// to each other (`tls-cluster`, `tls-replication`), with `pki`'s
    /// server certificate, requiring `password` if set, and with
    /// `acl_user` (`(name, password)`) allowed every key and command.
    pub fn start_tls(
        masters: usize,
        pki: &Pki,
        password: Option<String>,
        acl_user: Option<(&str, &str)>,
    ) -> RedisCluster {
        // A node dialing another's bus must show a client certificate
        // (the bus always asks for one), hence `tls-client-cert-file`.
        let mut conf = format!(
            "tls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n\
             tls-client-cert-file {}\ntls-client-key-file {}\n\
             tls-auth-clients no\ntls-cluster yes\ntls-replication yes\n",
            pki.server.cert.display(),
            pki.server.key.display(),
            pki.ca.display(),
            pki.client.cert.display(),
            pki.client.key.display(),
        );
        if let Some((name, secret)) = acl_user {
            conf.push_str(&format!("user {name} on >{secret} ~* &* +@all\n"));
        }
        let cli_tls = ["--tls", "--cacert", &pki.ca.to_string_lossy()]
            .map(str::to_owned)
            .to_vec();
        RedisCluster::launch(masters, password, Some((conf, cli_tls)))
    }

    fn launch(
        masters: usize,
        password: Option<String>,
        tls: Option<(String, Vec<String>)>,
    ) -> RedisCluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let nodes: Vec<SocketAddr> = (0..masters * 2)
            .map(|_| SocketAddr::from(([127, 0, 0, 1], free_port())))
            .collect();
        let (tls_conf, cli_tls) = tls.unwrap_or_default();
        for (i, addr) in nodes.iter().enumerate() {
            let node_dir = dir.path().join(format!("node{i}"));
            std::fs::create_dir(&node_dir).expect("node dir");
            let auth = password
                .as_ref()
                .map(|p| format!("requirepass {p}\nmasterauth {p}\n"))
                .unwrap_or_default();
            let ports = if cli_tls.is_empty() {
                format!("port {}\n", addr.port())
            } else {
                format!("port 0\ntls-port {}\n{tls_conf}", addr.port())
            };
            // The bus port is chosen too: the default (port + 10000) is
            // past 65535 for a port above 55535. A replica's first sync
            // starts at once: Redis 7 otherwise waits 5 s for more replicas
            // to share a diskless transfer (readiness is still polled).
            std::fs::write(
                node_dir.join("redis.conf"),
                format!(
                    "bind 127.0.0.1\n{ports}cluster-port {}\nprotected-mode yes\ndir {}\n\
                     cluster-enabled yes\ncluster-config-file nodes.conf\n\
                     cluster-node-timeout 3000\nappendonly no\nsave \"\"\n\
                     repl-diskless-sync-delay 0\n{auth}logfile {}\n",
                    free_port(),
                    node_dir.display(),
                    node_dir.join("redis.log").display()
                ),
            )
            .expect("write redis.conf");
        }
        let mut cluster = RedisCluster {
            nodes,
            password,
            cli_tls,
            dir,
            children: Vec::new(),
        };
        for i in 0..cluster.nodes.len() {
            cluster.children.push(None);
            cluster.restart(i);
        }
        let mut create = cluster.redis_cli();
        create.arg("--cluster").arg("create");
        create.args(cluster.nodes.iter().map(ToString::to_string));
        create.args(["--cluster-replicas", "1", "--cluster-yes"]);
        let out =
            Bounded::start(&mut create, "redis-cli --cluster create", CLUSTER_DEADLINE).finish();
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.wait_healthy();
        cluster
    }

    /// `redis-cli` with the cluster's password and TLS options, if any.
    fn redis_cli(&self) -> Command {
        let mut cmd = Command::new("redis-cli");
        cmd.args(&self.cli_tls);
        if let Some(password) = &self.password {
            cmd.env("REDISCLI_AUTH", password);
        }
        cmd
    }

    /// `redis-cli` output for `args` sent to node `node`.
    pub fn cli(&self, node: usize, args: &[&str]) -> String {
        let mut cmd = self.redis_cli();
        cmd.args([
            "-h",
            "127.0.0.1",
            "-p",
            &self.nodes[node].port().to_string(),
        ])
        .args(args);
        let what = format!(
            "redis-cli {} against cluster node {node} ({})",
            args.join(" "),
            self.nodes[node]
        );
        let out = Bounded::start(&mut cmd, &what, CLI_DEADLINE).finish();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Start node `node` (again) on its port and directory: a master that
    /// was killed and failed over comes back as its successor's replica.
    pub fn restart(&mut self, node: usize) {
        let binary = which("redis-server").unwrap_or_else(|| {
            panic!("redis-server not found: run `bash scripts/test-servers.sh`")
        });
        let node_dir = self.dir.path().join(format!("node{node}"));
        let mut child = Command::new(binary)
            .arg(node_dir.join("redis.conf"))
            .current_dir(&node_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        wait_listening(
            self.nodes[node],
            &mut child,
            "redis-server (cluster node)",
            &node_dir.join("redis.log"),
        );
        self.children[node] = Some(child);
    }

    /// SIGKILL node `node`: no shutdown, nothing handed over.
    pub fn kill(&mut self, node: usize) {
        if let Some(mut child) = self.children[node].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn alive(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&i| self.children[i].is_some())
    }

    /// `CLUSTER NODES` as seen by node `node`: one line per node.
    pub fn topology(&self, node: usize) -> String {
        self.cli(node, &["CLUSTER", "NODES"])
    }

    /// The nodes (by index) that are masters serving slots now, as every
    /// running node sees it; `None` while they disagree.
    pub fn masters(&self) -> Option<Vec<usize>> {
        let mut seen = None;
        for node in self.alive() {
            let topology = self.topology(node);
            let mut masters: Vec<usize> = topology
                .lines()
                .filter_map(|line| {
                    let fields: Vec<&str> = line.split(' ').collect();
                    let serving = fields.len() > 8
                        && fields[2].contains("master")
                        && !fields[2].contains("fail");
                    serving.then(|| {
                        let port = fields[1].split(['@', ',']).next()?.rsplit(':').next()?;
                        self.nodes.iter().position(|a| a.port().to_string() == port)
                    })?
                })
                .collect();
            masters.sort_unstable();
            match &seen {
                None => seen = Some(masters),
                Some(other) if *other == masters => {}
                Some(_) => return None,
            }
        }
        seen
    }

    /// The cluster ID of node `node`.
    pub fn id(&self, node: usize) -> String {
        self.cli(node, &["CLUSTER", "MYID"]).trim().to_owned()
    }

    /// Whether every running node reports `cluster_state:ok` with all
    /// slots served, they agree on the masters, and every master has a
    /// replica that is in sync (`WAIT 1` can then be met).
    pub fn healthy(&self) -> bool {
        let ok = self.alive().all(|node| {
            let info = self.cli(node, &["CLUSTER", "INFO"]);
            info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
        });
        let Some(masters) = self.masters().filter(|_| ok) else {
            return false;
        };
        masters.len() * 2 == self.alive().count()
            && masters.iter().all(|&m| {
                let info = self.cli(m, &["INFO", "replication"]);
                info.contains("connected_slaves:1")
                    && info
                        .lines()
                        .any(|l| l.starts_with("slave0:") && l.contains("state=online"))
            })
    }

    /// Poll until [`RedisCluster::healthy`], or panic with the topology.
    pub fn wait_healthy(&self) {
        self.wait_for(
            "healthy (all slots served, a synced replica per master)",
            || self.healthy(),
        );
    }

    /// Poll until `done`, or panic after a generous deadline, naming `what`.
    pub fn wait_for(&self, what: &str, mut done: impl FnMut() -> bool) {
        let start = Instant::now();
        while !done() {
            if start.elapsed() > CLUSTER_DEADLINE {
                let first = self.alive().next().unwrap_or(0);
                panic!(
                    "the cluster did not become {what} within {CLUSTER_DEADLINE:?}; \
                     CLUSTER NODES:\n{}",
                    self.topology(first)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Move `slots` slots, with their keys, from master `from` to master
    /// `to` (`redis-cli --cluster reshard`); returns the running process,
    /// which fails the test if it runs past [`CLUSTER_DEADLINE`].
    pub fn reshard(&self, from: usize, to: usize, slots: usize) -> Bounded {
        let mut cmd = self.redis_cli();
        cmd.args(["--cluster", "reshard", &self.nodes[to].to_string()])
            .args(["--cluster-from", &self.id(from)])
            .args(["--cluster-to", &self.id(to)])
            .args(["--cluster-slots", &slots.to_string()])
            .args(["--cluster-pipeline", "4", "--cluster-yes"]);
        Bounded::start(&mut cmd, "redis-cli --cluster reshard", CLUSTER_DEADLINE)
    }

    /// Keys stored on node `node`.
    pub fn dbsize(&self, node: usize) -> u64 {
        self.cli(node, &["DBSIZE"])
            .trim()
            .parse()
            .expect("DBSIZE is a number")
    }

    /// The slot of `key` (asked of a running node).
    pub fn keyslot(&self, key: &str) -> u16 {
        let node = self.alive().next().expect("a running node");
        self.cli(node, &["CLUSTER", "KEYSLOT", key])
            .trim()
            .parse()
            .expect("CLUSTER KEYSLOT is a number")
    }

    /// The node serving `slot` now (as node `asked` sees it).
    pub fn owner(&self, asked: usize, slot: u16) -> Option<usize> {
        self.topology(asked).lines().find_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            if fields.len() < 9 || !fields[2].contains("master") {
                return None;
            }
            let serves = fields[8..].iter().any(|range| {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                matches!((lo.parse::<u16>(), hi.parse::<u16>()), (Ok(lo), Ok(hi)) if (lo..=hi).contains(&slot))
            });
            let port = fields[1].split(['@', ',']).next()?.rsplit(':').next()?;
            serves
                .then(|| self.nodes.iter().position(|a| a.port().to_string() == port))
                .flatten()
        })
    }

    /// A counter from node `node`'s `INFO stats`.
    pub fn info_stat(&self, node: usize, name: &str) -> u64 {
        let info = self.cli(node, &["INFO", "stats"]);
        let prefix = format!("{name}:");
        info.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map(|n| n.trim().parse().expect("a counter"))
            .unwrap_or_else(|| panic!("no {name} in INFO stats"))
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in 0..self.nodes.len() {
            self.kill(node);
        }
    }
}

/// One command in RESP2: an array of bulk strings.
fn resp(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend(format!("${}\r\n", arg.len()).as_bytes());
        out.extend(*arg);
        out.extend(b"\r\n");
    }
    out
}

/// An `s3s-fs` server on 127.0.0.1 storing objects in a temporary
/// directory, with one bucket and SigV4 checking on.
pub struct S3Server {
    pub endpoint: String,
    pub bucket: String,
    pub access_key: String,
    pub secret_key: String,
    pub root: tempfile::TempDir,
    child: Child,
}

impl S3Server {
    pub fn start() -> S3Server {
        let root = tempfile::tempdir().expect("temp dir");
        let bucket = "kv-cache".to_owned();
        std::fs::create_dir(root.path().join(&bucket)).expect("create the bucket");
        let access_key = format!("AK{:016X}", rand_u64());
        let secret_key = format!(
            "sk-{:032x}",
            u128::from(rand_u64()) << 64 | u128::from(rand_u64())
        );
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let log = root.path().join("s3s-fs.log");
        let mut child = Command::new(s3s_fs_binary())
            .args(["--host", "127.0.0.1", "--port", &addr.port().to_string()])
            .args(["--access-key", &access_key, "--secret-key", &secret_key])
            .arg(root.path())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn s3s-fs");
        wait_listening(addr, &mut child, "s3s-fs", &log);
        S3Server {
            endpoint: format!("http://{addr}"),
            bucket,
            access_key,
            secret_key,
            root,
            child,
        }
    }

    /// The directory holding the bucket's objects.
    pub fn bucket_dir(&self) -> PathBuf {
        self.root.path().join(&self.bucket)
    }

    /// Kill the server: its port refuses connections from now on.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A TLS-terminating proxy (Debian's `stunnel4`) on a loopback port in
/// front of `target`, presenting `cert`: an https endpoint for the S3
/// server, as an on-premises store behind a private CA would be.
pub struct TlsProxy {
    pub addr: SocketAddr,
    log: PathBuf,
    _dir: tempfile::TempDir,
    child: Child,
}

impl TlsProxy {
    pub fn start(cert: &CertFiles, target: SocketAddr) -> TlsProxy {
        let binary = which("stunnel4")
            .or_else(|| which("stunnel"))
            .unwrap_or_else(|| {
                panic!("stunnel not found: run `bash scripts/test-servers.sh` (apt-get install stunnel4)")
            });
        let dir = tempfile::tempdir().expect("temp dir");
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let log = dir.path().join("stunnel.log");
        let conf = dir.path().join("stunnel.conf");
        std::fs::write(
            &conf,
            format!(
                "foreground = yes\npid =\noutput = {}\n[s3]\naccept = {addr}\n\
                 connect = {target}\ncert = {}\nkey = {}\n",
                log.display(),
                cert.cert.display(),
                cert.key.display()
            ),
        )
        .expect("write stunnel.conf");
        let mut child = Command::new(binary)
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn stunnel");
        wait_listening(addr, &mut child, "stunnel", &log);
        TlsProxy {
            addr,
            log,
            _dir: dir,
            child,
        }
    }

    /// Client connections the proxy has accepted so far (its log's count;
    /// `wait_listening`'s probe is one).
    pub fn connections(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("accepted connection"))
            .count()
    }
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `s3s-fs` (tests/servers/s3): `$KVWASM_S3S_FS`, else
/// `target/tools/bin/s3s-fs`, where `scripts/test-servers.sh` links the build
/// it caches outside the clone. Not the crates.io binary from `PATH`: its
/// responses wait ~40 ms each for the client's delayed ACK.
pub fn s3s_fs_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("KVWASM_S3S_FS") {
        return path.into();
    }
    let local = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tools/bin/s3s-fs");
    if local.is_file() {
        return local;
    }
    panic!(
        "s3s-fs not found at {}: run `bash scripts/test-servers.sh` (it builds tests/servers/s3)",
        local.display()
    )
}

/// A `nats-server` on 127.0.0.1 (a free port), killed when dropped.
pub struct NatsServer {
    pub addr: SocketAddr,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl NatsServer {
    pub fn start() -> NatsServer {
        let mut server = NatsServer {
            addr: SocketAddr::from(([127, 0, 0, 1], free_port())),
            dir: tempfile::tempdir().expect("temp dir"),
            child: None,
        };
        server.restart();
        server
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    /// Start (again) on the same port.
    pub fn restart(&mut self) {
        let binary = which("nats-server").unwrap_or_else(|| {
            panic!("nats-server not found: run `bash scripts/test-servers.sh` (apt-get install nats-server)")
        });
        let log = self.dir.path().join("nats-server.log");
        let mut child = Command::new(binary)
            .args(["-a", "127.0.0.1", "-p", &self.addr.port().to_string()])
            .arg("-l")
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nats-server");
        wait_listening(self.addr, &mut child, "nats-server", &log);
        self.child = Some(child);
    }

    /// SIGKILL the server: its clients lose their connections at once.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A run of `tests/scripts/kv_publisher.py` (see its docstring), killed
/// when dropped. `endpoint` is its publisher socket, `replay_endpoint` its
/// ROUTER.
pub struct KvPublisher {
    pub endpoint: String,
    pub replay_endpoint: String,
    child: Child,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl KvPublisher {
    /// Start the publisher on fresh loopback ports with `args` (`--shape`
    /// and the rest); returns once it has bound its sockets.
    pub fn start(args: &[&str]) -> KvPublisher {
        let endpoint = format!("tcp://127.0.0.1:{}", free_port());
        let replay_endpoint = format!("tcp://127.0.0.1:{}", free_port());
        KvPublisher::start_at(&endpoint, &replay_endpoint, args)
    }

    /// As [`KvPublisher::start`], on given endpoints (a publisher restarted
    /// where its predecessor was).
    pub fn start_at(endpoint: &str, replay_endpoint: &str, args: &[&str]) -> KvPublisher {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/kv_publisher.py");
        let mut child = Command::new(python_binary())
            .arg(script)
            .args(["--pub", endpoint, "--replay", replay_endpoint])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn kv_publisher.py");
        let stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let mut publisher = KvPublisher {
            endpoint: endpoint.to_owned(),
            replay_endpoint: replay_endpoint.to_owned(),
            child,
            stdout,
        };
        assert_eq!(publisher.line(), "ready");
        publisher
    }

    /// The next line the publisher prints (`published`, `replayed FROM N`).
    pub fn line(&mut self) -> String {
        use std::io::BufRead;
        let mut line = String::new();
        let n = self
            .stdout
            .read_line(&mut line)
            .expect("read kv_publisher.py");
        if n == 0 {
            let status = self.child.wait();
            panic!("kv_publisher.py ended early: {status:?}");
        }
        line.trim_end().to_owned()
    }

    /// SIGKILL the publisher.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for KvPublisher {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The venv's python (`target/tools/pyenv`, made by
/// `scripts/test-servers.sh` with pyzmq and msgpack).
pub fn python_binary() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tools/pyenv/bin/python");
    assert!(
        venv.is_file(),
        "{} missing: run `bash scripts/test-servers.sh` (a venv with pyzmq and msgpack)",
        venv.display()
    );
    venv
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

/// Random enough for test credentials.
fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(Instant::now())
}
