//! The fake's storage, as etcd and the API server's watch cache keep it: every object at its
//! current resourceVersion, and each resource's changes since its compaction — enough to answer
//! a list or a watch as of any resourceVersion not yet compacted away (a list's later pages are
//! read at its first page's resourceVersion, as etcd's snapshot reads are).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    ops::Bound,
    time::Duration,
};

use hyper::body::Bytes;
use serde_json::Value;

use super::{Resource, fields::Fields, wire};

/// The history kept per resource for watches to resume from, in serialized bytes; past it the
/// oldest half is compacted away (a watch resuming from there gets 410 Gone), as the API server's
/// watch cache of each resource keeps a bounded window.
const HISTORY_BYTES: usize = 128 << 20;

/// The API server's bookmark cadence: a watch asking for bookmarks gets one about every minute
/// (the cacher's `bookmarkFrequency`), and one 2 s before the watch's deadline.
pub const BOOKMARK_EVERY: Duration = Duration::from_secs(60);

/// An object's identity within its resource: (namespace, name).
pub(super) type Name = (String, String);
pub(super) type Key = (Resource, String, String);

#[derive(Default)]
pub(super) struct Store {
    pub(super) resource_version: u64,
    pub(super) objects: BTreeMap<Key, Stored>,
    /// Every change since compaction, per resource.
    history: HashMap<Resource, History>,
    /// The resourceVersion up to which every resource's history is forgotten.
    compacted: u64,
    /// While the watch cache lags (an HA replica behind the others): the version it is at.
    pub(super) cache_at: Option<u64>,
    /// The bookmark cadence (`None`: [`BOOKMARK_EVERY`]).
    pub(super) bookmark_every: Option<Duration>,
    pub(super) held: BTreeSet<Resource>,
    /// Resources whose list pages after the first are held.
    pub(super) held_continues: BTreeSet<Resource>,
    pub(super) down: bool,
    /// Every request answered with this status.
    pub(super) failing: Option<u16>,
    /// Watch requests answered with this status; lists still work.
    pub(super) failing_watches: Option<u16>,
    /// Watch requests get no response, not even headers, while set.
    pub(super) hang_watch_opens: bool,
    /// `retryAfterSeconds` of a 429, in the Status body as the API server sends it.
    pub(super) retry_after: u32,
    /// When each request came.
    pub(super) request_times: Vec<std::time::Instant>,
    /// Watches stay open and send nothing, not even bookmarks.
    pub(super) stalled: bool,
    pub(super) lists: HashMap<Resource, usize>,
    pub(super) watches: HashMap<Resource, usize>,
    /// The `timeoutSeconds` of every watch request, in order (`None`: not given).
    pub(super) watch_timeouts: Vec<Option<u64>>,
    /// Events (`events.k8s.io/v1`) by namespace and name, in the order they were created.
    pub(super) events: Vec<Value>,
    pub(super) requests: usize,
    /// Bytes of list and watch bodies sent, per resource.
    pub(super) sent: HashMap<Resource, u64>,
    /// Changes recorded (watch events), per resource.
    pub(super) changed: HashMap<Resource, u64>,
}

/// An object, and its JSON as lists send it: the part of its last event line that is the object
/// (no copy), so a list writes bytes instead of serializing every object again.
pub(super) struct Stored {
    pub(super) value: Value,
    pub(super) json: Bytes,
}

/// One change of one object.
struct Change {
    version: u64,
    /// The watch event line, serialized once for every watcher.
    line: Bytes,
    name: Name,
    /// The object's JSON before the change (`None`: it did not exist).
    before: Option<Bytes>,
}

/// One resource's changes since its compaction.
#[derive(Default)]
struct History {
    changes: Vec<Change>,
    /// The bytes of the changes' lines.
    bytes: usize,
    /// Changes up to this resourceVersion are forgotten.
    compacted: u64,
}

/// One page of a list as of some resourceVersion.
pub(super) struct Page {
    /// The objects' JSON, in key order.
    pub(super) items: Vec<Bytes>,
    /// The last object's name when more follow.
    pub(super) next: Option<Name>,
    /// How many objects follow (`remainingItemCount`), when no selector hides them.
    pub(super) remaining: Option<usize>,
}

impl Store {
    /// Adds or replaces `object` at `key` and records the change (ADDED or MODIFIED).
    pub(super) fn put(&mut self, key: Key, mut object: Value) -> u64 {
        let before = self.objects.get(&key).map(|stored| stored.json.clone());
        let kind = if before.is_some() { "MODIFIED" } else { "ADDED" };
        let (version, json) = self.record(&key, kind, &mut object, before);
        self.objects.insert(key, Stored { value: object, json });
        version
    }

    /// Deletes the object at `key`, recording the change; its resourceVersion, if it existed.
    pub(super) fn remove(&mut self, key: &Key) -> Option<u64> {
        let Stored { mut value, json } = self.objects.remove(key)?;
        Some(self.record(key, "DELETED", &mut value, Some(json)).0)
    }

