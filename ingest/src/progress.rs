//! Exactly-once progress, kept in the object store beside the data (see `ingest/README.md`).
//!
//! A flush of one Kafka partition covers a contiguous offset range `[first, last]` and may
//! write several files (one per event hour). It is recorded in three steps:
//!
//! 1. an **intent** `_ingest/<topic>/<partition>/<first>.intent` listing the files it will
//!    write (their names follow from the buffered events, so they are known up front);
//! 2. the files;
//! 3. a **marker** `_ingest/<topic>/<partition>/<first>-<last>.done`, created with
//!    `PutMode::Create` (a second writer of the same flush fails here), after which the
//!    intent is deleted and only then the Kafka offset `last + 1` committed.
//!
//! A worker that takes a partition derives where to resume from the markers (the Kafka
//! commit only helps when there are none), and first deletes the files of every intent that
//! has no marker: whatever a crash left half written is gone before the replay writes it
//! again, however differently the replay cuts its flushes. This module decides all of that
//! from listings, without I/O.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Prefix of the progress objects.
pub const PROGRESS_PREFIX: &str = "_ingest";

/// One flush's offset range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FlushRange {
    /// First offset (inclusive).
    pub first: i64,
    /// Last offset (inclusive).
    pub last: i64,
}

/// What a progress object's name says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProgressObject {
    /// An intent: a flush starting at this offset is (or was) being written.
    Intent {
        /// The flush's first offset.
        first: i64,
    },
    /// A marker: this flush is complete.
    Done(FlushRange),
}

/// Why a progress object's name does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("progress object {name:?} is not <first>.intent or <first>-<last>.done: {reason}")]
pub struct ProgressNameError {
    /// The name.
    pub name: String,
    /// What is wrong.
    pub reason: &'static str,
}

/// The folder of one partition's progress objects.
pub fn partition_prefix(topic: &str, partition: i32) -> String {
    format!("{PROGRESS_PREFIX}/{topic}/{partition:05}")
}

impl ProgressObject {
    /// The object's path.
    pub fn path(&self, topic: &str, partition: i32) -> String {
        format!("{}/{self}", partition_prefix(topic, partition))
    }
}

impl fmt::Display for ProgressObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Intent { first } => write!(f, "{first:020}.intent"),
            Self::Done(r) => write!(f, "{:020}-{:020}.done", r.first, r.last),
        }
    }
}

fn offset(s: &str) -> Option<i64> {
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

impl FromStr for ProgressObject {
    type Err = ProgressNameError;

    /// Parses an object name (the last path segment is taken if a path is given).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.rsplit('/').next().unwrap_or(s);
        let bad = |reason| ProgressNameError {
            name: name.to_owned(),
            reason,
        };
        if let Some(first) = name.strip_suffix(".intent") {
            let first = offset(first).ok_or_else(|| bad("the offset is not a decimal number"))?;
            return Ok(Self::Intent { first });
        }
        let range = name
            .strip_suffix(".done")
            .ok_or_else(|| bad("unknown suffix"))?;
        let (first, last) = range
            .split_once('-')
            .ok_or_else(|| bad("no '-' between the offsets"))?;
        let (first, last) = (
            offset(first).ok_or_else(|| bad("the first offset is not a decimal number"))?,
            offset(last).ok_or_else(|| bad("the last offset is not a decimal number"))?,
        );
        if first > last {
            return Err(bad("the first offset is after the last"));
        }
        Ok(Self::Done(FlushRange { first, last }))
    }
}

/// The content of an intent: the files the flush writes (object paths).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intent {
    /// The flush's offset range.
    pub range: FlushRange,
    /// Object paths of the files it writes.
    pub files: Vec<String>,
}

/// What a worker must do before consuming a partition it was given.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Recovery {
    /// The offset to consume from.
    pub resume_at: Option<i64>,
    /// Intents of flushes that never completed: delete their files, then them.
    pub abandoned: Vec<i64>,
    /// Intents of flushes that completed (a crash fell between the marker and the
    /// intent's deletion): delete only the intent.
    pub stale_intents: Vec<i64>,
    /// The completed flushes do not tile the offsets: these ranges overlap an earlier one
    /// (a bug or a second writer; the reader's covered-file rule still prevents double
    /// counting, and this is reported).
    pub overlaps: Vec<(FlushRange, FlushRange)>,
}

