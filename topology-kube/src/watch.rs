//! The cluster from the Kubernetes API: one list-and-watch per kind (Nodes, Services,
//! EndpointSlices), with a backoff on errors. Every relist (e.g. after 410 Gone) is buffered and
//! sent as one [`SourceEvent::Replace`], so the controller never acts on half a list; the initial
//! list is sent page by page ([`SourceEvent::Listing`]), which the controller only takes in until
//! every kind is listed. Objects are decoded into lean views that build only the
//! fields routing reads ([`convert`]), and reduced to the cluster model at once.
//!
//! Each kind runs its own list-and-watch ([`reflector`](super::reflector)); the Nodes are watched
//! as metadata unless a Service uses spillover (`nodes.rs`).

use std::{
    collections::BTreeSet,
    path::Path,
    time::{Duration, Instant},
};

use kube::{
    Api, Client, Resource, ResourceExt as _,
    config::{KubeConfigOptions, Kubeconfig},
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use topology_model::{
    ClusterState, Kind, ObjectKey, convert,
    convert::{EndpointSliceView, NodeView, ServiceView},
};

use super::{
    EventReceiver, EventSender, Invalid, Object, ObjectId, SourceEvent,
    reflector::{self, Watched},
};

/// The Kubernetes client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum KubeSourceError {
    /// The kubeconfig file could not be read.
    #[error("reading kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// The error.
        source: kube::config::KubeconfigError,
    },
    /// Neither a kubeconfig nor the in-cluster configuration is available.
    #[error("no Kubernetes configuration ($KUBECONFIG, ~/.kube/config, or in-cluster): {0}")]
    Infer(#[from] kube::config::InferConfigError),
    /// The client could not be created from the configuration.
    #[error("creating the Kubernetes client: {0}")]
    Client(#[from] kube::Error),
}

/// What a client is for, as its User-Agent says: the API server's audit log and its
/// per-agent flow accounting tell the agent's watches from an operator's `explain` by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// `topology-agent run`.
    Run,
    /// `topology-agent explain`.
    Explain,
}

/// The User-Agent of `role`'s requests, shaped as Kubernetes' own components shape theirs
/// (`kube-proxy/v1.35.4 (linux/amd64) kubernetes/…`).
pub fn user_agent(role: Role) -> String {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let role = match role {
        Role::Run => "run",
        Role::Explain => "explain",
    };
    format!("topology-agent/v{} ({}/{arch}) {role}", env!("CARGO_PKG_VERSION"), std::env::consts::OS)
}

/// A client from `--kubeconfig`, else `$KUBECONFIG`, else `~/.kube/config`, else the in-cluster
/// configuration (kube-rs's `Config::infer`), naming itself as `role`.
pub async fn client(kubeconfig: Option<&Path>, role: Role) -> Result<Client, KubeSourceError> {
    let config = match kubeconfig {
        Some(path) => {
            let error = |source| KubeSourceError::Kubeconfig { path: path.display().to_string(), source };
            let file = Kubeconfig::read_from(path).map_err(error)?;
            kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default()).await.map_err(error)?
        }
        None => kube::Config::infer().await?,
    };
    let mut config = config;
    // Always ASCII (a version, an OS and an architecture name).
    if let Ok(agent) = http::HeaderValue::from_str(&user_agent(role)) {
        config.headers.push((http::header::USER_AGENT, agent));
    }
    client_for(config)
}

/// A client for `config`, with the client's own retry of 429/503 turned off: it would hide an
/// API outage from the watchers for minutes, and `/readyz` must say the view is stale. The
/// watchers retry with their own backoff instead.
pub fn client_for(mut config: kube::Config) -> Result<Client, KubeSourceError> {
    config.default_retry = false;
    Ok(Client::try_from(config)?)
}

/// The three running watchers.
pub struct KubeSource {
    tasks: Vec<JoinHandle<()>>,
}

impl KubeSource {
    /// Starts the watchers of node `node`'s agent (`None`: of every Node alike, as `explain` reads
    /// them); they run until `shutdown`.
    pub fn start(client: &Client, node: Option<&str>, events: &EventSender, shutdown: &CancellationToken) -> Self {
        let (service_events, need) = super::nodes::services_tap(events);
        let reading = super::nodes::Reading { convert: self::node, identify: id_of };
        let tasks = vec![
            tokio::spawn(super::nodes::run(
                client.clone(),
                node.map(str::to_owned),
                reading,
                events.clone(),
                need,
                shutdown.clone(),
            )),
            tokio::spawn(reflector::run(
                Watched {
                    api: Api::<ServiceView>::all(client.clone()),
                    kind: Kind::Service,
                    convert: service,
                    identify: id_of,
                    metadata_only: false,
                    fields: None,
                    listed: false,
                },
                service_events,
                shutdown.clone(),
            )),
            tokio::spawn(reflector::run(
                Watched {
                    api: Api::<EndpointSliceView>::all(client.clone()),
                    kind: Kind::EndpointSlice,
                    convert: endpoint_slice,
                    identify: id_of,
                    metadata_only: false,
                    fields: None,
                    listed: false,
                },
                events.clone(),
                shutdown.clone(),
            )),
        ];
        Self { tasks }
    }

    /// Waits for the watchers to stop (after shutdown).
    pub async fn join(self) {
        for task in self.tasks {
            // A panicked watcher has nothing left to clean up.
            let _ = task.await;
        }
    }
}

