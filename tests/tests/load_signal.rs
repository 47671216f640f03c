//! Root test of the load signal: the `sock_ops` program's per-backend counters against known
//! connection counts, through the real kernel. Run single-threaded (`--test-threads=1`).

use std::{
    net::SocketAddr,
    process::Command,
    time::{Duration, Instant},
};

use topology_agent::{
    dataplane::{Dataplane, MeasuredBackend},
    desired::{DesiredService, DesiredState, PortOptions, Protocol, WeightedBackend},
};
use topology_tests::{
    fixture::{BACKEND_PORT, Fixture, service},
    require_root,
};

/// A port nothing listens on: the backend's kernel refuses (RST).
const CLOSED_PORT: u16 = 9;
/// A port whose SYNs the backend drops: the handshake times out.
const SILENT_PORT: u16 = 9999;

fn addr(text: &str) -> SocketAddr {
    text.parse().expect("socket address")
}

/// The measurement of `backend`, zero if it has none.
fn load_of(dp: &Dataplane, backend: SocketAddr) -> MeasuredBackend {
    let measured = dp.backend_load().expect("read the load map");
    measured.into_iter().find(|m| m.backend == backend).unwrap_or(MeasuredBackend {
        backend,
        in_flight: 0,
        connecting: 0,
        load: Default::default(),
    })
}

