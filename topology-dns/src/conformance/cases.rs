//! The rows: CoreDNS's tables, then the specification's, then names kept on CoreDNS.

use hickory_proto::{op::ResponseCode, rr::RecordType};

use super::{Case, Expect, NODATA, NXDOMAIN, ZONE_SOA, ok};

/// RFC 2782 weights: ours carry the plan's shares out of 10,000, CoreDNS's are 100 / n each.
const WEIGHTS: &str =
    "SRV weights carry this node's plan (shares out of 10,000, RFC 2782), not CoreDNS's equal 100 / n";

fn case(name: &'static str, qname: &'static str, qtype: RecordType, expect: Expect) -> Case {
    Case { name, qname, qtype, expect, coredns: None }
}

pub(super) fn cases() -> Vec<Case> {
    use RecordType::*;
    vec![
        // commonDnsTestCases
        case(
            "A Service",
            "svc1.testns.svc.cluster.local.",
            A,
            ok(&["svc1.testns.svc.cluster.local. 5 IN A 10.0.0.1"], &[]),
        ),
        case(
            "A Service without endpoints",
            "svcempty.testns.svc.cluster.local.",
            A,
            ok(&["svcempty.testns.svc.cluster.local. 5 IN A 10.0.0.1"], &[]),
        ),
        case(
            "SRV on a Service's name",
            "svc1.testns.svc.cluster.local.",
            SRV,
            ok(
                &["svc1.testns.svc.cluster.local. 5 IN SRV 0 100 80 svc1.testns.svc.cluster.local."],
                &["svc1.testns.svc.cluster.local. 5 IN A 10.0.0.1"],
            ),
        ),
        case(
            "SRV on a Service without endpoints",
            "svcempty.testns.svc.cluster.local.",
            SRV,
            ok(
                &["svcempty.testns.svc.cluster.local. 5 IN SRV 0 100 80 svcempty.testns.svc.cluster.local."],
                &["svcempty.testns.svc.cluster.local. 5 IN A 10.0.0.1"],
            ),
        ),
        case(
            "SRV on an IPv6 Service",
            "svc6.testns.svc.cluster.local.",
            SRV,
            ok(
                &["svc6.testns.svc.cluster.local. 5 IN SRV 0 100 80 svc6.testns.svc.cluster.local."],
                &["svc6.testns.svc.cluster.local. 5 IN AAAA 1234:abcd::1"],
            ),
        ),
        case(
            "SRV Service",
            "_http._tcp.svc1.testns.svc.cluster.local.",
            SRV,
            ok(
                &["_http._tcp.svc1.testns.svc.cluster.local. 5 IN SRV 0 100 80 svc1.testns.svc.cluster.local."],
                &["svc1.testns.svc.cluster.local. 5 IN A 10.0.0.1"],
            ),
        ),
        case(
            "SRV Service without endpoints",
            "_http._tcp.svcempty.testns.svc.cluster.local.",
            SRV,
            ok(
                &["_http._tcp.svcempty.testns.svc.cluster.local. 5 IN SRV 0 100 80 svcempty.testns.svc.cluster.local."],
                &["svcempty.testns.svc.cluster.local. 5 IN A 10.0.0.1"],
            ),
        ),
        case(
            "A Service (Headless)",
            "hdls1.testns.svc.cluster.local.",
            A,
            ok(
                &[
                    "hdls1.testns.svc.cluster.local. 5 IN A 172.0.0.2",
                    "hdls1.testns.svc.cluster.local. 5 IN A 172.0.0.3",
                    "hdls1.testns.svc.cluster.local. 5 IN A 172.0.0.4",
                    "hdls1.testns.svc.cluster.local. 5 IN A 172.0.0.5",
                ],
                &[],
            ),
        ),
        case(
            "A Service (Headless and Portless)",
            "hdlsprtls.testns.svc.cluster.local.",
            A,
            ok(&["hdlsprtls.testns.svc.cluster.local. 5 IN A 172.0.0.20"], &[]),
        ),
        case(
            "AAAA Service (with an existing A record, but no AAAA record)",
            "svc1.testns.svc.cluster.local.",
            AAAA,
            NODATA,
        ),
        case("AAAA Service (non-existing service)", "svc0.testns.svc.cluster.local.", AAAA, NXDOMAIN),
        case("A Service (non-existing service)", "svc0.testns.svc.cluster.local.", A, NXDOMAIN),
        case("A Service (non-existing namespace)", "svc0.svc-nons.svc.cluster.local.", A, NXDOMAIN),
        case(
            "TXT Schema",
            "dns-version.cluster.local.",
            TXT,
            ok(&["dns-version.cluster.local. 28800 IN TXT 1.1.0"], &[]),
        ),
        case(
            "A TXT record does not exist but another record for the same FQDN does",
            "svc1.testns.svc.cluster.local.",
            TXT,
            NODATA,
        ),
        case(
            "A TXT record does not exist and neither does another record for the same FQDN",
            "svc0.svc-nons.svc.cluster.local.",
            TXT,
            NXDOMAIN,
        ),
        case("A Service (Headless) does not exist", "bogusendpoint.hdls1.testns.svc.cluster.local.", A, NXDOMAIN),
        case("A Service does not exist", "bogusendpoint.svc0.testns.svc.cluster.local.", A, NXDOMAIN),
        case(
            "AAAA Service",
            "svc6.testns.svc.cluster.local.",
            AAAA,
            ok(&["svc6.testns.svc.cluster.local. 5 IN AAAA 1234:abcd::1"], &[]),
        ),
        case(
            "SRV (IPv6)",
            "_http._tcp.svc6.testns.svc.cluster.local.",
            SRV,
            ok(
                &["_http._tcp.svc6.testns.svc.cluster.local. 5 IN SRV 0 100 80 svc6.testns.svc.cluster.local."],
                &["svc6.testns.svc.cluster.local. 5 IN AAAA 1234:abcd::1"],
            ),
        ),
        case(
            "AAAA Service (Headless)",
            "hdls1.testns.svc.cluster.local.",
            AAAA,
            ok(
                &[
                    "hdls1.testns.svc.cluster.local. 5 IN AAAA 5678:abcd::1",
                    "hdls1.testns.svc.cluster.local. 5 IN AAAA 5678:abcd::2",
                ],
                &[],
            ),
        ),
        case("svc zone", "svc.cluster.local.", A, NODATA),
        case("pod zone: CoreDNS's pods plugin answers it", "pod.cluster.local.", A, Expect::Forward),
        case("a namespace", "testns.svc.cluster.local.", A, NODATA),
        case("NS query for qname != zone (existing domain)", "svc.cluster.local.", NS, NODATA),
        case("NS query for qname != zone (existing namespace)", "testns.svc.cluster.local.", NS, NODATA),
        case(
            "NS query for qname != zone (non existing domain): another plugin's, relayed",
            "foo.cluster.local.",
            NS,
            Expect::Forward,
        ),
        case("NS query for qname != zone (non existing namespace)", "foo.svc.cluster.local.", NS, NXDOMAIN),
        case(
            "Dual Stack ClusterIP Services: A",
            "svc-dual-stack.testns.svc.cluster.local.",
            A,
            ok(&["svc-dual-stack.testns.svc.cluster.local. 5 IN A 10.0.0.3"], &[]),
        ),
        case(
            "Dual Stack ClusterIP Services: AAAA",
            "svc-dual-stack.testns.svc.cluster.local.",
            AAAA,
            ok(&["svc-dual-stack.testns.svc.cluster.local. 5 IN AAAA 10::3"], &[]),
        ),
        Case {
            coredns: Some((
                &["svc-dual-stack.testns.svc.cluster.local. 5 IN SRV 0 50 80 svc-dual-stack.testns.svc.cluster.local."],
                "one target, so its weight is moot: CoreDNS divides 100 by the ClusterIPs",
            )),
            ..case(
                "Dual Stack ClusterIP Services: SRV",
                "svc-dual-stack.testns.svc.cluster.local.",
                SRV,
                ok(
                    &[
                        "svc-dual-stack.testns.svc.cluster.local. 5 IN SRV 0 100 80 svc-dual-stack.testns.svc.cluster.local.",
                    ],
                    &[
                        "svc-dual-stack.testns.svc.cluster.local. 5 IN A 10.0.0.3",
                        "svc-dual-stack.testns.svc.cluster.local. 5 IN AAAA 10::3",
                    ],
                ),
            )
        },
        case("SOA below the apex", "svc1.testns.svc.cluster.local.", SOA, NODATA),
        case(
            "A query for a subdomain of an external service should not resolve to the external service",
            "endpoint.external.testns.svc.cluster.local.",
            CNAME,
            NXDOMAIN,
        ),
        case(
            "A query for a subdomain of a subdomain of an external service should not resolve to the external service",
            "subdomain.subdomain.external.testns.svc.cluster.local.",
            CNAME,
            NXDOMAIN,
        ),
        // dnsTestCases
        Case {
            coredns: Some((
                &[
                    "_http._tcp.hdls1.testns.svc.cluster.local. 5 IN SRV 0 16 80 172-0-0-2.hdls1.testns.svc.cluster.local.",
                    "_http._tcp.hdls1.testns.svc.cluster.local. 5 IN SRV 0 16 80 172-0-0-3.hdls1.testns.svc.cluster.local.",
                    "_http._tcp.hdls1.testns.svc.cluster.local. 5 IN SRV 0 16 80 5678-abcd--1.hdls1.testns.svc.cluster.local.",
                    "_http._tcp.hdls1.testns.svc.cluster.local. 5 IN SRV 0 16 80 5678-abcd--2.hdls1.testns.svc.cluster.local.",
                    "_http._tcp.hdls1.testns.svc.cluster.local. 5 IN SRV 0 16 80 dup-name.hdls1.testns.svc.cluster.local.",
                ],
                WEIGHTS,
            )),
            ..case(
                "SRV Service (Headless)",
                "_http._tcp.hdls1.testns.svc.cluster.local.",
                SRV,
                ok(
                    &[
                        "_http._tcp.hdls1.testns.svc.cluster.local. 5 IN SRV 0 1667 80 172-0-0-2.hdls1.testns.svc.cluster.local.",
                        "_http._tcp.hdls1.testns.svc.cluster.local. 5 IN SRV 0 1667 80 172-0-0-3.hdls1.testns.svc.cluster.local.",
                        "_http._tcp.hdls1.testns.svc.cluster.local. 5 IN SRV 0 1667 80 5678-abcd--1.hdls1.testns.svc.cluster.local.",
                        "_http._tcp.hdls1.testns.svc.cluster.local. 5 IN SRV 0 1667 80 5678-abcd--2.hdls1.testns.svc.cluster.local.",
                        "_http._tcp.hdls1.testns.svc.cluster.local. 5 IN SRV 0 3333 80 dup-name.hdls1.testns.svc.cluster.local.",
                    ],
                    &[
                        "172-0-0-2.hdls1.testns.svc.cluster.local. 5 IN A 172.0.0.2",
                        "172-0-0-3.hdls1.testns.svc.cluster.local. 5 IN A 172.0.0.3",
                        "5678-abcd--1.hdls1.testns.svc.cluster.local. 5 IN AAAA 5678:abcd::1",
                        "5678-abcd--2.hdls1.testns.svc.cluster.local. 5 IN AAAA 5678:abcd::2",
                        "dup-name.hdls1.testns.svc.cluster.local. 5 IN A 172.0.0.4",
                        "dup-name.hdls1.testns.svc.cluster.local. 5 IN A 172.0.0.5",
                    ],
                ),
            )
        },
        case(
            "AAAA",
            "5678-abcd--2.hdls1.testns.svc.cluster.local.",
            AAAA,
            ok(&["5678-abcd--2.hdls1.testns.svc.cluster.local. 5 IN AAAA 5678:abcd::2"], &[]),
        ),
        case(
            "An Endpoint with no port",
            "172-0-0-20.hdlsprtls.testns.svc.cluster.local.",
            A,
            ok(&["172-0-0-20.hdlsprtls.testns.svc.cluster.local. 5 IN A 172.0.0.20"], &[]),
        ),
        case(
            "An Endpoint ip",
            "172-0-0-2.hdls1.testns.svc.cluster.local.",
            A,
            ok(&["172-0-0-2.hdls1.testns.svc.cluster.local. 5 IN A 172.0.0.2"], &[]),
        ),
        case(
            "An Endpoint by name",
            "dup-name.hdls1.testns.svc.cluster.local.",
            A,
            ok(
                &[
                    "dup-name.hdls1.testns.svc.cluster.local. 5 IN A 172.0.0.4",
                    "dup-name.hdls1.testns.svc.cluster.local. 5 IN A 172.0.0.5",
                ],
                &[],
            ),
        ),
        case(
            "CNAME External",
            "external.testns.svc.cluster.local.",
            CNAME,
            ok(&["external.testns.svc.cluster.local. 5 IN CNAME ext.interwebs.test."], &[]),
        ),
        case(
            "CNAME External, chased through the upstream",
            "external.testns.svc.cluster.local.",
            A,
            Expect::Chase {
                answer: &["external.testns.svc.cluster.local. 5 IN CNAME ext.interwebs.test."],
                target: "ext.interwebs.test.",
            },
        ),
        case(
            "CNAME External To Internal Service",
            "external-to-service.testns.svc.cluster.local.",
            A,
            ok(
                &[
                    "external-to-service.testns.svc.cluster.local. 5 IN CNAME svc1.testns.svc.cluster.local.",
                    "svc1.testns.svc.cluster.local. 5 IN A 10.0.0.1",
                ],
                &[],
            ),
        ),
        // kubeApexCases
        case("apex SOA", "cluster.local.", SOA, ok(&[ZONE_SOA], &[])),
        case("apex HINFO", "cluster.local.", HINFO, NODATA),
        Case {
            coredns: Some((
                &["cluster.local. 5 IN NS ns.dns.cluster.local."],
                "CoreDNS's test runs outside any cluster: no Service fronts its own address, so it names \
                 ns.dns; in a cluster it names kube-dns as this does (e2e_dns_differential)",
            )),
            ..case(
                "apex NS: the cluster DNS Service, at its address",
                "cluster.local.",
                NS,
                ok(
                    &["cluster.local. 5 IN NS kube-dns.kube-system.svc.cluster.local."],
                    &["kube-dns.kube-system.svc.cluster.local. 5 IN A 10.0.0.10"],
                ),
            )
        },
        case("apex A", "cluster.local.", A, NODATA),
        case("apex AAAA", "cluster.local.", AAAA, NODATA),
        case("apex SRV", "cluster.local.", SRV, NODATA),
        // The specification, beyond CoreDNS's tables.
        case(
            "2.3.3 SRV on a Service's name: every port, named or not",
            "unnamed.testns.svc.cluster.local.",
            SRV,
            ok(
                &[
                    "unnamed.testns.svc.cluster.local. 5 IN SRV 0 100 8080 unnamed.testns.svc.cluster.local.",
                    "unnamed.testns.svc.cluster.local. 5 IN SRV 0 100 9090 unnamed.testns.svc.cluster.local.",
                ],
                &["unnamed.testns.svc.cluster.local. 5 IN A 10.0.0.4"],
            ),
        ),
        case(
            "2.3.2 _<port>._<proto>: named ports only",
            "_metrics._tcp.unnamed.testns.svc.cluster.local.",
            SRV,
            ok(
                &[
                    "_metrics._tcp.unnamed.testns.svc.cluster.local. 5 IN SRV 0 100 9090 unnamed.testns.svc.cluster.local.",
                ],
                &["unnamed.testns.svc.cluster.local. 5 IN A 10.0.0.4"],
            ),
        ),
        case(
            "an IPv6 endpoint ending in :: is named with a final 0 (CoreDNS)",
            "hdls6.testns.svc.cluster.local.",
            SRV,
            ok(
                &["hdls6.testns.svc.cluster.local. 5 IN SRV 0 10000 80 fd00-20--0.hdls6.testns.svc.cluster.local."],
                &["fd00-20--0.hdls6.testns.svc.cluster.local. 5 IN AAAA fd00:20::"],
            ),
        ),
        case(
            "... and that name resolves",
            "fd00-20--0.hdls6.testns.svc.cluster.local.",
            AAAA,
            ok(&["fd00-20--0.hdls6.testns.svc.cluster.local. 5 IN AAAA fd00:20::"], &[]),
        ),
        case(
            "2.4.1 headless: ready endpoints only, no serving-and-terminating fallback",
            "hdlsterm.testns.svc.cluster.local.",
            A,
            NXDOMAIN,
        ),
        case(
            "2.4.1 headless: the terminating endpoint is left out",
            "hdlsmixed.testns.svc.cluster.local.",
            A,
            ok(&["hdlsmixed.testns.svc.cluster.local. 5 IN A 172.0.2.1"], &[]),
        ),
        case(
            "2.4.2 every SRV target resolves",
            "_http._tcp.hdlsmixed.testns.svc.cluster.local.",
            SRV,
            ok(
                &[
                    "_http._tcp.hdlsmixed.testns.svc.cluster.local. 5 IN SRV 0 10000 80 172-0-2-1.hdlsmixed.testns.svc.cluster.local.",
                ],
                &["172-0-2-1.hdlsmixed.testns.svc.cluster.local. 5 IN A 172.0.2.1"],
            ),
        ),
        // Names an operator keeps on CoreDNS (`topology-agent.io/dns: upstream`).
        case("a kept Service's name is relayed", "kept.testns.svc.cluster.local.", A, Expect::Forward),
        case("a kept Service's SRV is relayed", "_http._tcp.kept.testns.svc.cluster.local.", SRV, Expect::Forward),
        case("a kept Service's endpoint names are relayed", "ep.kept.testns.svc.cluster.local.", A, Expect::Forward),
        case(
            "an ExternalName naming a kept Service is chased through the upstream",
            "external-to-kept.testns.svc.cluster.local.",
            A,
            Expect::Chase {
                answer: &["external-to-kept.testns.svc.cluster.local. 5 IN CNAME kept.testns.svc.cluster.local."],
                target: "kept.testns.svc.cluster.local.",
            },
        ),
        // handler.go: no zone transfers.
        case(
            "AXFR is refused",
            "cluster.local.",
            AXFR,
            Expect::Answer { rcode: ResponseCode::Refused, answer: &[], extra: &[], soa: false },
        ),
        case(
            "IXFR is refused",
            "svc1.testns.svc.cluster.local.",
            IXFR,
            Expect::Answer { rcode: ResponseCode::Refused, answer: &[], extra: &[], soa: false },
        ),
    ]
}
