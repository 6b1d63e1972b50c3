//! How a replay models several regions' shares of a global limit, as the limiter enforced
//! them over the range: the static weights, or the shares the regional reconcile moved
//! (`verdict jobs reconcile`, which records its rounds in the lake's `reconcile_rounds`).
//!
//! With rounds recorded, the replay runs each round again for every key near its limit, with
//! the job's own arithmetic ([`verdict_limiter::regions::compute_shares`]) over the
//! replay's counters: the key's demand in each region (requests near the regional limit
//! since the last round: refused, or less than half of the bucket or of the quota left),
//! each region's sliding-window usage at the round, the share in force before it. A share
//! that grows applies the round's increase delay later, one that shrinks at once; a share
//! not rewritten for the round's share life gives way to the static weight, as in the
//! gateways. Under a candidate policy the rounds move shares by the candidate's limits, as
//! the job would have.
//!
//! What it leaves out: the gateways' share poll (up to 5 s after a round) and their
//! near-limit reports (every second) are taken as instant, and a region that could not be
//! read in a round is replayed as read.

use std::sync::Arc;

use arrow::array::{Array, Float64Array, Int64Array, TimestampMillisecondArray};
use chrono::Duration;
use rustc_hash::FxHashMap;
use verdict_limiter::algo::Limits;
use verdict_limiter::regions::{Reading, RegionInput, Share, ShareEntry, compute_shares};
use verdict_limiter::{CounterState, PolicySnapshot};
use verdict_schemas::{KeyId, RegionId};

use crate::engine::{Engine, RunOptions};
use crate::error::QueryError;
use crate::range::Range;

/// What the answer says when the regions enforced their static weights.
pub const STATIC_SHARES: &str = "each region enforced its static weight's share of every \
    limit: the lake records no round of the regional reconcile in the range";

/// How far before a range the rounds are read: a share written then may still be in force
/// (the reconcile's default share life is 5 minutes).
pub const LOOKBACK: Duration = Duration::hours(1);

/// One recorded round of the reconcile, as the replay needs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Round {
    /// When it read the counters, ms.
    pub time_ms: i64,
    /// Between rounds, ms (it counted the near-limit requests of this long before it).
    pub interval_ms: i64,
    /// Delay of a growing share, ms.
    pub increase_delay_ms: i64,
    /// Life of a share not rewritten, ms.
    pub share_ttl_ms: i64,
    /// Part of the static weight every region keeps.
    pub floor: f64,
}

/// How the regions' shares are modelled.
#[derive(Debug, Clone, Default)]
pub enum ShareModel {
    /// Each region its static weight's share.
    #[default]
    Static,
    /// The reconcile's rounds, in time order.
    Reconciled(Arc<[Round]>),
}

impl ShareModel {
    /// The model of `range` in the lake: its recorded rounds (from [`LOOKBACK`] before
    /// it), or the static weights when there are none.
    ///
    /// # Errors
    /// When the `reconcile_rounds` table cannot be read.
    pub async fn recorded(engine: &Engine, range: Range) -> Result<Self, QueryError> {
        let from = range.from - LOOKBACK;
        let sql = format!(
            "SELECT round_time, interval_ms, increase_delay_ms, share_ttl_ms, floor \
             FROM reconcile_rounds WHERE date >= DATE '{}' AND date <= DATE '{}' \
             AND round_time >= TIMESTAMP '{}' AND round_time < TIMESTAMP '{}' ORDER BY round_time",
            from.format("%Y-%m-%d"),
            range.to.format("%Y-%m-%d"),
            from.format("%Y-%m-%d %H:%M:%S%.3f"),
            range.to.format("%Y-%m-%d %H:%M:%S%.3f"),
        );
        let batches = engine.collect(&sql, &RunOptions::default()).await?.batches;
        let mut rounds = Vec::new();
        for b in &batches {
            let col = |i: usize| b.column(i);
            let bad = |name: &str| {
                tracing::error!(
                    column = name,
                    "reconcile_rounds: a column has an unexpected type"
                );
                QueryError::Internal
            };
            let time = col(0)
                .as_any()
                .downcast_ref::<TimestampMillisecondArray>()
                .ok_or_else(|| bad("round_time"))?;
            let int = |i: usize, name: &str| {
                col(i)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .ok_or_else(|| bad(name))
            };
            let (interval, delay, ttl) = (
                int(1, "interval_ms")?,
                int(2, "increase_delay_ms")?,
                int(3, "share_ttl_ms")?,
            );
            let floor = col(4)
                .as_any()
                .downcast_ref::<Float64Array>()
                .ok_or_else(|| bad("floor"))?;
            for i in 0..b.num_rows() {
                rounds.push(Round {
                    time_ms: time.value(i),
                    interval_ms: interval.value(i),
                    increase_delay_ms: delay.value(i),
                    share_ttl_ms: ttl.value(i),
                    floor: floor.value(i),
                });
            }
        }
        Ok(Self::of_rounds(rounds))
    }

