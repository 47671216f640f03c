//! Which record a query name asks for, relative to the cluster domain, as the Kubernetes DNS
//! specification names them. Case-insensitive; pure.

use hickory_proto::rr::Name;

/// What a name under (or outside) the cluster domain refers to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterName {
    /// Not in the cluster domain: forwarded.
    Outside,
    /// The cluster domain itself.
    Apex,
    /// `dns-version.<domain>`: the schema version TXT record.
    DnsVersion,
    /// `svc.<domain>`.
    SvcZone,
    /// `<ns>.svc.<domain>`.
    Namespace { namespace: String },
    /// `<svc>.<ns>.svc.<domain>`.
    Service { namespace: String, name: String },
    /// `<host>.<svc>.<ns>.svc.<domain>`: one endpoint of a Service.
    Endpoint { namespace: String, name: String, host: String },
    /// `_<port>._<proto>.<svc>.<ns>.svc.<domain>`.
    Srv { namespace: String, name: String, port: String, protocol: String },
    /// `….pod.<domain>`: pod records, which the upstream (CoreDNS) answers.
    Pod,
    /// Anything else under `svc.<domain>`, which the Kubernetes DNS specification defines whole:
    /// no such name.
    Unknown,
    /// A name in the cluster domain outside `svc` and `pod`, which another CoreDNS plugin may
    /// serve: forwarded.
    Elsewhere,
}

impl ClusterName {
    /// Parses `name` against `domain` (for example `cluster.local`), ignoring case.
    pub fn parse(name: &Name, domain: &Name) -> Self {
        let labels: Vec<String> = name.iter().map(|l| String::from_utf8_lossy(l).to_ascii_lowercase()).collect();
        let zone: Vec<String> = domain.iter().map(|l| String::from_utf8_lossy(l).to_ascii_lowercase()).collect();
        if labels.len() < zone.len() || labels[labels.len() - zone.len()..] != zone[..] {
            return Self::Outside;
        }
        let rel = &labels[..labels.len() - zone.len()];
        let owned = |s: &String| s.clone();
        match rel {
            [] => Self::Apex,
            [version] if version == "dns-version" => Self::DnsVersion,
            [.., last] if last == "pod" => Self::Pod,
            [svc] if svc == "svc" => Self::SvcZone,
            [ns, svc] if svc == "svc" => Self::Namespace { namespace: owned(ns) },
            [name, ns, svc] if svc == "svc" => Self::Service { namespace: owned(ns), name: owned(name) },
            [host, name, ns, svc] if svc == "svc" && !host.starts_with('_') => {
                Self::Endpoint { namespace: owned(ns), name: owned(name), host: owned(host) }
            }
            [port, protocol, name, ns, svc]
                if svc == "svc"
                    && port.len() > 1
                    && protocol.len() > 1
                    && port.starts_with('_')
                    && protocol.starts_with('_') =>
            {
                Self::Srv {
                    namespace: owned(ns),
                    name: owned(name),
                    port: port[1..].to_owned(),
                    protocol: protocol[1..].to_owned(),
                }
            }
            [.., svc] if svc == "svc" => Self::Unknown,
            _ => Self::Elsewhere,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(name: &str) -> ClusterName {
        ClusterName::parse(&Name::from_ascii(name).unwrap(), &Name::from_ascii("cluster.local.").unwrap())
    }

    fn s(v: &str) -> String {
        v.to_owned()
    }

    #[test]
    fn names_by_the_kubernetes_dns_specification() {
        let rows = [
            ("example.com.", ClusterName::Outside),
            ("local.", ClusterName::Outside),
            ("cluster.local.", ClusterName::Apex),
            ("DNS-Version.cluster.local.", ClusterName::DnsVersion),
            ("svc.cluster.local.", ClusterName::SvcZone),
            ("default.svc.cluster.local.", ClusterName::Namespace { namespace: s("default") }),
            ("web.default.svc.cluster.local.", ClusterName::Service { namespace: s("default"), name: s("web") }),
            ("WEB.Default.SVC.Cluster.Local.", ClusterName::Service { namespace: s("default"), name: s("web") }),
            (
                "web-0.web.default.svc.cluster.local.",
                ClusterName::Endpoint { namespace: s("default"), name: s("web"), host: s("web-0") },
            ),
            (
                "_http._tcp.web.default.svc.cluster.local.",
                ClusterName::Srv { namespace: s("default"), name: s("web"), port: s("http"), protocol: s("tcp") },
            ),
            ("_._tcp.web.default.svc.cluster.local.", ClusterName::Unknown),
            ("_http.web.default.svc.cluster.local.", ClusterName::Unknown),
            ("a.b.web.default.svc.cluster.local.", ClusterName::Unknown),
            ("10-0-0-1.default.pod.cluster.local.", ClusterName::Pod),
            ("web.default.cluster.local.", ClusterName::Elsewhere),
            ("nodes.cluster.local.", ClusterName::Elsewhere),
            ("api.github.com.cluster.local.", ClusterName::Elsewhere),
            ("api.github.com.default.svc.cluster.local.", ClusterName::Unknown),
            ("web.default.svc.cluster.local.example.com.", ClusterName::Outside),
        ];
        for (name, expect) in rows {
            assert_eq!(parse(name), expect, "{name}");
        }
    }
}
