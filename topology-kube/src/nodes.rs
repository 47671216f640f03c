//! Which part of the Nodes the agent watches: only what the Services it serves read.
//!
//! A Node's status is most of its bytes (the images a kubelet lists) and changes with every
//! status report of every kubelet; even its metadata changes with each (managedFields carry the
//! report's time), so at 5,000 Nodes every agent watching every Node's metadata received every
//! report: 0.9 MB/s each. What routing reads of the other Nodes comes mostly from elsewhere: an
//! endpoint's zone and node name are in its EndpointSlice. So the scope follows the Services:
//! - [`NodeScope::ThisNode`], the default: this Node alone (a field selector), and the others from a
//!   census — a list of every Node's metadata from the API server's watch cache every 10 to 20
//!   minutes — for the region of each zone and this agent's share of the cluster-wide Events;
//! - [`NodeScope::Labels`] while some Service's topology keys name another Node label: every Node's
//!   metadata, watched;
//! - [`NodeScope::Whole`] while some Service uses capacity spillover: every Node whole, for the
//!   allocatable CPU and readiness of each zone.
//!
//! The Services' own watch says which: a tap on it keeps the Services of each need, and the Node
//! watch starts once the Services are listed and starts over (a relist, sent whole) when the
//! scope changes.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use topology_model::{Kind, ObjectKey, Service, convert::NodeView};

use super::{
    EventSender, Object, ObjectId, SourceEvent, census,
    reflector::{self, Convert, Identify, Watched},
};

/// How much of the Nodes the Services need.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum NodeScope {
    /// This Node, and a census of the others.
    ThisNode,
    /// Every Node's metadata.
    Labels,
    /// Every Node whole.
    Whole,
}

impl NodeScope {
    /// What `service` needs.
    fn of(service: &Service) -> Self {
        if service.depends_on_demand() {
            Self::Whole
        } else if service.reads_node_labels() {
            Self::Labels
        } else {
            Self::ThisNode
        }
    }
}

/// The scope the Services need: `None` until they are listed.
pub type Need = watch::Receiver<Option<NodeScope>>;

/// The Services that need more than this Node, by what they need, as the Service watch passes
/// them on.
#[derive(Default)]
struct Readers {
    now: HashMap<ObjectKey, NodeScope>,
    /// Those of the list in progress.
    listing: HashMap<ObjectKey, NodeScope>,
    /// A list of Services completed.
    listed: bool,
}

impl Readers {
    fn see(&mut self, event: &SourceEvent) {
        let reads = |object: &Object| match object {
            Object::Service(service) => {
                Some((service.key.clone(), NodeScope::of(service))).filter(|(_, scope)| *scope != NodeScope::ThisNode)
            }
            _ => None,
        };
        match event {
            SourceEvent::Listing(Kind::Service) => self.listing.clear(),
            SourceEvent::ListPage { kind: Kind::Service, objects, .. } => {
                self.listing.extend(objects.iter().filter_map(reads));
            }
            SourceEvent::Replace { kind: Kind::Service, objects, .. } => {
                self.listing.extend(objects.iter().filter_map(reads));
                self.now = std::mem::take(&mut self.listing);
                self.listed = true;
            }
            SourceEvent::Apply(object @ Object::Service(service)) => {
                match reads(object) {
                    Some((key, scope)) => self.now.insert(key, scope),
                    None => self.now.remove(&service.key),
                };
            }
            SourceEvent::Delete(ObjectId::Service(key)) => {
                self.now.remove(key);
            }
            _ => {}
        }
    }

    fn need(&self) -> Option<NodeScope> {
        self.listed.then(|| self.now.values().copied().max().unwrap_or(NodeScope::ThisNode))
    }
}

/// `events` for the Service watch, tapped to follow which Services read the Nodes' status, and
/// what that says the Node watch needs.
pub fn services_tap(events: &EventSender) -> (EventSender, Need) {
    let (need, watched) = watch::channel(None);
    let readers = Mutex::new(Readers::default());
    let tap = Arc::new(move |event: &SourceEvent| {
        let mut readers = readers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        readers.see(event);
        need.send_if_modified(|was| {
            let now = readers.need();
            std::mem::replace(was, now) != now
        });
    });
    (events.tapped(tap), watched)
}

/// How the Node watch reads the Nodes.
#[derive(Clone, Copy)]
pub struct Reading {
    /// Node to model object.
    pub convert: Convert<NodeView>,
    /// A deleted Node's identity.
    pub identify: Identify<NodeView>,
}

/// The Node watch of node `node`'s agent (`None`: of no node's, every Node is read), of the scope
/// `need` says, until `shutdown`.
pub async fn run(
    client: Client,
    node: Option<String>,
    reading: Reading,
    events: EventSender,
    mut need: Need,
    shutdown: CancellationToken,
) {
    let (mut listed, mut censused) = (false, false);
    let floor = |scope: Option<NodeScope>| match (&node, scope) {
        (None, Some(scope)) => Some(scope.max(NodeScope::Labels)),
        (_, scope) => scope,
    };
    loop {
        let scope = loop {
            if let Some(scope) = floor(*need.borrow_and_update()) {
                break scope;
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                changed = need.changed() => if changed.is_err() { return },
            }
        };
        tracing::info!(scope = ?scope, "watching Nodes {}", match scope {
            NodeScope::ThisNode => "of this node alone (a census of the others every 10-20 min)",
            NodeScope::Labels => "as metadata (a Service's topology keys name another Node label)",
            NodeScope::Whole => "whole (a Service uses spillover)",
        });
        let round = shutdown.child_token();
        let census = if scope == NodeScope::ThisNode {
            // The census comes first: until it is in, this agent's share of the Events is unknown.
            if census::take(&client, &events, &round).await.is_none() {
                return;
            }
            censused = true;
            Some(tokio::spawn(census::every(client.clone(), events.clone(), round.clone())))
        } else {
            // Every Node is watched now: the census is void.
            if std::mem::take(&mut censused) && !events.send(SourceEvent::Census(None)) {
                return;
            }
            None
        };
        let watched = Watched {
            api: Api::<NodeView>::all(client.clone()),
            kind: Kind::Node,
            convert: reading.convert,
            identify: reading.identify,
            metadata_only: scope != NodeScope::Whole,
            fields: node.as_ref().filter(|_| scope == NodeScope::ThisNode).map(|node| format!("metadata.name={node}")),
            listed,
        };
        let task = reflector::run(watched, events.clone(), round.clone());
        tokio::pin!(task);
        loop {
            tokio::select! {
                () = &mut task => return,
                changed = need.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if floor(*need.borrow()) != Some(scope) {
                        break;
                    }
                }
            }
        }
        round.cancel();
        task.await;
        if let Some(census) = census {
            let _ = census.await;
        }
        listed = true;
    }
}
