//! `/healthz` (the control loop is alive), `/readyz` (the kernel holds the policy of a complete,
//! current view), `/metrics` (Prometheus text) and `/debug/plan[?service=NS/NAME]` (what this node
//! programs now and why: the `explain --output json` report of the running agent's own plan).

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

use crate::{
    cluster::ObjectKey,
    controller::{AskError, Health, PlanClient},
    metrics::Metrics,
};

/// How long `/debug/plan` waits for the control loop, which answers between batches.
const PLAN_ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

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
pub async fn serve(
    listener: TcpListener,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    plans: Option<PlanClient>,
    shutdown: CancellationToken,
) {
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
        let (health, metrics, plans) = (Arc::clone(&health), Arc::clone(&metrics), plans.clone());
        let requested = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&requested);
        let (ready, registered) = tokio::sync::oneshot::channel::<(u64, Arc<Connections>)>();
        let task = tokio::spawn(async move {
            let service = service_fn(move |request| {
                seen.store(true, Ordering::Relaxed);
                let (health, metrics, plans) = (Arc::clone(&health), Arc::clone(&metrics), plans.clone());
                async move { Ok::<_, Infallible>(respond(&request, &health, metrics, plans.as_ref()).await) }
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

async fn respond<B>(
    request: &Request<B>,
    health: &Health,
    metrics: Arc<Metrics>,
    plans: Option<&PlanClient>,
) -> Response<Full<Bytes>> {
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
        "/debug/plan" => {
            let Some(plans) = plans else {
                return text(StatusCode::NOT_FOUND, "this agent serves no plan\n".into());
            };
            let service = match service_param(request.uri().query()) {
                Ok(service) => service,
                Err(bad) => return text(StatusCode::BAD_REQUEST, format!("{bad}\n")),
            };
            match plans.ask(service, PLAN_ANSWER_TIMEOUT).await {
                Ok(report) => {
                    let body = serde_json::to_string_pretty(&report).unwrap_or_default() + "\n";
                    let mut response = text(StatusCode::OK, body);
                    response.headers_mut().insert(
                        hyper::header::CONTENT_TYPE,
                        hyper::header::HeaderValue::from_static("application/json"),
                    );
                    response
                }
                Err(error @ AskError::UnknownService(_)) => text(StatusCode::NOT_FOUND, format!("{error}\n")),
                Err(error) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{error}\n")),
            }
        }
        _ => text(StatusCode::NOT_FOUND, "not found; try /healthz, /readyz, /metrics or /debug/plan\n".into()),
    }
}

/// A `/debug/plan` query it cannot answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
enum BadQuery {
    /// `service=` is not `NAMESPACE/NAME`.
    #[error("service={0}")]
    Service(#[from] crate::cluster::model::NotNamespaced),
    /// Another parameter.
    #[error("unknown parameter {0:?}; the only one is service=NAMESPACE/NAME")]
    Unknown(String),
}

/// `service=NAMESPACE/NAME` (the `/` plain or as `%2F`) from a query string; nothing else is taken.
fn service_param(query: Option<&str>) -> Result<Option<ObjectKey>, BadQuery> {
    let Some(query) = query.filter(|q| !q.is_empty()) else { return Ok(None) };
    let mut service = None;
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("service", value)) => service = Some(value.replace("%2F", "/").replace("%2f", "/").parse()?),
            _ => return Err(BadQuery::Unknown(pair.to_owned())),
        }
    }
    Ok(service)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_takes_one_service_or_none_and_names_what_it_refuses() {
        assert_eq!(service_param(None), Ok(None));
        assert_eq!(service_param(Some("")), Ok(None));
        assert_eq!(service_param(Some("service=shop/api")), Ok(Some(ObjectKey::new("shop", "api"))));
        assert_eq!(service_param(Some("service=shop%2Fapi")), Ok(Some(ObjectKey::new("shop", "api"))));
        let bad = service_param(Some("service=api")).unwrap_err().to_string();
        assert_eq!(bad, "service=\"api\" is not NAMESPACE/NAME");
        let unknown = service_param(Some("node=a")).unwrap_err().to_string();
        assert!(unknown.starts_with("unknown parameter \"node=a\""), "{unknown}");
    }
}
