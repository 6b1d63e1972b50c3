//! The layout of a limit key's state in Redis, as `redis.lua` writes it, for readers other
//! than the script (the reconcile job reads the regions' windows).

use verdict_limiter::CounterState;

/// The 24 bytes the Redis script stores (`struct.pack('<ddII', …)`): tokens and time as
/// little-endian doubles, then the two counts as little-endian u32. None if the length
/// is not 24.
pub fn unpack(b: &[u8]) -> Option<CounterState> {
    let b: &[u8; 24] = b.try_into().ok()?;
    let f = |i: usize| f64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
    let u = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or([0; 4]));
    Some(CounterState {
        tokens: f(0) as i64,
        last_ms: f(8) as i64,
        cur: u(16),
        prev: u(20),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stored_state_reads_back_and_a_short_value_is_refused() {
        let mut b = Vec::new();
        b.extend_from_slice(&2_500_000f64.to_le_bytes());
        b.extend_from_slice(&(7_200_000.0 + 1_800_000.0f64).to_le_bytes());
        b.extend_from_slice(&30u32.to_le_bytes());
        b.extend_from_slice(&100u32.to_le_bytes());
        let s = unpack(&b).unwrap();
        assert_eq!(
            (s.tokens, s.last_ms, s.cur, s.prev),
            (2_500_000, 9_000_000, 30, 100)
        );
        assert!(unpack(&b[..23]).is_none());
    }
}
