//! Envoy's global rate limit service (`envoy.service.ratelimit.v3`, gRPC), decided by
//! verdict's limiter: what Envoy (alone, or under Istio, Envoy Gateway, Contour, Gloo or
//! Emissary) asks through its `ratelimit` HTTP filter.
//!
//! - [`mapping`]: a descriptor's entries → key id, tier and route class, by rules imported
//!   from an envoyproxy/ratelimit configuration or by the entries that carry verdict's
//!   identity; what does not map is allowed (or refused) and counted.
//! - [`service`]: the method, each descriptor decided by the limiter (with its decision
//!   event), the answer with its statuses, the rate-limit fields and `Retry-After`.
//! - [`server`]: gRPC with the standard health service beside it.
//! - [`import`]: an envoyproxy/ratelimit configuration read as a policy and the rules
//!   that map Envoy's descriptors onto it.
//!
//! It runs inside `verdict gateway` (`--rls-listen`), sharing its limiter, key directory,
//! routes, policy and events with the HTTP listener.

pub mod import;
pub mod mapping;
pub mod server;
pub mod service;

pub use mapping::{DescriptorMap, Rule, RuleEntry, Unmapped};
pub use server::serve;
pub use service::{Rls, RlsConfig, RlsMetrics};
