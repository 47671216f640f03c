//! The one diff between what a node should hold and what its kernel holds: desired service ports
//! against the kernel mirror, as the operations that close the gap. Pure; the writer
//! ([`super::writer`]) carries them out.

use std::collections::HashSet;

use topology_common::{Backend, Slot, THRESHOLD_ONE};
use topology_policy::{
    desired::{DesiredService, PortOptions, ServicePort},
    plan::alias,
};

use super::{error::DataplaneError, state::KernelState};

/// One change to one service port.
#[derive(Debug, PartialEq)]
pub enum Op<'a> {
    /// The kernel holds the port; it should not.
    Remove(ServicePort),
    /// The kernel does not hold the port; `replace`: it holds it under a service id that is not
    /// its own (adopted out of range or shared), to be removed first and written afresh.
    Add {
        /// The port.
        port: ServicePort,
        /// Its backend set as slots.
        slots: Vec<Slot>,
        /// Name and options.
        service: &'a DesiredService,
        /// Remove what the kernel holds first.
        replace: bool,
    },
    /// A new backend set, with the service's name and options.
    Swap {
        /// The port.
        port: ServicePort,
        /// Its new backend set as slots.
        slots: Vec<Slot>,
        /// Name and options.
        service: &'a DesiredService,
    },
    /// The same backend set under a new name or options.
    Retag {
        /// The port.
        port: ServicePort,
        /// The new name, if it changed.
        name: Option<&'a str>,
        /// The new options, if they changed.
        options: Option<PortOptions>,
    },
}

impl Op<'_> {
    /// The port the operation changes.
    pub fn port(&self) -> &ServicePort {
        match self {
            Self::Remove(port) | Self::Add { port, .. } | Self::Swap { port, .. } | Self::Retag { port, .. } => port,
        }
    }
}

/// Adopted entries the kernel holds but the agent cannot trust as its own.
#[derive(Debug, Default)]
pub struct Foreign {
    /// Ports whose slot run overlaps another's or lies out of range: never retired as theirs.
    pub runs: HashSet<ServicePort>,
    /// Ports whose service id is out of range or shared: rewritten from scratch.
    pub ids: HashSet<ServicePort>,
}

/// The operations for a set of changes, removals first (they free room for additions).
#[derive(Debug, Default)]
pub struct Diff<'a> {
    /// What to do, in order.
    pub ops: Vec<Op<'a>>,
    /// Ports already as desired.
    pub unchanged: usize,
    /// Ports whose desired state cannot be programmed; the kernel keeps what it holds.
    pub invalid: Vec<(ServicePort, DataplaneError)>,
}

/// The operations that make `kernel` hold `changes` (`None`: the port should not be there).
pub fn diff<'a>(
    changes: impl IntoIterator<Item = (ServicePort, Option<&'a DesiredService>)>,
    kernel: &KernelState,
    foreign: &Foreign,
) -> Diff<'a> {
    let mut out = Diff::default();
    let mut upserts = Vec::new();
    for (port, desired) in changes {
        let held = kernel.services.get(&port);
        let Some(service) = desired else {
            if held.is_some() {
                out.ops.push(Op::Remove(port));
            }
            continue;
        };
        let slots = match slots_for(&port, service) {
            Ok(slots) => slots,
            Err(error) => {
                out.invalid.push((port, error));
                continue;
            }
        };
        let op = match held {
            None => Op::Add { port, slots, service, replace: false },
            Some(_) if foreign.ids.contains(&port) => Op::Add { port, slots, service, replace: true },
            Some(current) if current.intact() && !foreign.runs.contains(&port) && current.slots == slots => {
                let name = (current.name != service.name).then_some(service.name.as_str());
                let options = (current.options != service.options).then_some(service.options);
                if name.is_none() && options.is_none() {
                    out.unchanged += 1;
                    continue;
                }
                Op::Retag { port, name, options }
            }
            Some(_) => Op::Swap { port, slots, service },
        };
        upserts.push(op);
    }
    out.ops.extend(upserts);
    out
}

