//! The rate limiter that lives inside the gateway process: the policy model and its sources,
//! the token bucket and sliding window (checked together in one atomic round trip), the
//! counter stores (Redis, memory), the breaker and local fallback, the HTTP answer to a
//! decision, and the emission of one `DecisionEvent` per decision.
