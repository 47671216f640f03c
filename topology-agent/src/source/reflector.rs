//! One kind's list-and-watch, written out rather than taken from kube-runtime's watcher, because
//! the agent must see what that hides: bookmarks, the end of each watch, and the silence of a
//! stalled one.
//!
//! A view is current only while its watch delivers. After a full list, the watch runs from the
//! list's resourceVersion in rounds the server ends after [`WATCH_TIMEOUT_S`] (with a bookmark
//! that keeps the resourceVersion current). The view counts as current once a watch has run
//! [`CONFIRM`] without failing — a list that succeeds proves nothing about the watch. Any failure
//! (an error, 410 Gone, or a watch silent for [`STALL`]: neither event, bookmark nor end) makes
//! it stale, and the next attempt lists again after a backoff from 1 s to 30 s.
//!
//! An update that converts to what was last sent of the object (a Node status heartbeat: nothing
//! the model reads changed) is dropped here, so it wakes neither the controller nor the policy.

use std::{collections::HashMap, fmt::Debug, hash::Hash, time::Duration};

use futures::TryStreamExt as _;
use kube::{
    Api, Resource, ResourceExt as _,
    api::{ListParams, WatchEvent, WatchParams},
};
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    EventSender, Invalid, Object, ObjectId, SourceEvent,
    pages::{PageError, Pages},
};
use crate::cluster::Kind;

/// Seconds after which the API server ends each watch round (the next round resumes from the
/// last resourceVersion): the longest a healthy watch stays silent.
pub const WATCH_TIMEOUT_S: u32 = 20;
/// A watch silent this long (no event, no bookmark, no end) is stalled: stale within 30 s.
pub const STALL: Duration = Duration::from_secs(25);
/// How long a watch must run after its list without failing before the view counts as current.
pub const CONFIRM: Duration = Duration::from_secs(2);
/// Objects per list page.
const PAGE: u32 = 500;
/// First wait before listing again after a failure; doubled up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// Longest wait between attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// How one kind's objects become model objects: `Ok(None)` for objects the model skips.
pub type Convert<K> = fn(&K) -> Result<Option<Object>, Box<Invalid>>;
/// The identity of a deleted object.
pub type Identify<K> = fn(&K, Kind) -> ObjectId;

/// Why one list-and-watch ended.
enum Ended {
    /// Shutdown, or the controller is gone.
    Stop,
    /// A failure, as `/readyz` names it.
    Failed(String),
}