/// A one-off view could not be had.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// A kind could not be listed (refused, throttled, unreachable): the API's reason.
    #[error("{watch}: {reason}")]
    List {
        /// Which watch (`Node watch`, ...).
        watch: String,
        /// Why, as `/readyz` would say it.
        reason: String,
    },
    /// Not every kind was listed in time.
    #[error("no complete list of {waiting_for} within {} s", within.as_secs())]
    Timeout {
        /// The kinds still missing, comma-separated.
        waiting_for: String,
        /// The time allowed.
        within: Duration,
    },
}

/// The cluster as the API lists it now, converted exactly as the running agent converts it: the
/// same watchers, stopped once every kind has been listed (all pages). Objects that cannot be
/// used are skipped and returned; a kind that cannot be listed is an error naming it and why.
pub async fn snapshot(client: &Client, within: Duration) -> Result<(ClusterState, Vec<Invalid>), SnapshotError> {
    let (events, receiver) = EventSender::channel();
    let shutdown = CancellationToken::new();
    let source = KubeSource::start(client, None, &events, &shutdown);
    drop(events);
    let collected = tokio::task::spawn_blocking(move || collect(&receiver, within)).await;
    shutdown.cancel();
    source.join().await;
    collected.unwrap_or_else(|_| Err(SnapshotError::Timeout { waiting_for: "every kind".into(), within }))
}

/// Applies the watchers' events until every kind is listed.
fn collect(receiver: &EventReceiver, within: Duration) -> Result<(ClusterState, Vec<Invalid>), SnapshotError> {
    let deadline = Instant::now() + within;
    let (mut state, mut skipped, mut listed) = (ClusterState::default(), Vec::new(), BTreeSet::new());
    while listed.len() < Kind::ALL.len() {
        let event = receiver.recv_timeout(deadline.saturating_duration_since(Instant::now())).map_err(|_| {
            let missing: Vec<String> =
                Kind::ALL.iter().filter(|kind| !listed.contains(*kind)).map(ToString::to_string).collect();
            SnapshotError::Timeout { waiting_for: missing.join(", "), within }
        })?;
        match event.1 {
            SourceEvent::ListPage { objects, invalid, .. } => {
                objects.into_iter().for_each(|object| apply(&mut state, object));
                skipped.extend(invalid);
            }
            SourceEvent::Replace { kind, objects, invalid } => {
                objects.into_iter().for_each(|object| apply(&mut state, object));
                skipped.extend(invalid);
                listed.insert(kind);
            }
            SourceEvent::Apply(object) => apply(&mut state, object),
            SourceEvent::Delete(id) => remove(&mut state, &id),
            SourceEvent::Invalid(invalid) => skipped.push(invalid),
            SourceEvent::Stale { source, reason, .. } => return Err(SnapshotError::List { watch: source, reason }),
            SourceEvent::Listing(_) | SourceEvent::Snapshot(_) | SourceEvent::Fresh { .. } | SourceEvent::Census(_) => {
            }
        }
    }
    Ok((state, skipped))
}

fn apply(state: &mut ClusterState, object: Object) {
    match object {
        Object::Node(node) => {
            state.upsert_node(node);
        }
        Object::Service(service) => {
            state.upsert_service(service);
        }
        Object::EndpointSlice(slice) => {
            state.upsert_slice(slice);
        }
    }
}

fn remove(state: &mut ClusterState, id: &ObjectId) {
    match id {
        ObjectId::Node(name) => {
            state.remove_node(name);
        }
        ObjectId::Service(key) => {
            state.remove_service(key);
        }
        ObjectId::EndpointSlice(key) => {
            state.remove_slice(key);
        }
    }
}

fn id_of<K: Resource>(object: &K, kind: Kind) -> ObjectId {
    let key = || ObjectKey::new(object.namespace().unwrap_or_else(|| "default".into()), object.name_any());
    match kind {
        Kind::Node => ObjectId::Node(object.name_any()),
        Kind::Service => ObjectId::Service(key()),
        Kind::EndpointSlice => ObjectId::EndpointSlice(key()),
    }
}

fn node(object: &NodeView) -> Result<Option<Object>, Box<Invalid>> {
    convert::node(object)
        .map(|node| Some(Object::Node(node)))
        .map_err(|error| Box::new(Invalid { id: id_of(object, Kind::Node), service: None, error }))
}

fn service(object: &ServiceView) -> Result<Option<Object>, Box<Invalid>> {
    convert::service(object).map(|service| Some(Object::Service(service))).map_err(|error| {
        let id = id_of(object, Kind::Service);
        let service = match &id {
            ObjectId::Service(key) => Some(key.clone()),
            _ => None,
        };
        Box::new(Invalid { id, service, error })
    })
}

fn endpoint_slice(object: &EndpointSliceView) -> Result<Option<Object>, Box<Invalid>> {
    let owner = object
        .labels()
        .get(topology_model::objects::LABEL_SERVICE_NAME)
        .map(|name| ObjectKey::new(object.namespace().unwrap_or_else(|| "default".into()), name.clone()));
    convert::endpoint_slice(object)
        .map(|slice| slice.map(Object::EndpointSlice))
        .map_err(|error| Box::new(Invalid { id: id_of(object, Kind::EndpointSlice), service: owner, error }))
}
