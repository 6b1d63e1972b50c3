//! The operator's changes to the policy (`verdict policy …`), the design's rollback levels:
//! a tier's mode (level one: back to shadow), a limit raised or lowered for a tier, a route
//! class or one key (level two), the kill switch (level three).
//!
//! An [`Edit`] is applied to the document in force first ([`apply`]); the result must build
//! into a valid snapshot, or nothing is written and the error names the row and field.
//! [`PgSource::apply`] then writes the changed rows in one transaction, provided the
//! policy's version is still the one that was edited (a concurrent change is refused, not
//! overwritten); the version triggers raise the version, and every gateway has it at its
//! next poll.

use verdict_limiter::policy::{
    ALL_ROUTES, LimitRow, Mode, OverrideRow, PolicyDocument, PolicyError, PolicySnapshot,
};
use verdict_schemas::KeyId;

use crate::error::PolicyStoreError;
use crate::pg::PgSource;

/// New values for a limit; a field left `None` keeps its value.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LimitChange {
    /// Bucket capacity.
    pub capacity: Option<i64>,
    /// Refill, tokens per second.
    pub refill_per_s: Option<f64>,
    /// Hourly quota.
    pub hourly_quota: Option<i64>,
}

impl LimitChange {
    fn is_empty(&self) -> bool {
        self.capacity.is_none() && self.refill_per_s.is_none() && self.hourly_quota.is_none()
    }
}

/// One change.
#[derive(Debug, Clone, PartialEq)]
pub enum Edit {
    /// A tier's mode, on every route class or one.
    SetMode {
        /// The tier.
        tier: String,
        /// One route class (its own row is created from `*` if it has none), or all.
        route_class: Option<String>,
        /// The mode.
        mode: Mode,
    },
    /// A tier's limits on a route class (`*`: the row covering the others).
    SetTierLimit {
        /// The tier.
        tier: String,
        /// The route class, or `*`.
        route_class: String,
        /// What changes.
        change: LimitChange,
    },
    /// One key's limits (an override), on a route class or `*`. A new override starts
    /// from the limits the key has now.
    SetKeyLimit {
        /// The key.
        key_id: KeyId,
        /// The key's tier (the starting point of a new override).
        tier: String,
        /// The route class, or `*`.
        route_class: String,
        /// What changes.
        change: LimitChange,
    },
    /// The global kill switch, or one tier's.
    KillSwitch {
        /// One tier, or every request.
        tier: Option<String>,
        /// On: hard-allow.
        on: bool,
    },
}

fn refused(row: String, field: &'static str, problem: impl Into<String>) -> PolicyError {
    PolicyError {
        row,
        field,
        problem: problem.into(),
    }
}

fn change_row(c: &LimitChange, capacity: &mut i64, refill: &mut f64, quota: &mut i64) {
    if let Some(v) = c.capacity {
        *capacity = v;
    }
    if let Some(v) = c.refill_per_s {
        *refill = v;
    }
    if let Some(v) = c.hourly_quota {
        *quota = v;
    }
}

/// The row that limits `tier` on `route_class` now: the class's own row, else the tier's
/// `*` row (its index, and whether it is the class's own).
fn row_in_force(
    doc: &PolicyDocument,
    tier: &str,
    route_class: &str,
) -> Result<(usize, bool), PolicyError> {
    if !doc.tiers.iter().any(|t| t.name == tier) {
        return Err(refused(
            format!("tier {tier}"),
            "tier",
            format!(
                "no such tier (the policy has {:?})",
                doc.tiers
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
            ),
        ));
    }
    if route_class != ALL_ROUTES && !doc.route_classes.iter().any(|r| r.name == route_class) {
        return Err(refused(
            format!("route class {route_class}"),
            "route_class",
            format!(
                "no such route class (the policy has {:?})",
                doc.route_classes
                    .iter()
                    .map(|r| r.name.as_str())
                    .collect::<Vec<_>>()
            ),
        ));
    }
    let at = |rc: &str| {
        doc.limits
            .iter()
            .position(|l| l.tier == tier && l.route_class == rc)
    };
    if let Some(i) = at(route_class) {
        return Ok((i, true));
    }
    at(ALL_ROUTES).map(|i| (i, false)).ok_or_else(|| {
        refused(
            format!("limits (tier={tier}, route_class={route_class})"),
            "route_class",
            "the tier has no row for this route class and no \"*\" row to start from",
        )
    })
}

