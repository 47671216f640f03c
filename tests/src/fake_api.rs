//! An in-process fake Kubernetes API server for Nodes, Services and EndpointSlices: list (with
//! pagination) and watch from a resourceVersion, bookmarks, aborted connections, 410 Gone after
//! compaction, lists held back on demand, and a record of the Events posted to it.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::{SinkExt as _, channel::mpsc};
use http_body_util::{BodyExt as _, StreamBody, combinators::BoxBody};
use hyper::{
    Request, Response, StatusCode,
    body::{Bytes, Frame, Incoming},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::{net::TcpListener, sync::watch};

/// A resource the fake serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    /// `/api/v1/nodes`.
    Nodes,
    /// `/api/v1/services`.
    Services,
    /// `/apis/discovery.k8s.io/v1/endpointslices`.
    EndpointSlices,
}

impl Resource {
    fn from_path(path: &str) -> Option<Self> {
        match path {
            "/api/v1/nodes" => Some(Self::Nodes),
            "/api/v1/services" => Some(Self::Services),
            "/apis/discovery.k8s.io/v1/endpointslices" => Some(Self::EndpointSlices),
            _ => None,
        }
    }

    fn of(object: &Value) -> Self {
        match object["kind"].as_str() {
            Some("Node") => Self::Nodes,
            Some("Service") => Self::Services,
            Some("EndpointSlice") => Self::EndpointSlices,
            other => panic!("the fake API serves no kind {other:?}"),
        }
    }

    fn list_kind(self) -> (&'static str, &'static str) {
        match self {
            Self::Nodes => ("v1", "NodeList"),
            Self::Services => ("v1", "ServiceList"),
            Self::EndpointSlices => ("discovery.k8s.io/v1", "EndpointSliceList"),
        }
    }
}

type Key = (Resource, String, String);

#[derive(Default)]
struct Store {
    resource_version: u64,
    objects: BTreeMap<Key, Value>,
    /// (resourceVersion, resource, event type, object) of every change since compaction.
    history: Vec<(u64, Resource, &'static str, Value)>,
    compacted: u64,
    held: BTreeSet<Resource>,
    down: bool,
    /// Every request answered with this status.
    failing: Option<u16>,
    /// Watch requests answered with this status; lists still work.
    failing_watches: Option<u16>,
    /// Watches stay open and send nothing, not even bookmarks.
    stalled: bool,
    lists: HashMap<Resource, usize>,
    watches: HashMap<Resource, usize>,
    events: Vec<Value>,
    requests: usize,
}

/// The fake API server; stops when dropped.
pub struct FakeApi {
    addr: SocketAddr,
    server: Server,
    store: Arc<Mutex<Store>>,
    /// Bumped on every change, to wake watches; its value is the latest resourceVersion.
    changes: watch::Sender<u64>,
    /// Bumped to abort every open watch connection.
    aborts: watch::Sender<u64>,
    /// Bumped to let held lists through.
    releases: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeApi {
    /// Starts serving on 127.0.0.1 (inside a tokio runtime).
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the fake API");
        Self::start_on(listener)
    }

    /// Starts serving on `listener` (inside a tokio runtime), which may live in any network
    /// namespace.
    pub fn start_on(listener: TcpListener) -> Self {
        let addr = listener.local_addr().expect("address");
        let store = Arc::new(Mutex::new(Store::default()));
        let (changes, _) = watch::channel(0);
        let (aborts, _) = watch::channel(0);
        let (releases, _) = watch::channel(0);
        let server = Server {
            store: Arc::clone(&store),
            changes: changes.clone(),
            aborts: aborts.clone(),
            releases: releases.clone(),
        };
        let task = accept(listener, server.clone());
        Self { addr, server, store, changes, aborts, releases, task }
    }

    /// Moves the server to `listener`, keeping its objects: the old address stops answering,
    /// as when the control plane is replaced.
    pub fn move_to(&mut self, listener: TcpListener) {
        self.task.abort();
        self.abort_watches();
        self.addr = listener.local_addr().expect("address");
        self.task = accept(listener, self.server.clone());
    }

