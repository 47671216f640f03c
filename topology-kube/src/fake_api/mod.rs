//! An in-process fake Kubernetes API server for Nodes, Services and EndpointSlices, made to
//! behave as the real one does — read from the API server's etcd3 store, cacher and validation,
//! never from what the agent expects: lists as snapshots with expiring continue tokens and the
//! `resourceVersion` / `resourceVersionMatch` semantics, watches with synthetic ADDED events,
//! bookmarks at the real cadence, in-stream ERROR events and 410 Gone after compaction, a lagging
//! watch cache (504 `ResourceVersionTooLarge`), `metadata.name` / `metadata.namespace` field
//! selectors, Events validated as `events.k8s.io/v1` does; and
//! failures on demand (outages, refusals, 429 with `Retry-After`, aborted, stalled and hung
//! watches, held lists).

mod events;
mod fields;
mod heartbeat;
mod list;
mod server;
mod store;
mod watching;
mod wire;

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::{Value, json};
use tokio::{net::TcpListener, sync::watch};

pub use self::{
    heartbeat::{Heartbeats, rfc3339},
    store::BOOKMARK_EVERY,
};
use self::{
    server::{Server, accept},
    store::{Key, Store},
};

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
    /// Set to end every open watch with an ERROR event of that status.
    errors: watch::Sender<u16>,
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
        let (errors, _) = watch::channel(0);
        let server = Server {
            store: Arc::clone(&store),
            changes: changes.clone(),
            aborts: aborts.clone(),
            releases: releases.clone(),
            errors: errors.clone(),
        };
        let task = accept(listener, server.clone());
        Self { addr, server, store, changes, aborts, releases, errors, task }
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
        crate::watch::client_for(config).expect("kube client")
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
        let version = self.with(|store| store.remove(&key));
        version.map(|v| self.changes.send_replace(v)).is_some()
    }

    /// Aborts every open watch connection, as a network failure would.
    pub fn abort_watches(&self) {
        self.aborts.send_modify(|n| *n += 1);
    }

    /// Compacts every resource's history, as etcd's periodic compaction does: a watch resuming
    /// from an older resourceVersion gets 410 Gone, and so do a list at one and the continue
    /// tokens of lists begun before.
    pub fn compact(&self) {
        self.with(Store::compact);
    }

    /// Moves the store's revision past every resourceVersion handed out (an unrelated write, as
    /// etcd's revision moves with every key of the cluster), then compacts: nothing read before
    /// can be resumed. What the harness's `compact_etcd` does to the real one.
    pub fn compact_past_everything(&self) {
        self.with(|store| {
            store.resource_version += 1;
            store.compact();
        });
        self.changes.send_modify(|_| {});
    }

    /// Ends every open watch with an in-stream ERROR event of `code` (410 Expired, 500 …), as the
    /// API server does when its watch of etcd fails.
    pub fn error_watches(&self, code: u16) {
        self.errors.send_replace(code);
    }

    /// A lagging watch cache (an HA replica behind the others): while `Some(behind)`, reads
    /// served from the cache (lists at `resourceVersion=0` or `NotOlderThan`, watches) see the
    /// state `behind` changes ago, frozen there, and a read asking for a newer resourceVersion
    /// answers 504 after 3 s; `None`: the cache caught up.
    pub fn lag_cache(&self, behind: Option<u64>) {
        self.with(|store| store.cache_at = behind.map(|behind| store.resource_version.saturating_sub(behind)));
        self.changes.send_modify(|_| {});
    }

    /// Bookmarks every `every` instead of the API server's [`BOOKMARK_EVERY`] (still one 2 s
    /// before each watch's deadline): for tests of what happens between two bookmarks, not for
    /// making a watch look fresher than a real server would.
    pub fn set_bookmark_cadence(&self, every: Duration) {
        self.with(|store| store.bookmark_every = Some(every));
    }

    /// While set, watch requests get no response at all, not even headers (a hung server or
    /// proxy); lists still work.
    pub fn hang_watch_opens(&self, hang: bool) {
        self.with(|store| store.hang_watch_opens = hang);
    }

    /// Holds list requests of `resource` until [`FakeApi::release`].
    pub fn hold(&self, resource: Resource) {
        self.with(|store| store.held.insert(resource));
    }

    /// Holds the pages after the first of `resource`'s lists until [`FakeApi::release`]: a list
    /// in progress, for what happens meanwhile.
    pub fn hold_continues(&self, resource: Resource) {
        self.with(|store| store.held_continues.insert(resource));
    }

    /// Lets held lists (and pages) through.
    pub fn release(&self, resource: Resource) {
        self.with(|store| {
            store.held.remove(&resource);
            store.held_continues.remove(&resource);
        });
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

    /// The `timeoutSeconds` every watch request asked for, in order (`None`: not given).
    pub fn watch_timeouts(&self) -> Vec<Option<u64>> {
        self.with(|store| store.watch_timeouts.clone())
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

    /// The Events accepted so far (as last updated), in the order they were created.
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

#[cfg(test)]
mod tests;