    /// Records a change for the watches: `object` as a `kind` event at the next resourceVersion;
    /// its resourceVersion and JSON.
    fn record(&mut self, key: &Key, kind: &str, object: &mut Value, before: Option<Bytes>) -> (u64, Bytes) {
        self.resource_version += 1;
        let version = self.resource_version;
        object["metadata"]["resourceVersion"] = version.to_string().into();
        let (line, json) = wire::event(kind, object);
        *self.changed.entry(key.0).or_default() += 1;
        let history = self.history.entry(key.0).or_default();
        history.bytes += line.len();
        history.changes.push(Change { version, line, name: (key.1.clone(), key.2.clone()), before });
        if history.bytes > HISTORY_BYTES {
            let drop = history.changes.len() / 2;
            history.compacted = history.changes[drop - 1].version;
            history.bytes -= history.changes.drain(..drop).map(|change| change.line.len()).sum::<usize>();
        }
        (version, json)
    }

    /// Forgets every change so far, as etcd's compaction does: nothing older can be read.
    pub(super) fn compact(&mut self) {
        self.compacted = self.resource_version;
        self.history.clear();
    }

    /// The oldest resourceVersion of `resource` that can still be read.
    pub(super) fn compacted(&self, resource: Resource) -> u64 {
        self.history.get(&resource).map_or(0, |h| h.compacted).max(self.compacted)
    }

    /// The version the watch cache is at (behind the store only while it lags).
    pub(super) fn cache_version(&self) -> u64 {
        self.cache_at.unwrap_or(self.resource_version)
    }

    /// The watch event lines of `resource` after resourceVersion `after` up to `upto`, of the
    /// objects `fields` selects; `None` when some were compacted away.
    pub(super) fn events_after(
        &self,
        resource: Resource,
        after: u64,
        upto: u64,
        fields: &Fields,
    ) -> Option<Vec<Bytes>> {
        if after < self.compacted(resource) {
            return None;
        }
        let Some(history) = self.history.get(&resource) else { return Some(Vec::new()) };
        let first = history.changes.partition_point(|c| c.version <= after);
        let last = history.changes.partition_point(|c| c.version <= upto);
        let changes = history.changes[first..last.max(first)].iter();
        Some(
            changes
                .filter(|change| fields.selects(&change.name.0, &change.name.1))
                .map(|change| change.line.clone())
                .collect(),
        )
    }

    /// `resource`'s objects that `fields` selects as they were at `version`, in key order,
    /// starting after `after`, at most `limit`; `None` when that version was compacted away.
    pub(super) fn page_at(
        &self,
        resource: Resource,
        version: u64,
        (after, limit): (Option<&Name>, usize),
        fields: &Fields,
    ) -> Option<Page> {
        if version < self.compacted(resource) {
            return None;
        }
        // What changed after `version`, undone: each name's state before its first later change.
        let mut undone: BTreeMap<&Name, Option<&Bytes>> = BTreeMap::new();
        if let Some(history) = self.history.get(&resource) {
            let first = history.changes.partition_point(|c| c.version <= version);
            for change in &history.changes[first..] {
                undone.entry(&change.name).or_insert(change.before.as_ref());
            }
        }
        let start = match after {
            Some((namespace, name)) => Bound::Excluded((resource, namespace.clone(), name.clone())),
            None => Bound::Included((resource, String::new(), String::new())),
        };
        let mut now = self
            .objects
            .range((start, Bound::Unbounded))
            .take_while(|(key, _)| key.0 == resource)
            .map(|((_, namespace, name), stored)| ((namespace, name), Some(&stored.json)))
            .peekable();
        let mut then = undone
            .iter()
            .filter(|(name, _)| after.is_none_or(|after| **name > after))
            .map(|(name, json)| ((&name.0, &name.1), *json))
            .peekable();
        let mut merged = std::iter::from_fn(|| {
            let take_now = match (now.peek(), then.peek()) {
                (None, None) => return None,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some((a, _)), Some((b, _))) => a < b,
            };
            if take_now {
                return now.next();
            }
            let (name, json) = then.next()?;
            // The same name now and then: then's state wins.
            if now.peek().is_some_and(|(current, _)| *current == name) {
                now.next();
            }
            Some((name, json))
        })
        .filter_map(|(name, json)| Some((name, json?)))
        .filter(|((namespace, name), _)| fields.selects(namespace, name))
        .peekable();
        let (mut items, mut last) = (Vec::new(), None);
        while items.len() < limit
            && let Some((name, json)) = merged.next()
        {
            items.push(json.clone());
            last = Some(name);
        }
        let next = last.filter(|_| merged.peek().is_some()).map(|(namespace, name)| (namespace.clone(), name.clone()));
        // The etcd3 store counts what a page leaves out, but not through a selector.
        let remaining = (next.is_some() && fields.everything()).then(|| merged.count());
        Some(Page { items, next, remaining })
    }

    /// The bookmark cadence.
    pub(super) fn bookmark_every(&self) -> Duration {
        self.bookmark_every.unwrap_or(BOOKMARK_EVERY)
    }
}
