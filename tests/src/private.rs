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
        let child = Command::new("redis-server")
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
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|_| panic!("{}", missing("redis-server")));
        self.child = Some(child);
        wait_for_pong(self.port);
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.stop();
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
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A TCP proxy on a spare loopback port in front of a server, for fault tests: it can
/// delay what the client sends, and cut the line (live connections are dropped and new
/// ones closed at once) until restored.
#[derive(Debug, Clone)]
pub struct TcpProxy {
    port: u16,
    delay_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
    up: tokio::sync::watch::Sender<bool>,
}

impl TcpProxy {
    /// Starts a proxy to `127.0.0.1:<upstream>`.
    pub async fn start(upstream: u16) -> Self {
        use std::sync::atomic::Ordering;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let port = spare_port();
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind proxy");
        let delay_ms = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (up, _) = tokio::sync::watch::channel(true);
        let proxy = Self {
            port,
            delay_ms: delay_ms.clone(),
            up: up.clone(),
        };
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let mut line = up.subscribe();
                if !*line.borrow() {
                    continue; // dropped: the client sees the connection closed
                }
                let delay_ms = delay_ms.clone();
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                    else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up_dir = async move {
                        let mut buf = vec![0u8; 64 * 1024];
                        while let Ok(n) = cr.read(&mut buf).await {
                            if n == 0 {
                                break;
                            }
                            let d = delay_ms.load(Ordering::SeqCst);
                            if d > 0 {
                                tokio::time::sleep(Duration::from_millis(d)).await;
                            }
                            if sw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    };
                    let down_dir = async move {
                        let _ = tokio::io::copy(&mut sr, &mut cw).await;
                    };
                    tokio::select! {
                        _ = async { tokio::join!(up_dir, down_dir) } => {}
                        _ = line.wait_for(|up| !*up) => {}
                    }
                });
            }
        });
        proxy
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Delays everything the client sends by `ms`.
    pub fn set_delay_ms(&self, ms: u64) {
        self.delay_ms.store(ms, std::sync::atomic::Ordering::SeqCst);
    }

    /// Cuts the line: live connections are dropped, new ones closed.
    pub fn cut(&self) {
        self.up.send_replace(false);
    }

    /// Restores the line.
    pub fn restore(&self) {
        self.up.send_replace(true);
    }
}
