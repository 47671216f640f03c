//! Root test of the load signal: the per-backend counters the connect hooks and the program at a
//! TCP socket's end keep, against known connection counts, through the real kernel. Run
//! single-threaded (`--test-threads=1`).
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::{
    net::SocketAddr,
    process::Command,
    time::{Duration, Instant},
};

use topology_dataplane::{Dataplane, LoadSignal, MeasuredBackend};
use topology_model::Protocol;
use topology_policy::desired::{DesiredService, DesiredState, PortOptions, WeightedBackend};
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
    closed: u64,
    refused: u64,
    timed_out: u64,
    reset: u64,
    in_flight: u64,
    rtt_us: u64,
    lifetime_us: u64,
}

impl Sum {
    fn of(measured: impl Iterator<Item = MeasuredBackend>) -> Self {
        measured.fold(Self::default(), |mut s, m| {
            s.connects += m.load.connects;
            s.closed += m.load.closed;
            s.refused += m.load.refused;
            s.timed_out += m.load.timed_out;
            s.reset += m.load.reset;
            s.in_flight += m.in_flight;
            s.rtt_us += m.load.rtt_us;
            s.lifetime_us += m.load.lifetime_us;
            s
        })
    }
}

fn one_backend(fx: &Fixture, index: usize, port: u16) -> WeightedBackend {
    WeightedBackend { port, ..fx.backends[index].weighted(false, 1) }
}

#[test]
fn the_counters_match_the_connections_made() {
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

    // 200 request-per-connection exchanges: each start, each orderly end, nothing left.
    let result = fx.place().tcp(addr("10.96.0.10:80"), 200);
    assert_eq!(result.successes(), 200, "{result:?}");
    let sum = settle(&dp, &both, "200 connections closed", |s| s.closed == 200);
    assert_eq!((sum.connects, sum.in_flight), (200, 0), "{sum:?}");
    assert_eq!((sum.refused, sum.timed_out, sum.reset), (0, 0, 0), "{sum:?}");
    assert!(sum.rtt_us > 0 && sum.lifetime_us > 0, "{sum:?}");
    for backend in both {
        let measured = load_of(&dp, backend).load.connects;
        assert!(measured > 50, "{backend}: {measured} of 200 connects");
    }

    // Connections held open are in flight until they close; UDP is not measured.
    let held: Vec<_> = (0..5).map(|_| fx.place().hold(addr("10.96.0.10:80"))).collect();
    let sum = settle(&dp, &both, "5 connections in flight", |s| s.in_flight == 5);
    assert_eq!((sum.connects, sum.closed), (205, 200), "{sum:?}");
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
    assert_eq!((sum.connects, sum.closed, sum.timed_out, sum.in_flight), (7, 0, 0, 0), "{sum:?}");

    // A backend that drops SYNs: the client gives up after the first retransmission (2 s).
    let result = fx.place().tcp(addr("10.96.0.12:80"), 1);
    assert_eq!(result.failures(), 1, "{result:?}");
    let sum = settle(&dp, &[silent], "a timed-out handshake", |s| s.timed_out == 1);
    assert_eq!((sum.connects, sum.refused, sum.closed, sum.in_flight), (1, 0, 0, 0), "{sum:?}");

    // A socket refused through a measured port that then connects straight to a backend (not a
    // Service) on the same socket: the refusal counts; the second connect counts nowhere, not
    // against the refusing backend (whose in-flight count it would leak) nor the one it reached.
    let direct = fx.backends[0].socket(false);
    let before = load_of(&dp, direct).load;
    let result = fx.place().reconnect(addr("10.96.0.11:80"), direct);
    assert_eq!((result.errno("ECONNREFUSED"), result.successes()), (1, 1), "{result:?}");
    let sum = settle(&dp, &[refusing], "8 refused handshakes", |s| s.refused == 8);
    assert_eq!((sum.connects, sum.closed, sum.in_flight), (8, 0, 0), "{sum:?}");
    assert_eq!(load_of(&dp, direct).load.connects, before.connects, "the direct connect is not measured");

    // Refused, then the same socket through a measured port again: the first start ends refused
    // when the connect hook sees the socket connect again.
    let before = Sum::of(both.iter().map(|b| load_of(&dp, *b)));
    let result = fx.place().reconnect(addr("10.96.0.11:80"), addr("10.96.0.10:80"));
    assert_eq!((result.errno("ECONNREFUSED"), result.successes()), (1, 1), "{result:?}");
    let sum = settle(&dp, &[refusing], "9 refused handshakes", |s| s.refused == 9);
    assert_eq!((sum.connects, sum.in_flight), (9, 0), "{sum:?}");
    let sum = settle(&dp, &both, "the second connect ended", |s| s.closed == before.closed + 1);
    assert_eq!((sum.connects, sum.in_flight), (before.connects + 1, 0), "{sum:?}");

    // Backends no set holds any more, with nothing in flight, are forgotten; live ones are kept.
    desired.services.retain(|port, _| port.vip == "10.96.0.10".parse::<std::net::IpAddr>().unwrap());
    let report = dp.apply(&desired);
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(dp.prune_backend_load().expect("prune"), 2);
    let left: Vec<_> = dp.backend_load().expect("read").into_iter().map(|m| m.backend).collect();
    assert_eq!(left, both.to_vec());
}