/// The slots for a desired service, after checking every backend has the ClusterIP's family.
pub fn slots_for(port: &ServicePort, service: &DesiredService) -> Result<Vec<Slot>, DataplaneError> {
    if let Some(backend) = service.backends.iter().find(|b| b.addr.is_ipv4() != port.vip.is_ipv4()) {
        return Err(DataplaneError::InvalidService {
            service: *port,
            reason: format!("backend {} is not of the ClusterIP's address family", backend.addr),
        });
    }
    let slots = alias::build(&service.backends);
    if slots.len() > u32::MAX as usize {
        return Err(DataplaneError::InvalidService { service: *port, reason: "too many backends".into() });
    }
    Ok(slots)
}

/// A backend that left a service port's set on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Departure {
    /// The service port.
    pub service: ServicePort,
    /// The backend that left.
    pub backend: std::net::SocketAddr,
}

/// The backends a set change takes away from a service port: drawn from `old`, never from `new`.
pub fn departures(port: &ServicePort, old: &[Slot], new: &[Slot]) -> Vec<Departure> {
    let kept = drawn(new);
    let ipv4 = port.vip.is_ipv4();
    let mut gone: Vec<Departure> = drawn(old)
        .difference(&kept)
        .map(|(addr, backend_port)| {
            let backend =
                alias::weighted_backend(&Backend { addr: *addr, port: *backend_port, ..Backend::default() }, 0.0, ipv4);
            Departure { service: *port, backend: std::net::SocketAddr::new(backend.addr, backend.port) }
        })
        .collect();
    gone.sort();
    gone
}

