//! One kind's list-and-watch, written out rather than taken from kube-runtime's watcher, because
//! the agent must see what that hides: bookmarks, the end of each watch, and the silence of a
//! stalled one.
//!
//! A view is current only while its watch delivers. After a full list, the watch runs from the
//! list's resourceVersion in rounds the server ends after 5 to 10 minutes, drawn at random for
//! each round as client-go's reflector does (fixed rounds would bring a fleet's watches back in
//! step). The API server sends a bookmark about every minute and 2 s before a round's deadline,
//! so a healthy watch is never silent for longer than that: the view counts as current once a
//! watch has run [`CONFIRM`] without failing — a list that succeeds proves nothing about the
//! watch — and any failure (an error, 410 Gone, or a watch silent for [`STALL`]: neither event,
//! bookmark nor end) makes it stale.
//!
//! What comes next follows the rules client-go's reflector learned at fleet scale, since every
//! node runs one per kind and an API server restart fails them all at once:
//! - a transient failure (a connection refused or reset, a watch that would not open within
//!   [`WATCH_OPEN`], a stall, 429, 5xx) resumes the watch from the last resourceVersion: no list;
//! - only 410 Gone (the resourceVersion is compacted away) or another refusal lists again, and a
//!   relist after 410 is a consistent one, any other from the watch cache (`resourceVersion` of
//!   the last sync, `NotOlderThan`), which costs the API server no etcd read;
//! - attempts wait a backoff from 1 s doubling to 30 s, drawn at random below it (full jitter, so
//!   a fleet's retries spread out instead of arriving in lockstep), at least what a 429's
//!   `Retry-After` asks, and reset only once no failure came for [`BACKOFF_RESET`].
//!
//! An update that converts to what was last sent of the object (a Node status heartbeat: nothing
//! the model reads changed) is dropped here, so it wakes neither the controller nor the policy.

use std::{collections::HashMap, fmt::Debug, hash::Hash, time::Duration};

use futures::TryStreamExt as _;
use kube::{
    Api, Resource, ResourceExt as _,
    api::{ListParams, VersionMatch, WatchEvent, WatchParams},
};
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use topology_model::Kind;

use super::{
    EventSender, Invalid, Object, ObjectId, SourceEvent,
    pages::{PageError, Pages},
};

/// The shortest watch round, in seconds: each asks the server to end it after between this and
/// twice this (client-go's `minWatchTimeout`); the next round resumes from the last version.
pub const MIN_WATCH_TIMEOUT_S: u32 = 300;
/// The API server's bookmark cadence (its cacher's `bookmarkFrequency`).
pub const BOOKMARK_CADENCE: Duration = Duration::from_secs(60);
/// A watch silent this long (no event, no bookmark, no end) is stalled: a bookmark is a quarter
/// of the cadence late (the cacher sends them from a one-second timer, after other events).
pub const STALL: Duration = Duration::from_secs(BOOKMARK_CADENCE.as_secs() + 15);
/// How long a watch must run after its list without failing before the view counts as current.
pub const CONFIRM: Duration = Duration::from_secs(2);
/// A watch whose response has not begun this soon is given up (a peer gone without a reset).
pub const WATCH_OPEN: Duration = Duration::from_secs(10);
/// The backoff starts over once no failure came for this long (client-go's reflector: 2 minutes).
pub const BACKOFF_RESET: Duration = Duration::from_secs(120);
/// Objects per list page.
const PAGE: u32 = 500;
/// First wait before trying again after a failure; doubled up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// Longest wait between attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// How one kind's objects become model objects: `Ok(None)` for objects the model skips.
pub type Convert<K> = fn(&K) -> Result<Option<Object>, Box<Invalid>>;
/// The identity of a deleted object.
pub type Identify<K> = fn(&K, Kind) -> ObjectId;

/// Why one attempt ended.
enum Ended {
    /// Shutdown, or the controller is gone.
    Stop,
    /// A failure, as `/readyz` names it.
    Failed(Failure),
}

/// A failed attempt: why, and what the next one should do.
struct Failure {
    /// As `/readyz` names it.
    why: String,
    /// What comes next.
    next: Next,
    /// The server's `Retry-After`.
    retry_after: Option<Duration>,
}

/// What the attempt after a failure does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    /// Resume the watch from the last resourceVersion.
    Resume,
    /// List again from the watch cache, then watch.
    Relist,
    /// List again, consistently (the resourceVersion is gone), then watch.
    ConsistentRelist,
}

impl Failure {
    fn new(why: String, next: Next) -> Self {
        Self { why, next, retry_after: None }
    }

    /// A request's failure: transient ones resume, 410 relists consistently, others relist.
    fn of(kind: Kind, error: &kube::Error) -> Self {
        let why = describe(kind, error);
        match error {
            kube::Error::Api(status) => Self::of_status(why, status),
            // Connection refused or reset, a timeout, a broken stream: the server may be back soon.
            _ => Self::new(why, Next::Resume),
        }
    }

