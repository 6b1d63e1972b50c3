//! Headless Chromium driven over the DevTools protocol: the analysts' page's test loads it
//! with it, and `verdict-bench page` times it.
//!
//! The browser is Debian's `chromium` (`scripts/services.sh up chromium` installs it),
//! started with `--remote-debugging-pipe`: it reads the protocol's JSON messages, each
//! ended by a NUL byte, on descriptor 3 and writes its own on descriptor 4. A shell puts the
//! child's stdin and stdout there, so no unsafe descriptor juggling is needed here.
//! Calls block: run a page's script in `spawn_blocking` (or a thread of its own) while the
//! service under test runs on the runtime.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

/// How long one protocol call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A headless Chromium with one page open.
pub struct Browser {
    child: Child,
    stdin: ChildStdin,
    messages: Receiver<Value>,
    next_id: u64,
    session: Option<String>,
    /// Uncaught exceptions and console or log errors the page produced, as text.
    problems: Vec<String>,
    _profile: tempfile::TempDir,
}

/// The Chromium binary: Debian's, or what `VERDICT_CHROMIUM` names.
pub fn chromium_path() -> Result<PathBuf, String> {
    if let Ok(p) = std::env::var("VERDICT_CHROMIUM") {
        return Ok(PathBuf::from(p));
    }
    // The real binary rather than Debian's launcher script, which probes the machine first.
    for p in ["/usr/lib/chromium/chromium", "/usr/bin/chromium"] {
        if Path::new(p).exists() {
            return Ok(PathBuf::from(p));
        }
    }
    Err(
        "Chromium is not installed: run scripts/services.sh up chromium (Debian's chromium \
         package), or name the binary in VERDICT_CHROMIUM"
            .to_string(),
    )
}

