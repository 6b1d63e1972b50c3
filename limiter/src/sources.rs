//! Where the policy comes from, and the background task that keeps it fresh. A
//! [`PolicySource`] reads the whole document and says, at each poll, whether it changed:
//! a TOML file ([`FileSource`]: the embedded default, re-read when it changes) here, the
//! PostgreSQL tables in `verdict-policy-store`. A source that is down or a document that is
//! invalid leaves the last snapshot in force, counts a reload error and shows in the
//! policy's age; a valid change is in force at the next poll.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::metrics::LimiterMetrics;
use crate::policy::{PolicyDocument, PolicyError, PolicyHandle, PolicySnapshot, parse_toml};
use verdict_schemas::clock::Clock;

/// Why a source could not deliver a policy.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The file could not be read.
    #[error("reading policy file {path}: {source}")]
    File {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The store holding the policy could not be reached or refused a query.
    #[error("policy store ({store}): {source}")]
    Store {
        /// Which store (`PostgreSQL`).
        store: &'static str,
        /// Why.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The document or a row is invalid.
    #[error(transparent)]
    Invalid(#[from] PolicyError),
}

/// Where the policy comes from.
#[async_trait::async_trait]
pub trait PolicySource: Send + Sync + std::fmt::Debug + 'static {
    /// Reads and validates the whole policy (at start: without it there is nothing to run).
    async fn load(&self) -> Result<PolicySnapshot, SourceError>;

    /// One poll: puts the policy in force in `handle` if it changed, and returns its
    /// version; `None` if the policy in force is still the source's (then `handle` records
    /// `now_ms` as confirmed).
    async fn refresh(&self, handle: &PolicyHandle, now_ms: i64)
    -> Result<Option<u64>, SourceError>;
}

/// `doc` as a snapshot at its own version (at least 1).
///
/// # Errors
/// When the document is invalid.
pub fn versioned(doc: PolicyDocument) -> Result<PolicySnapshot, PolicyError> {
    let version = doc.version.max(1);
    Ok(PolicySnapshot::build(doc)?.with_version(version))
}

/// A policy file.
#[derive(Debug)]
pub struct FileSource {
    path: PathBuf,
    /// The text last put in force or confirmed, so an unchanged file is not rebuilt.
    last_text: Mutex<Option<String>>,
}

impl FileSource {
    /// The file at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            last_text: Mutex::new(None),
        }
    }

    /// Reads and parses the file.
    pub async fn read(&self) -> Result<(String, PolicyDocument), SourceError> {
        let text = tokio::fs::read_to_string(&self.path)
            .await
            .map_err(|source| SourceError::File {
                path: self.path.display().to_string(),
                source,
            })?;
        let doc = parse_toml(&text).map_err(|e| PolicyError {
            row: format!("file {}", self.path.display()),
            ..e
        })?;
        Ok((text, doc))
    }
}

#[async_trait::async_trait]
impl PolicySource for FileSource {
    async fn load(&self) -> Result<PolicySnapshot, SourceError> {
        Ok(versioned(self.read().await?.1)?)
    }

    async fn refresh(
        &self,
        handle: &PolicyHandle,
        now_ms: i64,
    ) -> Result<Option<u64>, SourceError> {
        let current = handle.load().version();
        let (text, doc) = self.read().await?;
        let mut last_text = self.last_text.lock().unwrap_or_else(|e| e.into_inner());
        if last_text.as_deref() == Some(text.as_str()) {
            handle.confirmed(now_ms);
            return Ok(None);
        }
        let declared = doc.version;
        let snapshot = PolicySnapshot::build(doc)?;
        *last_text = Some(text);
        let in_force = handle.load();
        if same_rules(snapshot.document(), in_force.document()) {
            handle.confirmed(now_ms);
            return Ok(None);
        }
        // A changed file gets a higher version even if its author forgot to raise it.
        let version = if declared > current {
            declared
        } else {
            current + 1
        };
        handle.store(snapshot.with_version(version), now_ms);
        Ok(Some(version))
    }
}

