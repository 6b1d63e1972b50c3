//! The proxies verdict runs behind, started by the tests and `verdict-bench envoy`: Envoy,
//! nginx, Caddy, and the rate limit service Envoy users run today (envoyproxy/ratelimit).
//! Each runs in a folder of its own on loopback ports and is killed when dropped;
//! `scripts/services.sh up` installs them.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A proxy process, killed (and its folder removed) when dropped.
#[derive(Debug)]
pub struct Proxy {
    /// What it is, for messages.
    pub name: &'static str,
    /// Its folder: its configuration and its log (`log`).
    pub dir: tempfile::TempDir,
    child: Child,
}

impl Proxy {
    /// Starts `binary` with `args` (`{dir}` in an argument is the proxy's folder), after
    /// writing `files` (name, text; `{dir}` likewise) into its folder, and waits up to 30 s
    /// until `ready_port` on 127.0.0.1 accepts a connection.
    ///
    /// # Panics
    /// When it cannot start, or exits or does not listen within 30 s (its log is printed).
    pub fn start(
        name: &'static str,
        binary: &Path,
        args: &[&str],
        files: &[(&str, &str)],
        env: &[(&str, &str)],
        ready_port: u16,
    ) -> Self {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let d = dir.path().display().to_string();
        for (file, text) in files {
            let path = dir.path().join(file);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).expect("a proxy's configuration folder");
            }
            std::fs::write(path, text.replace("{dir}", &d))
                .expect("writing a proxy's configuration");
        }
        let log = std::fs::File::create(dir.path().join("log")).expect("a log file");
        let child = Command::new(binary)
            .args(args.iter().map(|a| a.replace("{dir}", &d)))
            .envs(env.iter().map(|(k, v)| (*k, v.replace("{dir}", &d))))
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name} ({}): {e}", binary.display()));
        let mut proxy = Self { name, dir, child };
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", ready_port)).is_err() {
            if let Ok(Some(status)) = proxy.child.try_wait() {
                panic!(
                    "{name} exited ({status}) before listening:\n{}",
                    proxy.log()
                );
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{name} did not listen on {ready_port} within 30 s:\n{}",
                proxy.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        proxy
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port free now.
///
/// # Panics
/// When the system has none.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn cache() -> PathBuf {
    std::env::var_os("VERDICT_CACHE").map_or_else(
        || {
            let home = std::env::var_os("HOME").unwrap_or_default();
            PathBuf::from(home).join(".cache/verdict")
        },
        PathBuf::from,
    )
}

/// A binary `scripts/services.sh up <service>` installs: in the cache, on the PATH, or in
/// Debian's place; when it is not installed, an error saying how to install it.
///
/// # Panics
/// For a service that is not a proxy.
pub fn binary(service: &str) -> Result<PathBuf, String> {
    let (name, places): (&str, &[PathBuf]) = match service {
        "envoy" => ("envoy", &[cache().join("envoy")]),
        "ratelimit" => ("service_cmd", &[cache().join("ratelimit")]),
        "nginx" => ("nginx", &[PathBuf::from("/usr/sbin/nginx")]),
        "caddy" => ("caddy", &[PathBuf::from("/usr/bin/caddy")]),
        other => panic!("no proxy named {other}"),
    };
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name));
    places
        .iter()
        .cloned()
        .chain(on_path)
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!("{service} is not installed: scripts/services.sh up {service} installs it")
        })
}

/// [`binary`], for the launchers below.
fn installed(service: &str) -> PathBuf {
    binary(service).unwrap_or_else(|e| panic!("{e}"))
}

/// Envoy (one worker thread) with a listener on `listen` routing every path to `upstream`,
/// its `ratelimit` filter asking the rate limit service on `rls` (gRPC, domain `domain`, a
/// 250 ms timeout, failing open) with the virtual host's `rate_limits` (YAML, indented for
/// its place), and its admin on `admin`.
pub fn envoy(
    listen: u16,
    admin: u16,
    upstream: u16,
    rls: u16,
    domain: &str,
    rate_limits: &str,
) -> Proxy {
    envoy_beside(
        &[(listen, Some(rls))],
        1,
        admin,
        upstream,
        domain,
        rate_limits,
    )
}

