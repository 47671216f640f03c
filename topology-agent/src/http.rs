//! `/healthz` (the control loop is alive), `/readyz` (the kernel holds the policy of a complete,
//! current view) and `/metrics` (Prometheus text).

use std::{convert::Infallible, net::SocketAddr, sync::Arc};

use http_body_util::Full;
use hyper::{Request, Response, StatusCode, body::Bytes, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::{controller::Health, metrics::Metrics};

/// Content type of the OpenMetrics text exposition prometheus-client writes.
const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Binds `addr`; the returned listener reports the actual address (for `127.0.0.1:0`).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves until `shutdown`.
pub async fn serve(listener: TcpListener, health: Arc<Health>, metrics: Arc<Metrics>, shutdown: CancellationToken) {
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
        let _ = stream.set_nodelay(true);
        let (health, metrics) = (Arc::clone(&health), Arc::clone(&metrics));
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let (health, metrics) = (Arc::clone(&health), Arc::clone(&metrics));
                async move { Ok::<_, Infallible>(respond(&request, &health, metrics).await) }
            });
            if let Err(error) = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await {
                tracing::debug!(%error, "HTTP connection ended");
            }
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