    /// The address served.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kube client for this server, configured as the agent configures its own.
    pub fn client(&self) -> kube::Client {
        let config = kube::Config::new(self.url().parse().expect("URL"));
        topology_agent::source::kube::client_for(config).expect("kube client")
    }

    fn with<T>(&self, f: impl FnOnce(&mut Store) -> T) -> T {
        f(&mut self.store.lock().expect("fake API store"))
    }

    /// Adds or replaces an object (by kind, namespace, name).
    pub fn apply(&self, mut object: Value) {
        let resource = Resource::of(&object);
        let key = key_of(resource, &object);
        let version = self.with(|store| {
            store.resource_version += 1;
            let version = store.resource_version;
            object["metadata"]["resourceVersion"] = version.to_string().into();
            let kind = if store.objects.contains_key(&key) { "MODIFIED" } else { "ADDED" };
            store.objects.insert(key, object.clone());
            store.history.push((version, resource, kind, object));
            version
        });
        self.changes.send_replace(version);
    }

    /// Deletes an object; true if it existed.
    pub fn delete(&self, resource: Resource, namespace: &str, name: &str) -> bool {
        let key = (resource, namespace.to_owned(), name.to_owned());
        let version = self.with(|store| {
            let mut object = store.objects.remove(&key)?;
            store.resource_version += 1;
            let version = store.resource_version;
            object["metadata"]["resourceVersion"] = version.to_string().into();
            store.history.push((version, resource, "DELETED", object));
            Some(version)
        });
        version.map(|v| self.changes.send_replace(v)).is_some()
    }

    /// Aborts every open watch connection, as a network failure would.
    pub fn abort_watches(&self) {
        self.aborts.send_modify(|n| *n += 1);
    }

    /// Forgets the history: a watch resuming from an older resourceVersion gets 410 Gone.
    pub fn compact(&self) {
        self.with(|store| {
            store.compacted = store.resource_version;
            store.history.clear();
        });
    }

    /// Holds list requests of `resource` until [`FakeApi::release`].
    pub fn hold(&self, resource: Resource) {
        self.with(|store| store.held.insert(resource));
    }

    /// Lets held lists through.
    pub fn release(&self, resource: Resource) {
        self.with(|store| store.held.remove(&resource));
        self.releases.send_modify(|n| *n += 1);
    }

    /// An outage: while down, every request is answered 503 Service Unavailable.
    pub fn set_down(&self, down: bool) {
        self.with(|store| store.down = down);
    }

    /// Answers every request with `status` (429 comes with `Retry-After: 1`); `None` ends it.
    pub fn fail_with(&self, status: Option<u16>) {
        self.with(|store| store.failing = status);
    }

    /// Answers watch requests with `status` while lists keep working; `None` ends it.
    pub fn fail_watches_with(&self, status: Option<u16>) {
        self.with(|store| store.failing_watches = status);
    }

    /// Stalls every watch: connections stay open, nothing is sent, not even bookmarks, and
    /// `timeoutSeconds` is not honoured — a hung server or a black-holed connection.
    pub fn stall(&self, stalled: bool) {
        self.with(|store| store.stalled = stalled);
        if !stalled {
            self.changes.send_modify(|_| {});
        }
    }

    /// Requests of any kind received so far (lists, watches, posts).
    pub fn requests(&self) -> usize {
        self.with(|store| store.requests)
    }

    /// How many list requests (not watches) `resource` has served.
    pub fn lists(&self, resource: Resource) -> usize {
        self.with(|store| store.lists.get(&resource).copied().unwrap_or(0))
    }

    /// How many watch requests `resource` has received.
    pub fn watches(&self, resource: Resource) -> usize {
        self.with(|store| store.watches.get(&resource).copied().unwrap_or(0))
    }