/// Lists and watches `api` until `shutdown`, sending what it sees to `events`.
pub async fn run<K>(
    api: Api<K>,
    kind: Kind,
    convert: Convert<K>,
    identify: Identify<K>,
    events: EventSender,
    shutdown: CancellationToken,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let source = format!("{kind} watch");
    let mut backoff = FIRST_BACKOFF;
    // Until a list completes, lists are sent page by page.
    let mut listed = false;
    loop {
        let mut reflector =
            Reflector { api: &api, kind, convert, identify, events: &events, source: &source, sent: HashMap::new() };
        let failure = tokio::select! {
            () = shutdown.cancelled() => return,
            ended = reflector.list_and_watch(&mut backoff, &mut listed) => match ended {
                Ended::Stop => return,
                Ended::Failed(why) => why,
            },
        };
        tracing::warn!(kind = %kind, error = %failure, retry_in = ?backoff, "watch failed; keeping the last good state");
        if !events.send(SourceEvent::Stale { source: source.clone(), reason: failure, transient: true }) {
            return;
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

struct Reflector<'a, K: Resource> {
    api: &'a Api<K>,
    kind: Kind,
    convert: Convert<K>,
    identify: Identify<K>,
    events: &'a EventSender,
    source: &'a str,
    /// What was last sent of each object: its identity's hash → its model's hash.
    sent: HashMap<u64, u64>,
}

impl<K> Reflector<'_, K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    /// One full list (page by page unless `listed`: one completed before), then watch rounds
    /// until something fails.
    async fn list_and_watch(&mut self, backoff: &mut Duration, listed: &mut bool) -> Ended {
        let mut version = match self.list(!*listed).await {
            Ok(Some(version)) => version,
            Ok(None) => return Ended::Stop,
            Err(why) => return Ended::Failed(why),
        };
        *backoff = FIRST_BACKOFF;
        *listed = true;
        let mut confirm = Some(Instant::now() + CONFIRM);
        let params = WatchParams::default().timeout(WATCH_TIMEOUT_S);
        loop {
            let stream = match self.api.watch(&params, &version).await {
                Ok(stream) => stream,
                Err(error) => return Ended::Failed(describe(self.kind, &error)),
            };
            futures::pin_mut!(stream);
            loop {
                let deadline = Instant::now() + STALL;
                let item = tokio::select! {
                    () = tokio::time::sleep_until(confirm.unwrap_or(deadline)), if confirm.is_some() => {
                        confirm = None;
                        if !self.events.send(SourceEvent::Fresh { source: self.source.to_owned() }) {
                            return Ended::Stop;
                        }
                        continue;
                    }
                    () = tokio::time::sleep_until(deadline) => {
                        return Ended::Failed(format!(
                            "stalled: no event, bookmark or end of watch for {} s",
                            STALL.as_secs()
                        ));
                    }
                    item = stream.try_next() => item,
                };
                let event = match item {
                    // The server ended this round; the next resumes from `version`.
                    Ok(None) => break,
                    Ok(Some(event)) => event,
                    Err(error) => return Ended::Failed(describe(self.kind, &error)),
                };
                let sent = match event {
                    WatchEvent::Added(object) | WatchEvent::Modified(object) => {
                        version = object.resource_version().unwrap_or(version);
                        match (self.convert)(&object) {
                            Ok(Some(object)) => !self.changed(&object) || self.events.send(SourceEvent::Apply(object)),
                            Ok(None) => self.deleted((self.identify)(&object, self.kind)),
                            Err(bad) => {
                                self.sent.remove(&hash(&bad.id));
                                self.events.send(SourceEvent::Invalid(*bad))
                            }
                        }
                    }
                    WatchEvent::Deleted(object) => {
                        version = object.resource_version().unwrap_or(version);
                        self.deleted((self.identify)(&object, self.kind))
                    }
                    WatchEvent::Bookmark(bookmark) => {
                        version = bookmark.metadata.resource_version;
                        true
                    }
                    WatchEvent::Error(status) if status.code == 410 => {
                        return Ended::Failed(format!("resourceVersion {version} expired (410 Gone); listing again"));
                    }
                    WatchEvent::Error(status) => return Ended::Failed(describe_status(self.kind, &status)),
                };
                if !sent {
                    return Ended::Stop;
                }
            }
        }
    }

    /// Whether `object` differs from what was last sent of it (and if so, remembers it). An
    /// update that changes nothing the model reads — a Node's status heartbeat — stops here:
    /// the controller is not even woken. Hash collisions of identities only cost a resend.
    fn changed(&mut self, object: &Object) -> bool {
        let content = hash(object);
        self.sent.insert(hash(&object.id()), content) != Some(content)
    }

    fn deleted(&mut self, id: ObjectId) -> bool {
        self.sent.remove(&hash(&id));
        self.events.send(SourceEvent::Delete(id))
    }

    /// Every object, page by page, sent as one replacement (`paged`: each page as it is read,
    /// the last one as the replacement); the list's resourceVersion, `None` once the controller
    /// is gone.
    async fn list(&mut self, paged: bool) -> Result<Option<String>, String> {
        if paged && !self.events.send(SourceEvent::Listing(self.kind)) {
            return Ok(None);
        }
        let (mut objects, mut invalid) = (Vec::new(), Vec::new());
        let (mut listed, mut skipped) = (0, 0);
        let convert = self.convert;
        let params = ListParams::default().limit(PAGE);
        let mut pages =
            Pages::new(self.api.clone().into_client(), self.api.resource_url(), params, move |object: K| {
                convert(&object)
            });
        loop {
            let page = match tokio::time::timeout(STALL, pages.next()).await {
                Ok(Ok(Some(page))) => page,
                Ok(Ok(None)) => break,
                Ok(Err(PageError::Api(error))) => return Err(describe(self.kind, &error)),
                Ok(Err(PageError::Decode(why))) => {
                    return Err(format!("decoding a page of the {} list: {why}", self.kind));
                }
                Err(_) => return Err(format!("stalled: a list page took more than {} s", STALL.as_secs())),
            };
            for converted in page.items {
                match converted {
                    Ok(Some(object)) => objects.push(object),
                    Ok(None) => {}
                    Err(bad) => invalid.push(*bad),
                }
            }
            if paged && !page.last {
                (listed, skipped) = (listed + objects.len(), skipped + invalid.len());
                self.remember(&objects);
                let page = SourceEvent::ListPage { kind: self.kind, objects, invalid };
                if !self.events.send(page) {
                    return Ok(None);
                }
                (objects, invalid) = (Vec::new(), Vec::new());
            }
        }
        let version = pages.version().to_owned();
        (listed, skipped) = (listed + objects.len(), skipped + invalid.len());
        tracing::info!(kind = %self.kind, objects = listed, invalid = skipped, "listed");
        self.remember(&objects);
        let sent = self.events.send(SourceEvent::Replace { kind: self.kind, objects, invalid });
        Ok(sent.then_some(version))
    }

    /// Notes what was sent of `objects`, so that an update that converts to the same is dropped.
    fn remember(&mut self, objects: &[Object]) {
        self.sent.extend(objects.iter().map(|object| (hash(&object.id()), hash(object))));
    }
}

/// A 64-bit hash, the same for equal values within the process. foldhash, not SipHash: nothing
/// here faces an adversary (a collision of identities costs a resend), and a full list hashes
/// every object twice (with SipHash, 4 % of a 50,000-Service list's CPU).
fn hash(value: &impl Hash) -> u64 {
    use std::hash::BuildHasher as _;
    foldhash::fast::FixedState::default().hash_one(value)
}

/// A request failure as `/readyz` names it: throttling and missing permissions said plainly.
fn describe(kind: Kind, error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => describe_status(kind, status),
        other => other.to_string(),
    }
}

fn describe_status(kind: Kind, status: &kube::core::Status) -> String {
    match status.code {
        429 => format!("throttled by the API server (HTTP 429 {}): {}; backing off", status.reason, status.message),
        403 => format!(
            "forbidden (HTTP 403): {}; the agent's ServiceAccount needs get, list and watch on {kind}",
            status.message
        ),
        code => format!("HTTP {code} {}: {}", status.reason, status.message),
    }
}
