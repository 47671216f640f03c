//! The census of the Nodes an agent does not watch (see `nodes.rs`): every Node's metadata, listed
//! from the API server's watch cache (`resourceVersion=0`: no etcd read, no consistency wait)
//! when the agent starts watching its own Node alone, then every 10 to 20 minutes, the draw
//! spreading a fleet's lists apart. A failed census keeps the last one.

use std::time::Duration;

use kube::{Api, Client, api::ListParams};
use tokio_util::sync::CancellationToken;
use topology_model::{
    census::{Census, Counted},
    convert::NodeView,
    objects::{LABEL_REGION, LABEL_ZONE},
};

use super::{
    EventSender, SourceEvent,
    pages::{PageError, Pages},
    reflector::{Backoff, STALL},
};

/// The source `/readyz` names when a census fails.
const SOURCE: &str = "Node census";

/// The shortest time between two censuses; the longest is twice it.
pub const CENSUS_EVERY: Duration = Duration::from_secs(600);

/// Takes a census, trying until one succeeds, and sends it; `None` once `stop` is cancelled or
/// the controller is gone.
pub async fn take(client: &Client, events: &EventSender, stop: &CancellationToken) -> Option<Census> {
    let mut backoff = Backoff::new();
    loop {
        let failed = tokio::select! {
            () = stop.cancelled() => return None,
            listed = list(client) => match listed {
                Ok(census) => {
                    tracing::info!(nodes = census.nodes(), zones = census.regions().len(), "took a census of the Nodes");
                    let fresh = SourceEvent::Fresh { source: SOURCE.into() };
                    return (events.send(SourceEvent::Census(Some(census.clone()))) && events.send(fresh)).then_some(census);
                }
                Err(error) => error,
            },
        };
        let wait = backoff.next(None);
        tracing::warn!(error = %failed, retry_in = ?wait, "a census of the Nodes failed; keeping the last one");
        // `/readyz` names it once it lasts (until the first census, nothing is programmed).
        if !events.send(SourceEvent::Stale { source: SOURCE.into(), reason: failed.to_string(), transient: true }) {
            return None;
        }
        tokio::select! {
            () = stop.cancelled() => return None,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// Takes a census every [`CENSUS_EVERY`] to twice that, until `stop`.
pub async fn every(client: Client, events: EventSender, stop: CancellationToken) {
    loop {
        let wait = CENSUS_EVERY + CENSUS_EVERY.mul_f64(rand::random::<f64>());
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        // The controller takes an unchanged census as nothing new.
        if take(&client, &events, &stop).await.is_none() {
            return;
        }
    }
}

/// Why a census failed.
#[derive(Debug, thiserror::Error)]
enum CensusError {
    #[error(transparent)]
    List(#[from] PageError),
    #[error("stalled: a page of the census took more than {} s", STALL.as_secs())]
    Stalled,
}

/// One census: every Node's metadata from the watch cache.
async fn list(client: &Client) -> Result<Census, CensusError> {
    let url = Api::<NodeView>::all(client.clone()).resource_url().to_owned();
    // resourceVersion=0 without a match: any version, from the watch cache, whole.
    let params = ListParams::default().at("0");
    let mut pages = Pages::new(client.clone(), &url, params, true, |node: NodeView| counted(&node));
    let mut nodes = Vec::new();
    while let Some(page) = tokio::time::timeout(STALL, pages.next()).await.map_err(|_| CensusError::Stalled)?? {
        if page.restarted {
            nodes.clear();
        }
        nodes.extend(page.items);
    }
    Ok(Census::new(nodes))
}

fn counted(node: &NodeView) -> Counted {
    let label = |key: &str| {
        let labels = node.metadata.labels.as_ref()?;
        labels.get(key).filter(|value| !value.is_empty()).cloned()
    };
    Counted {
        name: node.metadata.name.clone().unwrap_or_default(),
        zone: label(LABEL_ZONE),
        region: label(LABEL_REGION),
    }
}
