//! The v1 wire format of a [`DecisionEvent`]: 64 bytes, fixed size, little-endian, version
//! byte first. The byte table is in `schemas/README.md`; golden vectors in
//! `schemas/testdata/`. Decoding takes untrusted bytes and answers a typed error, never a
//! panic.

use crate::event::{
    DecisionEvent, DecisionSource, DeniedBy, KeyId, RegionId, RouteClassId, TierId, Verdict,
};

/// The version byte of this layout.
pub const EVENT_VERSION_V1: u8 = 1;
/// Every v1 event is exactly this long.
pub const EVENT_V1_LEN: usize = 64;

/// Byte offsets of the v1 layout; the README's table is written from these.
mod offset {
    pub const VERSION: usize = 0;
    pub const VERDICT: usize = 1;
    pub const DENIED_BY: usize = 2;
    pub const SOURCE: usize = 3;
    pub const TIER: usize = 4;
    pub const ROUTE_CLASS: usize = 5;
    pub const REGION: usize = 6;
    pub const EVENT_TIME_MS: usize = 8;
    pub const KEY_ID: usize = 16;
    pub const POLICY_VERSION: usize = 32;
    pub const GATEWAY_INSTANCE: usize = 40;
    pub const REMAINING_TOKENS: usize = 44;
    pub const REMAINING_WINDOW: usize = 48;
    pub const RETRY_AFTER_MS: usize = 52;
    pub const WINDOW_QUOTA: usize = 56;
    pub const SUB_KEY: usize = 60;
    pub const SUB_KEYS: usize = 61;
    pub const RESERVED: usize = 62;
}

/// Why a byte string is not a v1 decision event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Zero bytes: not even a version.
    #[error("empty record: no version byte")]
    Empty,
    /// The first byte names a version this build does not read.
    #[error("unknown event version {0} at byte 0 (this build reads version {EVENT_VERSION_V1})")]
    UnknownVersion(u8),
    /// The version is known but the length is not its length.
    #[error("event is {actual} bytes; version {EVENT_VERSION_V1} events are exactly {expected}")]
    WrongLength {
        /// What the version requires.
        expected: usize,
        /// What was given.
        actual: usize,
    },
    /// An enum or flag field holds a value with no meaning.
    #[error("byte {offset} ({field}) holds {value}, which is not a known {field}")]
    UnknownValue {
        /// The field's name.
        field: &'static str,
        /// Its byte offset.
        offset: usize,
        /// The value found.
        value: u8,
    },
    /// A reserved byte is not zero.
    #[error(
        "reserved byte {offset} is {value:#04x}; it must be zero in version {EVENT_VERSION_V1}"
    )]
    ReservedNotZero {
        /// Its byte offset.
        offset: usize,
        /// The value found.
        value: u8,
    },
    /// The verdict and the limits that denied contradict each other.
    #[error(
        "verdict {verdict} with denied_by bits {denied_by_bits:#04b} (byte 1 and byte 2 disagree)"
    )]
    InconsistentVerdict {
        /// The decoded verdict.
        verdict: &'static str,
        /// The decoded bits.
        denied_by_bits: u8,
    },
    /// The hot-key sub-key index is outside the split.
    #[error("sub_key {sub_key} (byte 60) is not below sub_keys {sub_keys} (byte 61)")]
    SubKeyOutOfRange {
        /// The index found.
        sub_key: u8,
        /// The split found.
        sub_keys: u8,
    },
}

impl DecodeError {
    /// A short stable name for metrics and quarantine records.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Empty => "empty",
            Self::UnknownVersion(_) => "unknown_version",
            Self::WrongLength { .. } => "wrong_length",
            Self::UnknownValue { .. } => "unknown_value",
            Self::ReservedNotZero { .. } => "reserved_not_zero",
            Self::InconsistentVerdict { .. } => "inconsistent_verdict",
            Self::SubKeyOutOfRange { .. } => "sub_key_out_of_range",
        }
    }
}

impl DecisionEvent {
    /// The v1 wire bytes.
    pub fn encode(&self) -> [u8; EVENT_V1_LEN] {
        let mut b = [0u8; EVENT_V1_LEN];
        self.encode_into(&mut b);
        b
    }

