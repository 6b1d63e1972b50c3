//! The reconcile's record of its rounds in the lake (`reconcile_rounds`): one row per round with
//! the settings it ran with, so a what-if over a range replays the shares as they moved (or
//! knows they stayed at the static weights: no rounds).
//!
//! Rounds are kept in memory and appended a few at a time (every
//! [`RoundLog::every`] rounds, and when the job stops): one small file and one commit per
//! append, not one per 30-second round. A failed append keeps its rounds for the next (up
//! to [`MAX_PENDING`]); the commit carries a `txn` of [`RECONCILE_ROUNDS_APP_ID`] whose version
//! is the last round's time, so an append that did land and is tried again is not written
//! twice.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, Date32Array, Float64Array, Int64Array, TimestampMillisecondArray, UInt16Array,
    UInt32Array,
};
use arrow::record_batch::RecordBatch;
use chrono::{DateTime, NaiveDate};
use object_store::ObjectStore;
use verdict_lake::action::Action;
use verdict_lake::table::Commit;
use verdict_lake::tables::{RECONCILE_ROUNDS, date_partition};
use verdict_rollup::{Rollup, RollupError};
use verdict_schemas::tables::{UTC, reconcile_rounds_schema};

/// The application id of the `txn` the appends carry.
pub const RECONCILE_ROUNDS_APP_ID: &str = "verdict-reconcile:reconcile_rounds";

/// Rounds kept at most while the lake does not answer (a day of 30-second rounds); the
/// oldest go first, with a warning.
pub const MAX_PENDING: usize = 2_880;

/// One round, as recorded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoundRecord {
    /// When it read the counters, ms.
    pub time_ms: i64,
    /// Between rounds, ms.
    pub interval_ms: i64,
    /// Delay of a growing share, ms.
    pub increase_delay_ms: i64,
    /// Life of a share not rewritten, ms.
    pub share_ttl_ms: i64,
    /// Part of the static weight kept.
    pub floor: f64,
    /// Keys whose shares it computed.
    pub keys: u32,
    /// Rows written.
    pub share_rows: u32,
    /// Regions it could not read.
    pub unreachable_regions: u16,
}

impl RoundRecord {
    fn date(&self) -> NaiveDate {
        DateTime::from_timestamp_millis(self.time_ms)
            .unwrap_or_default()
            .date_naive()
    }
}

/// Rounds as a batch of the table's schema.
pub fn rounds_batch(rounds: &[RoundRecord]) -> Result<RecordBatch, arrow::error::ArrowError> {
    let epoch = NaiveDate::from_ymd_opt(1970, 1, 1).expect("a date");
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Date32Array::from_iter_values(
            rounds.iter().map(|r| (r.date() - epoch).num_days() as i32),
        )),
        Arc::new(
            TimestampMillisecondArray::from_iter_values(rounds.iter().map(|r| r.time_ms))
                .with_timezone(UTC),
        ),
        Arc::new(Int64Array::from_iter_values(
            rounds.iter().map(|r| r.interval_ms),
        )),
        Arc::new(Int64Array::from_iter_values(
            rounds.iter().map(|r| r.increase_delay_ms),
        )),
        Arc::new(Int64Array::from_iter_values(
            rounds.iter().map(|r| r.share_ttl_ms),
        )),
        Arc::new(Float64Array::from_iter_values(
            rounds.iter().map(|r| r.floor),
        )),
        Arc::new(UInt32Array::from_iter_values(rounds.iter().map(|r| r.keys))),
        Arc::new(UInt32Array::from_iter_values(
            rounds.iter().map(|r| r.share_rows),
        )),
        Arc::new(UInt16Array::from_iter_values(
            rounds.iter().map(|r| r.unreachable_regions),
        )),
    ];
    RecordBatch::try_new(reconcile_rounds_schema(), columns)
}

/// The rounds not yet in the lake, and how to put them there.
pub struct RoundLog {
    rollup: Rollup,
    pending: Vec<RoundRecord>,
    every: usize,
}

impl std::fmt::Debug for RoundLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoundLog")
            .field("pending", &self.pending.len())
            .field("every", &self.every)
            .finish()
    }
}

impl RoundLog {
    /// A log appending to the lake in `store` every `every` rounds (at least 1).
    pub fn new(store: Arc<dyn ObjectStore>, every: usize) -> Self {
        Self {
            rollup: Rollup::new(store, 1),
            pending: Vec::new(),
            every: every.max(1),
        }
    }

