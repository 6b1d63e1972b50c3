//! One way to put a gateway together, shared by `verdict gateway`, `verdict demo` and
//! `verdict-bench gateway`: typed settings (`Duration`, `HeaderName`, `Uri`), the limiter
//! with its event queue, and the gateway around it. Where the events go (Kafka, the demo's
//! in-process queue, nowhere) and which counter store decides stay the caller's choice.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderName, Uri};
use verdict_limiter::{
    Clock, CounterStore, EventReceiver, Limiter, LimiterConfig, LimiterMetrics, MemoryStore,
    PolicyHandle, Regional, SystemClock, event_queue,
};

use crate::counters::GatewayStore;
use crate::keys::KeyDirectory;
use crate::proxy::{Gateway, GatewayConfig};

/// The settings of one gateway, with the defaults of `verdict gateway`.
#[derive(Clone)]
pub struct GatewayBuilder {
    config: GatewayConfig,
    limiter: LimiterConfig,
    event_queue: usize,
    clock: Arc<dyn Clock>,
    regional: Option<Regional>,
}

impl std::fmt::Debug for GatewayBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayBuilder")
            .field("config", &self.config)
            .field("limiter", &self.limiter)
            .field("event_queue", &self.event_queue)
            .finish_non_exhaustive()
    }
}

/// A gateway put together, and the far end of its event queue: drain it into a sink
/// (`verdict_limiter::spawn_drain`), or drop it and every event counts as dropped.
#[derive(Debug)]
pub struct BuiltGateway<S> {
    /// The gateway (serve it with [`crate::serve`]).
    pub gateway: Gateway<S>,
    /// Its decision events.
    pub events: EventReceiver,
}

impl GatewayBuilder {
    /// A gateway in front of `upstream`: header `x-api-key`, the upstream's 30 s for its
    /// response head, one instance, a queue of 65,536 events, the system clock.
    pub fn new(upstream: Uri) -> Self {
        Self::deciding_for(Some(upstream))
    }

    /// The same in front of `upstream`, or of none: a gateway that only decides
    /// (`/v1/check`, Envoy's rate limit service) and answers 404 on every other path.
    pub fn deciding_for(upstream: Option<Uri>) -> Self {
        Self {
            config: GatewayConfig::deciding_for(upstream),
            limiter: LimiterConfig::default(),
            event_queue: 65_536,
            clock: Arc::new(SystemClock),
            regional: None,
        }
    }

    /// The header carrying the API key.
    #[must_use]
    pub fn key_header(mut self, header: HeaderName) -> Self {
        self.config.key_header = header;
        self
    }

    /// How long the upstream has to send its response head (then 504).
    #[must_use]
    pub fn upstream_timeout(mut self, timeout: Duration) -> Self {
        self.config.upstream_timeout = timeout;
        self
    }

    /// The limiter's settings: region, instance, instance count, breaker, fallback.
    #[must_use]
    pub fn limiter(mut self, cfg: LimiterConfig) -> Self {
        self.limiter = cfg;
        self
    }

    /// The limiter's settings now.
    pub fn limiter_config(&self) -> &LimiterConfig {
        &self.limiter
    }

    /// Events the queue holds before it drops.
    #[must_use]
    pub fn event_queue(mut self, capacity: usize) -> Self {
        self.event_queue = capacity.max(1);
        self
    }

    /// The clock of the limiter (its fallback, breaker and events) and of
    /// [`Self::memory_counters`]: the demo runs a faster one.
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Enforce this region's shares and report its near-limit keys
    /// ([`crate::regional::start`]).
    #[must_use]
    pub fn regional(mut self, regional: Regional) -> Self {
        self.regional = Some(regional);
        self
    }

    /// Counters in this process's memory on the builder's clock, as many keys as the
    /// fallback keeps: right for one instance, wrong for several.
    pub fn memory_counters(&self) -> GatewayStore {
        GatewayStore::Memory(Arc::new(MemoryStore::with_clock(
            self.limiter.fallback_max_keys,
            Arc::clone(&self.clock),
        )))
    }

    /// The gateway deciding with `store` under `policy`, counting into `metrics` (which
    /// the policy refresher may already count into), for the keys in `keys`.
    pub fn build<S: CounterStore>(
        self,
        store: S,
        policy: PolicyHandle,
        metrics: Arc<LimiterMetrics>,
        keys: KeyDirectory,
    ) -> BuiltGateway<S> {
        let (queue, events) = event_queue(self.event_queue, Arc::clone(&metrics));
        let mut limiter =
            Limiter::with_clock(store, policy, queue, metrics, self.limiter, self.clock);
        if let Some(regional) = self.regional {
            limiter = limiter.with_regional(regional);
        }
        BuiltGateway {
            gateway: Gateway::new(limiter, keys, self.config),
            events,
        }
    }
}
