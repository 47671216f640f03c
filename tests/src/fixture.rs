//! The sandbox most datapath tests need: a child cgroup, a pin directory, a client namespace and
//! backend namespaces each running a server, all removed when the fixture drops.

use std::net::{IpAddr, SocketAddr};

use topology_dataplane::DataplaneConfig;
use topology_model::Protocol;
use topology_policy::desired::{DesiredService, DesiredState, Locality, ServicePort, WeightedBackend};

use crate::{
    net::{ClientPlace, Host, Network, Server, ServerOptions},
    sandbox::{CgroupGuard, PinGuard, unique_id},
    server::Capacity,
};

/// Port every backend server listens on, TCP and UDP.
pub const BACKEND_PORT: u16 = 8080;

/// A backend: its namespace and its server.
#[derive(Debug)]
pub struct Backend {
    /// Name the server answers with.
    pub name: String,
    /// Its server (`None` once stopped). Declared before the host so the server stops first.
    server: Option<Server>,
    /// Host namespace.
    pub host: Host,
}

impl Backend {
    /// The backend's IPv4 or IPv6 address.
    pub fn addr(&self, ipv6: bool) -> IpAddr {
        if ipv6 { IpAddr::V6(self.host.v6) } else { IpAddr::V4(self.host.v4) }
    }

    /// The backend's server address of one family.
    pub fn socket(&self, ipv6: bool) -> SocketAddr {
        SocketAddr::new(self.addr(ipv6), BACKEND_PORT)
    }

    /// Stops its server, as a pod that exits: connections to it are refused from then on.
    pub fn stop(&mut self) {
        drop(self.server.take());
    }

    /// A weighted backend for desired states.
    pub fn weighted(&self, ipv6: bool, weight: u32) -> WeightedBackend {
        WeightedBackend { addr: self.addr(ipv6), port: BACKEND_PORT, weight, locality: Locality::Zone }
    }
}

/// Everything one datapath test owns. Fields drop in order: servers, then pins (links detached),
/// then the cgroup, then the namespaces.
#[derive(Debug)]
pub struct Fixture {
    /// Backends `b0`, `b1`, ...
    pub backends: Vec<Backend>,
    /// Pin directory of this test's dataplane.
    pub pins: PinGuard,
    /// The cgroup the programs attach to and clients run in.
    pub cgroup: CgroupGuard,
    /// The client namespace.
    pub client: Host,
    /// The fabric.
    pub network: Network,
    /// Unique name prefix of this fixture.
    pub id: String,
}

impl Fixture {
    /// A fixture with `backends` servers named `b0`, `b1`, ...
    pub fn new(backends: usize) -> Self {
        Self::with_capacities(&vec![None; backends])
    }

    /// A fixture with one server per entry, named `b0`, `b1`, ..., each with that capacity limit
    /// (`None`: it answers at once).
    pub fn with_capacities(capacities: &[Option<Capacity>]) -> Self {
        let id = unique_id();
        let mut network = Network::new(&id);
        let client = network.host("c");
        let backends = capacities
            .iter()
            .enumerate()
            .map(|(i, capacity)| {
                let host = network.host("b");
                let name = format!("b{i}");
                let options = ServerOptions { capacity: *capacity, ..ServerOptions::default() };
                let server = Server::start_with(&host, &name, &[BACKEND_PORT], &options);
                Backend { name, server: Some(server), host }
            })
            .collect();
        Self { backends, pins: PinGuard::new(&id), cgroup: CgroupGuard::new(&id), client, network, id }
    }

    /// Dataplane configuration for this fixture.
    pub fn config(&self) -> DataplaneConfig {
        DataplaneConfig::new(self.pins.path(), self.cgroup.path())
    }

    /// A scratch directory of this fixture (control files of loop clients), created on demand.
    pub fn scratch(&self) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(&self.id);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        dir
    }

    /// Where clients run: the client namespace, inside the cgroup.
    pub fn place(&self) -> ClientPlace {
        self.place_in(&self.client)
    }

    /// Where another pod's clients run: `host`'s namespace (made on this fixture's network),
    /// inside the cgroup.
    pub fn place_in(&self, host: &Host) -> ClientPlace {
        ClientPlace { netns: host.netns.name().to_owned(), cgroup: self.cgroup.path().to_path_buf(), cpu: None }
    }

    /// A desired state with one service port.
    pub fn one_service(port: ServicePort, backends: Vec<WeightedBackend>) -> DesiredState {
        let mut desired = DesiredState::default();
        desired.services.insert(port, DesiredService { name: format!("test/{port}"), backends, ..Default::default() });
        desired
    }
}

/// A service port.
pub fn service(vip: &str, port: u16, protocol: Protocol) -> ServicePort {
    ServicePort { vip: vip.parse().expect("ClusterIP"), port, protocol }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // The kernel objects go with the fields; the scratch directory is plain files.
        let _ = std::fs::remove_dir_all(std::env::temp_dir().join(&self.id));
    }
}
