//! Entry points for the fuzz targets (`topology-agent/fuzz/`) and their regression test: each
//! takes untrusted bytes and must never panic. Built only with the `fuzzing` feature or in tests.

use std::collections::HashMap;

use topology_common::{IndexEntry4, ServiceKey4, ServiceValue, Slot};
use topology_dataplane::mounts;
use topology_model::{Node, ObjectKey, Service, TopologyKeysSource, TopologyKeysSpec, convert, yaml};
use topology_policy::policy;

use crate::sockets;

/// A fuzz target: untrusted bytes in, no panic.
pub type Target = fn(&[u8]);

/// Every fuzz target, by name, for the regression replay.
pub const TARGETS: [(&str, Target); 9] = [
    ("cluster_file", cluster_file),
    ("quantity", quantity),
    ("annotations", annotations),
    ("mountinfo", mountinfo),
    ("adopt", adopt),
    ("sock_diag", sock_diag),
    ("dns_packet", dns_packet),
    ("apply", apply),
    ("relay", relay),
];

/// A cluster file: parsed (every object converted), then decided for each of its first nodes.
pub fn cluster_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(state) = yaml::parse(text, "fuzz.yaml") else { return };
    let nodes: Vec<String> = state.nodes().take(3).map(|n| n.name.clone()).collect();
    for node in nodes {
        let _ = policy::compute(&state, &node);
        let _ = topology_policy::explain::explain(&state, &node, None, None).map(|report| report.table());
    }
}

/// A Kubernetes quantity.
pub fn quantity(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = convert::cpu_millis(text);
    }
}

/// Topology keys and the agent's annotations of a Service, decided as the policy decides: the
/// first line is the keys (comma-separated), the rest `name=value` annotations.
pub fn annotations(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut lines = text.lines();
    let keys = TopologyKeysSpec::new(TopologyKeysSource::Annotation, lines.next().unwrap_or_default().split(','));
    let mut service = Service {
        key: ObjectKey::new("fuzz", "svc"),
        cluster_ips: vec!["10.96.0.1".parse().expect("address")],
        headless: false,
        ports: Vec::new(),
        internal_traffic_local: false,
        session_affinity_timeout_s: None,
        traffic_distribution: None,
        topology_keys: Some(keys),
        topology_mode: None,
        agent_annotations: Default::default(),
        external_name: None,
        other_proxy: None,
    };
    for line in lines {
        if let Some((name, value)) = line.split_once('=') {
            service.agent_annotations.insert(name.to_owned(), value.to_owned());
        }
    }
    let labels = [("topology.kubernetes.io/zone", "z")].into_iter().collect();
    let node = Node {
        name: "n".into(),
        labels,
        allocatable_cpu_millis: 1000,
        ready: true,
        pod_cidrs: Vec::new(),
        addresses: Vec::new(),
    };
    let _ = policy::select(&node, &Default::default(), &service, &[]);
}

/// A `/proc/self/mountinfo` text, up to the first NUL (the corpus once carried a
/// `/proc/self/cgroup` text after it).
pub fn mountinfo(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mountinfo = text.split_once('\0').map_or(&*text, |(mountinfo, _)| mountinfo);
    let _ = mounts::cgroup2_root_in(mountinfo);
}

/// What a previous agent (or anything else) left in the pinned maps: index positions, service
/// entries, slot runs and ids, adopted as the writer adopts them.
pub fn adopt(data: &[u8]) {
    let positions = 1u32 << (data.first().copied().unwrap_or(0) % 8 + 3);
    let mut services = HashMap::new();
    let mut held = Vec::new();
    for chunk in data.get(1..).unwrap_or_default().chunks_exact(40) {
        // SAFETY: 32 bytes of any pattern make an IndexEntry4 (plain integers).
        let entry = unsafe { std::ptr::read_unaligned(chunk.as_ptr().cast::<IndexEntry4>()) };
        let position = u32::from_le_bytes([chunk[32], chunk[33], chunk[34], chunk[35]]) % positions;
        held.push((position, entry));
        if chunk[36] & 1 == 1 {
            // The writer's service keys come from service ports: their padding is always zero.
            services.insert(ServiceKey4 { _pad: 0, ..entry.key }, entry.value);
        }
    }
    topology_dataplane::fuzzing::adopt_index(positions, held, &services);
    let runs: Vec<(u32, u32)> = data.chunks_exact(8).map(|c| (read_u32(&c[..4]), read_u32(&c[4..]))).collect();
    let capacity = read_u32(data.get(..4).unwrap_or(&[0, 1, 0, 0])).clamp(1, 1 << 16);
    topology_dataplane::fuzzing::adopt_slots(capacity, &runs);
    let ids: Vec<u32> = runs.iter().map(|(a, _)| *a).collect();
    topology_dataplane::fuzzing::adopt_ids(&ids, capacity);
    // A service entry and a slot array, both arbitrary.
    if data.len() >= 16 {
        // SAFETY: 16 bytes of any pattern make a ServiceValue (plain integers).
        let value = unsafe { std::ptr::read_unaligned(data.as_ptr().cast::<ServiceValue>()) };
        let slots: Vec<Slot> = data[16..]
            .chunks_exact(size_of::<Slot>())
            .map(|chunk| {
                // SAFETY: as above, for a Slot.
                unsafe { std::ptr::read_unaligned(chunk.as_ptr().cast::<Slot>()) }
            })
            .collect();
        topology_dataplane::fuzzing::read_set(&value, &slots);
    }
}

/// A sequence of desired states applied by the writer to in-memory maps, with failing writes
/// and refused grace periods: see `topology_dataplane::fuzzing::apply`.
pub fn apply(data: &[u8]) {
    topology_dataplane::fuzzing::apply(data);
}

