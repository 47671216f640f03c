//! The fake's HTTP side: routing, outages and refusals on demand. Its answers are shaped in
//! `wire.rs`; lists are in `list.rs`, watches in `watching.rs`, Events in
//! `events.rs`.

use std::{
    collections::HashMap,
    convert::Infallible,
    sync::{Arc, Mutex},
    time::Duration,
};

use http_body_util::BodyExt as _;
use hyper::{
    Request, Response, StatusCode,
    body::{Bytes, Incoming},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::{net::TcpListener, sync::watch};

use super::{
    Resource,
    store::Store,
    wire::{Body, event_line, json_response, status},
};

/// Serves `listener` until the task is aborted.
pub(super) fn accept(listener: TcpListener, server: Server) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            // As the real API server (Go sets TCP_NODELAY): watch events are small writes that
            // Nagle's algorithm would hold back for a delayed ACK.
            let _ = stream.set_nodelay(true);
            let server = server.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request| {
                    let server = server.clone();
                    async move { Ok::<_, Infallible>(server.handle(request).await) }
                });
                // Aborted connections end here with an error; that is the point of them.
                let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    })
}

#[derive(Clone)]
pub(super) struct Server {
    pub(super) store: Arc<Mutex<Store>>,
    pub(super) changes: watch::Sender<u64>,
    pub(super) aborts: watch::Sender<u64>,
    pub(super) releases: watch::Sender<u64>,
    /// Set to a status code to end every open watch with an ERROR event of it.
    pub(super) errors: watch::Sender<u16>,
}

impl Server {
    async fn handle(&self, request: Request<Incoming>) -> Response<Body> {
        let path = request.uri().path().to_owned();
        let shape = Shape::of(&request);
        let (down, failing, failing_watches, retry_after) = {
            let mut store = self.store.lock().expect("store");
            store.requests += 1;
            store.request_times.push(std::time::Instant::now());
            (store.down, store.failing, store.failing_watches, store.retry_after.max(1))
        };
        if down {
            let unavailable = status(503, "ServiceUnavailable", "the fake API is down");
            return json_response(StatusCode::SERVICE_UNAVAILABLE, &unavailable);
        }
        if let Some(code) = failing {
            return failure(code, retry_after);
        }
        let query: HashMap<String, String> = request.uri().query().map(|q| url_pairs(q).collect()).unwrap_or_default();
        let watching = query.get("watch").is_some_and(|w| w == "true" || w == "1");
        if let (true, Some(code)) = (watching, failing_watches) {
            return failure(code, retry_after);
        }
        if let Some(rest) = path.strip_prefix("/apis/events.k8s.io/v1/namespaces/") {
            let method = request.method().clone();
            let body = request.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
            return self.event_request(&method, rest, &body);
        }
        let Some(resource) = Resource::from_path(&path) else {
            return json_response(StatusCode::NOT_FOUND, &status(404, "NotFound", &format!("no route {path}")));
        };
        if watching {
            {
                let mut store = self.store.lock().expect("store");
                *store.watches.entry(resource).or_default() += 1;
                store.watch_timeouts.push(query.get("timeoutSeconds").and_then(|t| t.parse().ok()));
            }
            // A hung server or proxy: the request was taken, no response (not even its headers)
            // comes until the hang ends.
            while self.store.lock().expect("store").hang_watch_opens {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            self.watch(resource, &query, shape)
        } else {
            self.list(resource, &query, shape).await
        }
    }
}

/// The form of the objects a client asked for (its `Accept` header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Shape {
    /// Whole objects.
    Full,
    /// `PartialObjectMetadata`: apiVersion, kind and metadata only, as the API server answers
    /// `Accept: application/json;as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1`.
    Metadata,
}

