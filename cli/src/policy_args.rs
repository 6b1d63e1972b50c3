//! Where the policy comes from, for every command that reads it.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use verdict_limiter::{FileSource, PolicySource};
use verdict_policy_store::PgSource;

/// `--policy-file` or `--policy-postgres`.
#[derive(Debug, Clone, Args)]
pub struct PolicyArgs {
    /// The policy in a TOML file (the embedded default; re-read when it changes).
    #[arg(long, env = "VERDICT_POLICY_FILE", conflicts_with = "policy_postgres")]
    pub policy_file: Option<PathBuf>,
    /// The policy in PostgreSQL (the limiter's tables), e.g.
    /// postgres://verdict@127.0.0.1:15432/verdict.
    #[arg(long, env = "VERDICT_POLICY_POSTGRES")]
    pub policy_postgres: Option<String>,
}

impl PolicyArgs {
    /// The source named, if any.
    pub fn source(&self) -> Option<Arc<dyn PolicySource>> {
        match (&self.policy_file, &self.policy_postgres) {
            (Some(f), _) => Some(Arc::new(FileSource::new(f))),
            (None, Some(url)) => Some(Arc::new(PgSource::new(url.clone()))),
            (None, None) => None,
        }
    }
}
