//! Private instances of Redis and PostgreSQL on spare loopback ports, for fault tests that
//! stop, slow or restart their store without disturbing any other test. They use the same
//! binaries `scripts/services.sh` installs, and are stopped when dropped.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A free TCP port on 127.0.0.1, never the same one twice in this process (tests run in
/// parallel threads, and a port released by one could be handed to the next before the
/// server of the first has bound it).
pub fn spare_port() -> u16 {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free loopback port");
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// Waits until a Redis on `port` answers PING with PONG.
fn wait_for_pong(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pong = std::net::TcpStream::connect(("127.0.0.1", port)).and_then(|mut s| {
            s.set_read_timeout(Some(Duration::from_secs(1)))?;
            s.write_all(b"PING\r\n")?;
            let mut buf = [0u8; 7];
            s.read_exact(&mut buf)?;
            Ok(&buf == b"+PONG\r\n")
        });
        if pong.unwrap_or(false) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "private redis on port {port} did not answer PING within 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_for_port(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "{what} did not listen on port {port} within 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts `command` (a redis-server) and waits until it answers on `port`.
fn spawn_redis(mut command: Command, port: u16) -> Child {
    let child = command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|_| panic!("{}", missing("redis-server")));
    wait_for_pong(port);
    child
}

fn missing(binary: &str) -> String {
    format!(
        "{binary} is not installed: run `scripts/services.sh up` once to install the test services"
    )
}

/// A Redis server of this test's own.
#[derive(Debug)]
pub struct PrivateRedis {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl PrivateRedis {
    /// Starts one on a spare port.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut r = Self {
            child: None,
            port: spare_port(),
            dir,
        };
        r.restart();
        r
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills it (like a crash: no save, connections reset).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port (empty: no persistence).
    pub fn restart(&mut self) {
        self.stop();
        let mut command = Command::new("redis-server");
        command
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &self.port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(self.dir.path());
        self.child = Some(spawn_redis(command, self.port));
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A Redis Cluster of this test's own: three masters with a replica each, every node on
/// spare ports (client and cluster bus), made with `redis-cli --cluster create`.
#[derive(Debug)]
pub struct PrivateCluster {
    nodes: Vec<ClusterNode>,
    node_timeout_ms: u32,
}

#[derive(Debug)]
struct ClusterNode {
    child: Option<Child>,
    port: u16,
    bus: u16,
    dir: tempfile::TempDir,
}

impl ClusterNode {
    fn spawn(&mut self, node_timeout_ms: u32) {
        let mut command = Command::new("redis-server");
        command
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--port", &self.port.to_string()])
            .args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ])
            .args(["--cluster-port", &self.bus.to_string()])
            .args(["--cluster-node-timeout", &node_timeout_ms.to_string()])
            // A replica's first sync at once, not after the default 5 s of waiting for more
            // replicas: a replica that has never synced cannot be promoted.
            .args(["--repl-diskless-sync-delay", "0"])
            // The other masters keep serving while one's slots are being failed over.
            .args(["--cluster-require-full-coverage", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--logfile", "redis.log"]);
        self.child = Some(spawn_redis(command, self.port));
    }
}

/// `redis-cli -p <port> <args…>`'s output.
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .unwrap_or_else(|_| panic!("{}", missing("redis-cli")));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl PrivateCluster {
    /// Starts six nodes and makes the cluster; a dead master's replica is promoted after
    /// `node_timeout_ms` (Redis's `cluster-node-timeout`) and an election.
    pub fn start(node_timeout_ms: u32) -> Self {
        let mut nodes: Vec<ClusterNode> = (0..6)
            .map(|_| ClusterNode {
                child: None,
                port: spare_port(),
                bus: spare_port(),
                dir: tempfile::tempdir().expect("temp dir"),
            })
            .collect();
        for n in &mut nodes {
            n.spawn(node_timeout_ms);
        }
        let hosts: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&hosts)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .unwrap_or_else(|_| panic!("{}", missing("redis-cli")));
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let c = Self {
            nodes,
            node_timeout_ms,
        };
        c.wait_until_healthy(Duration::from_secs(30));
        c
    }

    /// `redis-cluster://127.0.0.1:<first>?node=…` naming every node.
    pub fn url(&self) -> String {
        let rest: Vec<String> = self.nodes[1..]
            .iter()
            .map(|n| format!("node=127.0.0.1:{}", n.port))
            .collect();
        format!(
            "redis-cluster://127.0.0.1:{}?{}",
            self.nodes[0].port,
            rest.join("&")
        )
    }

    /// `CLUSTER NODES` as a node that is up sees it.
    pub fn cluster_nodes(&self) -> String {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| redis_cli(n.port, &["cluster", "nodes"]))
            .find(|out| !out.trim().is_empty())
            .unwrap_or_default()
    }

    /// The ports of the masters that serve slots, as the cluster sees them now (a killed
    /// master still counts until it is failed over).
    pub fn masters(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self
            .cluster_nodes()
            .lines()
            .filter(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 8 && f[2].contains("master") && !f[2].contains("fail")
            })
            .filter_map(|l| node_port(l.split_whitespace().nth(1)?))
            .collect();
        ports.sort_unstable();
        ports
    }

    /// The port of the master serving `slot` now.
    pub fn master_of_slot(&self, slot: u16) -> Option<u16> {
        self.cluster_nodes().lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() <= 8 || !f[2].contains("master") || f[2].contains("fail") {
                return None;
            }
            let serves = f[8..].iter().any(|r| {
                let (a, b) = r.split_once('-').unwrap_or((r, r));
                matches!((a.parse::<u16>(), b.parse::<u16>()), (Ok(a), Ok(b)) if (a..=b).contains(&slot))
            });
            serves.then(|| node_port(f[1])).flatten()
        })
    }

    /// Kills the node on `port` with SIGKILL (a crash: no goodbye to the cluster).
    pub fn kill(&mut self, port: u16) {
        let node = self.node(port);
        if let Some(mut c) = node.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the node on `port` again; it rejoins from its nodes.conf (a failed-over
    /// master comes back as a replica of its successor).
    pub fn restart(&mut self, port: u16) {
        let timeout = self.node_timeout_ms;
        let node = self.node(port);
        if node.child.is_none() {
            node.spawn(timeout);
        }
    }

    /// Waits until every node up says `cluster_state:ok`, three masters serve the slots,
    /// and every replica has synced with its master (only a synced replica can be
    /// promoted).
    pub fn wait_until_healthy(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let ok = self.nodes.iter().filter(|n| n.child.is_some()).all(|n| {
                let replication = redis_cli(n.port, &["info", "replication"]);
                redis_cli(n.port, &["cluster", "info"]).contains("cluster_state:ok")
                    && (replication.contains("role:master")
                        || replication.contains("master_link_status:up"))
            });
            if ok && self.masters().len() == 3 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the private cluster was not healthy within {within:?}:\n{}",
                self.cluster_nodes()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The last lines of every node's log, for a failure's message.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                let log =
                    std::fs::read_to_string(n.dir.path().join("redis.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(8).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!("--- node {}\n{}", n.port, tail.join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn node(&mut self, port: u16) -> &mut ClusterNode {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node of this cluster on port {port}"))
    }
}

/// The client port out of `CLUSTER NODES`'s `ip:port@bus`.
fn node_port(address: &str) -> Option<u16> {
    address.split('@').next()?.rsplit(':').next()?.parse().ok()
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut c) = n.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// A PostgreSQL cluster of this test's own (trust auth, database `verdict`).
#[derive(Debug)]
pub struct PrivatePostgres {
    port: u16,
    data: PathBuf,
    _dir: tempfile::TempDir,
    running: bool,
}

fn pg_bin(tool: &str) -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin"))
                .collect()
        })
        .unwrap_or_default();
    versions.sort();
    versions
        .pop()
        .map(|b| b.join(tool))
        .unwrap_or_else(|| panic!("{}", missing("PostgreSQL")))
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Runs a PostgreSQL tool as the postgres user when we are root (PostgreSQL refuses root).
fn pg_command(tool: &str) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(pg_bin(tool));
        c
    } else {
        Command::new(pg_bin(tool))
    }
}

