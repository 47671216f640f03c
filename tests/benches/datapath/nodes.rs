//! The bench's hooked nodes, one at a time: each a dataplane of its own (a cgroup, pinned maps
//! and links, the Services of its count) installed for its phase of the run and removed after it.
//! A dataplane's programs at a socket's end trace the whole machine, whichever cgroup: with every
//! node installed at once, each connect of any row would end in every node's program, which no
//! node runs.

use std::net::SocketAddr;

use topology_common::program_names;
use topology_dataplane::{Dataplane, DataplaneConfig, PinLayout};
use topology_model::Protocol;
use topology_policy::desired::{DesiredService, DesiredState, Locality, PortOptions, ServicePort, WeightedBackend};
use topology_tests::{
    fixture::Fixture,
    net::ClientPlace,
    sandbox::{CgroupGuard, PinGuard},
    traffic::Timed,
};

use super::{
    HEADLINE_BATCHES, HOOK, HOOK_CHOSEN_FAILING, HOOK_FEEDBACK, HOOK_PEER_FAILING, HOOK_UNMEASURED_NODE, NOT_A_SERVICE,
    outlier,
    rules::vip,
    scenario::{Scenario, run_stats},
};

/// The hooked nodes: each count's with a port under feedback, and at the largest count one
/// measuring nothing and two in the states of outlier ejection that cost a connect anything.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Node {
    Feedback,
    Unmeasured,
    PeerFailing,
    ChosenFailing,
}

impl Node {
    fn suffix(self) -> &'static str {
        match self {
            Node::Feedback => "",
            Node::Unmeasured => "u",
            Node::PeerFailing => "p",
            Node::ChosenFailing => "c",
        }
    }
}

/// One node's dataplane, attached to a cgroup of its own; removed when dropped (its pins, which
/// detach its programs, then its cgroup).
pub struct HookedNode {
    count: usize,
    node: Node,
    pins: PinGuard,
    pub cgroup: CgroupGuard,
}

impl HookedNode {
    /// A dataplane with `count` Services over `backends` (and a port under feedback unless
    /// `Node::Unmeasured`), in the outlier state `node` names.
    pub fn install(fx: &Fixture, count: usize, node: Node, backends: &[SocketAddr]) -> Self {
        let name = format!("{}-hook{count}{}", fx.id, node.suffix());
        let cgroup = CgroupGuard::new(&name);
        let pins = PinGuard::new(&name);
        let mut config =
            DataplaneConfig { pin_path: pins.path().to_path_buf(), cgroup: cgroup.path().to_path_buf(), ..fx.config() };
        // The default holds 65,536 IPv4 service ports; more take one flag (`--capacity`).
        config.programs.capacities.services_v4 =
            config.programs.capacities.services_v4.max((2 * count + 1).next_power_of_two() as u32);
        // As the agent runs by default: its tracing programs run only where a handshake fails.
        config.programs.outlier_ejection = true;
        let mut dp = Dataplane::open(&config).expect("open dataplane");
        let report = dp.apply(&services(count, backends, node != Node::Unmeasured));
        assert!(report.failed.is_empty(), "{:?}", report.failed);
        // Links are pinned: the programs stay attached after the handle is dropped.
        drop(dp);
        let hooked = Self { count, node, pins, cgroup };
        let state = match node {
            Node::PeerFailing => Some(outlier::State::Elsewhere),
            Node::ChosenFailing => Some(outlier::State::Chosen),
            Node::Feedback | Node::Unmeasured => None,
        };
        if let Some(state) = state {
            outlier::Maps::open(&hooked.layout(), target(count)).enter(state, backends);
        }
        hooked
    }

    pub fn layout(&self) -> PinLayout {
        PinLayout::new(self.pins.path())
    }

