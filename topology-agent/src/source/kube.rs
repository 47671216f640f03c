//! The cluster from the Kubernetes API: one kube-runtime watcher per kind (Nodes, Services,
//! EndpointSlices), with the default backoff on errors. A watcher's initial list (and every
//! relist, e.g. after 410 Gone) is buffered and sent as one [`SourceEvent::Replace`], so the
//! controller never acts on half a list. Objects are reduced to the cluster model at once, so
//! nothing of their bulk (managedFields, status) is kept.

use std::{fmt::Debug, path::Path, time::Duration};

use futures::StreamExt as _;
use k8s_openapi::api::{
    core::v1::{Node as K8sNode, Service as K8sService},
    discovery::v1::EndpointSlice as K8sEndpointSlice,
};
use kube::{
    Api, Client, Resource, ResourceExt as _,
    api::{ApiResource, DynamicObject, ListParams},
    config::{KubeConfigOptions, Kubeconfig},
    runtime::{WatchStreamExt as _, watcher},
};
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{EventSender, Invalid, Object, ObjectId, SourceEvent};
use crate::cluster::{Kind, ObjectKey, convert};

/// How often a stale watcher checks whether the API answers again.
const PROBE_INTERVAL: Duration = Duration::from_secs(2);

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
    /// Neither in-cluster configuration nor a default kubeconfig is available.
    #[error("no Kubernetes configuration (in-cluster or ~/.kube/config): {0}")]
    Infer(#[from] kube::config::InferConfigError),
    /// The client could not be created from the configuration.
    #[error("creating the Kubernetes client: {0}")]
    Client(#[from] kube::Error),
}

/// A client from `--kubeconfig`, else the in-cluster configuration or the default kubeconfig.
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, KubeSourceError> {
    let config = match kubeconfig {
        Some(path) => {
            let error = |source| KubeSourceError::Kubeconfig { path: path.display().to_string(), source };
            let file = Kubeconfig::read_from(path).map_err(error)?;
            kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default()).await.map_err(error)?
        }
        None => kube::Config::infer().await?,
    };
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
    /// Starts the watchers; they run until `shutdown`.
    pub fn start(client: &Client, events: &EventSender, shutdown: &CancellationToken) -> Self {
        let services = Api::<DynamicObject>::all_with(client.clone(), &ApiResource::erase::<K8sService>(&()));
        let tasks = vec![
            tokio::spawn(watch(
                Api::<K8sNode>::all(client.clone()),
                Kind::Node,
                node,
                events.clone(),
                shutdown.clone(),
            )),
            tokio::spawn(watch(services, Kind::Service, service, events.clone(), shutdown.clone())),
            tokio::spawn(watch(
                Api::<K8sEndpointSlice>::all(client.clone()),
                Kind::EndpointSlice,
                endpoint_slice,
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

/// How one kind's objects become model objects.
type Convert<K> = fn(&K) -> Result<Option<Object>, Box<Invalid>>;

async fn watch<K>(api: Api<K>, kind: Kind, convert: Convert<K>, events: EventSender, shutdown: CancellationToken)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let source = format!("{kind} watch");
    let stream = watcher(api.clone(), watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    let mut listing: Option<(Vec<Object>, Vec<Invalid>)> = None;
    let mut stale = false;
    loop {
        let item = tokio::select! {
            () = shutdown.cancelled() => return,
            // A watch that comes back without news says nothing; probe the API to clear staleness.
            () = tokio::time::sleep(PROBE_INTERVAL), if stale => {
                if api.list(&ListParams::default().limit(1)).await.is_ok() {
                    stale = false;
                    events.send(SourceEvent::Fresh { source: source.clone() });
                }
                continue;
            }
            item = stream.next() => item,
        };
        let Some(item) = item else { return };
        let event = match item {
            Ok(event) => event,
            Err(error) => {
                tracing::warn!(kind = %kind, %error, "watch failed; retrying with backoff, keeping the last good state");
                stale = true;
                events.send(SourceEvent::Stale { source: source.clone(), reason: error.to_string() });
                continue;
            }
        };
        if std::mem::take(&mut stale) {
            events.send(SourceEvent::Fresh { source: source.clone() });
        }
        let sent = match event {
            watcher::Event::Init => {
                listing = Some((Vec::new(), Vec::new()));
                true
            }
            watcher::Event::InitApply(object) => {
                let (objects, invalid) = listing.get_or_insert_with(Default::default);
                match convert(&object) {
                    Ok(Some(object)) => objects.push(object),
                    Ok(None) => {}
                    Err(bad) => invalid.push(*bad),
                }
                true
            }
            watcher::Event::InitDone => {
                let (objects, invalid) = listing.take().unwrap_or_default();
                tracing::info!(kind = %kind, objects = objects.len(), invalid = invalid.len(), "listed");
                events.send(SourceEvent::Replace { kind, objects, invalid })
            }
            watcher::Event::Apply(object) => match convert(&object) {
                Ok(Some(object)) => events.send(SourceEvent::Apply(object)),
                Ok(None) => events.send(SourceEvent::Delete(id_of(&object, kind))),
                Err(bad) => events.send(SourceEvent::Invalid(*bad)),
            },
            watcher::Event::Delete(object) => events.send(SourceEvent::Delete(id_of(&object, kind))),
        };
        if !sent {
            return;
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

fn node(object: &K8sNode) -> Result<Option<Object>, Box<Invalid>> {
    convert::node(object)
        .map(|node| Some(Object::Node(node)))
        .map_err(|error| Box::new(Invalid { id: id_of(object, Kind::Node), service: None, error }))
}

fn service(object: &DynamicObject) -> Result<Option<Object>, Box<Invalid>> {
    let id = id_of(object, Kind::Service);
    let service_key = match &id {
        ObjectId::Service(key) => Some(key.clone()),
        _ => None,
    };
    let invalid = |error| Box::new(Invalid { id: id.clone(), service: service_key.clone(), error });
    let mut raw = serde_json::to_value(object).map_err(|e| {
        invalid(crate::cluster::ObjectError {
            kind: Kind::Service,
            name: id.to_string(),
            field: "(object)".into(),
            message: e.to_string(),
        })
    })?;
    // List items carry no kind; the name in errors needs it to tell Services from Nodes.
    raw["kind"] = "Service".into();
    convert::service_from_value(&raw).map(|service| Some(Object::Service(service))).map_err(invalid)
}

fn endpoint_slice(object: &K8sEndpointSlice) -> Result<Option<Object>, Box<Invalid>> {
    let owner = object
        .labels()
        .get(crate::cluster::model::LABEL_SERVICE_NAME)
        .map(|name| ObjectKey::new(object.namespace().unwrap_or_else(|| "default".into()), name.clone()));
    convert::endpoint_slice(object)
        .map(|slice| slice.map(Object::EndpointSlice))
        .map_err(|error| Box::new(Invalid { id: id_of(object, Kind::EndpointSlice), service: owner, error }))
}
