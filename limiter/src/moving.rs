//! Moving the counters to a new store, as the design describes it: the counter store's state
//! is disposable by construction (every key lives two windows), so a move copies nothing.
//! Stand up the new store, **dual-write** for two window lengths (decide on the old store,
//! apply every allowed request to the new one as well), **cut over** (decide on the new
//! store), drop the old one. After two windows of dual writing, the new store holds every
//! count still in view, so no key's count resets at the cut-over.
//!
//! [`MovingStore`] is a [`CounterStore`] in one of three phases, switched at runtime
//! ([`MovingStore::set_phase`]). In the dual-write phase the new store's copy of an allowed
//! request is applied in the background, off the decision's latency; a failure there is
//! counted, and costs at most that request's count in the new store.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use crate::algo::Limits;
use crate::counter_store::{Charge, Checked, CounterStore};
use crate::key::LimitKey;

/// Where a move stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Decide on the old store only (before the move).
    Old = 0,
    /// Decide on the old store, apply allowed requests to both.
    DualWrite = 1,
    /// Decide on the new store only.
    CutOver = 2,
}

impl std::str::FromStr for Phase {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "old" => Ok(Self::Old),
            "dual-write" => Ok(Self::DualWrite),
            "cut-over" => Ok(Self::CutOver),
            other => Err(format!(
                "unknown phase {other:?} (expected old, dual-write or cut-over)"
            )),
        }
    }
}

/// Two stores and the phase of the move between them.
#[derive(Debug)]
pub struct MovingStore<A, B> {
    old: A,
    new: B,
    phase: AtomicU8,
    copies_failed: Arc<AtomicU64>,
}

impl<A: CounterStore, B: CounterStore + Clone> MovingStore<A, B> {
    /// A move from `old` to `new`, starting at `phase`.
    pub fn new(old: A, new: B, phase: Phase) -> Self {
        Self {
            old,
            new,
            phase: AtomicU8::new(phase as u8),
            copies_failed: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The phase now.
    pub fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            0 => Phase::Old,
            1 => Phase::DualWrite,
            _ => Phase::CutOver,
        }
    }

    /// Moves to `phase` (takes effect for the next decision).
    pub fn set_phase(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::Release);
        tracing::info!(?phase, "counter store move");
    }

    /// Copies of allowed requests the new store refused or failed (dual-write phase).
    pub fn copies_failed(&self) -> u64 {
        self.copies_failed.load(Ordering::Relaxed)
    }
}

/// A move is one shard: its two stores need not share a layout, so each locates the key
/// itself.
impl<A: CounterStore, B: CounterStore + Clone> CounterStore for MovingStore<A, B> {
    type Place = ();

    async fn check(&self, key: &LimitKey, limits: &Limits, hits: u32) -> Checked {
        match self.phase() {
            Phase::Old => self.old.check(key, limits, hits).await,
            Phase::CutOver => self.new.check(key, limits, hits).await,
            Phase::DualWrite => {
                let outcome = self.old.check(key, limits, hits).await?;
                // A check of no hits counted nothing: there is nothing to copy.
                if outcome.allowed && hits > 0 {
                    let (new, key, limits) = (self.new.clone(), *key, *limits);
                    let failed = Arc::clone(&self.copies_failed);
                    tokio::spawn(async move {
                        match new.check(&key, &limits, hits).await {
                            Ok(o) if o.allowed => {}
                            _ => {
                                failed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    });
                }
                Ok(outcome)
            }
        }
    }

    /// Charges go where decisions are made: the old store, and the new one too while it
    /// takes copies of what is allowed. Each store places the key itself; what the deciding
    /// store cannot take now is handed back.
    fn charge(&self, charges: Vec<Charge<()>>) -> Vec<Charge<()>> {
        fn placed<S: CounterStore>(s: &S, charges: &[Charge<()>]) -> Vec<Charge<S::Place>> {
            charges
                .iter()
                .map(|c| c.at(s.locate(&c.key).place))
                .collect()
        }
        let refused: Vec<LimitKey> = match self.phase() {
            Phase::Old => keys(self.old.charge(placed(&self.old, &charges))),
            Phase::CutOver => keys(self.new.charge(placed(&self.new, &charges))),
            Phase::DualWrite => {
                self.new.charge(placed(&self.new, &charges));
                keys(self.old.charge(placed(&self.old, &charges)))
            }
        };
        charges
            .into_iter()
            .filter(|c| refused.contains(&c.key))
            .collect()
    }
}

/// The keys of charges a store handed back.
fn keys<P>(refused: Vec<Charge<P>>) -> Vec<LimitKey> {
    refused.into_iter().map(|c| c.key).collect()
}
