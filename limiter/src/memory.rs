//! The in-process counter store: the embedded default, and the local fallback while the
//! shared store is unreachable. Sharded (a lock per shard, so threads rarely meet) and
//! bounded (idle keys are evicted, then the longest idle, when a shard is full).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::algo::{CounterCheck, CounterState, Limits, charge, decide_hits};
use crate::counter_store::{Charge, Checked, CounterStore};
use crate::key::LimitKey;
use verdict_schemas::clock::{Clock, SystemClock};

/// Shards of the map (a power of two).
const SHARDS: usize = 64;

/// Counters in this process's memory.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shards: Vec<Mutex<HashMap<LimitKey, CounterState>>>,
    hasher: RandomState,
    per_shard: usize,
    clock: Arc<dyn Clock>,
}

impl MemoryStore {
    /// A store holding at most about `max_keys` limit keys, on the system clock.
    pub fn new(max_keys: usize) -> Self {
        Self::with_clock(max_keys, Arc::new(SystemClock))
    }

    /// A store on the given clock.
    pub fn with_clock(max_keys: usize, clock: Arc<dyn Clock>) -> Self {
        Self {
            inner: Arc::new(Inner {
                shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
                hasher: RandomState::new(),
                per_shard: max_keys.div_ceil(SHARDS).max(1),
                clock,
            }),
        }
    }

    /// Limit keys held now.
    pub fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| s.lock().map(|m| m.len()).unwrap_or_default())
            .sum()
    }

    /// True if no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every counter.
    pub fn clear(&self) {
        for s in &self.inner.shards {
            if let Ok(mut m) = s.lock() {
                m.clear();
            }
        }
    }

    /// The counters of `key` as they are (`None`: it is full, or was never seen).
    pub fn get(&self, key: &LimitKey) -> Option<CounterState> {
        self.locked(key).get(key).copied()
    }

    /// Decides one request of `hits` now (synchronously: there is no I/O).
    pub fn decide(&self, key: &LimitKey, limits: &Limits, hits: u32) -> CounterCheck {
        let now = self.inner.clock.now_ms();
        let mut map = self.locked(key);
        let (outcome, next) = decide_hits(map.get(key).copied(), now, limits, hits);
        if let Some(next) = next {
            self.put(&mut map, key, next, limits.window_ms);
        }
        outcome
    }

    /// Counts `count` requests of `key` admitted elsewhere, now ([`charge`]).
    pub fn charge_one(&self, key: &LimitKey, limits: &Limits, count: u32) {
        let now = self.inner.clock.now_ms();
        let mut map = self.locked(key);
        let next = charge(map.get(key).copied(), now, limits, count);
        self.put(&mut map, key, next, limits.window_ms);
    }

    /// Seeds `key`'s counters from `state` (`None`: a full part) without giving back what
    /// they already spent: the lower of the two ([`CounterState::lower`]). The local
    /// fallback is seeded so from the shared store's answers, which may not count yet what
    /// the fallback itself admitted (its charges are on their way).
    pub fn seed(&self, key: &LimitKey, state: Option<CounterState>, limits: &Limits) {
        let mut map = self.locked(key);
        let next = match (map.get(key), state) {
            (None, None) => return,
            (None, Some(s)) => s,
            (Some(_), None) => return,
            (Some(kept), Some(s)) => kept.lower(&s, s.last_ms, limits),
        };
        self.put(&mut map, key, next, limits.window_ms);
    }

    /// Sets `key`'s counters to `state`, or forgets them (`None`: the key starts full).
    /// The local fallback is seeded this way from the shared store's answers
    /// ([`CounterState::from_store_answer`]).
    pub fn set(&self, key: &LimitKey, state: Option<CounterState>, window_ms: i64) {
        let mut map = self.locked(key);
        match state {
            Some(s) => self.put(&mut map, key, s, window_ms),
            None => {
                map.remove(key);
            }
        }
    }

    /// The locked shard of `key`. A poisoned shard only means another thread panicked
    /// mid-update of plain data; the counters are still counters.
    fn locked(&self, key: &LimitKey) -> MutexGuard<'_, HashMap<LimitKey, CounterState>> {
        let i = (self.inner.hasher.hash_one(key) as usize) & (SHARDS - 1);
        self.inner.shards[i]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Stores `state` for `key`, making room first when the shard is full.
    fn put(
        &self,
        map: &mut HashMap<LimitKey, CounterState>,
        key: &LimitKey,
        state: CounterState,
        window_ms: i64,
    ) {
        if !map.contains_key(key) && map.len() >= self.inner.per_shard {
            evict(map, state.last_ms, 2 * window_ms);
        }
        map.insert(*key, state);
    }
}

/// Makes room in a full shard: drops keys idle for longer than `idle_ms` (their state has
/// expired anyway), and if none were, the eighth of the shard that was idle longest.
fn evict(map: &mut HashMap<LimitKey, CounterState>, now: i64, idle_ms: i64) {
    let before = map.len();
    map.retain(|_, s| now - s.last_ms <= idle_ms);
    if map.len() < before {
        return;
    }
    let mut ages: Vec<i64> = map.values().map(|s| s.last_ms).collect();
    let cut = (ages.len() / 8).max(1).min(ages.len() - 1);
    let (_, threshold, _) = ages.select_nth_unstable(cut);
    let threshold = *threshold;
    map.retain(|_, s| s.last_ms > threshold);
}

impl CounterStore for MemoryStore {
    type Place = ();

    async fn check(&self, key: &LimitKey, limits: &Limits, hits: u32) -> Checked {
        Ok(self.decide(key, limits, hits))
    }

    fn charge(&self, charges: Vec<Charge<()>>) -> Vec<Charge<()>> {
        for c in charges {
            self.charge_one(&c.key, &c.limits, c.count);
        }
        Vec::new()
    }

    fn can_fail(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use verdict_schemas::{KeyId, RouteClassId, TierId};

    use super::*;
    use verdict_schemas::clock::FakeClock;

    fn key(i: u32) -> LimitKey {
        let mut id = [0u8; 16];
        id[..4].copy_from_slice(&i.to_le_bytes());
        LimitKey::new(KeyId(id), RouteClassId(0), TierId(0))
    }

    #[test]
    fn the_store_stays_bounded_and_keeps_the_recently_used() {
        let clock = FakeClock::at(1_796_047_200_000);
        let store = MemoryStore::with_clock(1_000, Arc::new(clock.clone()));
        let l = Limits::per_hour(10, 1.0, 100);
        for i in 0..10_000 {
            clock.advance(1);
            store.decide(&key(i), &l, 1);
        }
        assert!(store.len() <= 1_000 + SHARDS, "{} keys held", store.len());
        // The most recent key is still counted: its second request sees one token gone.
        let o = store.decide(&key(9_999), &l, 1);
        assert_eq!(o.remaining_tokens, 8);
    }

    #[test]
    fn idle_keys_go_first() {
        let clock = FakeClock::at(1_796_047_200_000);
        let store = MemoryStore::with_clock(SHARDS, Arc::new(clock.clone()));
        let l = Limits {
            window_ms: 1_000,
            ..Limits::per_hour(10, 1.0, 100)
        };
        for i in 0..SHARDS as u32 {
            store.decide(&key(i), &l, 1);
        }
        clock.advance(10_000);
        for i in 1_000..1_000 + SHARDS as u32 {
            store.decide(&key(i), &l, 1);
        }
        assert!(store.len() <= SHARDS + 1, "{}", store.len());
    }
}