/// The row of `tier` × `route_class`: its own, or a copy of the tier's `*` row added to
/// the document.
fn limit_row<'a>(
    doc: &'a mut PolicyDocument,
    tier: &str,
    route_class: &str,
) -> Result<&'a mut LimitRow, PolicyError> {
    let i = match row_in_force(doc, tier, route_class)? {
        (i, true) => i,
        (base, false) => {
            let row = LimitRow {
                route_class: route_class.to_owned(),
                ..doc.limits[base].clone()
            };
            doc.limits.push(row);
            doc.limits.len() - 1
        }
    };
    Ok(&mut doc.limits[i])
}

/// Applies `edit` to `doc` and checks that the result is a valid policy.
///
/// # Errors
/// When a name is unknown, a change is empty, or the changed policy is invalid (the error
/// names the row and field).
pub fn apply(doc: &mut PolicyDocument, edit: &Edit) -> Result<(), PolicyError> {
    match edit {
        Edit::SetMode {
            tier,
            route_class: Some(rc),
            mode,
        } => limit_row(doc, tier, rc)?.mode = *mode,
        Edit::SetMode {
            tier,
            route_class: None,
            mode,
        } => {
            let mut rows = doc.limits.iter_mut().filter(|l| &l.tier == tier).peekable();
            if rows.peek().is_none() {
                return Err(refused(
                    format!("tier {tier}"),
                    "tier",
                    "no such tier, or it has no limits",
                ));
            }
            for l in rows {
                l.mode = *mode;
            }
        }
        Edit::SetTierLimit {
            tier,
            route_class,
            change,
        } => {
            if change.is_empty() {
                return Err(refused(
                    format!("limits (tier={tier}, route_class={route_class})"),
                    "change",
                    "nothing to change: give a capacity, a refill or an hourly quota",
                ));
            }
            let row = limit_row(doc, tier, route_class)?;
            change_row(
                change,
                &mut row.capacity,
                &mut row.refill_per_s,
                &mut row.hourly_quota,
            );
        }
        Edit::SetKeyLimit {
            key_id,
            tier,
            route_class,
            change,
        } => {
            let row_name = format!("overrides (key_id={key_id}, route_class={route_class})");
            if change.is_empty() {
                return Err(refused(
                    row_name,
                    "change",
                    "nothing to change: give a capacity, a refill or an hourly quota",
                ));
            }
            let existing = doc
                .overrides
                .iter()
                .position(|o| &o.key_id == key_id && &o.route_class == route_class);
            let i = match existing {
                Some(i) => i,
                None => {
                    // Start from what the key has now: its all-routes override, else its tier's.
                    let from_key = doc
                        .overrides
                        .iter()
                        .find(|o| &o.key_id == key_id && o.route_class == ALL_ROUTES)
                        .map(|o| (o.capacity, o.refill_per_s, o.hourly_quota));
                    let base = match from_key {
                        Some(b) => b,
                        None => {
                            let r = &doc.limits[row_in_force(doc, tier, route_class)?.0];
                            (r.capacity, r.refill_per_s, r.hourly_quota)
                        }
                    };
                    doc.overrides.push(OverrideRow {
                        key_id: *key_id,
                        route_class: route_class.clone(),
                        capacity: base.0,
                        refill_per_s: base.1,
                        hourly_quota: base.2,
                        mode: None,
                    });
                    doc.overrides.len() - 1
                }
            };
            let o = &mut doc.overrides[i];
            change_row(
                change,
                &mut o.capacity,
                &mut o.refill_per_s,
                &mut o.hourly_quota,
            );
        }
        Edit::KillSwitch { tier: None, on } => doc.kill_switch = *on,
        Edit::KillSwitch {
            tier: Some(tier),
            on,
        } => {
            let t = doc
                .tiers
                .iter_mut()
                .find(|t| &t.name == tier)
                .ok_or_else(|| refused(format!("tier {tier}"), "tier", "no such tier"))?;
            t.kill_switch = *on;
        }
    }
    PolicySnapshot::build(doc.clone()).map(|_| ())
}

