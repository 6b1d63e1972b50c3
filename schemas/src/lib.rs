//! The contracts between verdict's crates, with no I/O: the decision event and its v1 wire
//! format ([`wire`]), the Arrow schemas of the tables and the event → `RecordBatch`
//! conversion ([`tables`]), where every object lives in the store ([`layout`]), and the
//! time every part reads ([`clock`]).

pub mod clock;
pub mod event;
pub mod layout;
#[cfg(feature = "synth")]
pub mod synth;
pub mod tables;
pub mod wire;

pub use clock::{Clock, FakeClock, ScaledClock, SystemClock};
pub use event::{
    DecisionEvent, DecisionSource, DeniedBy, KeyId, RegionId, RouteClassId, TierId, Verdict,
};
pub use layout::{HourPartition, LayoutError};
pub use tables::{RawBatchBuilder, denied_hourly_schema, overage_schema, raw_schema};
pub use wire::{DecodeError, EVENT_V1_LEN, EVENT_VERSION_V1};
