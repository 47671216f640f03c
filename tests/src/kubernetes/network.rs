//! The cluster's network, dual-stack, routed the way a simple CNI plugin (ptp, Calico) routes it,
//! inside namespaces the test made: the control plane and every node on one bridge
//! (10.244.0.0/24 and fd00:244::/64, the "underlay"); each pod in a namespace of its own behind a
//! veth into its node's namespace, with a /32 address from the node's IPv4 pod CIDR
//! (10.244.<node>.0/24) and a /128 from its IPv6 one (fd00:10:244:<node>::/64), and a route for
//! each of the cluster's pod ranges through the node — so a pod's packets cross its node's
//! namespace, where kube-proxy's rules would apply. Nothing has a default route: nothing can
//! leave, and a connection to a ClusterIP nobody rewrote fails with ENETUNREACH.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::sandbox::{NetnsGuard, run};

/// The whole cluster range: nodes, the control plane and every pod CIDR.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// The whole cluster range of IPv6 pods: every node's IPv6 pod CIDR.
pub const CLUSTER_CIDR_V6: &str = "fd00:10:244::/56";
/// The gateway address every pod's routes point at: the node end of its veth, as Calico does.
pub(super) const GATEWAY: &str = "169.254.1.1";
/// The IPv6 gateway: a link-local address of the node end of every pod's veth.
const GATEWAY_V6: &str = "fe80::1";

/// A node's address on the underlay (node `index` counts from 1).
pub fn node_address(index: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, 0, index)
}

/// The control plane's address on the underlay.
pub fn control_plane_address() -> Ipv4Addr {
    Ipv4Addr::new(10, 244, 0, 254)
}

/// The IPv6 address beside an underlay IPv4 address (`fd00:244::<last octet>`).
pub fn underlay_v6(v4: Ipv4Addr) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x244, 0, 0, 0, 0, 0, u16::from(v4.octets()[3]))
}

/// A node's pod CIDR.
pub fn pod_cidr(index: u8) -> String {
    format!("10.244.{index}.0/24")
}

/// A node's IPv6 pod CIDR.
pub fn pod_cidr_v6(index: u8) -> String {
    format!("fd00:10:244:{index:x}::/64")
}

/// Pod `n` of node `index`'s IPv6 address.
pub fn pod_address_v6(index: u8, n: u8) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x10, 0x244, u16::from(index), 0, 0, 0, u16::from(n))
}

/// Pod `n` of node `index` (`n` from 2: .1 is left unused, as IPAM plugins leave the gateway's).
pub fn pod_address(index: u8, n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, index, n)
}

/// Routes from a namespace on the underlay (the control plane, a node) to every other node's pod
/// CIDR, through that node: the routes a cloud's VPC or a CNI's BGP would carry.
pub fn route_pod_cidrs(netns: &str, nodes: &[u8], except: Option<u8>) {
    for &index in nodes.iter().filter(|&&index| Some(index) != except) {
        run("ip", &["-n", netns, "route", "replace", &pod_cidr(index), "via", &node_address(index).to_string()]);
        let via = underlay_v6(node_address(index)).to_string();
        run("ip", &["-n", netns, "-6", "route", "replace", &pod_cidr_v6(index), "via", &via]);
    }
}

/// Makes a node's namespace forward between its pods and the underlay, in both families.
pub fn enable_forwarding(node_netns: &str) {
    run("ip", &["netns", "exec", node_netns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"]);
    run("ip", &["netns", "exec", node_netns, "sysctl", "-q", "-w", "net.ipv6.conf.all.forwarding=1"]);
}

/// Creates the pod namespace `pod_netns` with `address` and `address6` on its `eth0`, a veth whose
/// other end, `link` in the node's namespace, holds the gateway addresses and the routes to the
/// pod. No duplicate address detection: the addresses are the harness's to give, and usable at once.
pub fn attach_pod(node_netns: &str, link: &str, address: Ipv4Addr, address6: Ipv6Addr) -> NetnsGuard {
    // A name of the node's and the link's: unique per pod, and swept with the node's prefix.
    let pod = NetnsGuard::new(&format!("{node_netns}-{link}"));
    let ns = pod.name();
    run("ip", &["netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf.default.accept_dad=0"]);
    run("ip", &["-n", node_netns, "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns]);
    run("ip", &["-n", node_netns, "addr", "add", &format!("{GATEWAY}/32"), "dev", link]);
    run("ip", &["-n", node_netns, "addr", "add", &format!("{GATEWAY_V6}/64"), "dev", link, "nodad"]);
    run("ip", &["-n", node_netns, "link", "set", link, "up"]);
    run("ip", &["-n", node_netns, "route", "add", &format!("{address}/32"), "dev", link]);
    run("ip", &["-n", node_netns, "-6", "route", "add", &format!("{address6}/128"), "dev", link]);
    run("ip", &["-n", ns, "addr", "add", &format!("{address}/32"), "dev", "eth0"]);
    run("ip", &["-n", ns, "addr", "add", &format!("{address6}/128"), "dev", "eth0", "nodad"]);
    run("ip", &["-n", ns, "link", "set", "eth0", "up"]);
    run("ip", &["-n", ns, "route", "add", GATEWAY, "dev", "eth0", "scope", "link"]);
    run("ip", &["-n", ns, "route", "add", CLUSTER_CIDR, "via", GATEWAY, "dev", "eth0"]);
    run("ip", &["-n", ns, "-6", "route", "add", CLUSTER_CIDR_V6, "via", GATEWAY_V6, "dev", "eth0"]);
    pod
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_of_nodes_pods_and_the_control_plane_never_meet() {
        let mut seen = std::collections::BTreeSet::new();
        assert!(seen.insert(control_plane_address()));
        for node in 1..=20u8 {
            assert!(seen.insert(node_address(node)));
            for n in 2..=254u8 {
                assert!(seen.insert(pod_address(node, n)), "node {node} pod {n}");
            }
        }
        assert_eq!(pod_cidr(3), "10.244.3.0/24");
        // Each IPv6 pod address in its node's CIDR, every CIDR in the cluster's range.
        assert_eq!(pod_cidr_v6(12), "fd00:10:244:c::/64");
        assert_eq!(pod_address_v6(12, 7).to_string(), "fd00:10:244:c::7");
        assert_eq!(pod_address_v6(199, 254).to_string(), "fd00:10:244:c7::fe");
        assert!(CLUSTER_CIDR_V6.ends_with("::/56") && 199 < 256, "node indexes fit the /56's 8 bits");
    }
}