impl Browser {
    /// Starts Chromium with a fresh profile and a `width` × `height` window.
    pub fn start(width: u32, height: u32) -> Result<Self, String> {
        let binary = chromium_path()?;
        let profile = tempfile::tempdir().map_err(|e| format!("a profile folder: {e}"))?;
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(r#"exec "$0" "$@" 3<&0 4>&1 </dev/null >/dev/null"#)
            .arg(&binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--hide-scrollbars",
                "--remote-debugging-pipe",
                &format!("--window-size={width},{height}"),
                &format!("--user-data-dir={}", profile.path().display()),
                "about:blank",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", binary.display()))?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, messages) = channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(0, &mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                if buf.last() == Some(&0) {
                    buf.pop();
                }
                if let Ok(v) = serde_json::from_slice::<Value>(&buf)
                    && tx.send(v).is_err()
                {
                    return;
                }
            }
        });
        Ok(Self {
            child,
            stdin,
            messages,
            next_id: 0,
            session: None,
            problems: Vec::new(),
            _profile: profile,
        })
    }

    /// Calls `method` (on the open page once there is one) and returns its result.
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({"id": id, "method": method, "params": params});
        if let Some(s) = &self.session {
            message["sessionId"] = json!(s);
        }
        let mut bytes = serde_json::to_vec(&message).expect("JSON");
        bytes.push(0);
        self.stdin
            .write_all(&bytes)
            .and_then(|()| self.stdin.flush())
            .map_err(|e| format!("{method}: the browser is gone: {e}"))?;
        let deadline = Instant::now() + CALL_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let m = match self.messages.recv_timeout(left) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!("{method}: no answer in {CALL_TIMEOUT:?}"));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(format!("{method}: the browser exited"));
                }
            };
            if m["id"] == json!(id) {
                if let Some(e) = m.get("error") {
                    return Err(format!("{method}: {e}"));
                }
                return Ok(m["result"].clone());
            }
            self.note_event(&m);
        }
    }

    fn note_event(&mut self, m: &Value) {
        match m["method"].as_str() {
            Some("Runtime.exceptionThrown") => {
                let d = &m["params"]["exceptionDetails"];
                self.problems.push(format!(
                    "uncaught: {} {}",
                    d["text"].as_str().unwrap_or_default(),
                    d["exception"]["description"].as_str().unwrap_or_default()
                ));
            }
            Some("Runtime.consoleAPICalled") if m["params"]["type"] == "error" => {
                self.problems
                    .push(format!("console.error: {}", m["params"]["args"]));
            }
            // Network errors (the 401s the page is built to handle) are the page's to show;
            // anything else logged as an error (a refused script or style, a security
            // policy violation) is a problem.
            Some("Log.entryAdded")
                if m["params"]["entry"]["level"] == "error"
                    && m["params"]["entry"]["source"] != "network" =>
            {
                self.problems.push(format!(
                    "log: {}",
                    m["params"]["entry"]["text"].as_str().unwrap_or_default()
                ));
            }
            _ => {}
        }
    }

    /// Opens `url` in a new page and attaches to it (events on).
    pub fn open(&mut self, url: &str) -> Result<(), String> {
        self.open_with(url, None)
    }

    /// Opens `url` in a new page, after `script` (if any) is set to run in it before the
    /// page's own scripts (to put a token in its session storage, say).
    pub fn open_with(&mut self, url: &str, script: Option<&str>) -> Result<(), String> {
        self.session = None;
        let target = self.call("Target.createTarget", json!({"url": "about:blank"}))?;
        let id = target["targetId"].clone();
        let attached = self.call(
            "Target.attachToTarget",
            json!({"targetId": id, "flatten": true}),
        )?;
        self.session = attached["sessionId"].as_str().map(str::to_string);
        self.call("Runtime.enable", json!({}))?;
        self.call("Log.enable", json!({}))?;
        self.call("Page.enable", json!({}))?;
        if let Some(source) = script {
            self.call(
                "Page.addScriptToEvaluateOnNewDocument",
                json!({"source": source}),
            )?;
        }
        self.call("Page.navigate", json!({"url": url}))?;
        Ok(())
    }

    /// Evaluates `expression` in the page (awaiting a promise) and returns its value.
    pub fn eval(&mut self, expression: &str) -> Result<Value, String> {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        )?;
        if let Some(e) = r.get("exceptionDetails") {
            return Err(format!(
                "{expression}\n-> {}",
                e["exception"]["description"]
                    .as_str()
                    .unwrap_or(&e.to_string())
            ));
        }
        Ok(r["result"]["value"].clone())
    }

    /// Waits until `condition` (an expression) is true in the page, polling.
    pub fn wait_for(&mut self, condition: &str, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            // Before the page has loaded, `document.body` may not exist yet.
            if self.eval(&format!(
                "(() => {{ try {{ return !!({condition}); }} catch (_) {{ return false; }} }})()"
            ))? == json!(true)
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let state = self
                    .eval("document.body ? document.body.dataset.state + ' / ' + document.querySelector('#status')?.textContent : 'no body'")
                    .unwrap_or_default();
                return Err(format!(
                    "not true within {timeout:?}: {condition} (page: {state}; problems: {:?})",
                    self.problems
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Saves a PNG of the whole page (not only the window) at `path`.
    pub fn screenshot(&mut self, path: &Path) -> Result<(), String> {
        let metrics = self.call("Page.getLayoutMetrics", json!({}))?;
        let size = &metrics["cssContentSize"];
        let shot = self.call(
            "Page.captureScreenshot",
            json!({
                "format": "png",
                "captureBeyondViewport": true,
                "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1},
            }),
        )?;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap_or_default())
            .map_err(|e| format!("the screenshot's base64: {e}"))?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        std::fs::write(path, png).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// What went wrong in the page so far (uncaught exceptions, errors logged).
    pub fn problems(&mut self) -> Vec<String> {
        while let Ok(m) = self.messages.try_recv() {
            self.note_event(&m);
        }
        self.problems.clone()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.session = None;
        let _ = self.call("Browser.close", json!({}));
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