impl Shape {
    fn of(request: &Request<Incoming>) -> Self {
        let accept = request.headers().get(hyper::header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or_default();
        if accept.contains("as=PartialObjectMetadata") { Self::Metadata } else { Self::Full }
    }

    /// An object's JSON in this shape.
    pub(super) fn object(self, json: &Bytes) -> Bytes {
        match self {
            Self::Full => json.clone(),
            Self::Metadata => {
                let object: Value = serde_json::from_slice(json).expect("stored JSON");
                let partial = json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                     "metadata": object["metadata"]});
                Bytes::from(serde_json::to_vec(&partial).expect("JSON"))
            }
        }
    }

    /// A watch event line in this shape.
    pub(super) fn line(self, line: &Bytes) -> Bytes {
        match self {
            Self::Full => line.clone(),
            Self::Metadata => {
                let event: Value = serde_json::from_slice(line).expect("stored event");
                let kind = event["type"].as_str().unwrap_or("MODIFIED");
                let object = serde_json::to_vec(&event["object"]).expect("JSON");
                let partial: Value = serde_json::from_slice(&self.object(&Bytes::from(object))).expect("JSON");
                event_line(kind, &partial)
            }
        }
    }
}

/// An error answer with `code`, as the API server words it; a 429 asks to retry after
/// `retry_after` seconds, in its header and its Status details.
fn failure(code: u16, retry_after: u32) -> Response<Body> {
    let (reason, message) = match code {
        429 => ("TooManyRequests", "too many requests, please try again later"),
        403 => ("Forbidden", "User \"system:serviceaccount:topology-agent:topology-agent\" cannot list resource"),
        _ => ("InternalError", "the fake API fails as asked"),
    };
    let mut body = status(code, reason, message);
    if code == 429 {
        body["details"] = json!({"retryAfterSeconds": retry_after});
    }
    let mut response = json_response(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), &body);
    if code == 429 {
        let header = retry_after.to_string().parse().expect("header");
        response.headers_mut().insert(hyper::header::RETRY_AFTER, header);
    }
    response
}

/// `a=b&c=d` pairs, percent-decoded (`+` is a space, as forms encode it).
fn url_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    query.split('&').filter(|p| !p.is_empty()).filter_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        Some((percent_decode(key), percent_decode(value)))
    })
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let hex = bytes.get(at + 1..at + 3).and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match (bytes[at], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                at += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                at += 1;
            }
            (byte, _) => {
                out.push(byte);
                at += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};

    use super::*;
    use crate::{fake_api::FakeApi, objects};

    #[test]
    fn percent_decoding_reads_what_clients_encode() {
        assert_eq!(percent_decode("a%7Eb%2Fc+d%3D1%2C2"), "a~b/c d=1,2");
        assert_eq!(percent_decode("100%"), "100%", "a stray % stays");
        assert_eq!(percent_decode("%zz"), "%zz");
    }

    #[tokio::test]
    async fn a_paged_list_sends_every_object_once_in_order() {
        let api = FakeApi::start().await;
        for n in 0..1_203u32 {
            let ip = IpAddr::V4(Ipv4Addr::from(0x0a60_0000 + n));
            api.apply(objects::service("paged", &format!("svc-{n:04}"), ip, 80, "TCP", "http"));
        }
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "Service"));
        let services: Api<DynamicObject> = Api::all_with(api.client(), &resource);
        let (mut names, mut pages, mut token) = (Vec::new(), 0, None::<String>);
        loop {
            let mut params = ListParams::default().limit(500);
            if let Some(token) = token.take() {
                params = params.continue_token(&token);
            }
            let page = services.list(&params).await.expect("list");
            pages += 1;
            names.extend(page.items.into_iter().map(|s| s.metadata.name.expect("name")));
            match page.metadata.continue_ {
                Some(next) if !next.is_empty() => token = Some(next),
                _ => break,
            }
        }
        let expected: Vec<String> = (0..1_203).map(|n| format!("svc-{n:04}")).collect();
        assert_eq!(names, expected);
        assert_eq!(pages, 3);
        assert_eq!(api.lists(crate::fake_api::Resource::Services), 1, "one list, three pages");
    }
}
