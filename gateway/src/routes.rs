//! Paths to route classes, by the policy's prefixes (`route_classes[].prefixes`): the
//! longest prefix that matches wins, matching whole path segments (`/v1/items` covers
//! `/v1/items` and `/v1/items/7`, not `/v1/itemsx`). A path no prefix covers is not served.

use std::sync::Arc;

use verdict_limiter::PolicySnapshot;
use verdict_schemas::RouteClassId;

/// The prefixes of one policy version, longest first.
#[derive(Debug, Clone, Default)]
pub struct RouteTable {
    version: u64,
    prefixes: Vec<(String, RouteClassId)>,
}

impl RouteTable {
    /// The table of `policy`.
    pub fn of(policy: &PolicySnapshot) -> Self {
        let mut prefixes: Vec<(String, RouteClassId)> = policy
            .document()
            .route_classes
            .iter()
            .flat_map(|r| {
                r.prefixes
                    .iter()
                    .map(move |p| (p.trim_end_matches('/').to_owned(), RouteClassId(r.id)))
            })
            .collect();
        prefixes.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
        Self {
            version: policy.version(),
            prefixes,
        }
    }

    /// The policy version it was built from.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The route class of `path`.
    pub fn route(&self, path: &str) -> Option<RouteClassId> {
        self.prefixes.iter().find_map(|(p, id)| {
            let covered = path == p
                || p.is_empty()
                || (path.starts_with(p.as_str()) && path.as_bytes().get(p.len()) == Some(&b'/'));
            covered.then_some(*id)
        })
    }
}

/// The table of the policy in force, rebuilt when the policy's version changes.
#[derive(Debug, Clone, Default)]
pub struct Routes {
    current: Arc<arc_swap::ArcSwap<RouteTable>>,
}

impl Routes {
    /// The route class of `path` under `policy`.
    pub fn route(&self, policy: &PolicySnapshot, path: &str) -> Option<RouteClassId> {
        let table = self.current.load();
        if table.version() == policy.version() && policy.version() != 0 {
            return table.route(path);
        }
        let fresh = RouteTable::of(policy);
        let id = fresh.route(path);
        self.current.store(Arc::new(fresh));
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use verdict_limiter::policy::parse_toml;

    #[test]
    fn the_longest_prefix_wins_on_whole_segments() {
        let doc = parse_toml(include_str!("../fixtures/policies/nested_prefixes.toml")).unwrap();
        let t = RouteTable::of(&PolicySnapshot::build(doc).unwrap());
        assert_eq!(t.route("/v1/items"), Some(RouteClassId(0)));
        assert_eq!(t.route("/v1/items/7"), Some(RouteClassId(0)));
        assert_eq!(t.route("/v1/items/bulk"), Some(RouteClassId(1)));
        assert_eq!(t.route("/v1/items/bulk/2"), Some(RouteClassId(1)));
        assert_eq!(t.route("/v1/search"), Some(RouteClassId(0)));
        // Not a whole segment: falls to the catch-all.
        assert_eq!(t.route("/v1/itemsx"), Some(RouteClassId(2)));
        assert_eq!(t.route("/anything"), Some(RouteClassId(2)));
        let none = RouteTable::default();
        assert_eq!(none.route("/v1/items"), None);
    }
}
