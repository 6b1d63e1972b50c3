//! The decision event: what the limiter decided for one request, and why. One is emitted per
//! decision; its wire form is in [`crate::wire`], its table form in [`crate::tables`].

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The caller's identity as the limiter sees it: 16 bytes derived from the API key (a hash,
/// never the secret itself). The partition key on Kafka and the first sort key of the raw
/// table.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct KeyId(pub [u8; 16]);

impl KeyId {
    /// The 16 bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = [0u8; 32];
        // Cannot fail: the buffer is exactly twice the input.
        hex::encode_to_slice(self.0, &mut buf).map_err(|_| fmt::Error)?;
        f.write_str(std::str::from_utf8(&buf).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

/// Why a string is not a key id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("key id {input:?} is not 32 hex digits")]
pub struct KeyIdParseError {
    /// The text that was given.
    pub input: String,
}

impl FromStr for KeyId {
    type Err = KeyIdParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = [0u8; 16];
        hex::decode_to_slice(s, &mut out).map_err(|_| KeyIdParseError {
            input: s.to_owned(),
        })?;
        Ok(KeyId(out))
    }
}

impl Serialize for KeyId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for KeyId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A tier's stable numeric id, assigned in the policy (names live there, not on the wire).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct TierId(pub u8);

/// A route class's stable numeric id, assigned in the policy.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct RouteClassId(pub u8);

/// A region's stable numeric id, assigned in the regional configuration.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct RegionId(pub u16);

/// What the caller was told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Verdict {
    /// The request went through.
    Allowed = 0,
    /// The request was refused with 429.
    Denied = 1,
    /// Shadow mode: the limits say deny, the caller was allowed.
    WouldDeny = 2,
}

impl Verdict {
    /// The wire and table code.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The verdict for a wire or table code, `None` for an unknown one.
    pub const fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(Self::Allowed),
            1 => Some(Self::Denied),
            2 => Some(Self::WouldDeny),
            _ => None,
        }
    }

    /// The name used in tables and reports.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Denied => "denied",
            Self::WouldDeny => "would_deny",
        }
    }
}

/// Where the decision came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum DecisionSource {
    /// The shared counter store (Redis): the normal path.
    CounterStore = 0,
    /// The per-instance local bucket at limit / instance count, while the breaker is open.
    LocalFallback = 1,
    /// The kill switch (global or per tier): hard allow, nothing counted.
    KillSwitch = 2,
    /// The policy's mode for this tier and route class is `off`: allowed, nothing counted.
    PolicyOff = 3,
}

impl DecisionSource {
    /// The wire and table code.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The source for a wire or table code, `None` for an unknown one.
    pub const fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(Self::CounterStore),
            1 => Some(Self::LocalFallback),
            2 => Some(Self::KillSwitch),
            3 => Some(Self::PolicyOff),
            _ => None,
        }
    }

    /// The name used in tables and reports.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::CounterStore => "counter_store",
            Self::LocalFallback => "local_fallback",
            Self::KillSwitch => "kill_switch",
            Self::PolicyOff => "policy_off",
        }
    }

    /// True where the decision did not come from the shared counters.
    pub const fn is_degraded(self) -> bool {
        !matches!(self, Self::CounterStore)
    }
}

/// Which limit refused the request (both can).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct DeniedBy {
    /// The token bucket (burst) had too few tokens.
    pub bucket: bool,
    /// The sliding window (hourly quota) was spent.
    pub window: bool,
}

impl DeniedBy {
    /// Nothing refused the request.
    pub const NONE: Self = Self {
        bucket: false,
        window: false,
    };
    const BUCKET_BIT: u8 = 0b01;
    const WINDOW_BIT: u8 = 0b10;

    /// True if either limit refused.
    pub const fn any(self) -> bool {
        self.bucket || self.window
    }

    /// The wire bits: bit 0 bucket, bit 1 window.
    pub const fn bits(self) -> u8 {
        ((self.bucket as u8) * Self::BUCKET_BIT) | ((self.window as u8) * Self::WINDOW_BIT)
    }

    /// The flags for wire bits, `None` if a bit other than 0 and 1 is set.
    pub const fn from_bits(bits: u8) -> Option<Self> {
        if bits & !(Self::BUCKET_BIT | Self::WINDOW_BIT) != 0 {
            return None;
        }
        Some(Self {
            bucket: bits & Self::BUCKET_BIT != 0,
            window: bits & Self::WINDOW_BIT != 0,
        })
    }
}

/// One decision of the limiter, as it travels to Kafka and lands in the raw table.
///
/// Invariants (checked when decoding): an `Allowed` verdict has no `denied_by`; `Denied` and
/// `WouldDeny` name at least one limit; `sub_keys >= 1` and `sub_key < sub_keys`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DecisionEvent {
    /// When the decision was made, Unix milliseconds (UTC).
    pub event_time_ms: i64,
    /// Who asked.
    pub key_id: KeyId,
    /// The route class of the request.
    pub route_class: RouteClassId,
    /// The caller's tier.
    pub tier: TierId,
    /// The region whose counters decided.
    pub region: RegionId,
    /// The gateway instance that decided.
    pub gateway_instance: u32,
    /// What the caller was told.
    pub verdict: Verdict,
    /// Which limit refused (empty when allowed).
    pub denied_by: DeniedBy,
    /// Where the decision came from.
    pub source: DecisionSource,
    /// Whole tokens left in the bucket after this decision.
    pub remaining_tokens: u32,
    /// Requests left in the hourly window after this decision.
    pub remaining_window: u32,
    /// How long the caller was told to wait, milliseconds (0 when allowed).
    pub retry_after_ms: u32,
    /// The hourly quota in force for this key (after overrides and hot-key split).
    pub window_quota: u32,
    /// The version of the policy snapshot that decided.
    pub policy_version: u64,
    /// For a hot key split into sub-keys: which one this caller hashed to (0 otherwise).
    pub sub_key: u8,
    /// For a hot key: into how many sub-keys it is split (1 otherwise).
    pub sub_keys: u8,
}

impl DecisionEvent {
    /// True if the decision did not come from the shared counters.
    pub fn is_degraded(&self) -> bool {
        self.source.is_degraded()
    }
}