/// What [`PgSource::apply`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    /// The version edited.
    pub from_version: u64,
    /// The version after the change.
    pub to_version: u64,
    /// The document now in the store.
    pub document: PolicyDocument,
}

impl PgSource {
    /// Applies `edit`: validated on the document in force, then written in one
    /// transaction if the version is still the one read.
    ///
    /// # Errors
    /// An invalid change (nothing written), a concurrent change, or the store failing.
    pub async fn apply(&self, edit: &Edit) -> Result<Applied, PolicyStoreError> {
        let mut doc = self.read().await?;
        let from_version = doc.version;
        apply(&mut doc, edit)?;
        let mut guard = self.client().await?;
        let client = &mut *guard;
        let tx = client.transaction().await?;
        let now: i64 = tx
            .query_one("select version from verdict_policy.meta for update", &[])
            .await?
            .get(0);
        if now as u64 != from_version {
            return Err(PolicyStoreError::Invalid(refused(
                "meta".into(),
                "version",
                format!(
                    "the policy changed while this change was checked (version {from_version} became {now}); nothing was written, run the command again"
                ),
            )));
        }
        match edit {
            Edit::SetMode { tier, .. } => {
                for l in doc.limits.iter().filter(|l| &l.tier == tier) {
                    upsert_limit(&tx, l).await?;
                }
            }
            Edit::SetTierLimit {
                tier, route_class, ..
            } => {
                if let Some(l) = doc
                    .limits
                    .iter()
                    .find(|l| &l.tier == tier && &l.route_class == route_class)
                {
                    upsert_limit(&tx, l).await?;
                }
            }
            Edit::SetKeyLimit {
                key_id,
                route_class,
                ..
            } => {
                if let Some(o) = doc
                    .overrides
                    .iter()
                    .find(|o| &o.key_id == key_id && &o.route_class == route_class)
                {
                    tx.execute(
                        "insert into verdict_policy.overrides (key_id, route_class, capacity, refill_per_s, hourly_quota, mode) \
                         values ($1, $2, $3, $4, $5, $6) on conflict (key_id, route_class) do update set \
                         capacity = excluded.capacity, refill_per_s = excluded.refill_per_s, hourly_quota = excluded.hourly_quota",
                        &[
                            &o.key_id.to_string(),
                            &o.route_class,
                            &o.capacity,
                            &o.refill_per_s,
                            &o.hourly_quota,
                            &o.mode.map(|m| m.as_str().to_owned()),
                        ],
                    )
                    .await?;
                }
            }
            Edit::KillSwitch { tier: None, on } => {
                tx.execute(
                    "update verdict_policy.meta set kill_switch = $1 where id",
                    &[on],
                )
                .await?;
            }
            Edit::KillSwitch { tier: Some(t), on } => {
                tx.execute(
                    "update verdict_policy.tiers set kill_switch = $1 where name = $2",
                    &[on, t],
                )
                .await?;
            }
        }
        let to: i64 = tx
            .query_one("select version from verdict_policy.meta", &[])
            .await?
            .get(0);
        tx.commit().await?;
        doc.version = to.max(0) as u64;
        Ok(Applied {
            from_version,
            to_version: doc.version,
            document: doc,
        })
    }
}