    fn of_status(why: String, status: &kube::core::Status) -> Self {
        let next = match status.code {
            410 | 504 => Next::ConsistentRelist,
            429 | 500.. => Next::Resume,
            _ => Next::Relist,
        };
        let retry_after = status
            .details
            .as_ref()
            .map(|details| details.retry_after_seconds)
            .filter(|seconds| *seconds > 0)
            .map(|seconds| Duration::from_secs(u64::from(seconds)));
        Self { why, next, retry_after }
    }
}

/// The wait between attempts: exponential, full jitter, reset after a quiet [`BACKOFF_RESET`].
pub(super) struct Backoff {
    ceiling: Duration,
    last_failure: Option<Instant>,
}

impl Backoff {
    pub(super) fn new() -> Self {
        Self { ceiling: FIRST_BACKOFF, last_failure: None }
    }

    /// The wait before the next attempt after a failure now, at least `retry_after`.
    pub(super) fn next(&mut self, retry_after: Option<Duration>) -> Duration {
        if self.last_failure.is_some_and(|at| at.elapsed() >= BACKOFF_RESET) {
            self.ceiling = FIRST_BACKOFF;
        }
        self.last_failure = Some(Instant::now());
        let wait = self.ceiling.mul_f64(rand::random::<f64>());
        self.ceiling = (self.ceiling * 2).min(MAX_BACKOFF);
        wait.max(retry_after.unwrap_or_default())
    }
}

/// What one reflector lists and watches, and how it reads it.
pub struct Watched<K> {
    /// The resource.
    pub api: Api<K>,
    /// Its kind in the model.
    pub kind: Kind,
    /// Object to model object.
    pub convert: Convert<K>,
    /// A deleted object's identity.
    pub identify: Identify<K>,
    /// Ask for `PartialObjectMetadata` (the objects' metadata only, decoded as `K` without the
    /// rest): a fraction of the bytes where the rest is large and changes often.
    pub metadata_only: bool,
    /// A field selector (`metadata.name=node-a`): only the objects it selects are listed and
    /// watched.
    pub fields: Option<String>,
    /// The model already holds a complete list of this kind (the watch is restarted with other
    /// options): lists are sent whole, never page by page.
    pub listed: bool,
}

