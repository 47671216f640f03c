//! Who the responder answers. It serves on the agent pod's address, which every pod of the cluster
//! can reach; with [`Clients::Node`] it answers only its own node: sources in the Node's
//! `spec.podCIDRs`, the Node's own addresses (host-network pods and the node's processes), loopback
//! and its own address (the readiness probe). Anyone else gets REFUSED, as CoreDNS's `acl` plugin
//! answers a blocked client, and costs the responder no relay slot, no cache entry and no rate
//! limit token of the node's pods. A Node without pod CIDRs (a network plugin that assigns
//! addresses another way) leaves nothing to tell pods apart by: the responder then answers every
//! source, and says so in its log once.

use std::{fmt, net::IpAddr, str::FromStr};

use crate::view::DnsView;

/// Whose queries are answered (`--dns-clients`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Clients {
    /// Every source.
    #[default]
    Any,
    /// This node's pods and processes only, where its Node lists pod CIDRs.
    Node,
}

impl FromStr for Clients {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "any" => Ok(Self::Any),
            "node" => Ok(Self::Node),
            other => Err(format!("{other:?}: expected `node` (this node's pods only) or `any`")),
        }
    }
}

impl fmt::Display for Clients {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Any => "any",
            Self::Node => "node",
        })
    }
}

/// What decides whether a source may ask.
#[derive(Clone, Copy, Debug)]
pub struct Admission {
    /// The rule.
    pub clients: Clients,
    /// The responder's own address (its probe asks from it).
    pub own: IpAddr,
}

impl Admission {
    /// Whether `source` may ask, by `view`'s Node.
    pub fn allows(&self, view: &DnsView, source: IpAddr) -> bool {
        let source = source.to_canonical();
        match self.clients {
            Clients::Any => true,
            Clients::Node => {
                let node = view.node();
                node.pod_cidrs.is_empty()
                    || source.is_loopback()
                    || source == self.own.to_canonical()
                    || node.addresses.iter().any(|a| a.to_canonical() == source)
                    || node.pod_cidrs.iter().any(|cidr| cidr.contains(source))
            }
        }
    }
}

/// REFUSED for the query `bytes`, its question echoed (resolvers drop a reply whose question is not
/// theirs); `None` for what is not a query.
pub fn refused(bytes: &[u8]) -> Option<Vec<u8>> {
    if bytes.len() < 12 || bytes[2] & 0x80 != 0 {
        return None;
    }
    let end = crate::relay_cache::wire::question_end(bytes).unwrap_or(12);
    let mut reply = bytes[..end].to_vec();
    reply[2] = (reply[2] & 0x79) | 0x80; // QR=1, keep opcode and RD, clear AA and TC
    reply[3] = 0x05; // RCODE REFUSED
    if end == 12 {
        reply[4..6].fill(0);
    }
    reply[6..12].fill(0); // no answers, authority or additional records
    Some(reply)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use topology_model::{Node, Prefix};

    use super::*;

    fn view(pod_cidrs: &[&str], addresses: &[&str]) -> DnsView {
        let mut view = DnsView::default();
        view.set_node(&Node {
            name: "a".into(),
            labels: Default::default(),
            allocatable_cpu_millis: 0,
            ready: true,
            pod_cidrs: pod_cidrs.iter().map(|c| c.parse::<Prefix>().unwrap()).collect(),
            addresses: addresses.iter().map(|a| a.parse().unwrap()).collect(),
        });
        view
    }

    #[test]
    fn node_admits_its_pods_its_addresses_loopback_and_itself() {
        let view = view(&["10.244.1.0/24", "fd00:10:244:1::/64"], &["10.132.0.1"]);
        let node = Admission { clients: Clients::Node, own: "10.244.1.9".parse().unwrap() };
        for source in ["10.244.1.20", "::ffff:10.244.1.20", "fd00:10:244:1::20", "10.132.0.1", "127.0.0.1", "::1"] {
            assert!(node.allows(&view, source.parse().unwrap()), "{source}");
        }
        for source in ["10.244.2.20", "fd00:10:244:2::20", "10.132.0.2", "192.0.2.1"] {
            assert!(!node.allows(&view, source.parse().unwrap()), "{source}");
        }
        let any = Admission { clients: Clients::Any, ..node };
        assert!(any.allows(&view, "192.0.2.1".parse().unwrap()));
        let own = Admission { own: "192.0.2.53".parse().unwrap(), ..node };
        assert!(own.allows(&view, "192.0.2.53".parse().unwrap()), "the probe asks from the responder's address");
    }

    #[test]
    fn a_node_without_pod_cidrs_cannot_tell_and_admits_all() {
        let node = Admission { clients: Clients::Node, own: "10.0.0.9".parse().unwrap() };
        assert!(node.allows(&view(&[], &["10.132.0.1"]), "192.0.2.1".parse().unwrap()));
        assert!(node.allows(&Arc::new(DnsView::default()), "192.0.2.1".parse().unwrap()), "before the Node is known");
    }

    #[test]
    fn refused_echoes_the_question() {
        let query = [
            0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 1, 3, b'f', b'o', b'o', 0, 0, 1, 0, 1, // + OPT
            0, 0, 41, 4, 0xd0, 0, 0, 0, 0, 0, 0,
        ];
        let reply = refused(&query).unwrap();
        assert_eq!(reply[..12], [0x12, 0x34, 0x81, 0x05, 0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(reply[12..], query[12..21], "the question, and nothing after it");
        assert_eq!(refused(&reply), None, "a response gets no reply");
        assert_eq!(refused(&[0; 5]), None);
        let truncated = &query[..15];
        assert_eq!(refused(truncated).unwrap()[4..6], [0, 0], "an unreadable question is not echoed");
        assert_eq!("node".parse(), Ok(Clients::Node));
        assert!("pods".parse::<Clients>().unwrap_err().contains("expected `node`"));
    }
}
