//! Opening the object store the raw table lives in, from a URL: `s3://bucket[/prefix]`
//! (credentials and region from the usual `AWS_*` variables, an endpoint for S3-compatible
//! servers) or a local folder (`file:///path` or a plain path) for the embedded default.

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;

use crate::prefixed::Prefixed;

/// Why a store URL could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The URL names no bucket.
    #[error("store URL {0:?}: s3:// needs a bucket, e.g. s3://verdict-events/prod")]
    NoBucket(String),
    /// The store refused the configuration.
    #[error("store URL {url:?}: {source}")]
    Store {
        /// The URL.
        url: String,
        /// Why.
        source: object_store::Error,
    },
}

/// How to reach S3; what is left out comes from the usual `AWS_*` variables (and, in the
/// cloud, from the instance's role).
#[derive(Debug, Clone, Default)]
pub struct S3Options {
    /// Endpoint of an S3-compatible server (plain `http://` is then allowed).
    pub endpoint: Option<String>,
    /// Access key id.
    pub access_key_id: Option<String>,
    /// Secret access key.
    pub secret_access_key: Option<String>,
    /// Region.
    pub region: Option<String>,
}

/// Opens `url`.
pub fn open_store(url: &str, s3: &S3Options) -> Result<Arc<dyn ObjectStore>, OpenError> {
    let err = |source| OpenError::Store {
        url: url.to_owned(),
        source,
    };
    if let Some(rest) = url.strip_prefix("s3://") {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(OpenError::NoBucket(url.to_owned()));
        }
        let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket);
        if let Some(endpoint) = &s3.endpoint {
            b = b
                .with_endpoint(endpoint)
                .with_allow_http(endpoint.starts_with("http://"));
        }
        if let Some(v) = &s3.access_key_id {
            b = b.with_access_key_id(v);
        }
        if let Some(v) = &s3.secret_access_key {
            b = b.with_secret_access_key(v);
        }
        if let Some(v) = &s3.region {
            b = b.with_region(v);
        }
        let s3: Arc<dyn ObjectStore> = Arc::new(b.build().map_err(err)?);
        let prefix = prefix.trim_matches('/');
        return Ok(if prefix.is_empty() {
            s3
        } else {
            Arc::new(Prefixed::new(s3, prefix))
        });
    }
    Ok(Arc::new(open_folder(url)?))
}

/// The folder `url` names (a path, or `file://` and a path); `None` for an `s3://` URL.
pub fn folder_of(url: &str) -> Option<&str> {
    (!url.starts_with("s3://")).then(|| url.strip_prefix("file://").unwrap_or(url))
}

/// Opens the folder `url` names as a store, creating it if it is not there yet.
pub fn open_folder(url: &str) -> Result<LocalFileSystem, OpenError> {
    let err = |source| OpenError::Store {
        url: url.to_owned(),
        source,
    };
    let path = folder_of(url).ok_or_else(|| {
        err(object_store::Error::NotSupported {
            source: format!("{url} is not a folder").into(),
        })
    })?;
    std::fs::create_dir_all(path).map_err(|e| {
        err(object_store::Error::Generic {
            store: "LocalFileSystem",
            source: Box::new(e),
        })
    })?;
    LocalFileSystem::new_with_prefix(path).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_open_or_say_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lake");
        let none = S3Options::default();
        assert!(open_store(path.to_str().unwrap(), &none).is_ok());
        assert!(path.is_dir());
        assert!(open_store(&format!("file://{}", path.display()), &none).is_ok());
        let e = open_store("s3:///prod", &none).unwrap_err().to_string();
        assert!(e.contains("needs a bucket"), "{e}");
    }
}