/// One Envoy of `workers` worker threads with a listener per (port, rate limit service
/// port) pair, each as [`envoy`] makes its one: the same filter and descriptors in front of
/// different services; a listener without a service has no rate limit filter (Envoy alone).
pub fn envoy_beside(
    listeners: &[(u16, Option<u16>)],
    workers: u16,
    admin: u16,
    upstream: u16,
    domain: &str,
    rate_limits: &str,
) -> Proxy {
    let listener = |(listen, rls): &(u16, Option<u16>)| {
        let filter = rls.map_or_else(String::new, |rls| {
            format!(
                r#"          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: {domain}
              failure_mode_deny: false
              timeout: 0.25s
              rate_limit_service:
                transport_api_version: V3
                grpc_service:
                  envoy_grpc: {{cluster_name: rls_{rls}}}
"#
            )
        });
        format!(
            r#"  - name: edge_{listen}
    address: {{socket_address: {{address: 127.0.0.1, port_value: {listen}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: edge_{listen}
          route_config:
            virtual_hosts:
            - name: api
              domains: ["*"]
              rate_limits:
{rate_limits}
              routes:
              - match: {{prefix: "/"}}
                route: {{cluster: upstream}}
          http_filters:
{filter}          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#
        )
    };
    let cluster = |(_, rls): &(u16, Option<u16>)| {
        let Some(rls) = rls else {
            return String::new();
        };
        format!(
            r#"  - name: rls_{rls}
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: rls_{rls}
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {rls}}}}}}}}}]}}]
"#
        )
    };
    let listeners_yaml: String = listeners.iter().map(listener).collect();
    let clusters_yaml: String = listeners.iter().map(cluster).collect();
    let config = format!(
        r#"admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}
static_resources:
  listeners:
{listeners_yaml}  clusters:
  - name: upstream
    type: STATIC
    load_assignment:
      cluster_name: upstream
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {upstream}}}}}}}}}]}}]
{clusters_yaml}"#
    );
    let last = listeners.last().expect("a listener").0;
    Proxy::start(
        "envoy",
        &installed("envoy"),
        &[
            "-c",
            "{dir}/envoy.yaml",
            "--concurrency",
            &workers.to_string(),
            "--log-level",
            "warn",
            "--base-id",
            &last.to_string(),
        ],
        &[("envoy.yaml", &config)],
        &[],
        last,
    )
}

/// envoyproxy/ratelimit with `config` (its YAML) in a folder of its own, its counters in
/// the Redis at `redis` (host:port), serving gRPC on `grpc`.
pub fn envoy_ratelimit(config: &str, redis: &str, grpc: u16) -> Proxy {
    let (http, debug) = (free_port(), free_port());
    let (grpc, http, debug) = (grpc.to_string(), http.to_string(), debug.to_string());
    Proxy::start(
        "envoyproxy/ratelimit",
        &installed("ratelimit"),
        &[],
        &[("runtime/ratelimit/config/config.yaml", config)],
        &[
            ("RUNTIME_ROOT", "{dir}/runtime"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", redis),
            ("USE_STATSD", "false"),
            ("LOG_LEVEL", "warn"),
            ("HOST", "127.0.0.1"),
            ("GRPC_HOST", "127.0.0.1"),
            ("DEBUG_HOST", "127.0.0.1"),
            ("GRPC_PORT", &grpc),
            ("PORT", &http),
            ("DEBUG_PORT", &debug),
        ],
        grpc.parse().expect("a port"),
    )
}

/// An example configuration of `gateway/examples/` made to run here: every `from` address
/// replaced by its `to`.
pub fn example(name: &str, replace: &[(&str, String)]) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../gateway/examples")
        .join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    replace
        .iter()
        .fold(text, |text, (from, to)| text.replace(from, to))
}

/// nginx with `config`, listening on `listen`.
pub fn nginx(config: &str, listen: u16) -> Proxy {
    Proxy::start(
        "nginx",
        &installed("nginx"),
        &[
            "-p",
            "{dir}",
            "-c",
            "{dir}/nginx.conf",
            "-g",
            "daemon off; pid {dir}/nginx.pid; error_log {dir}/log warn;",
        ],
        &[("nginx.conf", config)],
        &[],
        listen,
    )
}

/// Caddy with the Caddyfile `config`, listening on `listen`.
pub fn caddy(config: &str, listen: u16) -> Proxy {
    Proxy::start(
        "caddy",
        &installed("caddy"),
        &[
            "run",
            "--config",
            "{dir}/Caddyfile",
            "--adapter",
            "caddyfile",
        ],
        &[("Caddyfile", config)],
        &[
            ("XDG_DATA_HOME", "{dir}"),
            ("XDG_CONFIG_HOME", "{dir}"),
            ("HOME", "{dir}"),
        ],
        listen,
    )
}
