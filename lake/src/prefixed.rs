//! A store under a prefix, like `object_store::prefix::PrefixStore`, except that the
//! metadata returned by `get` and `head` names the object relative to the prefix, as
//! `list` does. (`PrefixStore` 0.13 returns the full path there; DataFusion then thinks a
//! file it has just looked up is outside the table and reads nothing.)

use std::sync::Arc;

use crate::observed::{Observed, Observer};
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::{ObjectMeta, ObjectStore};

/// A store seen under a prefix: [`Prefixed::new`] makes it.
#[derive(Debug)]
pub struct Prefixed {
    prefix: Path,
}

impl Prefixed {
    /// `inner` under `prefix` (a path such as `runs/42`).
    #[allow(clippy::new_ret_no_self)]
    pub fn new(inner: Arc<dyn ObjectStore>, prefix: &str) -> Observed<Prefixed> {
        Observed::new(
            Arc::new(PrefixStore::new(inner, prefix)),
            Self {
                prefix: Path::from(prefix),
            },
        )
    }
}

impl Observer for Prefixed {
    fn name(&self) -> &str {
        "Prefixed"
    }

    fn got(&self, meta: &mut ObjectMeta) {
        let relative = meta
            .location
            .prefix_match(&self.prefix)
            .map(Path::from_iter);
        if let Some(relative) = relative {
            meta.location = relative;
        }
    }
}

#[cfg(test)]
mod tests {
    use object_store::memory::InMemory;
    use object_store::{ObjectStoreExt, PutPayload};

    use super::*;

    #[tokio::test]
    async fn head_and_get_name_the_object_relative_to_the_prefix() {
        let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let store = Prefixed::new(Arc::clone(&inner), "runs/42");
        let path = Path::from("raw/date=2026-11-30/hour=14/t+00000+1+2.parquet");
        store
            .put(&path, PutPayload::from_static(b"x"))
            .await
            .unwrap();
        assert_eq!(store.head(&path).await.unwrap().location, path);
        assert_eq!(store.get(&path).await.unwrap().meta.location, path);
        assert!(
            inner
                .head(&Path::from(format!("runs/42/{path}")))
                .await
                .is_ok()
        );
    }
}
