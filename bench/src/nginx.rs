//! The peer `verdict-bench gateway --nginx` measures the gateway against: Debian's nginx with
//! its own limiter, `limit_req`, keyed by the same API-key header, proxying to the same
//! upstream over kept-alive connections. Its limit, like the bench's policy, is one nobody
//! reaches, so both sides look a key up, count it and forward. Started in a folder of its
//! own and stopped when dropped.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// A running nginx, stopped (and its folder removed) when dropped.
#[derive(Debug)]
pub struct Nginx {
    /// Where it listens.
    pub addr: SocketAddr,
    child: Child,
    dir: tempfile::TempDir,
}

/// The configuration: `worker_processes auto` (one per core, as the gateway's runtime has a
/// thread per core), no access log, `limit_req` on `key_header` with a rate and burst no key
/// reaches, and kept-alive connections upstream.
fn config(dir: &Path, listen: SocketAddr, upstream: SocketAddr, key_header: &str) -> String {
    let d = dir.display();
    let var = key_header.to_ascii_lowercase().replace('-', "_");
    format!(
        r#"daemon off;
worker_processes auto;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  limit_req_zone $http_{var} zone=keys:32m rate=1000000r/s;
  upstream bench_upstream {{
    server {upstream};
    keepalive 128;
  }}
  server {{
    listen {listen};
    location / {{
      limit_req zone=keys burst=1000000 nodelay;
      limit_req_status 429;
      proxy_pass http://bench_upstream;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }}
  }}
}}
"#
    )
}

impl Nginx {
    /// Starts nginx in front of `upstream`, limiting by the header `key_header`, on a free
    /// loopback port; waits until it accepts connections (10 s at most).
    pub fn start(upstream: SocketAddr, key_header: &str) -> anyhow::Result<Self> {
        let bin = verdict_load::proxies::binary("nginx").map_err(anyhow::Error::msg)?;
        let dir = tempfile::tempdir().context("a folder for nginx")?;
        let listen = TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let conf = dir.path().join("nginx.conf");
        std::fs::write(&conf, config(dir.path(), listen, upstream, key_header))?;
        let mut child = Command::new(&bin)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(listen).is_err() {
            if let Some(status) = child.try_wait()? {
                let log = std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default();
                bail!("nginx exited ({status}) before it listened on {listen}: {log}");
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                bail!("nginx did not listen on {listen} within 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Self {
            addr: listen,
            child,
            dir,
        })
    }

    /// Its error log so far (empty when all went well).
    pub fn errors(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM to the master is a fast shutdown; the workers go with it.
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_limits_by_the_header_and_keeps_upstream_connections() {
        let dir = Path::new("/tmp/n");
        let conf = config(
            dir,
            "127.0.0.1:9000".parse().unwrap(),
            "127.0.0.1:9001".parse().unwrap(),
            "X-Api-Key",
        );
        assert!(conf.contains("limit_req_zone $http_x_api_key zone=keys"));
        assert!(conf.contains("server 127.0.0.1:9001;"));
        assert!(conf.contains("listen 127.0.0.1:9000;"));
        assert!(conf.contains("pid /tmp/n/nginx.pid;"));
        assert!(conf.contains("proxy_set_header Connection \"\";"));
    }
}
