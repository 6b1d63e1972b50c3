//! Why the policy store could not answer.

use verdict_limiter::policy::PolicyError;
use verdict_limiter::sources::SourceError;

/// Why a read or a write of the policy store failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyStoreError {
    /// PostgreSQL could not be reached or refused a query.
    #[error("policy store (PostgreSQL): {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// A row, or the document after a change, is invalid (nothing was written).
    #[error(transparent)]
    Invalid(#[from] PolicyError),
}

impl From<PolicyStoreError> for SourceError {
    fn from(e: PolicyStoreError) -> Self {
        match e {
            PolicyStoreError::Invalid(p) => SourceError::Invalid(p),
            other => SourceError::Store {
                store: "PostgreSQL",
                source: Box::new(other),
            },
        }
    }
}
