//! What the local fallback admitted, kept per shard of the counter store until that shard
//! answers again, then handed to the store to count ([`CounterStore::charge`]). So the
//! shared window and bucket see every request admitted while the store was failing or this
//! process was overloaded, and the next store answer (from which the fallback is seeded)
//! already holds them: an outage or an overload costs a key at most one bucket plus the
//! refill over its length, once, not once per breaker opening.
//!
//! Bounded in count (keys kept per shard; a key's requests are one entry) and in age (a
//! charge older than its key's window is dropped: the window no longer sees it).
//!
//! [`CounterStore::charge`]: crate::CounterStore::charge

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::algo::Limits;
use crate::counter_store::Charge;
use crate::key::LimitKey;

/// The charges waiting, by shard of the store.
#[derive(Debug)]
pub(crate) struct ChargeBack<P> {
    shards: Box<[Waiting<P>]>,
    keys_per_shard: usize,
}

#[derive(Debug)]
struct Waiting<P> {
    /// Whether `charges` holds anything: read on every store answer, without the lock.
    any: AtomicBool,
    charges: Mutex<HashMap<LimitKey, Charge<P>>>,
}

impl<P: Copy> ChargeBack<P> {
    /// Room for about `max_keys` keys over `shards` shards.
    pub(crate) fn new(shards: usize, max_keys: usize) -> Self {
        let shards = shards.max(1);
        Self {
            shards: (0..shards)
                .map(|_| Waiting {
                    any: AtomicBool::new(false),
                    charges: Mutex::new(HashMap::new()),
                })
                .collect(),
            keys_per_shard: max_keys.div_ceil(shards).max(1),
        }
    }

    /// A request of `key` counting as `count` (at `place` of `shard`, under `limits`)
    /// admitted at `now_ms`; false when the shard already keeps as many keys as it may (the
    /// request is dropped).
    pub(crate) fn add(
        &self,
        shard: usize,
        key: &LimitKey,
        place: P,
        limits: &Limits,
        count: u32,
        now_ms: i64,
    ) -> bool {
        let w = &self.shards[shard.min(self.shards.len() - 1)];
        let mut map = w.charges.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = map.get_mut(key) {
            c.count = c.count.saturating_add(count);
            c.limits = *limits;
            return true;
        }
        if map.len() >= self.keys_per_shard {
            return false;
        }
        map.insert(
            *key,
            Charge {
                key: *key,
                place,
                limits: *limits,
                count,
                first_ms: now_ms,
            },
        );
        w.any.store(true, Ordering::Release);
        true
    }

    /// Whether `shard` has charges waiting.
    pub(crate) fn waiting(&self, shard: usize) -> bool {
        self.shards[shard.min(self.shards.len() - 1)]
            .any
            .load(Ordering::Acquire)
    }

    /// Takes `shard`'s charges, less those older than their key's window at `now_ms`; and
    /// how many requests those expired ones held.
    pub(crate) fn take(&self, shard: usize, now_ms: i64) -> (Vec<Charge<P>>, u64) {
        let w = &self.shards[shard.min(self.shards.len() - 1)];
        let taken = {
            let mut map = w.charges.lock().unwrap_or_else(|e| e.into_inner());
            w.any.store(false, Ordering::Release);
            std::mem::take(&mut *map)
        };
        let mut expired = 0;
        let fresh = taken
            .into_values()
            .filter(|c| {
                let young = now_ms - c.first_ms < c.limits.window_ms;
                if !young {
                    expired += u64::from(c.count);
                }
                young
            })
            .collect();
        (fresh, expired)
    }

    /// Keeps again the charges the store could not take; how many requests found no room.
    pub(crate) fn put_back(&self, shard: usize, charges: Vec<Charge<P>>) -> u64 {
        if charges.is_empty() {
            return 0;
        }
        let w = &self.shards[shard.min(self.shards.len() - 1)];
        let mut map = w.charges.lock().unwrap_or_else(|e| e.into_inner());
        let mut dropped = 0;
        for c in charges {
            if let Some(kept) = map.get_mut(&c.key) {
                kept.count = kept.count.saturating_add(c.count);
                kept.first_ms = kept.first_ms.min(c.first_ms);
            } else if map.len() < self.keys_per_shard {
                map.insert(c.key, c);
            } else {
                dropped += u64::from(c.count);
            }
        }
        w.any.store(!map.is_empty(), Ordering::Release);
        dropped
    }
}

#[cfg(test)]
mod tests {
    use verdict_schemas::{KeyId, RouteClassId, TierId};

    use super::*;

    fn key(i: u8) -> LimitKey {
        LimitKey::new(KeyId([i; 16]), RouteClassId(0), TierId(0))
    }

    #[test]
    fn requests_of_a_key_are_one_charge_kept_by_shard_until_taken() {
        let l = Limits {
            window_ms: 1_000,
            ..Limits::per_hour(10, 1.0, 100)
        };
        let cb = ChargeBack::<u16>::new(2, 4);
        for t in 0..3 {
            assert!(cb.add(1, &key(1), 7, &l, 1, 100 + t));
        }
        assert!(cb.add(1, &key(2), 9, &l, 1, 500));
        assert!(!cb.waiting(0) && cb.waiting(1));
        let (mut taken, expired) = cb.take(1, 1_050);
        taken.sort_by_key(|c| c.place);
        // The first key's charge began at 100: older than its window at 1,100 only.
        assert_eq!(expired, 0);
        assert_eq!(
            taken.iter().map(|c| (c.place, c.count)).collect::<Vec<_>>(),
            [(7, 3), (9, 1)]
        );
        assert!(!cb.waiting(1));

        // Handed back, they are kept again (merged with what came meanwhile), then expire.
        assert!(cb.add(1, &key(1), 7, &l, 1, 1_060));
        assert_eq!(cb.put_back(1, taken), 0);
        let (again, expired) = cb.take(1, 1_200);
        assert_eq!(expired, 4, "key 1's 4 requests began at 100, a window ago");
        assert_eq!(again.len(), 1);
    }

    #[test]
    fn a_full_shard_drops_new_keys_and_says_so() {
        let l = Limits::per_hour(10, 1.0, 100);
        let cb = ChargeBack::<()>::new(1, 2);
        assert!(cb.add(0, &key(1), (), &l, 1, 0));
        assert!(cb.add(0, &key(2), (), &l, 1, 0));
        assert!(!cb.add(0, &key(3), (), &l, 1, 0));
        assert!(
            cb.add(0, &key(1), (), &l, 1, 0),
            "a key already kept still counts"
        );
        let (taken, _) = cb.take(0, 1);
        let mut more = taken.clone();
        more.push(Charge {
            key: key(4),
            place: (),
            limits: l,
            count: 5,
            first_ms: 0,
        });
        assert_eq!(cb.put_back(0, more), 5, "key 4's 5 requests found no room");
        assert!(cb.waiting(0));
    }
}