    /// Rounds per append.
    pub fn every(&self) -> usize {
        self.every
    }

    /// Rounds not yet appended.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Keeps `round` for the next append.
    pub fn push(&mut self, round: RoundRecord) {
        if self.pending.len() >= MAX_PENDING {
            let dropped = self.pending.remove(0);
            tracing::warn!(
                round_ms = dropped.time_ms,
                "reconcile_rounds: the lake has not taken a round for {MAX_PENDING} rounds; the oldest is dropped"
            );
        }
        self.pending.push(round);
    }

    /// True when an append is due.
    pub fn due(&self) -> bool {
        self.pending.len() >= self.every
    }

    /// Appends the pending rounds (one file per day, one commit) and returns how many. On
    /// error they stay pending.
    ///
    /// # Errors
    /// When the lake refuses the files or the commit.
    pub async fn append(&mut self, now_ms: i64) -> Result<usize, RollupError> {
        if self.pending.is_empty() {
            return Ok(0);
        }
        let last = self.pending.iter().map(|r| r.time_ms).max().unwrap_or(0);
        let (table, mut snapshot) = RECONCILE_ROUNDS
            .open_table(RECONCILE_ROUNDS.table_at(
                Arc::clone(self.rollup.store()),
                Arc::clone(self.rollup.clock()),
            ))
            .await?;
        let expected = snapshot.txn_version(RECONCILE_ROUNDS_APP_ID);
        if expected.is_some_and(|v| v >= last) {
            // An earlier append of these rounds landed after all.
            return Ok(std::mem::take(&mut self.pending).len());
        }
        let mut days: Vec<NaiveDate> = self.pending.iter().map(RoundRecord::date).collect();
        days.sort_unstable();
        days.dedup();
        let mut actions = Vec::with_capacity(days.len());
        for day in days {
            let rounds: Vec<RoundRecord> = self
                .pending
                .iter()
                .filter(|r| r.date() == day)
                .copied()
                .collect();
            let batch = rounds_batch(&rounds)?;
            let add = self
                .rollup
                .put_file(
                    &RECONCILE_ROUNDS,
                    &format!("date={}/", day.format("%Y-%m-%d")),
                    "rounds",
                    &batch,
                    &[],
                    &date_partition(day),
                    now_ms,
                )
                .await?;
            actions.push(Action::Add(add));
        }
        let commit = Commit::new("WRITE", actions)
            .with_parameter("mode", "Append")
            .with_txn(RECONCILE_ROUNDS_APP_ID, expected, last, now_ms);
        table.commit(&mut snapshot, commit).await?;
        Ok(std::mem::take(&mut self.pending).len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    fn round(time_ms: i64) -> RoundRecord {
        RoundRecord {
            time_ms,
            interval_ms: 30_000,
            increase_delay_ms: 12_000,
            share_ttl_ms: 300_000,
            floor: 0.1,
            keys: 3,
            share_rows: 9,
            unreachable_regions: 0,
        }
    }

    #[tokio::test]
    async fn rounds_are_appended_once_across_days() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let mut log = RoundLog::new(Arc::clone(&store), 2);
        let midnight = 1_764_547_200_000; // 2025-12-01T00:00:00Z
        log.push(round(midnight - 30_000));
        assert!(!log.due());
        log.push(round(midnight));
        assert!(log.due());
        assert_eq!(log.append(midnight + 1).await.unwrap(), 2);
        assert_eq!(log.pending(), 0);
        assert_eq!(log.append(midnight + 2).await.unwrap(), 0);
        let snapshot = RECONCILE_ROUNDS
            .table(Arc::clone(&store))
            .snapshot()
            .await
            .unwrap();
        assert_eq!(snapshot.files().len(), 2, "one file per day");
        assert_eq!(snapshot.num_records(), 2);
        assert_eq!(
            snapshot.txn_version(RECONCILE_ROUNDS_APP_ID),
            Some(midnight)
        );
        // A retry of rounds that already landed writes nothing.
        log.push(round(midnight));
        assert_eq!(log.append(midnight + 3).await.unwrap(), 1);
        let again = RECONCILE_ROUNDS.table(store).snapshot().await.unwrap();
        assert_eq!(again.version(), snapshot.version());
    }
}