/// Waits up to 5 s for `done` over the measurement of `backends` summed.
fn settle(dp: &Dataplane, backends: &[SocketAddr], what: &str, done: impl Fn(&Sum) -> bool) -> Sum {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let sum = Sum::of(backends.iter().map(|b| load_of(dp, *b)));
        if done(&sum) {
            return sum;
        }
        assert!(Instant::now() < deadline, "{what}: {sum:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Counters summed over backends.
#[derive(Debug, Default)]
struct Sum {
    connects: u64,
    established: u64,
    closed: u64,
    refused: u64,
    timed_out: u64,
    reset: u64,
    in_flight: u64,
    handshake_us: u64,
    lifetime_us: u64,
}

impl Sum {
    fn of(measured: impl Iterator<Item = MeasuredBackend>) -> Self {
        measured.fold(Self::default(), |mut s, m| {
            s.connects += m.load.connects;
            s.established += m.load.established;
            s.closed += m.load.closed;
            s.refused += m.load.refused;
            s.timed_out += m.load.timed_out;
            s.reset += m.load.reset;
            s.in_flight += m.in_flight;
            s.handshake_us += m.load.handshake_us;
            s.lifetime_us += m.load.lifetime_us;
            s
        })
    }
}

fn one_backend(fx: &Fixture, index: usize, port: u16) -> WeightedBackend {
    WeightedBackend { port, ..fx.backends[index].weighted(false, 1) }
}

#[test]
fn the_sock_ops_counters_match_the_connections_made() {
    require_root!();
    let fx = Fixture::new(2);
    let both = [fx.backends[0].socket(false), fx.backends[1].socket(false)];
    let refusing = SocketAddr::new(fx.backends[0].addr(false), CLOSED_PORT);
    let silent = SocketAddr::new(fx.backends[1].addr(false), SILENT_PORT);
    let drop_syns = Command::new("ip")
        .args(["netns", "exec", fx.backends[1].host.netns.name(), "iptables", "-w", "-A", "INPUT", "-p", "tcp"])
        .args(["--dport", &SILENT_PORT.to_string(), "-j", "DROP"])
        .output()
        .expect("run iptables");
    assert!(drop_syns.status.success(), "iptables: {}", String::from_utf8_lossy(&drop_syns.stderr));

    let mut desired = DesiredState::default();
    let all: Vec<_> = (0..2).map(|i| one_backend(&fx, i, BACKEND_PORT)).collect();
    // Measured: ports under feedback. The same backends through an unmeasured port cost nothing.
    let measured = PortOptions { measured: true, ..PortOptions::default() };
    for protocol in [Protocol::Tcp, Protocol::Udp] {
        let port = service("10.96.0.10", 80, protocol);
        desired
            .services
            .insert(port, DesiredService { name: "test/a".into(), backends: all.clone(), options: measured });
    }
    desired.services.insert(
        service("10.96.0.13", 80, Protocol::Tcp),
        DesiredService { name: "test/unmeasured".into(), backends: all.clone(), ..Default::default() },
    );
    let refused =
        DesiredService { name: "test/b".into(), backends: vec![one_backend(&fx, 0, CLOSED_PORT)], options: measured };
    desired.services.insert(service("10.96.0.11", 80, Protocol::Tcp), refused);
    let timeout =
        DesiredService { name: "test/c".into(), backends: vec![one_backend(&fx, 1, SILENT_PORT)], options: measured };
    desired.services.insert(service("10.96.0.12", 80, Protocol::Tcp), timeout);
    let mut dp = Dataplane::open(&fx.config()).expect("open dataplane");
    let report = dp.apply(&desired);
    assert!(report.failed.is_empty(), "{:?}", report.failed);

    // 200 request-per-connection exchanges: each handshake, each orderly close, nothing left.
    let result = fx.place().tcp(addr("10.96.0.10:80"), 200);
    assert_eq!(result.successes(), 200, "{result:?}");
    let sum = settle(&dp, &both, "200 connections closed", |s| s.closed == 200);
    assert_eq!((sum.connects, sum.established, sum.in_flight), (200, 200, 0), "{sum:?}");
    assert_eq!((sum.refused, sum.timed_out, sum.reset), (0, 0, 0), "{sum:?}");
    assert!(sum.handshake_us > 0 && sum.lifetime_us > 0, "{sum:?}");
    for backend in both {
        let measured = load_of(&dp, backend).load.connects;
        assert!(measured > 50, "{backend}: {measured} of 200 connects");
    }

    // Connections held open are in flight until they close; UDP is not measured.
    let held: Vec<_> = (0..5).map(|_| fx.place().hold(addr("10.96.0.10:80"))).collect();
    let sum = settle(&dp, &both, "5 connections in flight", |s| s.in_flight == 5);
    assert_eq!(sum.established, 205, "{sum:?}");
    for holder in held {
        let report = holder.check();
        assert_eq!(report.failures(), 0, "{report:?}");
    }
    let sum = settle(&dp, &both, "the held connections closed", |s| s.closed == 205);
    assert_eq!((sum.in_flight, sum.connects, sum.reset), (0, 205, 0), "{sum:?}");

    // Connections to a backend directly, not through a service, are not this node's choice; those
    // through a port not under feedback are not measured.
    let direct = fx.place().tcp(both[0], 10);
    assert_eq!(direct.successes(), 10, "{direct:?}");
    let unmeasured = fx.place().tcp(addr("10.96.0.13:80"), 20);
    assert_eq!(unmeasured.successes(), 20, "{unmeasured:?}");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(Sum::of(both.iter().map(|b| load_of(&dp, *b))).connects, 205);

    // A port nothing listens on refuses every handshake.
    let result = fx.place().tcp(addr("10.96.0.11:80"), 7);
    assert_eq!(result.errno("ECONNREFUSED"), 7, "{result:?}");
    let sum = settle(&dp, &[refusing], "7 refused handshakes", |s| s.refused == 7);
    assert_eq!((sum.connects, sum.established, sum.timed_out, sum.in_flight), (7, 0, 0, 0), "{sum:?}");

    // A backend that drops SYNs: the client gives up after the first retransmission (2 s).
    let result = fx.place().tcp(addr("10.96.0.12:80"), 1);
    assert_eq!(result.failures(), 1, "{result:?}");
    let sum = settle(&dp, &[silent], "a timed-out handshake", |s| s.timed_out == 1);
    assert_eq!((sum.connects, sum.refused, sum.established), (1, 0, 0), "{sum:?}");

    // A socket refused through a measured port that then connects straight to a backend (not a
    // Service) on the same socket: the refusal counts; the second connect counts nowhere, not
    // against the refusing backend (whose in-flight count it would leak) nor the one it reached.
    let direct = fx.backends[0].socket(false);
    let before = load_of(&dp, direct).load;
    let result = fx.place().reconnect(addr("10.96.0.11:80"), direct);
    assert_eq!((result.errno("ECONNREFUSED"), result.successes()), (1, 1), "{result:?}");
    let sum = settle(&dp, &[refusing], "8 refused handshakes", |s| s.refused == 8);
    assert_eq!((sum.connects, sum.established, sum.in_flight), (8, 0, 0), "{sum:?}");
    assert_eq!(load_of(&dp, direct).load.connects, before.connects, "the direct connect is not measured");

    // Backends no set holds any more, with nothing in flight, are forgotten; live ones are kept.
    desired.services.retain(|port, _| port.vip == "10.96.0.10".parse::<std::net::IpAddr>().unwrap());
    let report = dp.apply(&desired);
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(dp.prune_backend_load().expect("prune"), 2);
    let left: Vec<_> = dp.backend_load().expect("read").into_iter().map(|m| m.backend).collect();
    assert_eq!(left, both.to_vec());
}

#[test]
fn the_load_signal_runs_only_while_a_port_is_measured_and_can_be_turned_off() {
    require_root!();
    let fx = Fixture::new(1);
    let attached = || {
        let out = std::process::Command::new("bpftool")
            .args(["cgroup", "show"])
            .arg(fx.cgroup.path())
            .output()
            .expect("run bpftool");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let port = service("10.96.0.10", 80, Protocol::Tcp);
    let vip = addr("10.96.0.10:80");
    let backend = fx.backends[0].socket(false);
    let mut desired = Fixture::one_service(port, vec![fx.backends[0].weighted(false, 1)]);
    // The holder below also holds UDP sockets to the same port (never measured: TCP only).
    let udp = service("10.96.0.10", 80, Protocol::Udp);
    desired.services.insert(udp, DesiredService { name: "test/udp".into(), ..desired.services[&port].clone() });
    let measure = |desired: &mut DesiredState, on: bool| {
        desired.services.get_mut(&port).expect("the port").options.measured = on;
    };
    let open = |load_signal: bool| {
        Dataplane::open(&topology_agent::dataplane::DataplaneConfig { load_signal, ..fx.config() })
            .expect("open dataplane")
    };

    // No port measured: the program is loaded but every TCP connection is spared its callbacks.
    let mut dp = open(true);
    assert!(dp.apply(&desired).failed.is_empty());
    assert!(!attached().contains("backend_load") && !dp.load_signal_attached(), "{}", attached());
    // A measured port attaches it; its connections are counted.
    measure(&mut desired, true);
    assert!(dp.apply(&desired).failed.is_empty());
    assert!(attached().contains("backend_load") && dp.load_signal_attached(), "{}", attached());
    let held = fx.place().hold(vip);
    let result = fx.place().tcp(vip, 10);
    assert_eq!(result.successes(), 10, "{result:?}");
    let sum = settle(&dp, &[backend], "11 connections, one open", |s| s.connects == 11 && s.in_flight == 1);
    assert_eq!(sum.established, 11, "{sum:?}");

    // Reloaded (another fingerprint: a kernel log level) with a connection open: the program is
    // swapped inside the pinned link, which never runs twice or not at all; the count goes on.
    let link_id = || link_of(&fx.pins.path().join("links").join("backend_load"));
    let before = link_id();
    drop(dp);
    let mut dp = Dataplane::open(&topology_agent::dataplane::DataplaneConfig {
        kernel_log: topology_agent::dataplane::KernelLogLevel::Error,
        ..fx.config()
    })
    .expect("reopen dataplane");
    assert!(dp.apply(&desired).failed.is_empty());
    let after = link_id();
    assert_eq!(before.0, after.0, "the same link");
    assert_ne!(before.1, after.1, "running the new program");
    let report = held.check();
    assert_eq!((report.failures(), report.peer_mismatch), (0, 0), "no translation erased: {report:?}");
    let sum = settle(&dp, &[backend], "the held connection closed", |s| s.in_flight == 0);
    assert_eq!((sum.connects, sum.established, sum.closed), (11, 11, 11), "{sum:?}");

    // The last measured port goes: detached, and its measurements with it.
    measure(&mut desired, false);
    assert!(dp.apply(&desired).failed.is_empty());
    assert!(!attached().contains("backend_load") && !dp.load_signal_attached(), "{}", attached());
    assert!(dp.backend_load().expect("read").is_empty());
    measure(&mut desired, true);
    assert!(dp.apply(&desired).failed.is_empty());
    assert!(dp.load_signal_attached());
    drop(dp);

    // Restarted with it off: the earlier agent's link goes, the rewrites stay, nothing is measured.
    let mut dp = open(false);
    assert!(dp.apply(&desired).failed.is_empty());
    let programs = attached();
    assert!(!programs.contains("backend_load") && programs.contains("connect4"), "{programs}");
    let result = fx.place().tcp(vip, 10);
    assert_eq!(result.successes(), 10, "{result:?}");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(load_of(&dp, backend).load.connects, 0);
    assert!(!fx.pins.path().join("links").join("backend_load").exists());
}

/// The link id and program id of the link pinned at `path`, as bpftool reports them.
fn link_of(path: &std::path::Path) -> (u64, u64) {
    let out = Command::new("bpftool").args(["-j", "link", "show", "pinned"]).arg(path).output().expect("bpftool");
    let link: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bpftool JSON");
    (link["id"].as_u64().expect("link id"), link["prog_id"].as_u64().expect("program id"))
}

#[test]
fn a_connection_older_than_its_table_entry_still_closes_in_the_counts() {
    require_root!();
    let fx = Fixture::new(2);
    let mut config = fx.config();
    // Two batches of socket cookies: newer sockets take the held connection's entry soon.
    config.capacities.tcp_connections = 8192;
    let mut dp = Dataplane::open(&config).expect("open dataplane");
    let measured = PortOptions { measured: true, ..PortOptions::default() };
    let mut desired = DesiredState::default();
    for (vip, backend, options) in [("10.96.0.20", 0, measured), ("10.96.0.21", 1, PortOptions::default())] {
        for protocol in [Protocol::Tcp, Protocol::Udp] {
            let backends = vec![fx.backends[backend].weighted(false, 1)];
            let options = if protocol == Protocol::Tcp { options } else { PortOptions::default() };
            let name = format!("test/{vip}:{protocol}");
            desired.services.insert(service(vip, 80, protocol), DesiredService { name, backends, options });
        }
    }
    assert!(dp.apply(&desired).failed.is_empty());
    let backend = fx.backends[0].socket(false);
    let place = topology_tests::net::ClientPlace { cpu: Some(0), ..fx.place() };

    let held = place.hold(addr("10.96.0.20:80"));
    settle(&dp, &[backend], "the held connection", |s| s.in_flight == 1);
    // 20,000 newer connections through the unmeasured port: the held one's entry is taken.
    let others = place.tcp(addr("10.96.0.21:80"), 20_000);
    assert_eq!(others.failures(), 0, "{:?}", others.errors);
    let report = held.check();
    assert_eq!(report.failures(), 0, "{report:?}");
    // Its close still counts (the flag marks it counted); only its lifetime is unknown.
    let sum = settle(&dp, &[backend], "the held connection closed", |s| s.closed == 1);
    assert_eq!((sum.connects, sum.established, sum.in_flight), (1, 1, 0), "{sum:?}");
}
