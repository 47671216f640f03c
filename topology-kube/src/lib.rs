//! topology-kube: the watch stage. Sources of cluster objects — Kubernetes watches
//! ([`watch::KubeSource`]: a reflector per kind, lists taken page by page, the census of Nodes) or
//! a YAML file ([`file`]) — turn what they see into [`SourceEvent`]s for the control loop, stamped
//! with when they were seen. They never compute. [`events`] publishes the agent's Kubernetes
//! Events.
//!
//! The data flows one way: **watch** → cluster state → policy → node plan → diff → kernel.
//! With the feature `testing`, [`fake_api`] is an in-process API server for the faults the real one
//! cannot be driven into, and [`objects`] writes the objects of test clusters.

mod census;
pub mod events;
#[cfg(any(test, feature = "testing"))]
pub mod fake_api;
pub mod file;
mod nodes;
#[cfg(any(test, feature = "testing"))]
pub mod objects;
mod pages;
pub mod reflector;
pub mod watch;

use std::{fmt, sync::mpsc, time::Instant};

use topology_model::{ClusterState, EndpointSlice, Kind, Node, ObjectError, ObjectKey, Service, census::Census};

/// A usable object.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Object {
    /// A Node.
    Node(Node),
    /// A Service.
    Service(Service),
    /// An EndpointSlice.
    EndpointSlice(EndpointSlice),
}

impl Object {
    /// The object's identity.
    pub fn id(&self) -> ObjectId {
        match self {
            Self::Node(node) => ObjectId::Node(node.name.clone()),
            Self::Service(service) => ObjectId::Service(service.key.clone()),
            Self::EndpointSlice(slice) => ObjectId::EndpointSlice(slice.key.clone()),
        }
    }
}

/// The identity of an object: its kind and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectId {
    /// A Node by name.
    Node(String),
    /// A Service.
    Service(ObjectKey),
    /// An EndpointSlice.
    EndpointSlice(ObjectKey),
}

impl ObjectId {
    /// The kind.
    pub fn kind(&self) -> Kind {
        match self {
            Self::Node(_) => Kind::Node,
            Self::Service(_) => Kind::Service,
            Self::EndpointSlice(_) => Kind::EndpointSlice,
        }
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Node(name) => write!(f, "Node {name}"),
            Self::Service(key) => write!(f, "Service {key}"),
            Self::EndpointSlice(key) => write!(f, "EndpointSlice {key}"),
        }
    }
}

/// An object the source could not use; the controller keeps its last good version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    /// Which object.
    pub id: ObjectId,
    /// The Service it concerns (itself, or the owner of an EndpointSlice), if known.
    pub service: Option<ObjectKey>,
    /// The field and the problem.
    pub error: ObjectError,
}

/// What a source saw.
#[derive(Debug)]
pub enum SourceEvent {
    /// A list of one kind begins whose pages are sent as they are read ([`SourceEvent::ListPage`]),
    /// the last one as the [`SourceEvent::Replace`] that ends it. Only a kind's lists before its
    /// first complete one are sent so: the controller programs nothing until every kind was
    /// listed, so it never acts on half a list, and takes each page in while the next is read.
    Listing(Kind),
    /// One page of the list that [`SourceEvent::Listing`] began.
    ListPage {
        /// The kind listed.
        kind: Kind,
        /// The page's usable objects.
        objects: Vec<Object>,
        /// The page's objects that could not be used.
        invalid: Vec<Invalid>,
    },
    /// The complete set of one kind after a list or relist (with the pages sent since its
    /// [`SourceEvent::Listing`], if it began with one): objects not listed are gone, except the
    /// `invalid` ones, which keep their last good version.
    Replace {
        /// The kind listed.
        kind: Kind,
        /// Every usable object of that kind.
        objects: Vec<Object>,
        /// Listed objects that could not be used.
        invalid: Vec<Invalid>,
    },
    /// The whole cluster at once (the file source).
    Snapshot(Box<ClusterState>),
    /// An object was added or changed.
    Apply(Object),
    /// An object was deleted.
    Delete(ObjectId),
    /// An object changed but cannot be used.
    Invalid(Invalid),
    /// The source lost its view (disconnected, unreadable file); the last good state stays.
    Stale {
        /// Which source (`file`, `Node watch`, ...).
        source: String,
        /// Why.
        reason: String,
        /// A failure that usually passes (a watch broken by an API server's restart): the view
        /// counts as stale only once it has lasted the health's grace.
        transient: bool,
    },
    /// What is known of the Nodes not watched (`None`: every Node is watched).
    Census(Option<Census>),
    /// The source's view is current again.
    Fresh {
        /// Which source.
        source: String,
    },
}

/// The sending half of the controller's channel; each event carries the instant it was seen.
#[derive(Clone)]
pub struct EventSender {
    tx: mpsc::Sender<(Instant, SourceEvent)>,
    /// Sees every event before it is sent (a source's own bookkeeping of what it passes on).
    tap: Option<Tap>,
}

/// What an [`EventSender`] shows each event to.
pub type Tap = std::sync::Arc<dyn Fn(&SourceEvent) + Send + Sync>;

impl fmt::Debug for EventSender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventSender").field("tapped", &self.tap.is_some()).finish()
    }
}

/// The receiving half.
pub type EventReceiver = mpsc::Receiver<(Instant, SourceEvent)>;

impl EventSender {
    /// A new channel.
    pub fn channel() -> (Self, EventReceiver) {
        let (tx, rx) = mpsc::channel();
        (Self { tx, tap: None }, rx)
    }

    /// A sender on the same channel that shows every event to `tap` before sending it.
    pub fn tapped(&self, tap: Tap) -> Self {
        Self { tx: self.tx.clone(), tap: Some(tap) }
    }

    /// Sends an event stamped now; false once the controller is gone.
    pub fn send(&self, event: SourceEvent) -> bool {
        if let Some(tap) = &self.tap {
            tap(&event);
        }
        self.tx.send((Instant::now(), event)).is_ok()
    }
}
