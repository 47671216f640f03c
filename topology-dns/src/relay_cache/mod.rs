//! The cache of relayed answers: what the upstream answered, kept for its TTL (capped) and served
//! again with the TTLs counted down; negative answers kept as RFC 2308 bounds them; expired
//! answers served when the upstream fails (RFC 8767, with a 30 s TTL); a popular answer fetched
//! again shortly before it expires, so it never expires for its users. Bounded in bytes, evicting
//! by CLOCK (a second chance for the recently used). Sharded, so the responder's threads seldom
//! meet on a lock. Each answer is charged to the client whose query brought it, and no client
//! keeps more than [`SOURCE_SHARE`] of the cache: one pod asking unique names cannot push the
//! node's popular answers out.

mod shard;
pub mod wire;

use std::{
    collections::HashMap,
    hash::BuildHasher,
    net::IpAddr,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use prometheus_client::metrics::{counter::Counter, gauge::Gauge};
use shard::Shard;

/// Shards of the cache: about twice the responder's threads on a large node.
const SHARDS: usize = 32;
/// The TTL of an answer served stale (RFC 8767 §4).
const STALE_TTL: u32 = 30;
/// What an entry costs beyond its bytes (key, map slot, ring slot), for the budget.
const OVERHEAD: usize = 96;
/// The part of the cache one client's answers may take at most: 1/8, so that it takes eight busy
/// clients to fill it, and a flood of unique names from one pod evicts at most an eighth of what
/// the others keep. Answers a popular name brings are charged once, to its first asker.
pub const SOURCE_SHARE: usize = 8;

/// The memory the cache takes unless told (`--dns-cache-mib`), MiB.
pub const DEFAULT_MIB: usize = 16;
/// The longest a positive answer is kept unless told (`--dns-cache-max-ttl`), seconds.
pub const DEFAULT_MAX_TTL: u32 = 300;
/// The longest a negative answer is kept unless told (`--dns-cache-max-negative-ttl`), seconds.
pub const DEFAULT_MAX_NEGATIVE_TTL: u32 = 30;
/// How long after expiry a popular answer is still served, with TTL 0, while it is fetched
/// again: a refresh normally lands within a round trip. Behind a cache of its own (CoreDNS's
/// `cache 30`) a refresh brings what is left of the upstream's TTL, down to a second, and every
/// answer the upstream cached at one moment expires here at one moment too; without this, all
/// of their askers would wait for the upstream together.
const REFRESH_GRACE: Duration = Duration::from_secs(1);
/// Places the CLOCK hand of a shard moves at most, for one answer, to find answers of a client
/// over its share to evict.
const OWN_STEPS: usize = 16;
/// How long after expiry an answer may still be served when the upstream fails.
const STALE_FOR: Duration = Duration::from_secs(3600);

/// How the cache keeps answers (the responder's `--dns-cache-*` flags, see
/// [`DnsConfig::cache`](crate::DnsConfig::cache)).
#[derive(Clone, Copy, Debug)]
pub struct CacheSettings {
    /// The most memory answers take, bytes; 0: no cache.
    pub max_bytes: usize,
    /// The longest a positive answer is kept, seconds, whatever its TTL.
    pub max_ttl: u32,
    /// The longest a negative answer is kept, seconds.
    pub max_negative_ttl: u32,
    /// How long after expiry an answer may still be served when the upstream fails.
    pub stale_for: Duration,
}

impl Default for CacheSettings {
    fn default() -> Self {
        Self {
            max_bytes: DEFAULT_MIB << 20,
            max_ttl: DEFAULT_MAX_TTL,
            max_negative_ttl: DEFAULT_MAX_NEGATIVE_TTL,
            stale_for: STALE_FOR,
        }
    }
}

/// How a query asked, as far as it changes the answer: without EDNS (no OPT record may come
/// back, RFC 6891), with EDNS, or with EDNS asking for DNSSEC records (DO).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Asked {
    /// No OPT record.
    Plain,
    /// EDNS, DO clear.
    Edns,
    /// EDNS, DO set.
    Dnssec,
}