/// A sock_diag answer's attributes.
pub fn sock_diag(data: &[u8]) {
    sockets::fuzzing::attributes(data);
}

/// A DNS message to the node-local responder, over TCP when the first byte is odd, else over UDP;
/// every reply must be a message a resolver can parse, within the client's UDP size.
pub fn dns_packet(data: &[u8]) {
    use std::sync::OnceLock;

    use hickory_proto::op::Message;
    use topology_dns::{DnsView, answer, glance, parse_domain, relay_cache, server};

    static VIEW: OnceLock<(DnsView, answer::Zone)> = OnceLock::new();
    let (view, zone) = VIEW.get_or_init(|| {
        let state = yaml::parse(topology_dns::fuzzing::CLUSTER, "dns.yaml").expect("the DNS fuzz cluster parses");
        let view = DnsView::of_node(&state, "a", vec!["192.0.2.53:53".parse().expect("address")]).expect("node a");
        (view, answer::Zone { domain: parse_domain("cluster.local").expect("domain"), ttl: 5 })
    });
    let Some((&mode, packet)) = data.split_first() else { return };
    let tcp = mode & 1 == 1;
    let mut at = f64::from(mode) / 256.0;
    let mut draw = || {
        at = (at + 0.618_034) % 1.0;
        at
    };
    let glanced = glance::glance(packet, &glance::Domain::of(&zone.domain));
    let handled = server::respond(view, zone, packet, tcp, &mut draw);
    if let Some(glanced) = glanced {
        // Read from the wire alone, a query must be one the whole path relays, asked the same.
        let server::Handled::Forward { request, .. } = &handled else { panic!("glanced at as relayed: {glanced:?}") };
        assert_eq!(relay_cache::Asked::of(request), glanced.asked);
        assert_eq!(answer::udp_limit(request), glanced.udp_limit);
        assert_eq!(request.queries.first().map(|q| u16::from(q.query_type())), Some(glanced.qtype));
    }
    if let server::Handled::Reply { bytes, .. } = handled {
        let reply = Message::from_vec(&bytes).expect("every reply parses");
        if !tcp {
            let request_limit = Message::from_vec(packet).map_or(512, |request| answer::udp_limit(&request));
            assert!(bytes.len() <= usize::from(request_limit), "a UDP reply over the client's size");
        }
        drop(reply);
    }
}

/// A relayed query and what came back from the upstream: the first byte picks UDP (even) or TCP,
/// the next two the query's length, then the query and the upstream's datagram. A reply passed on
/// must answer the client's id and question, parse, and fit the client's size.
pub fn relay(data: &[u8]) {
    use hickory_proto::op::{Message, MessageType};
    use topology_dns::relay;

    let [mode, high, low, rest @ ..] = data else { return };
    let (query, reply) = rest.split_at(usize::from(u16::from_be_bytes([*high, *low])).min(rest.len()));
    let Ok(request) = Message::from_vec(query) else { return };
    if request.metadata.message_type != MessageType::Query {
        return;
    }
    let limit = relay::limit(&request, mode & 1 == 1);
    relayed(query, reply);
    // The id the upstream was asked under: what the reply carries, or not, at the input's choice.
    let id = if mode & 2 == 0 { reply.get(..2).map_or(0, |id| u16::from_be_bytes([id[0], id[1]])) } else { 0x5a5a };
    let _ = relay::outgoing(query, id);
    let Ok(passed) = relay::incoming(&request, id, reply, limit) else { return };
    assert!(passed.len() <= usize::from(limit), "{} bytes passed on, the client takes {limit}", passed.len());
    let passed = Message::from_vec(&passed).expect("what is passed on parses");
    assert_eq!(passed.metadata.id, request.metadata.id, "the client's id");
    let names = |m: &Message| m.queries.iter().map(|q| (q.name().to_lowercase(), q.query_type())).collect::<Vec<_>>();
    assert_eq!(names(&passed), names(&request), "the client's question");
}

/// The cache of relayed answers on any reply: keeping it never panics, and a kept reply served
/// to the query it answers parses, with the query's id and question.
fn relayed(query: &[u8], reply: &[u8]) {
    use std::time::{Duration, Instant};

    use hickory_proto::op::Message;
    use topology_dns::relay_cache::{Asked, CacheSettings, Found, Key, RelayCache, wire};

    let _ = wire::layout(reply);
    let Ok(asked) = Message::from_vec(query).map(|request| Asked::of(&request)) else { return };
    let Some(key) = Key::of(query, asked) else { return };
    let cache = RelayCache::new(CacheSettings::default(), std::sync::Arc::default());
    let now = Instant::now();
    if !cache.put(key.clone(), reply, now, None) {
        return;
    }
    for at in [now, now + Duration::from_secs(1)] {
        if let Found::Fresh { reply: served, .. } = cache.get(&key, query, at)
            && let (Ok(served), Ok(asked)) = (Message::from_vec(&served), Message::from_vec(query))
        {
            assert_eq!(served.metadata.id, asked.metadata.id, "the client's id");
        }
    }
}

fn read_u32(bytes: &[u8]) -> u32 {
    let mut word = [0u8; 4];
    for (to, from) in word.iter_mut().zip(bytes) {
        *to = *from;
    }
    u32::from_le_bytes(word)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// Every input ever kept (crashes found by the fuzzers, and seeds) still passes every target.
    #[test]
    fn the_kept_fuzz_inputs_pass() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
        let mut replayed = 0;
        for (name, target) in TARGETS {
            let Ok(entries) = std::fs::read_dir(root.join(name)) else { continue };
            for entry in entries.flatten() {
                let data = std::fs::read(entry.path()).expect("read a kept input");
                target(&data);
                replayed += 1;
            }
        }
        assert!(replayed > 0, "no kept inputs under {}", root.display());
    }
}
