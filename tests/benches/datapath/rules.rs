//! The kube-proxy-shaped rulesets the hook is compared with, loaded into a namespace: its
//! iptables mode (`KUBE-SERVICES -> KUBE-SVC-* -> KUBE-SEP-*`, `statistic --mode random`) and its
//! nftables mode, the recommended one since Kubernetes 1.33 (a `service-ips` verdict map, one
//! chain per service with `numgen random mod N vmap`, one per endpoint).

use std::{
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    process::{Command, Stdio},
};

/// The ClusterIP of service `index` (10.96.0.0/12).
pub fn vip(index: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 96 + (index >> 16) as u8, (index >> 8) as u8, index as u8))
}

/// Services per `nft -f` transaction: one transaction of every chain costs the kernel's
/// validation far more than batches of this size.
const NFT_BATCH: usize = 1000;

/// kube-proxy's iptables mode for `count` services of one TCP port each over `backends`.
pub fn load_iptables(netns: &str, count: usize, backends: &[SocketAddr]) {
    let mut rules = String::from("*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n");
    for index in 0..count {
        let _ = writeln!(rules, ":KUBE-SVC-{index:08X} - [0:0]");
        for b in 0..backends.len() {
            let _ = writeln!(rules, ":KUBE-SEP-{index:08X}-{b} - [0:0]");
        }
    }
    rules.push_str("-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n");
    rules.push_str("-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n");
    for index in 0..count {
        let _ = writeln!(
            rules,
            "-A KUBE-SERVICES -d {}/32 -p tcp -m comment --comment \"bench/svc-{index}:http cluster IP\" -m tcp --dport 80 -j KUBE-SVC-{index:08X}",
            vip(index)
        );
        for (b, backend) in backends.iter().enumerate() {
            let remaining = backends.len() - b;
            let comment = format!("-m comment --comment \"bench/svc-{index}:http -> {backend}\"");
            if remaining > 1 {
                let _ = writeln!(
                    rules,
                    "-A KUBE-SVC-{index:08X} {comment} -m statistic --mode random --probability {:.11} -j KUBE-SEP-{index:08X}-{b}",
                    1.0 / remaining as f64
                );
            } else {
                let _ = writeln!(rules, "-A KUBE-SVC-{index:08X} {comment} -j KUBE-SEP-{index:08X}-{b}");
            }
            let _ = writeln!(rules, "-A KUBE-SEP-{index:08X}-{b} -s {}/32 -j KUBE-MARK-MASQ", backend.ip());
            let _ = writeln!(rules, "-A KUBE-SEP-{index:08X}-{b} -p tcp -m tcp -j DNAT --to-destination {backend}");
        }
    }
    rules.push_str("COMMIT\n");
    restore(netns, &["iptables-restore"], &rules);
}

/// Runs `command` in `netns` with `input` on its standard input; panics if it fails.
pub fn restore(netns: &str, command: &[&str], input: &str) {
    let mut child = Command::new("ip")
        .args(["netns", "exec", netns])
        .args(command)
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn the ruleset loader");
    std::io::Write::write_all(child.stdin.as_mut().expect("stdin"), input.as_bytes()).expect("write rules");
    drop(child.stdin.take());
    assert!(child.wait().expect("run the ruleset loader").success(), "{command:?} failed");
}

/// kube-proxy's nftables mode for `count` services of one TCP port each over `backends`, in the
/// table `kube-proxy`: `nat-output` jumps to `services`, whose verdict map sends each
/// (ClusterIP, protocol, port) to its service chain; that picks an endpoint chain with
/// `numgen random mod N`, which marks hairpin traffic and DNATs.
pub fn load_nftables(netns: &str, count: usize, backends: &[SocketAddr]) {
    let head = "table ip kube-proxy {
  chain mark-for-masquerade {
    mark set mark or 0x4000
  }
  map service-ips {
    type ipv4_addr . inet_proto . inet_service : verdict
  }
  chain services {
    ip daddr . meta l4proto . th dport vmap @service-ips
  }
  chain nat-output {
    type nat hook output priority -100; policy accept;
    jump services
  }
}
";
    restore(netns, &["nft", "-f", "-"], head);
    for first in (0..count).step_by(NFT_BATCH) {
        let mut rules = String::from("table ip kube-proxy {\n");
        let mut elements = Vec::new();
        for index in first..(first + NFT_BATCH).min(count) {
            let mut picks = Vec::new();
            for (b, backend) in backends.iter().enumerate() {
                let _ = writeln!(
                    rules,
                    "  chain endpoint-{index:08X}-{b} {{\n    ip saddr {} jump mark-for-masquerade\n    meta l4proto \
                     tcp dnat to {backend}\n  }}",
                    backend.ip()
                );
                picks.push(format!("{b} : goto endpoint-{index:08X}-{b}"));
            }
            let _ = writeln!(
                rules,
                "  chain service-{index:08X} {{\n    numgen random mod {} vmap {{ {} }}\n  }}",
                backends.len(),
                picks.join(", ")
            );
            elements.push(format!("{} . tcp . 80 : goto service-{index:08X}", vip(index)));
        }
        let _ = writeln!(rules, "}}\nadd element ip kube-proxy service-ips {{ {} }}", elements.join(", "));
        restore(netns, &["nft", "-f", "-"], &rules);
    }
}
