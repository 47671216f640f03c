//! An in-process fake Kubernetes API server for Nodes, Services and EndpointSlices: list (with
//! pagination) and watch from a resourceVersion, bookmarks, aborted connections, 410 Gone after
//! compaction, lists held back on demand, and a record of the Events posted to it.

mod heartbeat;
mod server;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use hyper::body::Bytes;
use serde_json::{Value, json};
use tokio::{net::TcpListener, sync::watch};

pub use self::heartbeat::{Heartbeats, rfc3339};
use self::server::{Server, accept};

/// The history kept per resource for watches to resume from, in serialized bytes; past it the
/// oldest half is compacted away (a watch resuming from there gets 410 Gone), as the API server's
/// watch cache of each resource keeps a bounded window.
const HISTORY_BYTES: usize = 128 << 20;

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
    objects: BTreeMap<Key, Stored>,
    /// Every change since compaction, per resource.
    history: HashMap<Resource, History>,
    /// The resourceVersion up to which every resource's history is forgotten.
    compacted: u64,
    held: BTreeSet<Resource>,
    down: bool,
    /// Every request answered with this status.
    failing: Option<u16>,
    /// Watch requests answered with this status; lists still work.
    failing_watches: Option<u16>,
    /// `retryAfterSeconds` of a 429, in the Status body as the API server sends it.
    retry_after: u32,
    /// When each request came.
    request_times: Vec<std::time::Instant>,
    /// Watches stay open and send nothing, not even bookmarks.
    stalled: bool,
    lists: HashMap<Resource, usize>,
    watches: HashMap<Resource, usize>,
    events: Vec<Value>,
    requests: usize,
    /// Bytes of list and watch bodies sent, per resource.
    sent: HashMap<Resource, u64>,
    /// Changes recorded (watch events), per resource.
    changed: HashMap<Resource, u64>,
}

/// An object, and its JSON as lists send it: the part of its last event line that is the object
/// (no copy), so a list writes bytes instead of serializing every object again.
struct Stored {
    value: Value,
    json: Bytes,
}

/// One resource's watch events since its compaction.
#[derive(Default)]
struct History {
    /// (resourceVersion, watch event line), serialized once for every watcher.
    events: Vec<(u64, Bytes)>,
    /// The bytes of `events`.
    bytes: usize,
    /// Events up to this resourceVersion are forgotten.
    compacted: u64,
}

impl Store {
    /// Adds or replaces `object` at `key` and records the change (ADDED or MODIFIED).
    fn put(&mut self, key: Key, mut object: Value) -> u64 {
        let kind = if self.objects.contains_key(&key) { "MODIFIED" } else { "ADDED" };
        let (version, json) = self.record(key.0, kind, &mut object);
        self.objects.insert(key, Stored { value: object, json });
        version
    }

    /// Records a change for the watches: `object` as a `kind` event at the next resourceVersion;
    /// its resourceVersion and JSON.
    fn record(&mut self, resource: Resource, kind: &str, object: &mut Value) -> (u64, Bytes) {
        self.resource_version += 1;
        let version = self.resource_version;
        object["metadata"]["resourceVersion"] = version.to_string().into();
        let (line, json) = server::event(kind, object);
        *self.changed.entry(resource).or_default() += 1;
        let history = self.history.entry(resource).or_default();
        history.bytes += line.len();
        history.events.push((version, line));
        if history.bytes > HISTORY_BYTES {
            let drop = history.events.len() / 2;
            history.compacted = history.events[drop - 1].0;
            history.bytes -= history.events.drain(..drop).map(|(_, line)| line.len()).sum::<usize>();
        }
        (version, json)
    }

    /// The events of `resource` after resourceVersion `after` (0: all kept); `None` when some
    /// were compacted away.
    fn events_after(&self, resource: Resource, after: u64) -> Option<Vec<Bytes>> {
        let history = self.history.get(&resource);
        let compacted = history.map_or(0, |h| h.compacted).max(self.compacted);
        if after != 0 && after < compacted {
            return None;
        }
        let Some(history) = history else { return Some(Vec::new()) };
        let first = history.events.partition_point(|(v, _)| *v <= after);
        Some(history.events[first..].iter().map(|(_, line)| line.clone()).collect())
    }
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

    /// Writes a kubeconfig for this server to `path`.
    pub fn write_kubeconfig(&self, path: &std::path::Path) {
        write_kubeconfig(path, &self.url());
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
    pub fn apply(&self, object: Value) {
        let key = key_of(Resource::of(&object), &object);
        let version = self.with(|store| store.put(key, object));
        self.changes.send_replace(version);
    }

    /// Deletes an object; true if it existed.
    pub fn delete(&self, resource: Resource, namespace: &str, name: &str) -> bool {
        let key = (resource, namespace.to_owned(), name.to_owned());
        let version = self.with(|store| {
            let mut object = store.objects.remove(&key)?.value;
            Some(store.record(resource, "DELETED", &mut object).0)
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

    /// A 429 asks to retry after `seconds` (header and Status details, as the API server does).
    pub fn set_retry_after(&self, seconds: u32) {
        self.with(|store| store.retry_after = seconds);
    }

    /// When each request came, in order.
    pub fn request_times(&self) -> Vec<std::time::Instant> {
        self.with(|store| store.request_times.clone())
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

    /// Bytes of list and watch bodies `resource` has sent so far, to every client.
    pub fn bytes_sent(&self, resource: Resource) -> u64 {
        self.with(|store| store.sent.get(&resource).copied().unwrap_or(0))
    }

    /// Changes of `resource` so far (additions, modifications, deletions: its watch events).
    pub fn modifications(&self, resource: Resource) -> u64 {
        self.with(|store| store.changed.get(&resource).copied().unwrap_or(0))
    }

    /// The Events posted so far.
    pub fn events(&self) -> Vec<Value> {
        self.with(|store| store.events.clone())
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Writes a kubeconfig for the API server at `server` (no credentials) to `path`.
pub fn write_kubeconfig(path: &std::path::Path, server: &str) {
    let config = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "fake", "user": {}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        "current-context": "fake"
    });
    std::fs::write(path, serde_json::to_string(&config).expect("JSON")).expect("write kubeconfig");
}

fn key_of(resource: Resource, object: &Value) -> Key {
    let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default().to_owned();
    let name = object["metadata"]["name"].as_str().expect("metadata.name").to_owned();
    (resource, namespace, name)
}