fn run(mut c: Command, what: &str) {
    let out = c.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl PrivatePostgres {
    /// Creates and starts one on a spare port.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let data = dir.path().join("data");
        std::fs::create_dir(&data).expect("data dir");
        if is_root() {
            run(
                {
                    let mut c = Command::new("chown");
                    c.args(["-R", "postgres:postgres"]).arg(dir.path());
                    c
                },
                "chown",
            );
        }
        let mut c = pg_command("initdb");
        c.arg("-D")
            .arg(&data)
            .args(["-U", "verdict", "--auth=trust", "--locale=C", "-E", "UTF8"]);
        run(c, "initdb");
        let mut pg = Self {
            port: spare_port(),
            data,
            _dir: dir,
            running: false,
        };
        pg.restart();
        let mut c = Command::new("psql");
        c.args([
            "-h",
            "127.0.0.1",
            "-p",
            &pg.port.to_string(),
            "-U",
            "verdict",
            "-d",
            "postgres",
            "-qc",
            "create database verdict",
        ]);
        run(c, "create database");
        pg
    }

    /// `postgres://verdict@127.0.0.1:<port>/verdict`.
    pub fn url(&self) -> String {
        format!("postgres://verdict@127.0.0.1:{}/verdict", self.port)
    }

    /// Stops it at once (connections are cut).
    pub fn stop(&mut self) {
        if self.running {
            let mut c = pg_command("pg_ctl");
            c.arg("-D")
                .arg(&self.data)
                .args(["-m", "immediate", "-w", "stop"]);
            let _ = c.output();
            self.running = false;
        }
    }

    /// Starts it again.
    pub fn restart(&mut self) {
        self.stop();
        let mut c = pg_command("pg_ctl");
        c.arg("-D")
            .arg(&self.data)
            .arg("-o")
            .arg(format!(
                "-c listen_addresses=127.0.0.1 -p {} -k {} -c fsync=off",
                self.port,
                self.data.display()
            ))
            .args(["-w", "-t", "60", "-l"])
            .arg(self.data.join("log"))
            .arg("start");
        run(c, "pg_ctl start");
        self.running = true;
        wait_for_port(self.port, "private postgres");
    }

    /// Hangs it: SIGSTOP to the postmaster and every backend (connections stay open and
    /// nothing answers), as a machine that stalls rather than dies.
    pub fn hang(&self) {
        self.signal("-STOP");
    }

    /// Lets a hung one go on (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = std::fs::read_to_string(self.data.join("postmaster.pid"))
            .ok()
            .and_then(|t| t.lines().next().map(str::to_owned))
            .expect("postmaster.pid names the running postmaster");
        // The backends first, so none starts work between the two.
        let _ = Command::new("pkill").args([signal, "-P", &pid]).status();
        let status = Command::new("kill")
            .args([signal, &pid])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {signal} {pid}");
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        if self.running {
            self.resume();
        }
        self.stop();
    }
}

pub use verdict_load::proxy::TcpProxy;

/// A private Redis, a loopback proxy in front of it (to slow or cut), and a store reaching
/// Redis through the proxy with `config` (its URL set to the proxy's).
///
/// # Panics
/// When Redis or the proxy cannot start, or the store cannot connect.
pub async fn redis_behind_a_proxy(
    config: verdict_counters_redis::RedisStoreConfig,
) -> (PrivateRedis, TcpProxy, verdict_counters_redis::RedisStore) {
    let redis = PrivateRedis::start();
    let proxy = TcpProxy::start(redis.port())
        .await
        .expect("a loopback proxy");
    let store =
        verdict_counters_redis::RedisStore::connect(&verdict_counters_redis::RedisStoreConfig {
            url: format!("redis://127.0.0.1:{}", proxy.port()),
            ..config
        })
        .await
        .expect("connecting to the private Redis through the proxy");
    (redis, proxy, store)
}