/// Lists and watches `watched` until `shutdown`, sending what it sees to `events`.
pub async fn run<K>(watched: Watched<K>, events: EventSender, shutdown: CancellationToken)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let Watched { api, kind, convert, identify, metadata_only, fields, listed } = watched;
    let source = format!("{kind} watch");
    let mut backoff = Backoff::new();
    let mut reflector = Reflector {
        api: &api,
        kind,
        convert,
        identify,
        events: &events,
        source: &source,
        sent: HashMap::new(),
        version: None,
        listed,
        metadata_only,
        fields,
    };
    let mut next = Next::ConsistentRelist;
    loop {
        let failure = tokio::select! {
            () = shutdown.cancelled() => return,
            ended = reflector.attempt(next) => match ended {
                Ended::Stop => return,
                Ended::Failed(failure) => failure,
            },
        };
        next = if reflector.version.is_none() { Next::ConsistentRelist } else { failure.next };
        let wait = backoff.next(failure.retry_after);
        tracing::warn!(kind = %kind, error = %failure.why, next = ?next, retry_in = ?wait, "watch failed; keeping the last good state");
        if !events.send(SourceEvent::Stale { source: source.clone(), reason: failure.why, transient: true }) {
            return;
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
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
    /// The resourceVersion the view is at (the last list's, then each event's and bookmark's).
    version: Option<String>,
    /// A list completed: relists are sent whole, not page by page.
    listed: bool,
    /// Objects are asked for as `PartialObjectMetadata`.
    metadata_only: bool,
    /// The field selector of every list and watch.
    fields: Option<String>,
}

impl<K> Reflector<'_, K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    /// One attempt: a list unless `next` resumes (page by page until one completed), then watch
    /// rounds until something fails.
    async fn attempt(&mut self, next: Next) -> Ended {
        let resume = self.version.clone().filter(|_| next == Next::Resume);
        let mut version = match resume {
            Some(version) => version,
            None => {
                let from_cache = self.version.clone().filter(|_| next == Next::Relist);
                match self.list(from_cache).await {
                    Ok(Some(version)) => version,
                    Ok(None) => return Ended::Stop,
                    Err(failure) => return Ended::Failed(failure),
                }
            }
        };
        self.version = Some(version.clone());
        let mut confirm = Some(Instant::now() + CONFIRM);
        loop {
            let round = MIN_WATCH_TIMEOUT_S + rand::random_range(0..MIN_WATCH_TIMEOUT_S);
            let mut params = WatchParams::default().timeout(round);
            if let Some(fields) = &self.fields {
                params = params.fields(fields);
            }
            let stream = match tokio::time::timeout(WATCH_OPEN, self.watch(&params, &version)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => return Ended::Failed(Failure::of(self.kind, &error)),
                Err(_) => {
                    let why = format!("a watch did not open within {} s", WATCH_OPEN.as_secs());
                    return Ended::Failed(Failure::new(why, Next::Resume));
                }
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
                        let why = format!("stalled: no event, bookmark or end of watch for {} s", STALL.as_secs());
                        return Ended::Failed(Failure::new(why, Next::Resume));
                    }
                    item = stream.try_next() => item,
                };
                let event = match item {
                    // The server ended this round; the next resumes from `version`.
                    Ok(None) => break,
                    Ok(Some(event)) => event,
                    Err(error) => return Ended::Failed(Failure::of(self.kind, &error)),
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
                        let why = format!("resourceVersion {version} expired (410 Gone); listing again");
                        return Ended::Failed(Failure::new(why, Next::ConsistentRelist));
                    }
                    WatchEvent::Error(status) => {
                        return Ended::Failed(Failure::of_status(describe_status(self.kind, &status), &status));
                    }
                };
                if !sent {
                    return Ended::Stop;
                }
                self.version = Some(version.clone());
            }
        }
    }

    /// Opens a watch from `version`, of whole objects or of their metadata.
    async fn watch(
        &self,
        params: &WatchParams,
        version: &str,
    ) -> kube::Result<impl futures::Stream<Item = kube::Result<WatchEvent<K>>> + use<K>> {
        let request = kube::core::Request::new(self.api.resource_url());
        let built =
            if self.metadata_only { request.watch_metadata(params, version) } else { request.watch(params, version) };
        let mut request = built.map_err(kube::Error::BuildRequest)?;
        request.extensions_mut().insert("watch");
        self.api.clone().into_client().request_events::<K>(request).await
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

    /// Every object, sent as one replacement (each page as it is read, the last one as the
    /// replacement, until a list completed); `from_cache`: the resourceVersion the API server's
    /// watch cache must be at least at, else a consistent list. The list's resourceVersion,
    /// `None` once the controller is gone.
    async fn list(&mut self, from_cache: Option<String>) -> Result<Option<String>, Failure> {
        let paged = !self.listed;
        if paged && !self.events.send(SourceEvent::Listing(self.kind)) {
            return Ok(None);
        }
        // The list replaces everything: an object deleted meanwhile and made again the same must
        // not look unchanged.
        self.sent.clear();
        let (mut objects, mut invalid) = (Vec::new(), Vec::new());
        let (mut listed, mut skipped) = (0, 0);
        let convert = self.convert;
        let mut params = ListParams::default().limit(PAGE);
        if let Some(fields) = &self.fields {
            params = params.fields(fields);
        }
        if let Some(version) = &from_cache {
            params = params.at(version).matching(VersionMatch::NotOlderThan);
        }
        let mut pages = Pages::new(
            self.api.clone().into_client(),
            self.api.resource_url(),
            params,
            self.metadata_only,
            move |object: K| convert(&object),
        );
        loop {
            let page = match tokio::time::timeout(STALL, pages.next()).await {
                Ok(Ok(Some(page))) => page,
                Ok(Ok(None)) => break,
                Ok(Err(PageError::Api(error))) => {
                    let mut failure = Failure::of(self.kind, &error);
                    // A list is never resumed: what was read of it is thrown away.
                    if failure.next == Next::Resume {
                        failure.next = if from_cache.is_some() { Next::Relist } else { Next::ConsistentRelist };
                    }
                    return Err(failure);
                }
                Ok(Err(error @ (PageError::Decode(_) | PageError::Decoder(_)))) => {
                    let why = format!("{} list: {error}", self.kind);
                    return Err(Failure::new(why, Next::ConsistentRelist));
                }
                Err(_) => {
                    let why = format!("stalled: a list page took more than {} s", STALL.as_secs());
                    return Err(Failure::new(why, Next::ConsistentRelist));
                }
            };
            if page.restarted {
                // The pages so far are void: this one holds every object.
                (objects, invalid, listed, skipped) = (Vec::new(), Vec::new(), 0, 0);
                self.sent.clear();
                if paged && !self.events.send(SourceEvent::Listing(self.kind)) {
                    return Ok(None);
                }
            }
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
        self.listed = true;
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
            "forbidden (HTTP 403): {}; the agent's ServiceAccount needs list and watch on {kind}",
            status.message
        ),
        code => format!("HTTP {code} {}: {}", status.reason, status.message),
    }
}
