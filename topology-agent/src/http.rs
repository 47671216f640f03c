//! `/healthz` (the control loop is alive), `/readyz` (the kernel holds the policy of a complete,
//! current view) and `/metrics` (Prometheus text).

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use http_body_util::Full;
use hyper::{Request, Response, StatusCode, body::Bytes, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{net::TcpListener, sync::Semaphore};
use tokio_util::sync::CancellationToken;

/// Connections served at once; one more is closed as soon as it is accepted, so no number of
/// idle clients can exhaust the agent's descriptors or memory.
pub const MAX_CONNECTIONS: usize = 128;
/// A client must have sent its request headers this soon after connecting (or after the last
/// response on a kept-alive connection), else the connection is closed.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

use crate::{controller::Health, metrics::Metrics};

/// Content type of the OpenMetrics text exposition prometheus-client writes.
const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Binds `addr`; the returned listener reports the actual address (for `127.0.0.1:0`).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves until `shutdown`.
pub async fn serve(listener: TcpListener, health: Arc<Health>, metrics: Arc<Metrics>, shutdown: CancellationToken) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, _) = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accepting an HTTP connection");
                    continue;
                }
            },
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            // Full: this connection is closed unserved (dropped here).
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (health, metrics) = (Arc::clone(&health), Arc::clone(&metrics));
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let (health, metrics) = (Arc::clone(&health), Arc::clone(&metrics));
                async move { Ok::<_, Infallible>(respond(&request, &health, metrics).await) }
            });
            let served = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(error) = served {
                tracing::debug!(%error, "HTTP connection ended");
            }
            drop(slot);
        });
    }
}

async fn respond<B>(request: &Request<B>, health: &Health, metrics: Arc<Metrics>) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, body: String| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response
    };
    match request.uri().path() {
        "/healthz" => match health.liveness() {
            Ok(()) => text(StatusCode::OK, "ok\n".into()),
            Err(reason) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
        },
        "/readyz" => match health.readiness() {
            Ok(()) => text(StatusCode::OK, "ok\n".into()),
            Err(reason) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
        },
        "/metrics" => {
            // Encoding reads the kernel counters: blocking syscalls, off the async workers.
            let encoded = tokio::task::spawn_blocking(move || metrics.encode()).await;
            let Ok(body) = encoded else {
                return text(StatusCode::INTERNAL_SERVER_ERROR, "metrics encoding failed\n".into());
            };
            let mut response = text(StatusCode::OK, body);
            response
                .headers_mut()
                .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(METRICS_CONTENT_TYPE));
            response
        }
        _ => text(StatusCode::NOT_FOUND, "not found; try /healthz, /readyz or /metrics\n".into()),
    }
}