impl Asked {
    /// How `request` asked.
    pub fn of(request: &hickory_proto::op::Message) -> Self {
        match &request.edns {
            None => Self::Plain,
            Some(edns) if edns.flags().dnssec_ok => Self::Dnssec,
            Some(_) => Self::Edns,
        }
    }
}

/// A question as the cache knows it: its wire form with the name in lowercase, how it was asked,
/// and its CD bit.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key(Box<[u8]>);

impl Key {
    /// The key of `request`, a query of one question asked as `asked`; `None` for anything else.
    pub fn of(request: &[u8], asked: Asked) -> Option<Self> {
        if request.len() < 12 || request[2] & 0x80 != 0 || request.get(4..6)? != [0, 1] {
            return None;
        }
        let mut end = 12;
        loop {
            let len = usize::from(*request.get(end)?);
            if len == 0 {
                break;
            }
            if len & 0xC0 != 0 {
                return None;
            }
            end += 1 + len;
        }
        let question = request.get(12..end + 5)?;
        let (name, type_and_class) = question.split_at(question.len() - 4);
        let mut key = Vec::with_capacity(question.len() + 2);
        // Names compare without case (RFC 4343); the type and class are numbers, never folded
        // (TYPE97 is not HTTPS).
        key.extend(name.iter().map(u8::to_ascii_lowercase));
        key.extend_from_slice(type_and_class);
        key.push(asked as u8);
        // Checking Disabled (RFC 4035 §3.2.2): an answer fetched without validation is not one
        // for a client that wants it validated.
        key.push(request[3] & wire::CHECKING_DISABLED);
        Some(Self(key.into()))
    }
}

/// One kept answer.
struct Entry {
    /// The upstream's reply (id zero), TTLs as received.
    bytes: Box<[u8]>,
    ttl_offsets: Box<[u16]>,
    question_end: usize,
    stored: Instant,
    /// Seconds it is fresh for.
    keep_for: u32,
    /// Used since the ring last passed it.
    referenced: bool,
    /// Served since stored.
    hits: u32,
    /// A refresh is under way.
    refreshing: bool,
    /// The client it is charged to (`None`: the responder's own lookup).
    owner: Option<IpAddr>,
}

impl Entry {
    fn cost(&self) -> usize {
        self.bytes.len() + self.ttl_offsets.len() * 2 + OVERHEAD
    }

    /// A copy for `request`, each TTL `ttl(original)`.
    fn serve(&self, request: &[u8], ttl: impl Fn(u32) -> u32) -> Option<Vec<u8>> {
        let mut bytes = self.bytes.to_vec();
        wire::set_ttls(&mut bytes, &self.ttl_offsets, ttl);
        wire::address_to(&mut bytes, self.question_end, request).then_some(bytes)
    }
}

/// What the cache holds for a question.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    /// A fresh answer for the request, or a popular one expired less than a second ago
    /// (with TTL 0); `refresh`: the caller should fetch it again in the background (it is
    /// popular and about to expire, or just expired).
    Fresh { reply: Vec<u8>, refresh: bool },
    /// Nothing fresh: ask the upstream.
    Miss,
}

topology_metrics::metrics! {
    /// Hits, misses and what was served stale (`dns_cache_*`).
    pub struct CacheMetrics;
    exported {
        hits: Counter = Counter::default(), "dns_cache_hits", "Relayed names answered from the cache";
        misses: Counter = Counter::default(), "dns_cache_misses", "Relayed names asked of the upstream";
        stale: Counter = Counter::default(),
            "dns_cache_stale",
            "Relayed names answered from an expired entry because the upstream failed (RFC 8767)";
        refreshes: Counter = Counter::default(),
            "dns_cache_refreshes",
            "Popular relayed names fetched again before they expired";
        expired_served: Counter = Counter::default(),
            "dns_cache_expired_served",
            "Popular relayed names answered with TTL 0 from an entry expired less than a second ago while it was fetched again";
        evictions: Counter = Counter::default(),
            "dns_cache_evictions",
            "Entries dropped to stay within the cache's size";
        over_share: Counter = Counter::default(),
            "dns_cache_over_share",
            "Answers not kept because their client already keeps its share of the cache";
        bytes: Gauge = Gauge::default(), "dns_cache_bytes", "Memory the kept answers take, bytes";
    }
    nested {}
    own {}
}