    /// Writes the v1 wire bytes into `out`.
    pub fn encode_into(&self, out: &mut [u8; EVENT_V1_LEN]) {
        use offset::*;
        out[VERSION] = EVENT_VERSION_V1;
        out[VERDICT] = self.verdict.code();
        out[DENIED_BY] = self.denied_by.bits();
        out[SOURCE] = self.source.code();
        out[TIER] = self.tier.0;
        out[ROUTE_CLASS] = self.route_class.0;
        put(out, REGION, self.region.0.to_le_bytes());
        put(out, EVENT_TIME_MS, self.event_time_ms.to_le_bytes());
        put(out, KEY_ID, self.key_id.0);
        put(out, POLICY_VERSION, self.policy_version.to_le_bytes());
        put(out, GATEWAY_INSTANCE, self.gateway_instance.to_le_bytes());
        put(out, REMAINING_TOKENS, self.remaining_tokens.to_le_bytes());
        put(out, REMAINING_WINDOW, self.remaining_window.to_le_bytes());
        put(out, RETRY_AFTER_MS, self.retry_after_ms.to_le_bytes());
        put(out, WINDOW_QUOTA, self.window_quota.to_le_bytes());
        out[SUB_KEY] = self.sub_key;
        out[SUB_KEYS] = self.sub_keys;
        out[RESERVED] = 0;
        out[RESERVED + 1] = 0;
    }

    /// Reads one event from untrusted bytes.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        use offset::*;
        let Some(&version) = bytes.first() else {
            return Err(DecodeError::Empty);
        };
        if version != EVENT_VERSION_V1 {
            return Err(DecodeError::UnknownVersion(version));
        }
        let b: &[u8; EVENT_V1_LEN] = bytes.try_into().map_err(|_| DecodeError::WrongLength {
            expected: EVENT_V1_LEN,
            actual: bytes.len(),
        })?;

        let verdict = Verdict::from_code(b[VERDICT]).ok_or(DecodeError::UnknownValue {
            field: "verdict",
            offset: VERDICT,
            value: b[VERDICT],
        })?;
        let denied_by = DeniedBy::from_bits(b[DENIED_BY]).ok_or(DecodeError::UnknownValue {
            field: "denied_by",
            offset: DENIED_BY,
            value: b[DENIED_BY],
        })?;
        let source = DecisionSource::from_code(b[SOURCE]).ok_or(DecodeError::UnknownValue {
            field: "source",
            offset: SOURCE,
            value: b[SOURCE],
        })?;
        if let Some((i, &value)) = b[RESERVED..].iter().enumerate().find(|(_, v)| **v != 0) {
            return Err(DecodeError::ReservedNotZero {
                offset: RESERVED + i,
                value,
            });
        }
        if (verdict == Verdict::Allowed) == denied_by.any() {
            return Err(DecodeError::InconsistentVerdict {
                verdict: verdict.as_str(),
                denied_by_bits: denied_by.bits(),
            });
        }
        let (sub_key, sub_keys) = (b[SUB_KEY], b[SUB_KEYS]);
        if sub_key >= sub_keys {
            return Err(DecodeError::SubKeyOutOfRange { sub_key, sub_keys });
        }

        Ok(DecisionEvent {
            event_time_ms: i64::from_le_bytes(take(b, EVENT_TIME_MS)),
            key_id: KeyId(take(b, KEY_ID)),
            route_class: RouteClassId(b[ROUTE_CLASS]),
            tier: TierId(b[TIER]),
            region: RegionId(u16::from_le_bytes(take(b, REGION))),
            gateway_instance: u32::from_le_bytes(take(b, GATEWAY_INSTANCE)),
            verdict,
            denied_by,
            source,
            remaining_tokens: u32::from_le_bytes(take(b, REMAINING_TOKENS)),
            remaining_window: u32::from_le_bytes(take(b, REMAINING_WINDOW)),
            retry_after_ms: u32::from_le_bytes(take(b, RETRY_AFTER_MS)),
            window_quota: u32::from_le_bytes(take(b, WINDOW_QUOTA)),
            policy_version: u64::from_le_bytes(take(b, POLICY_VERSION)),
            sub_key,
            sub_keys,
        })
    }
}

fn put<const N: usize>(out: &mut [u8; EVENT_V1_LEN], at: usize, bytes: [u8; N]) {
    out[at..at + N].copy_from_slice(&bytes);
}

fn take<const N: usize>(b: &[u8; EVENT_V1_LEN], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&b[at..at + N]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_fields_tile_the_64_bytes_without_overlap() {
        use offset::*;
        let fields = [
            (VERSION, 1),
            (VERDICT, 1),
            (DENIED_BY, 1),
            (SOURCE, 1),
            (TIER, 1),
            (ROUTE_CLASS, 1),
            (REGION, 2),
            (EVENT_TIME_MS, 8),
            (KEY_ID, 16),
            (POLICY_VERSION, 8),
            (GATEWAY_INSTANCE, 4),
            (REMAINING_TOKENS, 4),
            (REMAINING_WINDOW, 4),
            (RETRY_AFTER_MS, 4),
            (WINDOW_QUOTA, 4),
            (SUB_KEY, 1),
            (SUB_KEYS, 1),
            (RESERVED, 2),
        ];
        let mut next = 0;
        for (at, len) in fields {
            assert_eq!(at, next, "field at {at} leaves a gap or overlaps");
            next = at + len;
        }
        assert_eq!(next, EVENT_V1_LEN);
    }
}
