//! The tests that need the real services, as one test binary (one link, not one per file:
//! each would hold its own copy of DataFusion, Delta and the clients, about 300 MB apiece in
//! a debug build). Each file is a module: run one with a filter, for example
//! `cargo test -p verdict-tests --test services limiter_redis::`. `scripts/test.sh` runs
//! them one at a time: some stop or restart a shared service (the Kafka broker), and the
//! timing checks are measured with the machine to themselves.

/// The query service's allocator, as the `verdict` binary declares it: every block counts
/// against the query it was made for (see `verdict_query::memory`).
#[global_allocator]
static ALLOCATOR: verdict_query::memory::Counted<std::alloc::System> =
    verdict_query::memory::Counted::new(std::alloc::System);

mod behind_proxies;
mod ingest_broker_restart;
mod ingest_kafka_s3;
mod jobs_s3;
mod lake_engines;
mod limit_review;
mod limiter_accuracy;
mod limiter_cluster_faults;
mod limiter_faults;
mod limiter_kafka;
mod limiter_overload;
mod limiter_postgres;
mod limiter_redis;
mod limiter_redis_cluster;
mod limiter_store_move;
mod query_connections;
mod query_hostile;
mod query_http;
mod query_page;
mod query_pg;
mod query_reports;
mod query_router;
mod regions_move;
mod regions_outage;
mod rollup_s3;
mod smoke;