/// The cache.
pub struct RelayCache {
    settings: CacheSettings,
    shards: Box<[Mutex<Shard>]>,
    hasher: foldhash::fast::RandomState,
    metrics: Arc<CacheMetrics>,
    /// Bytes kept per client; locked inside a shard's lock, never the other way.
    owned: Mutex<HashMap<IpAddr, usize>>,
}

impl RelayCache {
    /// An empty cache, counting into `metrics`.
    pub fn new(settings: CacheSettings, metrics: Arc<CacheMetrics>) -> Self {
        Self {
            settings,
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: foldhash::fast::RandomState::default(),
            metrics,
            owned: Mutex::default(),
        }
    }

    /// Whether it keeps anything.
    pub fn enabled(&self) -> bool {
        self.settings.max_bytes > 0
    }

    fn shard(&self, key: &Key) -> std::sync::MutexGuard<'_, Shard> {
        let index = (self.hasher.hash_one(key) as usize) % self.shards.len();
        self.shards[index].lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The fresh answer to `request` (its bytes), if kept.
    pub fn get(&self, key: &Key, request: &[u8], now: Instant) -> Found {
        if !self.enabled() {
            return Found::Miss;
        }
        let mut shard = self.shard(key);
        let Some(entry) = shard.entries.get_mut(key) else {
            self.metrics.misses.inc();
            return Found::Miss;
        };
        let age = now.saturating_duration_since(entry.stored);
        let keep = Duration::from_secs(u64::from(entry.keep_for));
        // Popular: asked again since stored.
        let popular = entry.hits >= 2;
        let reply = if age < keep {
            let (keep_for, seconds) = (entry.keep_for, u32::try_from(age.as_secs()).unwrap_or(u32::MAX));
            entry.serve(request, |ttl| ttl.min(keep_for) - seconds.min(ttl.min(keep_for)))
        } else if popular && age - keep < REFRESH_GRACE {
            // Just expired and popular: served with TTL 0 (for no one to keep) while it is
            // fetched again, rather than every asker waiting for the upstream at once.
            entry.serve(request, |_| 0)
        } else {
            None
        };
        let Some(reply) = reply else {
            self.metrics.misses.inc();
            return Found::Miss;
        };
        entry.referenced = true;
        entry.hits = entry.hits.saturating_add(1);
        // Popular and in its last tenth, to the millisecond (so a short TTL is refreshed too),
        // or past it: fetch it again now, one fetch at a time.
        let refresh = !entry.refreshing && popular && keep.saturating_sub(age) * 10 <= keep;
        if age >= keep {
            self.metrics.expired_served.inc();
        }
        if refresh {
            entry.refreshing = true;
            self.metrics.refreshes.inc();
        }
        self.metrics.hits.inc();
        Found::Fresh { reply, refresh }
    }

    /// An expired answer to `request` still within the stale window, with a 30 s TTL: for when
    /// the upstream fails.
    pub fn stale(&self, key: &Key, request: &[u8], now: Instant) -> Option<Vec<u8>> {
        if !self.enabled() {
            return None;
        }
        let shard = self.shard(key);
        let entry = shard.entries.get(key)?;
        let expired_at = entry.stored + Duration::from_secs(u64::from(entry.keep_for));
        if now.saturating_duration_since(expired_at) > self.settings.stale_for {
            return None;
        }
        let reply = entry.serve(request, |_| STALE_TTL)?;
        self.metrics.stale.inc();
        Some(reply)
    }