    /// This node's rows, each interleaved with `baseline` (a cgroup without programs, dialling
    /// the backends); at the `largest` count under feedback, also the rows of the hook's fixed
    /// cost (not a Service) and of a Service under feedback.
    pub fn rows(
        &self,
        client: &ClientPlace,
        baseline: &(std::path::PathBuf, Vec<SocketAddr>),
        largest: usize,
    ) -> Vec<Scenario> {
        let layout = self.layout();
        let load = layout.link(program_names::TCP_CLOSED);
        let load = load.exists().then_some(load);
        let place = ClientPlace { cgroup: self.cgroup.path().to_path_buf(), ..client.clone() };
        let headline = self.count == largest;
        let row = |kind: Timed, name: &'static str, targets: Vec<SocketAddr>| {
            let mut row = Scenario::new(kind, name, Some(self.count), place.clone(), targets);
            row.baseline = Some(baseline.clone());
            row.hook = Some(layout.link("connect4"));
            row.load = load.clone();
            if kind == Timed::Tcp && headline && matches!(name, HOOK | HOOK_FEEDBACK | NOT_A_SERVICE) {
                row.batches = HEADLINE_BATCHES;
            }
            row
        };
        let service = vec![target(self.count)];
        match self.node {
            Node::Unmeasured => vec![row(Timed::Tcp, HOOK_UNMEASURED_NODE, service)],
            Node::PeerFailing => vec![row(Timed::Tcp, HOOK_PEER_FAILING, service)],
            Node::ChosenFailing => vec![row(Timed::Tcp, HOOK_CHOSEN_FAILING, service)],
            Node::Feedback => {
                let mut rows = Vec::new();
                for kind in [Timed::Tcp, Timed::UdpConnect] {
                    rows.push(row(kind, HOOK, service.clone()));
                    if headline {
                        // The hook's fixed cost: it runs and looks the destination up, but rewrites nothing.
                        rows.push(row(kind, NOT_A_SERVICE, baseline.1.clone()));
                    }
                }
                rows.push(row(Timed::Tcp, HOOK_FEEDBACK, vec![SocketAddr::new(vip(self.count), 80)]));
                rows
            }
        }
    }

    /// How many times the outlier ejection programs of this node ran so far.
    pub fn outlier_runs(&self) -> u64 {
        let layout = self.layout();
        let links: Vec<_> = program_names::OUTLIER.iter().map(|(name, _)| layout.link(name)).collect();
        assert!(links.iter().all(|link| link.exists()), "the outlier ejection programs are attached");
        links.iter().map(|link| run_stats(link).1).sum()
    }
}

/// The ClusterIP the client dials: the service in the middle of the list (average position in
/// the iptables chain).
pub fn target(count: usize) -> SocketAddr {
    SocketAddr::new(vip(count / 2), 80)
}

/// `count` services, each with TCP and UDP port 80 over the two backends; with `feedback`, one
/// more (index `count`) whose TCP port is under feedback (measured by the load signal).
fn services(count: usize, backends: &[SocketAddr], feedback: bool) -> DesiredState {
    let mut desired = DesiredState::default();
    let weighted: Vec<WeightedBackend> = backends
        .iter()
        .map(|b| WeightedBackend { addr: b.ip(), port: b.port(), weight: 1, locality: Locality::Zone })
        .collect();
    for index in 0..count {
        for protocol in [Protocol::Tcp, Protocol::Udp] {
            desired.services.insert(
                ServicePort { vip: vip(index), port: 80, protocol },
                DesiredService {
                    name: format!("bench/svc-{index}:{protocol}"),
                    backends: weighted.clone(),
                    ..Default::default()
                },
            );
        }
    }
    if feedback {
        desired.services.insert(
            ServicePort { vip: vip(count), port: 80, protocol: Protocol::Tcp },
            DesiredService {
                name: "bench/feedback:TCP".into(),
                backends: weighted,
                // Under feedback: measured, and with the per-connection limit, so each connect
                // also reads the drawn backend's connections in flight.
                options: PortOptions { measured: true, spill_at: 4, ..PortOptions::default() },
            },
        );
    }
    desired
}