    /// The Events posted so far.
    pub fn events(&self) -> Vec<Value> {
        self.with(|store| store.events.clone())
    }
}

/// Serves `listener` until the task is aborted.
fn accept(listener: TcpListener, server: Server) -> tokio::task::JoinHandle<()> {
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

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn key_of(resource: Resource, object: &Value) -> Key {
    let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default().to_owned();
    let name = object["metadata"]["name"].as_str().expect("metadata.name").to_owned();
    (resource, namespace, name)
}

type Body = BoxBody<Bytes, std::io::Error>;

#[derive(Clone)]
struct Server {
    store: Arc<Mutex<Store>>,
    changes: watch::Sender<u64>,
    aborts: watch::Sender<u64>,
    releases: watch::Sender<u64>,
}

impl Server {
    async fn handle(&self, request: Request<Incoming>) -> Response<Body> {
        let path = request.uri().path().to_owned();
        let (down, failing, failing_watches) = {
            let mut store = self.store.lock().expect("store");
            store.requests += 1;
            (store.down, store.failing, store.failing_watches)
        };
        if down {
            let unavailable = status(503, "ServiceUnavailable", "the fake API is down");
            return json_response(StatusCode::SERVICE_UNAVAILABLE, &unavailable);
        }
        if let Some(code) = failing {
            return failure(code);
        }
        let query: HashMap<String, String> = request.uri().query().map(|q| url_pairs(q).collect()).unwrap_or_default();
        let watching = query.get("watch").is_some_and(|w| w == "true" || w == "1");
        if let (true, Some(code)) = (watching, failing_watches) {
            return failure(code);
        }
        if request.method() == hyper::Method::POST && path.starts_with("/apis/events.k8s.io/v1/namespaces/") {
            let body = request.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
            let event: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            self.store.lock().expect("store").events.push(event.clone());
            return json_response(StatusCode::CREATED, &event);
        }
        let Some(resource) = Resource::from_path(&path) else {
            return json_response(StatusCode::NOT_FOUND, &status(404, "NotFound", &format!("no route {path}")));
        };
        if watching {
            *self.store.lock().expect("store").watches.entry(resource).or_default() += 1;
            self.watch(resource, &query)
        } else {
            self.list(resource, &query).await
        }
    }

    async fn list(&self, resource: Resource, query: &HashMap<String, String>) -> Response<Body> {
        let mut released = self.releases.subscribe();
        while self.store.lock().expect("store").held.contains(&resource) {
            // A dropped sender means the server is going away; answer anyway.
            if released.changed().await.is_err() {
                break;
            }
        }
        let limit: usize = query.get("limit").and_then(|l| l.parse().ok()).unwrap_or(usize::MAX);
        let offset: usize = query.get("continue").and_then(|c| c.parse().ok()).unwrap_or(0);
        let mut store = self.store.lock().expect("store");
        if offset == 0 {
            *store.lists.entry(resource).or_default() += 1;
        }
        // The resource's objects are one range of the map; each item is serialized straight from
        // the store (no copy), so the fake's own cost stays small beside the agent's it measures.
        let range = (resource, String::new(), String::new())..;
        let of_resource = || store.objects.range(range.clone()).take_while(|(k, _)| k.0 == resource);
        let total = of_resource().count();
        let (api_version, kind) = resource.list_kind();
        let mut metadata = json!({"resourceVersion": store.resource_version.to_string()});
        let next = offset.saturating_add(limit).min(total);
        if next < total {
            metadata["continue"] = next.to_string().into();
        }
        let head = json!({"apiVersion": api_version, "kind": kind, "metadata": metadata});
        let mut body = serde_json::to_vec(&head).expect("JSON");
        body.pop();
        body.extend_from_slice(br#","items":["#);
        for (n, (_, object)) in of_resource().skip(offset).take(limit).enumerate() {
            if n > 0 {
                body.push(b',');
            }
            serde_json::to_writer(&mut body, object).expect("JSON");
        }
        body.extend_from_slice(b"]}");
        bytes_response(StatusCode::OK, body)
    }

    fn watch(&self, resource: Resource, query: &HashMap<String, String>) -> Response<Body> {
        let from: u64 = query.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
        let bookmarks = query.get("allowWatchBookmarks").is_some_and(|b| b == "true");
        let ends = query
            .get("timeoutSeconds")
            .and_then(|t| t.parse::<u64>().ok())
            .map(|seconds| tokio::time::Instant::now() + Duration::from_secs(seconds));
        let (mut tx, rx) = mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(64);
        let (store, mut changes, mut aborts) =
            (Arc::clone(&self.store), self.changes.subscribe(), self.aborts.subscribe());
        aborts.mark_unchanged();
        tokio::spawn(async move {
            let mut sent = from;
            {
                let compacted = store.lock().expect("store").compacted;
                if from != 0 && from < compacted {
                    let gone = json!({"type": "ERROR", "object": status(410, "Expired", "too old resource version")});
                    let _ = tx.send(Ok(Frame::data(line(&gone)))).await;
                    return;
                }
            }
            loop {
                if store.lock().expect("store").stalled {
                    // Hold the connection open, silent, until the stall ends or the client leaves.
                    while store.lock().expect("store").stalled {
                        if tx.is_closed() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                if ends.is_some_and(|at| tokio::time::Instant::now() >= at) {
                    // The server ends the watch, as asked; the client resumes from where it was.
                    return;
                }
                let pending: Vec<Value> = {
                    let store = store.lock().expect("store");
                    let fresh = store
                        .history
                        .iter()
                        .filter(|(v, r, _, _)| *v > sent && *r == resource)
                        .map(|(_, _, kind, object)| json!({"type": kind, "object": object}))
                        .collect();
                    sent = store.resource_version;
                    fresh
                };
                for event in pending {
                    if tx.send(Ok(Frame::data(line(&event)))).await.is_err() {
                        return;
                    }
                }
                let end = ends.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
                tokio::select! {
                    () = tokio::time::sleep_until(end) => return,
                    changed = changes.changed() => if changed.is_err() { return },
                    _ = aborts.changed() => {
                        let _ = tx.send(Err(std::io::Error::other("connection aborted by the fake API"))).await;
                        return;
                    }
                    () = tokio::time::sleep(Duration::from_millis(500)), if bookmarks => {
                        let (api_version, kind) = resource.list_kind();
                        let object = json!({"apiVersion": api_version, "kind": kind.trim_end_matches("List"),
                            "metadata": {"resourceVersion": sent.to_string()}});
                        if tx.send(Ok(Frame::data(line(&json!({"type": "BOOKMARK", "object": object}))))).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let mut response = Response::new(StreamBody::new(rx).boxed());
        response.headers_mut().insert(hyper::header::CONTENT_TYPE, "application/json".parse().expect("header"));
        response
    }
}

/// An error answer with `code`, as the API server words it.
fn failure(code: u16) -> Response<Body> {
    let (reason, message) = match code {
        429 => ("TooManyRequests", "too many requests, please try again later"),
        403 => ("Forbidden", "User \"system:serviceaccount:topology-agent:topology-agent\" cannot list resource"),
        _ => ("InternalError", "the fake API fails as asked"),
    };
    let mut response = json_response(
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &status(code, reason, message),
    );
    if code == 429 {
        response.headers_mut().insert(hyper::header::RETRY_AFTER, "1".parse().expect("header"));
    }
    response
}

fn line(value: &Value) -> Bytes {
    let mut text = serde_json::to_vec(value).expect("JSON");
    text.push(b'\n');
    Bytes::from(text)
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    bytes_response(status, serde_json::to_vec(value).expect("JSON"))
}

/// A response with a JSON body already serialized.
fn bytes_response(status: StatusCode, body: Vec<u8>) -> Response<Body> {
    let body = http_body_util::Full::new(Bytes::from(body)).map_err(|never: Infallible| match never {}).boxed();
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(hyper::header::CONTENT_TYPE, "application/json".parse().expect("header"));
    response
}

/// `a=b&c=d` pairs, percent-decoded enough for the parameters the watcher sends.
fn url_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    query.split('&').filter(|p| !p.is_empty()).filter_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        Some((key.to_owned(), value.replace("%3D", "=").replace("%2C", ",")))
    })
}
