//! The gateway: an HTTP reverse proxy that puts the limiter in front of an upstream.
//!
//! - [`keys`]: the key directory (API key → key id and tier); no key, no limiter: 401.
//! - [`routes`]: path → route class, by the policy's prefixes.
//! - [`proxy`]: the request path (decision, 429 or proxy with the rate-limit fields, 502/504
//!   for the upstream's failures), `/metrics` and `/healthz`.
//! - [`check`]: `/v1/check`, forward authentication for Caddy, Traefik and nginx.
//! - [`builder`]: one way to put a gateway together, with typed settings.
//! - [`counters`]: Redis or memory counters, chosen at start.
//! - [`regional`]: a region's shares and near-limit reports under a multi-region policy.

pub mod builder;
pub mod check;
pub mod counters;
pub mod keys;
pub mod proxy;
pub mod regional;
pub mod routes;

pub use builder::{BuiltGateway, GatewayBuilder};
pub use counters::GatewayStore;
pub use keys::{KeyDirectory, KeyEntry, spawn_key_refresher};
pub use proxy::{Gateway, GatewayConfig, GatewayMetrics, serve};
