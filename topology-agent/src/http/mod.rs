//! `/healthz` (the control loop is alive), `/readyz` (the kernel holds the policy of a complete,
//! current view), `/metrics` (Prometheus text), `/debug/cost` (the bytes per Service port in and
//! across zones, with rates: what `status --cost` prints) and `/debug/plan[?service=NS/NAME]` (what
//! this node programs now and why: the `explain --output json` report of the running agent's own
//! plan).
//!
//! Any pod can reach the pod address, so each listener bounds its connections in total and per
//! client address ([`topology_dns::connections`]), a response the client does not read ends its connection
//! ([`deadline`]), kubelet's probes can have a listener of their own (`--probe-addr`), and the plan
//! and the cost, which show every Service (every tenant's volumes) whatever the reader may see
//! through the API, are served on loopback only.

mod deadline;

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use deadline::{WRITE_TIMEOUT, WriteDeadline};
use http_body_util::Full;
use hyper::{Request, Response, StatusCode, body::Bytes, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{net::TcpListener, sync::Semaphore};
use tokio_util::sync::CancellationToken;
use topology_dns::connections::{Limits, Pool};
use topology_model::ObjectKey;

use crate::{
    controller::{AskError, Health, PlanClient},
    metrics::Metrics,
};

/// Connections of the listener that serves `/metrics`: any pod may scrape it, and none may take
/// more than its share.
pub const SCRAPE_LIMITS: Limits = Limits { total: 128, per_source: 8 };
/// Connections of the probe listener (`--probe-addr`): kubelet's, from the node's address.
pub const PROBE_LIMITS: Limits = Limits { total: 32, per_source: 4 };
/// A client must have sent its request headers this soon after connecting (or after the last
/// response on a kept-alive connection), else the connection is closed.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// `/metrics` bodies encoded at once: each is megabytes at scale.
const METRICS_ENCODING: usize = 2;

/// How long `/debug/plan` waits for the control loop, which answers between batches.
const PLAN_ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// Content type of the OpenMetrics text exposition prometheus-client writes.
const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Binds `addr`; the returned listener reports the actual address (for `127.0.0.1:0`).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// What one listener answers.
#[derive(Clone)]
pub struct Endpoints {
    /// `/healthz` and `/readyz`, always.
    pub health: Arc<Health>,
    /// `/metrics`, if served here.
    pub metrics: Option<Arc<Metrics>>,
    /// `/debug/plan` and `/debug/cost`, if served here: only on loopback, since they show every
    /// Service, endpoint, zone and volume whatever the reader may see through the API.
    pub plans: Option<PlanClient>,
}

/// Serves `endpoints` until `shutdown`, with at most `limits` connections.
pub async fn serve(listener: TcpListener, endpoints: Endpoints, limits: Limits, shutdown: CancellationToken) {
    let connections = Arc::new(Pool::new(limits));
    let encoding = Arc::new(Semaphore::new(METRICS_ENCODING));
    loop {
        let (stream, peer) = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accepting an HTTP connection");
                    continue;
                }
            },
        };
        if !connections.make_room(peer.ip()) {
            // Every connection of its bound is mid-request: this one is closed unserved.
            continue;
        }
        let _ = stream.set_nodelay(true);
        let (endpoints, encoding) = (endpoints.clone(), Arc::clone(&encoding));
        let requested = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&requested);
        connections.spawn(peer.ip(), requested, async move {
            let service = service_fn(move |request| {
                seen.store(true, Ordering::Relaxed);
                let (endpoints, encoding) = (endpoints.clone(), Arc::clone(&encoding));
                async move { Ok::<_, Infallible>(respond(&request, &endpoints, &encoding).await) }
            });
            let served = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(WriteDeadline::new(stream, WRITE_TIMEOUT)), service)
                .await;
            if let Err(error) = served {
                tracing::debug!(%error, "HTTP connection ended");
            }
        });
    }
}

async fn respond<B>(request: &Request<B>, endpoints: &Endpoints, encoding: &Semaphore) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, body: String| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response
    };
    match request.uri().path() {
        "/healthz" => match endpoints.health.liveness() {
            Ok(()) => text(StatusCode::OK, "ok\n".into()),
            Err(reason) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
        },
        "/readyz" => match endpoints.health.readiness() {
            Ok(()) => text(StatusCode::OK, "ok\n".into()),
            Err(reason) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
        },
        "/metrics" => {
            let Some(metrics) = endpoints.metrics.clone() else {
                return text(StatusCode::NOT_FOUND, "/metrics is served on --metrics-addr\n".into());
            };
            let Ok(_permit) = encoding.acquire().await else {
                return text(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n".into());
            };
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
        "/debug/cost" => {
            // Every tenant's volumes per Service: on the loopback only, beside the plan.
            let (Some(metrics), Some(_)) = (&endpoints.metrics, &endpoints.plans) else {
                return text(
                    StatusCode::NOT_FOUND,
                    "/debug/cost is served on loopback only (status --cost in the agent's pod reaches it)\n".into(),
                );
            };
            let report = metrics
                .bytes
                .cost
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .report(std::time::Instant::now());
            let mut response = text(StatusCode::OK, serde_json::to_string_pretty(&report).unwrap_or_default() + "\n");
            response
                .headers_mut()
                .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
            response
        }
        "/debug/plan" => {
            let Some(plans) = &endpoints.plans else {
                return text(
                    StatusCode::NOT_FOUND,
                    "/debug/plan is served on loopback only (kubectl port-forward reaches it)\n".into(),
                );
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
        _ => text(
            StatusCode::NOT_FOUND,
            "not found; try /healthz, /readyz, /metrics, /debug/cost or /debug/plan\n".into(),
        ),
    }
}

/// A `/debug/plan` query it cannot answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
enum BadQuery {
    /// `service=` is not `NAMESPACE/NAME`.
    #[error("service={0}")]
    Service(#[from] topology_model::objects::NotNamespaced),
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