#[test]
fn the_load_signal_costs_other_sockets_nothing_and_survives_reloads_and_a_small_table() {
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
    desired.services.get_mut(&port).expect("the port").options.measured = true;
    // The holder below also holds UDP sockets to the same port (never measured: TCP only).
    let udp = service("10.96.0.10", 80, Protocol::Udp);
    desired.services.insert(udp, DesiredService { name: "test/udp".into(), ..desired.services[&port].clone() });
    // Sixteen positions in the TCP connections table: a connection outlives its entry after
    // sixteen newer ones through the hooks.
    let config = |load_signal: bool, kernel_log| {
        let mut config = fx.config();
        config.programs.load_signal = if load_signal { LoadSignal::On } else { LoadSignal::Off };
        config.programs.kernel_log = kernel_log;
        config.programs.capacities.tcp_connections = 16;
        config
    };
    let open = |load_signal: bool| {
        Dataplane::open(&config(load_signal, topology_dataplane::KernelLogLevel::Off)).expect("open dataplane")
    };

    // Nothing on the cgroup but the socket-address hooks: no other socket pays for the signal.
    let mut dp = open(true);
    assert!(dp.apply(&desired).failed.is_empty());
    let programs = attached();
    assert!(!programs.contains("sock_ops") && programs.contains("connect4"), "{programs}");
    assert!(fx.pins.path().join("links").join(topology_common::program_names::TCP_CLOSED).exists());

    // A connection held open while 64 newer ones take every position of the table: its end is
    // still counted (the mark on its socket), and nothing stays in flight.
    let held = fx.place().hold(vip);
    let result = fx.place().tcp(vip, 64);
    assert_eq!(result.successes(), 64, "{result:?}");
    let sum = settle(&dp, &[backend], "64 closed, one open", |s| s.closed == 64 && s.in_flight == 1);
    assert_eq!(sum.connects, 65, "{sum:?}");

    // Reloaded (another fingerprint: a kernel log level) with it still open: the new programs
    // count its end.
    drop(dp);
    let mut dp = Dataplane::open(&config(true, topology_dataplane::KernelLogLevel::Error)).expect("reopen dataplane");
    assert!(dp.apply(&desired).failed.is_empty());
    drop(held);
    let sum = settle(&dp, &[backend], "the held connection closed", |s| s.in_flight == 0);
    assert_eq!((sum.connects, sum.closed, sum.refused), (65, 65, 0), "{sum:?}");
    drop(dp);

    // Restarted with it off: the rewrites stay, nothing is measured.
    let mut dp = open(false);
    assert!(dp.apply(&desired).failed.is_empty());
    let result = fx.place().tcp(vip, 10);
    assert_eq!(result.successes(), 10, "{result:?}");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(load_of(&dp, backend).load.connects, 65);
}