    /// Keeps `reply`, the upstream's answer to the question `key` asked by `owner` (`None`: the
    /// responder itself; a refresh stays charged to whom the entry was), if it may be kept and
    /// `owner` keeps less than its share; whether it was. A refresh under way for the key ends.
    pub fn put(&self, key: Key, reply: &[u8], now: Instant, owner: Option<IpAddr>) -> bool {
        if !self.enabled() {
            return false;
        }
        let Some(layout) = wire::layout(reply) else {
            self.end_refresh(&key);
            return false;
        };
        let cap = if layout.negative { self.settings.max_negative_ttl } else { self.settings.max_ttl };
        let Some(keep_for) = layout.keep_for.map(|ttl| ttl.min(cap)).filter(|ttl| *ttl > 0) else {
            self.end_refresh(&key);
            return false;
        };
        let mut bytes: Box<[u8]> = reply.into();
        bytes[..2].fill(0);
        let entry = Entry {
            bytes,
            ttl_offsets: layout.ttl_offsets.into(),
            question_end: layout.question_end,
            stored: now,
            keep_for,
            referenced: false,
            hits: 0,
            refreshing: false,
            owner,
        };
        let budget = self.settings.max_bytes / SHARDS;
        let cost = entry.cost();
        if cost > budget {
            return false;
        }
        let mut shard = self.shard(&key);
        let shard = &mut *shard;
        let old = shard.entries.get(&key).map(|old| (old.cost(), old.owner));
        let replaced = old.map(|(cost, _)| cost);
        let mut entry = entry;
        if owner.is_none() {
            entry.owner = old.and_then(|(_, owner)| owner);
        }
        let mut owned = self.owned.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(owner) = entry.owner {
            let share = self.settings.max_bytes / SOURCE_SHARE;
            let own_replaced = old.filter(|(_, o)| *o == Some(owner)).map_or(0, |(cost, _)| cost);
            let mut already = owned.get(&owner).copied().unwrap_or(0).saturating_sub(own_replaced);
            if already + cost > share {
                // In place of its own answers, the expired and the unused: what a client asked
                // once does not keep what it asks now out of the cache.
                let freed = shard.evict_own(&mut owned, owner, &key, already + cost - share, now, &self.metrics);
                already = already.saturating_sub(freed);
            }
            if already + cost > share {
                drop(owned);
                self.metrics.over_share.inc();
                if let Some(old) = shard.entries.get_mut(&key) {
                    old.refreshing = false;
                }
                return false;
            }
        }
        if replaced.is_none() {
            shard.ring.push_back(key.clone());
        }
        let replaced_cost = replaced.unwrap_or(0);
        if !shard.make_room(&key, cost, budget + replaced_cost, &mut owned, &self.metrics) {
            if let Some(old) = shard.entries.get_mut(&key) {
                old.refreshing = false;
            }
            return false;
        }
        shard.bytes = shard.bytes + cost - replaced_cost;
        self.metrics.bytes.inc_by(cost as i64 - replaced_cost as i64);
        if let Some((cost, owner)) = old {
            uncharge(&mut owned, owner, cost);
        }
        if let Some(owner) = entry.owner {
            *owned.entry(owner).or_default() += cost;
        }
        shard.entries.insert(key, entry);
        true
    }

    /// Bytes kept for answers `owner` brought.
    pub fn owned_by(&self, owner: IpAddr) -> usize {
        self.owned.lock().unwrap_or_else(PoisonError::into_inner).get(&owner).copied().unwrap_or(0)
    }

    /// A refresh of `key` failed or brought nothing to keep: the next hit may try again.
    pub fn end_refresh(&self, key: &Key) {
        if let Some(entry) = self.shard(key).entries.get_mut(key) {
            entry.refreshing = false;
        }
    }

    /// Entries kept, over all shards.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).entries.len()).sum()
    }

    /// Nothing kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Takes `cost` off what `owner` keeps; a client keeping nothing is forgotten.
fn uncharge(owned: &mut HashMap<IpAddr, usize>, owner: Option<IpAddr>, cost: usize) {
    let Some(owner) = owner else { return };
    if let Some(bytes) = owned.get_mut(&owner) {
        *bytes = bytes.saturating_sub(cost);
        if *bytes == 0 {
            owned.remove(&owner);
        }
    }
}

#[cfg(test)]
mod tests;