/// Plans the recovery of one partition from the names of its progress objects and the
/// offset Kafka has committed for the group (if any).
///
/// Resume at the end of the last completed flush, or at Kafka's commit if that is later
/// (markers lost to an operator's cleanup); with neither, `None` (the consumer's
/// `auto.offset.reset` decides).
pub fn plan_recovery(objects: &[ProgressObject], kafka_committed: Option<i64>) -> Recovery {
    let mut done: Vec<FlushRange> = objects
        .iter()
        .filter_map(|o| match o {
            ProgressObject::Done(r) => Some(*r),
            ProgressObject::Intent { .. } => None,
        })
        .collect();
    done.sort();
    let mut plan = Recovery::default();
    for pair in done.windows(2) {
        if pair[1].first <= pair[0].last {
            plan.overlaps.push((pair[0], pair[1]));
        }
    }
    let from_markers = done.iter().map(|r| r.last + 1).max();
    plan.resume_at = match (from_markers, kafka_committed) {
        (Some(m), Some(k)) => Some(m.max(k)),
        (m, k) => m.or(k),
    };
    for o in objects {
        if let ProgressObject::Intent { first } = o {
            if done.iter().any(|r| r.first == *first) {
                plan.stale_intents.push(*first);
            } else {
                plan.abandoned.push(*first);
            }
        }
    }
    plan.abandoned.sort_unstable();
    plan.stale_intents.sort_unstable();
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(first: i64, last: i64) -> ProgressObject {
        ProgressObject::Done(FlushRange { first, last })
    }

    #[test]
    fn names_round_trip_and_sort_as_offsets() {
        for o in [
            ProgressObject::Intent { first: 42 },
            done(0, 999),
            done(1000, 1000),
        ] {
            assert_eq!(o.to_string().parse::<ProgressObject>().unwrap(), o);
        }
        assert_eq!(
            done(5, 9).path("verdict.decisions.v1", 3),
            "_ingest/verdict.decisions.v1/00003/00000000000000000005-00000000000000000009.done"
        );
        assert!(done(9, 99).to_string() < done(100, 100).to_string());
        for bad in [
            "1.pending",
            "x.intent",
            "5-3.done",
            "5.done",
            "-1-3.done",
            "1-2.done.tmp",
        ] {
            assert!(bad.parse::<ProgressObject>().is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn resume_after_the_last_completed_flush_and_abandon_unfinished_ones() {
        // Flushes [0,99] and [100,249] completed; [250, ?] crashed after its intent; a crash
        // also fell between [100,249]'s marker and the deletion of its intent.
        let objects = [
            done(0, 99),
            done(100, 249),
            ProgressObject::Intent { first: 100 },
            ProgressObject::Intent { first: 250 },
        ];
        let plan = plan_recovery(&objects, Some(100));
        assert_eq!(
            plan.resume_at,
            Some(250),
            "markers win over a lagging Kafka commit"
        );
        assert_eq!(plan.abandoned, vec![250]);
        assert_eq!(plan.stale_intents, vec![100]);
        assert!(plan.overlaps.is_empty());
    }

    #[test]
    fn without_markers_kafka_decides_and_a_later_commit_wins() {
        assert_eq!(plan_recovery(&[], None).resume_at, None);
        assert_eq!(plan_recovery(&[], Some(77)).resume_at, Some(77));
        assert_eq!(plan_recovery(&[done(0, 9)], Some(500)).resume_at, Some(500));
        let plan = plan_recovery(&[ProgressObject::Intent { first: 0 }], None);
        assert_eq!((plan.resume_at, plan.abandoned), (None, vec![0]));
    }

    #[test]
    fn overlapping_flushes_are_reported() {
        let plan = plan_recovery(&[done(0, 99), done(50, 149)], None);
        assert_eq!(
            plan.overlaps,
            vec![(
                FlushRange { first: 0, last: 99 },
                FlushRange {
                    first: 50,
                    last: 149
                }
            )]
        );
        assert_eq!(plan.resume_at, Some(150));
    }
}
