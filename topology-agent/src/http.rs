//! `/healthz` (the control loop is alive), `/readyz` (the kernel holds the policy of a complete,
//! current view) and `/metrics` (Prometheus text).

use std::{
    collections::VecDeque,
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use http_body_util::Full;
use hyper::{Request, Response, StatusCode, body::Bytes, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{net::TcpListener, task::AbortHandle};
use tokio_util::sync::CancellationToken;

/// Connections served at once. Past it, a new connection replaces the oldest one that has not
/// sent a request yet (or is closed at once if every one is mid-request), so idle clients can
/// neither exhaust the agent's descriptors nor keep a scrape out.
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

/// The connections being served, oldest first.
#[derive(Default)]
struct Connections {
    open: Mutex<VecDeque<Connection>>,
    next: AtomicU64,
}

struct Connection {
    id: u64,
    /// Set once a request arrived on it.
    requested: Arc<AtomicBool>,
    task: AbortHandle,
}

impl Connections {
    /// Makes room for one more: true if there is room (after evicting an idle one if needed).
    fn make_room(&self) -> bool {
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if open.len() < MAX_CONNECTIONS {
            return true;
        }
        match open.iter().position(|c| !c.requested.load(Ordering::Relaxed)) {
            Some(idle) => {
                if let Some(evicted) = open.remove(idle) {
                    evicted.task.abort();
                }
                true
            }
            None => false,
        }
    }

    fn add(&self, requested: Arc<AtomicBool>, task: AbortHandle) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push_back(Connection {
            id,
            requested,
            task,
        });
        id
    }

    fn remove(&self, id: u64) {
        self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner).retain(|c| c.id != id);
    }
}

/// Serves until `shutdown`.
pub async fn serve(listener: TcpListener, health: Arc<Health>, metrics: Arc<Metrics>, shutdown: CancellationToken) {
    let connections = Arc::new(Connections::default());
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
        if !connections.make_room() {
            // Every connection is mid-request: this one is closed unserved (dropped here).
            continue;
        }
        let _ = stream.set_nodelay(true);
        let (health, metrics) = (Arc::clone(&health), Arc::clone(&metrics));
        let requested = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&requested);
        let (ready, registered) = tokio::sync::oneshot::channel::<(u64, Arc<Connections>)>();
        let task = tokio::spawn(async move {
            let service = service_fn(move |request| {
                seen.store(true, Ordering::Relaxed);
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
            if let Ok((id, connections)) = registered.await {
                connections.remove(id);
            }
        });
        let id = connections.add(requested, task.abort_handle());
        let _ = ready.send((id, Arc::clone(&connections)));
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