/// A source with a copy of its last policy on disk: every policy it puts in force is
/// written there (atomically: a temporary file renamed over the copy), and when the source
/// cannot be read at start the copy is what the caller starts from, with its age. A
/// gateway scaled out while the policy store is down still starts, enforcing the last
/// policy it knew, instead of refusing traffic; `verdict_policy_age_seconds` says how old.
#[derive(Debug)]
pub struct CachedSource {
    inner: Arc<dyn PolicySource>,
    path: PathBuf,
}

/// What a start from a [`CachedSource`] read.
#[derive(Debug)]
pub struct Started {
    /// The policy to start with.
    pub snapshot: PolicySnapshot,
    /// When it was last confirmed by the source (ms since the epoch): now when the source
    /// answered, the copy's time when it did not.
    pub confirmed_ms: i64,
    /// Why the source was not used, when the copy was.
    pub source_error: Option<SourceError>,
}

impl CachedSource {
    /// `inner`, with its copy at `path`.
    pub fn new(inner: Arc<dyn PolicySource>, path: impl Into<PathBuf>) -> Self {
        Self {
            inner,
            path: path.into(),
        }
    }

    /// Loads from the source (keeping the copy), or, when the source fails, from the copy.
    ///
    /// # Errors
    /// The source's error when there is no usable copy either (the copy's problem is in
    /// the log).
    pub async fn start(&self, now_ms: i64) -> Result<Started, SourceError> {
        match self.inner.load().await {
            Ok(snapshot) => {
                self.keep(&snapshot).await;
                Ok(Started {
                    snapshot,
                    confirmed_ms: now_ms,
                    source_error: None,
                })
            }
            Err(e) => match self.read_copy().await {
                Ok((snapshot, confirmed_ms)) => Ok(Started {
                    snapshot,
                    confirmed_ms,
                    source_error: Some(e),
                }),
                Err(copy) => {
                    tracing::warn!(path = %self.path.display(), error = %copy, "no usable copy of the policy to start from");
                    Err(e)
                }
            },
        }
    }

    async fn read_copy(&self) -> Result<(PolicySnapshot, i64), SourceError> {
        let file = |source| SourceError::File {
            path: self.path.display().to_string(),
            source,
        };
        let text = tokio::fs::read_to_string(&self.path).await.map_err(file)?;
        let modified = tokio::fs::metadata(&self.path)
            .await
            .and_then(|m| m.modified())
            .map_err(file)?;
        let confirmed_ms = modified
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        Ok((versioned(parse_toml(&text)?)?, confirmed_ms))
    }

    /// Writes `snapshot` as the copy; a failure is logged, never fatal.
    async fn keep(&self, snapshot: &PolicySnapshot) {
        let mut doc = snapshot.document().clone();
        doc.version = snapshot.version();
        let written = async {
            let text = toml::to_string(&doc).map_err(std::io::Error::other)?;
            let tmp = self.path.with_extension("tmp");
            tokio::fs::write(&tmp, text).await?;
            tokio::fs::rename(&tmp, &self.path).await
        }
        .await;
        if let Err(e) = written {
            tracing::warn!(path = %self.path.display(), error = %e, "could not keep a copy of the policy");
        }
    }
}

#[async_trait::async_trait]
impl PolicySource for CachedSource {
    async fn load(&self) -> Result<PolicySnapshot, SourceError> {
        let snapshot = self.inner.load().await?;
        self.keep(&snapshot).await;
        Ok(snapshot)
    }

    async fn refresh(
        &self,
        handle: &PolicyHandle,
        now_ms: i64,
    ) -> Result<Option<u64>, SourceError> {
        let changed = self.inner.refresh(handle, now_ms).await?;
        if changed.is_some() {
            self.keep(&handle.load()).await;
        }
        Ok(changed)
    }
}

