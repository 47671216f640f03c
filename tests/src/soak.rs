//! The crash-mid-write soak: clients connecting without pause over TCP and UDP, IPv4 and IPv6,
//! while the cluster file changes 20 times a second (every service's set each time, and a
//! service added or removed) and the agent is killed with SIGKILL at a random 0–50 ms after a
//! change, then restarted. Used by a root test (20 kills) and `cargo xtask bench soak` (200).
//!
//! What must hold: no connection fails; every landing is on a backend of its own service, in a set
//! written for it before the landing and current within [`LAG`] of it (or of the last kill, while
//! the agent is down); after every kill the pinned state is consistent (`verify_pins`: slot runs
//! whole and disjoint, the index agreeing with the hash maps).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use serde_json::Value;
use topology_kube::objects::{self, EndpointSpec};

use crate::{
    agent::{Agent, AgentOptions},
    fixture::{BACKEND_PORT, Fixture},
    net::LoopClient,
    traffic::monotonic_ns,
};

/// How far behind the newest set written a landing's set may be while the agent runs.
pub const LAG: Duration = Duration::from_secs(1);
/// Time between file changes.
const EDIT_EVERY: Duration = Duration::from_millis(50);

/// One service under load.
struct Soaked {
    name: &'static str,
    vip: &'static str,
    port: u16,
    protocol: &'static str,
    ipv6: bool,
    /// The backends its sets are drawn from.
    pool: [usize; 3],
}

/// The services under load.
const SERVICES: [Soaked; 4] = [
    Soaked { name: "tcp4", vip: "10.96.7.1", port: 80, protocol: "TCP", ipv6: false, pool: [0, 1, 2] },
    Soaked { name: "tcp6", vip: "fd00:96::7:1", port: 80, protocol: "TCP", ipv6: true, pool: [0, 1, 2] },
    Soaked { name: "udp4", vip: "10.96.7.2", port: 53, protocol: "UDP", ipv6: false, pool: [3, 4, 5] },
    Soaked { name: "udp6", vip: "fd00:96::7:2", port: 53, protocol: "UDP", ipv6: true, pool: [3, 4, 5] },
];

/// What a soak saw.
#[derive(Debug, Default)]
pub struct SoakReport {
    /// Agent kills.
    pub kills: usize,
    /// Cluster file versions written.
    pub edits: usize,
    /// Set swaps those edits asked for.
    pub swaps: usize,
    /// Connections and exchanges made, and failed.
    pub attempts: u64,
    /// Failed attempts, by errno.
    pub failures: BTreeMap<String, u64>,
    /// Landings checked against the sets written.
    pub landings: usize,
    /// Landings on a backend outside every recent set of their service.
    pub violations: Vec<String>,
    /// Problems `verify_pins` found after kills.
    pub inconsistent: Vec<String>,
    /// Restart-to-ready times.
    pub restarts: Vec<Duration>,
    /// Wall time.
    pub elapsed: Duration,
}

/// The backends each service used in one version of the file.
type Version = BTreeMap<&'static str, BTreeSet<String>>;