async fn upsert_limit(
    tx: &tokio_postgres::Transaction<'_>,
    l: &LimitRow,
) -> Result<(), tokio_postgres::Error> {
    tx.execute(
        "insert into verdict_policy.limits (tier, route_class, capacity, refill_per_s, hourly_quota, mode) \
         values ($1, $2, $3, $4, $5, $6) on conflict (tier, route_class) do update set \
         capacity = excluded.capacity, refill_per_s = excluded.refill_per_s, \
         hourly_quota = excluded.hourly_quota, mode = excluded.mode",
        &[
            &l.tier,
            &l.route_class,
            &l.capacity,
            &l.refill_per_s,
            &l.hourly_quota,
            &l.mode.as_str(),
        ],
    )
    .await
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use verdict_limiter::policy::parse_toml;

    const DOC: &str = include_str!("../fixtures/policies/two_tiers.toml");

    fn doc() -> PolicyDocument {
        parse_toml(DOC).unwrap()
    }

    #[test]
    fn modes_limits_and_switches_change_only_what_they_name() {
        // A tier's mode: all its rows, no other tier's.
        let mut d = doc();
        let edit = Edit::SetMode {
            tier: "pro".into(),
            route_class: None,
            mode: Mode::Shadow,
        };
        apply(&mut d, &edit).unwrap();
        let modes: Vec<(&str, &str, Mode)> = d
            .limits
            .iter()
            .map(|l| (l.tier.as_str(), l.route_class.as_str(), l.mode))
            .collect();
        assert_eq!(
            modes,
            vec![
                ("free", "*", Mode::Enforce),
                ("pro", "*", Mode::Shadow),
                ("pro", "write", Mode::Shadow)
            ]
        );

        // A limit on a class without its own row: the row is made from "*", and only it
        // changes.
        let mut d = doc();
        let edit = Edit::SetTierLimit {
            tier: "free".into(),
            route_class: "write".into(),
            change: LimitChange {
                hourly_quota: Some(12_345),
                ..LimitChange::default()
            },
        };
        apply(&mut d, &edit).unwrap();
        assert_eq!(d.limits.len(), 4);
        let row = &d.limits[3];
        assert_eq!(
            (
                row.tier.as_str(),
                row.route_class.as_str(),
                row.capacity,
                row.hourly_quota
            ),
            ("free", "write", 10, 12_345)
        );
        assert_eq!(d.limits[0].hourly_quota, 100);

        let mut d = doc();
        apply(
            &mut d,
            &Edit::KillSwitch {
                tier: None,
                on: true,
            },
        )
        .unwrap();
        assert!(d.kill_switch);
        apply(
            &mut d,
            &Edit::KillSwitch {
                tier: Some("free".into()),
                on: true,
            },
        )
        .unwrap();
        assert!(d.tiers[0].kill_switch && !d.tiers[1].kill_switch);
    }

    #[test]
    fn a_new_key_override_starts_from_its_tier_and_bad_changes_are_refused() {
        let mut d = doc();
        let star = d.limits[0].clone();
        let key = KeyId([0x77; 16]);
        apply(
            &mut d,
            &Edit::SetKeyLimit {
                key_id: key,
                tier: star.tier.clone(),
                route_class: ALL_ROUTES.into(),
                change: LimitChange {
                    capacity: Some(999),
                    ..LimitChange::default()
                },
            },
        )
        .unwrap();
        let o = d.overrides.iter().find(|o| o.key_id == key).unwrap();
        assert_eq!(
            (o.capacity, o.refill_per_s, o.hourly_quota),
            (999, star.refill_per_s, star.hourly_quota)
        );

        let mut d = doc();
        let e = apply(
            &mut d,
            &Edit::SetTierLimit {
                tier: star.tier.clone(),
                route_class: ALL_ROUTES.into(),
                change: LimitChange {
                    refill_per_s: Some(-1.0),
                    ..LimitChange::default()
                },
            },
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("refill_per_s: must be 0.001"), "{e}");
        let e = apply(
            &mut d,
            &Edit::SetMode {
                tier: "platinum".into(),
                route_class: None,
                mode: Mode::Off,
            },
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("no such tier"), "{e}");
        let e = apply(
            &mut d,
            &Edit::SetTierLimit {
                tier: star.tier,
                route_class: ALL_ROUTES.into(),
                change: LimitChange::default(),
            },
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("nothing to change"), "{e}");
    }
}