    /// The model of these rounds (the static weights when there are none).
    pub fn of_rounds(mut rounds: Vec<Round>) -> Self {
        if rounds.is_empty() {
            return Self::Static;
        }
        rounds.sort_by_key(|r| r.time_ms);
        rounds.dedup_by_key(|r| r.time_ms);
        Self::Reconciled(rounds.into())
    }
}

/// One key's shares and near-limit notes, per region of the policy (in its order).
#[derive(Debug, Clone)]
struct KeyShares {
    entries: Vec<Option<ShareEntry>>,
    near: Vec<u64>,
    last_note_ms: i64,
    /// The first round this key has not passed.
    next_round: usize,
}

/// The shares of every key the reconcile touched, as a replay goes.
#[derive(Debug)]
pub struct Reconcile {
    rounds: Arc<[Round]>,
    regions: Vec<(RegionId, u32)>,
    keys: FxHashMap<(KeyId, u8, u8), KeyShares>,
}

impl Reconcile {
    /// The rounds, over the regions of `policy`.
    pub fn new(rounds: Arc<[Round]>, policy: &PolicySnapshot) -> Self {
        let regions = policy
            .document()
            .regions
            .iter()
            .map(|r| {
                let id = RegionId(r.id);
                (id, policy.region_static_ppm(id))
            })
            .collect();
        Self {
            rounds,
            regions,
            keys: FxHashMap::default(),
        }
    }

    fn index(&self, region: u16) -> Option<usize> {
        self.regions.iter().position(|(id, _)| id.0 == region)
    }

    fn rounds_until(&self, t_ms: i64) -> usize {
        self.rounds.partition_point(|r| r.time_ms <= t_ms)
    }

    /// What the answer says about the rounds it replays.
    pub fn describe(&self) -> String {
        let last = self.rounds[self.rounds.len() - 1];
        format!(
            "shares moved by the regional reconcile as recorded: {} rounds in the range \
             (every {} s, growing shares {} s after their round, shares kept {} s, \
             floor {} of the static weight), each run again on the replayed counters \
             under the candidate's limits",
            self.rounds.len(),
            last.interval_ms / 1000,
            last.increase_delay_ms / 1000,
            last.share_ttl_ms / 1000,
            last.floor
        )
    }

    /// Region `region`'s share of `key`'s limits at `t_ms` as the reconcile left it, after
    /// running the rounds passed since the key's last request; `None` where no round's
    /// share is in force (the region's static weight applies). `limits` are the global
    /// limits of one counter (divided for a split key), `sub_keys` the split, and `used`
    /// reads a region's counter of a sub-key.
    pub fn share(
        &mut self,
        key: (KeyId, u8, u8),
        region: u16,
        t_ms: i64,
        limits: &Limits,
        sub_keys: u8,
        used: impl Fn(u16, u8) -> Option<CounterState>,
    ) -> Option<Share> {
        let until = self.rounds_until(t_ms);
        let state = self.keys.get_mut(&key)?;
        if state.next_round < until {
            let round = self.rounds[state.next_round];
            state.next_round = until;
            let noted = state.near.iter().any(|&n| n > 0);
            if noted && state.last_note_ms >= round.time_ms - round.interval_ms {
                let t = round.time_ms;
                let quota = limits.quota.saturating_mul(u32::from(sub_keys.max(1)));
                let inputs: Vec<RegionInput> = self
                    .regions
                    .iter()
                    .enumerate()
                    .map(|(i, (id, static_ppm))| {
                        let used: f64 = (0..sub_keys.max(1))
                            .filter_map(|s| used(id.0, s))
                            .map(|c| c.window_used(t, limits.window_ms))
                            .sum();
                        let last = state.entries[i]
                            .and_then(|e| e.in_force_within(t, round.share_ttl_ms))
                            .unwrap_or(Share::uniform(*static_ppm));
                        RegionInput {
                            static_ppm: *static_ppm,
                            reading: Some(Reading {
                                used,
                                demand: state.near[i],
                            }),
                            last,
                        }
                    })
                    .collect();
                let shares = compute_shares(quota, &inputs, round.floor);
                for (i, (input, share)) in inputs.iter().zip(shares).enumerate() {
                    state.entries[i] = Some(ShareEntry {
                        before: input.last,
                        after: share,
                        effective_ms: t + round.increase_delay_ms,
                        computed_ms: t,
                    });
                }
            }
            state.near.iter_mut().for_each(|n| *n = 0);
        }
        let ttl = self.rounds[until.saturating_sub(1)].share_ttl_ms;
        let i = self.regions.iter().position(|(id, _)| id.0 == region)?;
        state.entries[i]?.in_force_within(t_ms, ttl)
    }

    /// Notes a request of `key` in `region` at `t_ms` that found the key near its regional
    /// limit (the gateway's near-limit note).
    pub fn note_near(&mut self, key: (KeyId, u8, u8), region: u16, t_ms: i64) {
        let Some(i) = self.index(region) else {
            return;
        };
        let n = self.regions.len();
        let next_round = self.rounds_until(t_ms);
        let state = self.keys.entry(key).or_insert_with(|| KeyShares {
            entries: vec![None; n],
            near: vec![0; n],
            last_note_ms: t_ms,
            next_round,
        });
        state.near[i] += 1;
        state.last_note_ms = t_ms;
    }
}
