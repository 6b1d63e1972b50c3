//! The limit key: who (API key id), on what (route class), at which tier, and, for a hot key
//! split into sub-keys, which sub-key. (How a limit key is laid out in Redis is the Redis
//! store's: `verdict_counters_redis::layout`.)

use verdict_schemas::{KeyId, RouteClassId, TierId};

/// One counter's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LimitKey {
    /// The caller.
    pub key_id: KeyId,
    /// The route class of the request.
    pub route_class: RouteClassId,
    /// The caller's tier.
    pub tier: TierId,
    /// For a hot key split into `sub_keys` sub-keys, the one this caller hashed to.
    pub sub_key: u8,
    /// Into how many sub-keys the key is split (1: not split).
    pub sub_keys: u8,
}

impl LimitKey {
    /// An unsplit limit key.
    pub fn new(key_id: KeyId, route_class: RouteClassId, tier: TierId) -> Self {
        Self {
            key_id,
            route_class,
            tier,
            sub_key: 0,
            sub_keys: 1,
        }
    }

    /// The same key split into `n` sub-keys, the caller placed by a stable attribute of its
    /// own (a client id, an IP): the same caller always lands on the same sub-key.
    pub fn split(mut self, n: u8, caller: &[u8]) -> Self {
        let n = n.max(1);
        self.sub_keys = n;
        // FNV-1a's low bits depend only on the low bits of the input's bytes, and its high
        // bits little on the last bytes: mixed first (MurmurHash3's finalizer), so callers
        // that differ in higher bits (even client numbers, IPs 8 apart) spread too.
        self.sub_key = (((mix64(fnv1a(caller)) >> 32) * u64::from(n)) >> 32) as u8;
        self
    }
}

/// MurmurHash3's 64-bit finalizer: every input bit moves about half the output bits.
pub fn mix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// FNV-1a: a small, stable hash (the same in every process and release), for placing
/// callers on sub-keys.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> LimitKey {
        LimitKey::new(KeyId([0xab; 16]), RouteClassId(2), TierId(1))
    }

    #[test]
    fn a_caller_always_lands_on_the_same_sub_key_and_callers_spread() {
        let k = key();
        assert_eq!(
            k.split(16, b"client-7").sub_key,
            k.split(16, b"client-7").sub_key
        );
        let mut seen = [0u32; 16];
        for i in 0..1600 {
            seen[k.split(16, format!("client-{i}").as_bytes()).sub_key as usize] += 1;
        }
        assert!(seen.iter().all(|&n| (60..140).contains(&n)), "{seen:?}");
    }
    #[test]
    fn callers_that_differ_only_in_high_bits_still_reach_every_sub_key() {
        let k = key();
        let mut seen = [0u32; 8];
        // Even numbers, and IPv4 addresses 8 apart: the low three bits of every byte equal.
        for i in 0..400u64 {
            seen[k.split(8, &(i * 2).to_le_bytes()).sub_key as usize] += 1;
            let ip = [10, 0, (i >> 5) as u8, ((i * 8) & 0xff) as u8];
            seen[k.split(8, &ip).sub_key as usize] += 1;
        }
        assert!(seen.iter().all(|&n| (60..140).contains(&n)), "{seen:?}");
    }
}
