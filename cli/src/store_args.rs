//! The options every command that reads or writes the lake shares: where it is, and how
//! to reach an S3-compatible server.

use std::sync::Arc;

use clap::Args;
use object_store::ObjectStore;
use verdict_lake::{S3Options, open_store};

/// Where the lake (raw table, rollups, job state) lives.
#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    /// The lake: s3://bucket[/prefix], or a local folder.
    #[arg(long, env = "VERDICT_STORE")]
    pub store: String,
    /// Endpoint of an S3-compatible server (credentials come from AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY, AWS_REGION).
    #[arg(long, env = "VERDICT_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
}

impl StoreArgs {
    /// Opens the store.
    pub fn open(&self) -> anyhow::Result<Arc<dyn ObjectStore>> {
        let s3 = S3Options {
            endpoint: self.s3_endpoint.clone(),
            ..S3Options::default()
        };
        Ok(open_store(&self.store, &s3)?)
    }
}