/// Runs the soak with `kills` SIGKILLs.
pub fn run(fx: &Fixture, kills: usize, seed: u64) -> SoakReport {
    let file = fx.scratch().join("soak.yaml");
    let versions: Arc<Mutex<Vec<(u64, Version)>>> = Arc::default();
    let backends: Vec<IpAddrPair> = fx.backends.iter().map(|b| (b.addr(false), b.addr(true))).collect();
    write_with(&backends, &file, 0, &versions);
    let log = fx.scratch().join("soak-agent.log");
    let options =
        || AgentOptions { log: Some(&log), ..AgentOptions::new(&file, "node-a", fx.cgroup.path(), fx.pins.path()) };
    let started = Instant::now();
    let mut agent = Agent::start(&options());
    agent.wait_ready(Duration::from_secs(30));

    let clients: Vec<(&str, LoopClient)> = SERVICES
        .iter()
        .flat_map(|&Soaked { name, vip, port, protocol, .. }| {
            let target = SocketAddr::new(vip.parse::<IpAddr>().expect("VIP"), port);
            (0..2).map(move |_| (name, target, protocol == "UDP"))
        })
        .map(|(name, target, udp)| {
            let scratch = fx.scratch();
            (
                name,
                fx.place().spawn_loop_with(
                    target,
                    &scratch,
                    Duration::from_secs(3600),
                    udp,
                    Duration::from_millis(8),
                    true,
                ),
            )
        })
        .collect();

    // The editor: a new version every 50 ms until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let edits = Arc::new(Mutex::new(0usize));
    let editor = {
        let (stop, versions, edits, file) =
            (Arc::clone(&stop), Arc::clone(&versions), Arc::clone(&edits), file.clone());
        let backends = backends.clone();
        std::thread::spawn(move || {
            let mut version = 1;
            while !stop.load(Ordering::Relaxed) {
                write_with(&backends, &file, version, &versions);
                *edits.lock().expect("edits") = version;
                version += 1;
                std::thread::sleep(EDIT_EVERY);
            }
        })
    };

    let mut report = SoakReport::default();
    let mut kill_windows: Vec<(u64, u64)> = Vec::new();
    let mut chance = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for _ in 0..kills {
        // A random moment 0-50 ms after a change: often in the middle of writing it.
        let seen = *edits.lock().expect("edits");
        while *edits.lock().expect("edits") == seen {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_micros(next(&mut chance) % 50_000));
        let killed = monotonic_ns();
        agent.signal(libc::SIGKILL);
        agent.wait_exit(Duration::from_secs(10));
        report.kills += 1;
        if let Err(problem) = topology_dataplane::verify_pins(fx.pins.path()) {
            report.inconsistent.push(format!("after kill {}: {problem}", report.kills));
        }
        let restarted = Instant::now();
        agent = Agent::start(&options());
        agent.wait_ready(Duration::from_secs(30));
        report.restarts.push(restarted.elapsed());
        kill_windows.push((killed, monotonic_ns()));
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    let _ = editor.join();
    std::thread::sleep(Duration::from_millis(500));
    if let Err(problem) = topology_dataplane::verify_pins(fx.pins.path()) {
        report.inconsistent.push(format!("at the end: {problem}"));
    }
    let versions = versions.lock().expect("versions").clone();
    report.edits = versions.len();
    report.swaps = versions.len().saturating_sub(1) * SERVICES.len();
    for (name, client) in clients {
        let seen = client.finish();
        report.attempts += seen.attempts;
        for (errno, count) in &seen.errors {
            *report.failures.entry(errno.clone()).or_default() += count;
        }
        for (at, backend) in &seen.landings {
            report.landings += 1;
            if let Some(problem) = check(name, *at, backend, &versions, &kill_windows) {
                report.violations.push(problem);
            }
        }
    }
    report.elapsed = started.elapsed();
    drop(agent);
    report
}

/// Why a landing at `at` on `backend` is wrong, if it is.
fn check(service: &str, at: u64, backend: &str, versions: &[(u64, Version)], kills: &[(u64, u64)]) -> Option<String> {
    let lag = LAG.as_nanos() as u64;
    // The oldest moment whose set may still be in the kernel: LAG ago, or LAG before a kill
    // whose agent was not ready again until within LAG of this landing.
    let floor = kills
        .iter()
        .filter(|(killed, ready)| *killed <= at && at <= ready + lag)
        .map(|(killed, _)| killed.saturating_sub(lag))
        .fold(at.saturating_sub(lag), u64::min);
    let allowed = versions.iter().enumerate().any(|(i, (written, sets))| {
        let superseded = versions.get(i + 1).map_or(u64::MAX, |(next, _)| *next);
        *written <= at && superseded >= floor && sets.get(service).is_some_and(|set| set.contains(backend))
    });
    (!allowed).then(|| format!("{service} landed on {backend} at {at}: in no set current between {floor} and then"))
}

/// (IPv4, IPv6) address of a backend.
type IpAddrPair = (IpAddr, IpAddr);

/// Writes version `version`: each service's set is two of its three backends, a different two
/// each version (so every version swaps every service's set), and an extra service comes and
/// goes; records the sets, stamped just before the write.
fn write_with(backends: &[IpAddrPair], file: &Path, version: usize, versions: &Mutex<Vec<(u64, Version)>>) {
    let mut objects: Vec<Value> = vec![objects::node("node-a", "zone-a", None, "4")];
    let mut sets = Version::new();
    for (index, &Soaked { name, vip, port, protocol, ipv6, pool }) in SERVICES.iter().enumerate() {
        let left_out = (version + index) % 3;
        let chosen: Vec<usize> =
            pool.iter().copied().enumerate().filter(|(i, _)| *i != left_out).map(|(_, b)| b).collect();
        sets.insert(name, chosen.iter().map(|b| format!("b{b}")).collect());
        objects.push(objects::service("default", name, vip.parse().expect("VIP"), port, protocol, name));
        let endpoints: Vec<EndpointSpec> = chosen
            .iter()
            .map(|&b| EndpointSpec::new(if ipv6 { backends[b].1 } else { backends[b].0 }, "node-a"))
            .collect();
        objects.push(objects::slice("default", &format!("{name}-1"), name, name, BACKEND_PORT, protocol, &endpoints));
    }
    if !version.is_multiple_of(3) {
        let extra = format!("10.96.8.{}", version % 200 + 1);
        objects.push(objects::service("default", "extra", extra.parse().expect("VIP"), 80, "TCP", "http"));
    }
    versions.lock().expect("versions").push((monotonic_ns(), sets));
    objects::write(file, &objects);
}

/// xorshift64*.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_F491_4F6C_DD1D)
}