/// How long one refresh may take: the polling interval, and at least a second. A source
/// that hangs (a PostgreSQL stopped, not gone) is given up on then, counted as a reload
/// error, and the age metric keeps growing; the next tick asks again.
pub fn refresh_deadline(every: Duration) -> Duration {
    every.max(Duration::from_secs(1))
}

/// Keeps `handle` fresh from `source`, polling every `every` (each refresh bounded by
/// [`refresh_deadline`]); updates the policy metrics.
pub fn spawn_refresher(
    source: Arc<dyn PolicySource>,
    handle: PolicyHandle,
    metrics: Arc<LimiterMetrics>,
    clock: Arc<dyn Clock>,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    crate::periodic::spawn_every(every, move || {
        let (source, handle) = (Arc::clone(&source), handle.clone());
        let (metrics, clock) = (Arc::clone(&metrics), Arc::clone(&clock));
        async move {
            let deadline = refresh_deadline(every);
            match tokio::time::timeout(deadline, source.refresh(&handle, clock.now_ms())).await {
                Ok(Ok(Some(version))) => tracing::info!(version, "policy updated"),
                Ok(Ok(None)) => {}
                Ok(Err(e)) => {
                    metrics.policy_reload_errors.inc();
                    tracing::warn!(error = %e, version = handle.load().version(), "policy not refreshed; the previous one stays in force");
                }
                Err(_) => {
                    metrics.policy_reload_errors.inc();
                    tracing::warn!(
                        ?deadline,
                        version = handle.load().version(),
                        "the policy source did not answer in time; the previous policy stays in force"
                    );
                }
            }
            let current = handle.load();
            metrics.policy_version.set(current.version() as i64);
            metrics
                .policy_age_seconds
                .set((clock.now_ms() - handle.confirmed_ms()).max(0) / 1000);
        }
    })
}