/// The backends (address, port) a set can draw: a slot's primary unless its threshold is 0, its
/// alias unless its threshold is one.
fn drawn(slots: &[Slot]) -> HashSet<([u8; 16], u16)> {
    let mut out = HashSet::new();
    for slot in slots {
        if slot.threshold > 0 {
            out.insert((slot.primary.addr, slot.primary.port));
        }
        if slot.threshold < THRESHOLD_ONE {
            out.insert((slot.alias.addr, slot.alias.port));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use topology_model::Protocol;
    use topology_policy::desired::{Locality, WeightedBackend};

    use super::*;
    use crate::state::ProgrammedService;

    fn port(last: u8) -> ServicePort {
        ServicePort { vip: IpAddr::from([10, 96, 0, last]), port: 53, protocol: Protocol::Udp }
    }

    fn backend(last: u8) -> WeightedBackend {
        WeightedBackend { addr: IpAddr::from([10, 244, 0, last]), port: 8053, weight: 1, locality: Locality::Zone }
    }

    fn service(name: &str, backends: &[u8]) -> DesiredService {
        DesiredService {
            name: name.into(),
            backends: backends.iter().map(|&b| backend(b)).collect(),
            options: PortOptions::default(),
        }
    }

    /// The kernel holding `service` at `port`, as the writer would have written it.
    fn held(services: &[(ServicePort, &DesiredService)]) -> KernelState {
        let mut kernel = KernelState::default();
        for (id, (port, service)) in services.iter().enumerate() {
            let slots = alias::build(&service.backends);
            let value = topology_common::ServiceValue {
                service_id: id as u32,
                set_id: id as u32 + 1,
                count: slots.len() as u32,
                base: 0,
            };
            kernel.services.insert(*port, ProgrammedService::new(&value, slots, service.name.clone(), service.options));
        }
        kernel
    }

    #[test]
    fn each_kind_of_change_is_one_operation_and_removals_come_first() {
        let (web, dns, gone, new) =
            (service("web", &[1, 2]), service("dns", &[3]), service("gone", &[4]), service("new", &[5]));
        let kernel = held(&[(port(1), &web), (port(2), &dns), (port(3), &gone)]);
        let renamed = DesiredService { name: "web2".into(), ..web.clone() };
        let affinity = DesiredService {
            options: PortOptions { affinity_timeout_s: Some(5), ..PortOptions::default() },
            ..dns.clone()
        };
        let out = diff(
            [
                (port(1), Some(&renamed)),
                (port(2), Some(&affinity)),
                (port(4), Some(&new)),
                (port(3), None),
                (port(9), None),
            ],
            &kernel,
            &Foreign::default(),
        );
        let kinds: Vec<_> = out
            .ops
            .iter()
            .map(|op| match op {
                Op::Remove(p) => format!("remove {p}"),
                Op::Add { port, replace, .. } => format!("add {port} replace={replace}"),
                Op::Swap { port, .. } => format!("swap {port}"),
                Op::Retag { port, name, options } => {
                    format!("retag {port} {name:?} {:?}", options.map(|o| o.affinity_timeout_s))
                }
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "remove 10.96.0.3:53/UDP",
                "retag 10.96.0.1:53/UDP Some(\"web2\") None",
                "retag 10.96.0.2:53/UDP None Some(Some(5))",
                "add 10.96.0.4:53/UDP replace=false",
            ]
        );
        let same = diff([(port(1), Some(&web)), (port(2), Some(&dns))], &kernel, &Foreign::default());
        assert!(same.ops.is_empty());
        assert_eq!(same.unchanged, 2);
    }

    #[test]
    fn new_members_damaged_sets_and_foreign_runs_swap_foreign_ids_are_rewritten() {
        let web = service("web", &[1, 2]);
        let mut kernel = held(&[(port(1), &web)]);
        let grown = service("web", &[1, 2, 3]);
        assert!(matches!(diff([(port(1), Some(&grown))], &kernel, &Foreign::default()).ops[..], [Op::Swap { .. }]));
        let foreign_run = Foreign { runs: HashSet::from([port(1)]), ..Foreign::default() };
        assert!(matches!(diff([(port(1), Some(&web))], &kernel, &foreign_run).ops[..], [Op::Swap { .. }]));
        let foreign_id = Foreign { ids: HashSet::from([port(1)]), ..Foreign::default() };
        assert!(matches!(diff([(port(1), Some(&web))], &kernel, &foreign_id).ops[..], [Op::Add { replace: true, .. }]));
        kernel.services.get_mut(&port(1)).unwrap().slots.pop();
        assert!(matches!(diff([(port(1), Some(&web))], &kernel, &Foreign::default()).ops[..], [Op::Swap { .. }]));
    }

    #[test]
    fn a_backend_of_the_other_family_is_refused_and_nothing_else_is_touched() {
        let mut bad = service("web", &[1]);
        bad.backends[0].addr = "fd00::1".parse().unwrap();
        let ok = service("ok", &[2]);
        let out = diff([(port(1), Some(&bad)), (port(2), Some(&ok))], &KernelState::default(), &Foreign::default());
        assert_eq!(out.ops.len(), 1);
        assert_eq!(out.invalid.len(), 1);
        let error = out.invalid[0].1.to_string();
        assert!(error.contains("fd00::1 is not of the ClusterIP's address family"), "{error}");
    }

    #[test]
    fn departures_are_the_backends_the_old_set_drew_and_the_new_one_does_not() {
        let old = alias::build(&[backend(1), backend(2), backend(3)]);
        let new = alias::build(&[backend(2), backend(3), backend(4)]);
        let gone = departures(&port(10), &old, &new);
        assert_eq!(gone, vec![Departure { service: port(10), backend: "10.244.0.1:8053".parse().unwrap() }]);
        assert!(departures(&port(10), &old, &old).is_empty(), "new weights for the same members take nobody away");
        assert_eq!(departures(&port(10), &old, &[]).len(), 3, "a removed service port takes every backend");
    }
}
