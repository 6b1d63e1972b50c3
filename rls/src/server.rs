//! Serving the rate limit service over gRPC (HTTP/2, plaintext, as Envoy's `grpc_service`
//! with an `envoy_grpc` cluster of `http2_protocol_options` calls it), beside the standard
//! gRPC health service (`grpc.health.v1.Health`) that Envoy's `grpc_health_check` and
//! Kubernetes' gRPC probes call: `SERVING` for the overall service (`""`) and for
//! `envoy.service.ratelimit.v3.RateLimitService` while the service runs, `NOT_SERVING` from
//! the moment it is told to stop (so health checks drain it before it closes).
//!
//! A store that is slow or gone does not make it unhealthy: the limiter's fallback decides
//! then, and Envoy should keep asking.

use std::future::Future;
use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;
use verdict_limiter::CounterStore;

use crate::service::Rls;

/// The health service's name for the rate limit service.
pub const SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// Serves `rls` on `listener` until `stop` resolves, then stops taking calls and lets the
/// calls in flight finish.
///
/// # Errors
/// When the server fails.
pub async fn serve<S: CounterStore>(
    listener: tokio::net::TcpListener,
    rls: Arc<Rls<S>>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let (reporter, health) = tonic_health::server::health_reporter();
    for name in ["", SERVICE_NAME] {
        reporter
            .set_service_status(name, ServingStatus::Serving)
            .await;
    }
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .add_service(health)
        .add_service(RateLimitServiceServer::from_arc(rls))
        .serve_with_incoming_shutdown(incoming, async move {
            stop.await;
            for name in ["", SERVICE_NAME] {
                reporter
                    .set_service_status(name, ServingStatus::NotServing)
                    .await;
            }
        })
        .await
}