/// True if two documents differ at most in their version.
fn same_rules(a: &PolicyDocument, b: &PolicyDocument) -> bool {
    PolicyDocument {
        version: 0,
        ..a.clone()
    } == PolicyDocument {
        version: 0,
        ..b.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use verdict_schemas::clock::SystemClock;

    const DOC: &str = "version = 5\n[[tiers]]\nid = 0\nname = \"free\"\n[[route_classes]]\nid = 0\nname = \"read\"\n[[limits]]\ntier = \"free\"\nroute_class = \"*\"\ncapacity = 10\nrefill_per_s = 1.0\nhourly_quota = 100\n";

    /// A source that never answers, as a PostgreSQL stopped with SIGSTOP.
    #[derive(Debug)]
    struct Hung;

    #[async_trait::async_trait]
    impl PolicySource for Hung {
        async fn load(&self) -> Result<PolicySnapshot, SourceError> {
            std::future::pending().await
        }
        async fn refresh(&self, _: &PolicyHandle, _: i64) -> Result<Option<u64>, SourceError> {
            std::future::pending().await
        }
    }

    #[tokio::test]
    async fn a_hung_source_is_given_up_on_and_the_age_keeps_growing() {
        let snapshot = versioned(parse_toml(DOC).unwrap()).unwrap();
        let clock = verdict_schemas::clock::FakeClock::at(1_000_000);
        let handle = PolicyHandle::new(snapshot, clock.now_ms());
        let metrics = Arc::new(LimiterMetrics::new());
        let every = Duration::from_millis(50);
        assert_eq!(refresh_deadline(every), Duration::from_secs(1));
        let task = spawn_refresher(
            Arc::new(Hung),
            handle.clone(),
            Arc::clone(&metrics),
            Arc::new(clock.clone()),
            every,
        );
        clock.advance(90_000);
        // Each refresh is abandoned after a second: at least two have been by 2.5 s, each
        // counted, and the age set although no refresh ever finished.
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        task.abort();
        let m = metrics.render();
        let value = |name: &str| -> i64 {
            m.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
                .unwrap_or_else(|| panic!("{name} in {m}"))
        };
        assert!(value("verdict_policy_reload_errors_total ") >= 2, "{m}");
        assert_eq!(value("verdict_policy_age_seconds "), 90, "{m}");
        assert_eq!(handle.load().version(), 5, "the last policy stays in force");
    }

    #[test]
    fn a_kept_copy_reads_back_as_the_same_document() {
        let mut doc = parse_toml(include_str!("../examples/policy.toml")).unwrap();
        doc.regions = vec![crate::policy::RegionRow {
            id: 1,
            name: "eu".into(),
            weight: 1.0,
        }];
        let text = toml::to_string(&doc).unwrap();
        assert_eq!(parse_toml(&text).unwrap(), doc, "{text}");
    }

    #[tokio::test]
    async fn a_copy_kept_while_the_source_answers_is_the_start_when_it_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let (file, copy) = (dir.path().join("policy.toml"), dir.path().join("last.toml"));
        std::fs::write(&file, DOC.replace("capacity = 10", "capacity = 7")).unwrap();
        let cached = CachedSource::new(Arc::new(FileSource::new(&file)), &copy);
        let started = cached.start(1_000).await.unwrap();
        assert!(started.source_error.is_none());
        assert_eq!(
            (started.snapshot.version(), started.confirmed_ms),
            (5, 1_000)
        );
        let handle = PolicyHandle::new(started.snapshot, 1_000);

        // A change the source puts in force is kept too.
        std::fs::write(&file, DOC.replace("capacity = 10", "capacity = 9")).unwrap();
        assert_eq!(cached.refresh(&handle, 2_000).await.unwrap(), Some(6));

        // The source gone: the start is the copy, with the copy's time and the reason.
        std::fs::remove_file(&file).unwrap();
        let started = cached.start(3_000).await.unwrap();
        assert!(matches!(
            started.source_error,
            Some(SourceError::File { .. })
        ));
        assert_eq!(started.snapshot.version(), 6);
        assert_eq!(started.snapshot.document().limits[0].capacity, 9);
        let age = SystemClock.now_ms() - started.confirmed_ms;
        assert!(
            (0..60_000).contains(&age),
            "the copy was written just now: {age} ms"
        );

        // Neither: the source's error.
        std::fs::write(&copy, "not toml [").unwrap();
        assert!(matches!(
            cached.start(4_000).await,
            Err(SourceError::File { path, .. }) if path.ends_with("policy.toml")
        ));
    }

    #[tokio::test]
    async fn a_changed_file_is_taken_and_a_broken_one_leaves_the_last_in_force() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.toml");
        std::fs::write(&path, DOC).unwrap();
        let source = FileSource::new(&path);
        let handle = PolicyHandle::new(source.load().await.unwrap(), 0);
        assert_eq!(handle.load().version(), 5);

        // The first poll finds the rules already in force.
        assert_eq!(source.refresh(&handle, 1).await.unwrap(), None);
        assert_eq!(handle.confirmed_ms(), 1);

        // Edited without raising the version: still a new version.
        std::fs::write(&path, DOC.replace("capacity = 10", "capacity = 20")).unwrap();
        assert_eq!(source.refresh(&handle, 2).await.unwrap(), Some(6));
        assert_eq!(handle.load().document().limits[0].capacity, 20);

        // Broken: refused with the file and field named; version 6 stays.
        std::fs::write(&path, DOC.replace("capacity = 10", "capacity = -1")).unwrap();
        let e = source.refresh(&handle, 3).await.unwrap_err().to_string();
        assert!(e.contains("capacity"), "{e}");
        std::fs::write(&path, "not toml [").unwrap();
        let e = source.refresh(&handle, 4).await.unwrap_err().to_string();
        assert!(e.contains("policy.toml"), "{e}");
        assert_eq!((handle.load().version(), handle.confirmed_ms()), (6, 2));

        // Deleted: the read fails, the policy stays.
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(
            source.refresh(&handle, 5).await,
            Err(SourceError::File { .. })
        ));
        assert_eq!(handle.load().version(), 6);
    }
}
