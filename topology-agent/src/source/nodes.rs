//! Which part of the Nodes the agent watches: only what the Services it serves read.
//!
//! Routing reads a Node's labels (zone, region, hostname, any topology key); only capacity-aware
//! spillover reads more — `status.allocatable.cpu` and the Ready condition, for the demand of each
//! zone. A Node's status is most of its bytes (the images a kubelet lists) and changes with every
//! status report of every kubelet, so the Node watch asks for `PartialObjectMetadata` unless some
//! Service asks for spillover, and for whole Nodes while one does. The Services' own watch says
//! which: a tap on it keeps the set of Services with the spillover annotation, and the Node watch
//! starts once the Services are listed and starts over (a relist, sent whole) when the need
//! changes.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
};

use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{
    EventSender, Object, ObjectId, SourceEvent,
    reflector::{self, Convert, Identify, Watched},
};
use crate::cluster::{Kind, ObjectKey, convert::NodeView};

/// Whether whole Nodes are needed: `None` until the Services are listed.
pub type Need = watch::Receiver<Option<bool>>;

/// The Services that read the Nodes' status, as the Service watch passes them on.
#[derive(Default)]
struct Readers {
    /// Services whose spillover needs the demand of each zone.
    now: HashSet<ObjectKey>,
    /// Those of the list in progress.
    listing: HashSet<ObjectKey>,
    /// A list of Services completed.
    listed: bool,
}

impl Readers {
    fn see(&mut self, event: &SourceEvent) {
        let reads = |object: &Object| match object {
            Object::Service(service) if service.depends_on_demand() => Some(service.key.clone()),
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
                    Some(key) => self.now.insert(key),
                    None => self.now.remove(&service.key),
                };
            }
            SourceEvent::Delete(ObjectId::Service(key)) => {
                self.now.remove(key);
            }
            _ => {}
        }
    }

    fn need(&self) -> Option<bool> {
        self.listed.then_some(!self.now.is_empty())
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

/// The Node watch, of metadata or whole Nodes as `need` says, until `shutdown`.
pub async fn run(
    client: Client,
    convert: Convert<NodeView>,
    identify: Identify<NodeView>,
    events: EventSender,
    mut need: Need,
    shutdown: CancellationToken,
) {
    let mut listed = false;
    loop {
        let whole = loop {
            if let Some(whole) = *need.borrow_and_update() {
                break whole;
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                changed = need.changed() => if changed.is_err() { return },
            }
        };
        tracing::info!(
            whole,
            "watching Nodes {}",
            if whole { "whole (a Service uses spillover)" } else { "as metadata" }
        );
        let round = shutdown.child_token();
        let watched = Watched {
            api: Api::<NodeView>::all(client.clone()),
            kind: Kind::Node,
            convert,
            identify,
            metadata_only: !whole,
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
                    if *need.borrow() != Some(whole) {
                        break;
                    }
                }
            }
        }
        round.cancel();
        task.await;
        listed = true;
    }
}
