//! An isolated network: one "fabric" namespace holding a bridge, and hosts (clients, backends),
//! each in its own namespace with a veth on the bridge. Hosts get 10.244.0.0/16 and fd00:244::/64
//! addresses and no default route, so nothing can leave and an unrewritten ClusterIP (10.96.x.x,
//! fd00:96::x) fails with ENETUNREACH.

use std::{
    io::{BufRead as _, BufReader},
    net::{Ipv4Addr, Ipv6Addr, SocketAddr},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use crate::{
    sandbox::{NetnsGuard, ProcessGuard, run},
    traffic::{Report, StreamReport, Timed, UdpMode},
};

/// The fabric and the hosts attached to it.
#[derive(Debug)]
pub struct Network {
    prefix: String,
    hosts: u32,
    // Declared last: dropped after every host guard held here.
    fabric: NetnsGuard,
}

/// A host namespace with one address per family.
#[derive(Debug)]
pub struct Host {
    /// The namespace.
    pub netns: NetnsGuard,
    /// IPv4 address.
    pub v4: Ipv4Addr,
    /// IPv6 address.
    pub v6: Ipv6Addr,
}

impl Network {
    /// Creates the fabric namespace `<prefix>-fab` with its bridge.
    pub fn new(prefix: &str) -> Self {
        let fabric = NetnsGuard::new(&format!("{prefix}-fab"));
        run("ip", &["-n", fabric.name(), "link", "add", "br0", "type", "bridge"]);
        run("ip", &["-n", fabric.name(), "link", "set", "br0", "up"]);
        Self { prefix: prefix.to_owned(), hosts: 0, fabric }
    }

    /// Adds a host namespace `<prefix>-<role><n>` with a veth on the bridge.
    pub fn host(&mut self, role: &str) -> Host {
        let n = self.hosts + 1;
        assert!(n < 65_000, "too many hosts");
        let v4 = Ipv4Addr::new(10, 244, (n >> 8) as u8, (n & 0xff) as u8);
        let v6 = Ipv6Addr::new(0xfd00, 0x244, 0, 0, 0, 0, 0, n as u16);
        self.host_at(&format!("{role}{n}"), (v4, 16), (v6, 64))
    }

    /// Adds a host namespace `<prefix>-<name>` with a veth on the bridge and these addresses and
    /// on-link prefixes (the caller keeps them apart from every other host's).
    pub fn host_at(&mut self, name: &str, (v4, len4): (Ipv4Addr, u8), (v6, len6): (Ipv6Addr, u8)) -> Host {
        self.hosts += 1;
        let netns = NetnsGuard::new(&format!("{}-{name}", self.prefix));
        let fab = self.fabric.name();
        let port = format!("h{}", self.hosts);
        run("ip", &["-n", fab, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", netns.name()]);
        run("ip", &["-n", fab, "link", "set", &port, "master", "br0", "up"]);
        let ns = netns.name();
        run("ip", &["-n", ns, "addr", "add", &format!("{v4}/{len4}"), "dev", "eth0"]);
        run("ip", &["-n", ns, "addr", "add", &format!("{v6}/{len6}"), "dev", "eth0", "nodad"]);
        run("ip", &["-n", ns, "link", "set", "eth0", "up"]);
        Host { netns, v4, v6 }
    }
}

/// Path of the probe binary: `$TOPOLOGY_PROBE`, else next to the running test's target directory.
pub fn probe_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("TOPOLOGY_PROBE") {
        return PathBuf::from(path);
    }
    sibling_binary("topology-probe")
}

/// Path of the agent binary: `$TOPOLOGY_AGENT`, else next to the running test's target directory.
pub fn agent_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("TOPOLOGY_AGENT") {
        return PathBuf::from(path);
    }
    sibling_binary("topology-agent")
}

/// The image archive `cargo xtask image` writes: `$TOPOLOGY_IMAGE` (which must exist: `cargo xtask
/// test` builds it and sets it), else `target/image/topology-agent.tar` when it is there.
pub fn image_archive() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("TOPOLOGY_IMAGE") {
        let path = PathBuf::from(path);
        assert!(path.is_file(), "$TOPOLOGY_IMAGE names {}, which does not exist", path.display());
        return Some(path);
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/image/topology-agent.tar");
    path.is_file().then_some(path)
}

/// `target/<profile>/<name>`, next to the running binary or, for a test binary running from
/// `target/<profile>/deps/`, one directory up.
fn sibling_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current executable");
    let here = exe.parent().expect("executable directory");
    let candidates = [here.join(name), here.parent().unwrap_or(here).join(name)];
    candidates.iter().find(|path| path.exists()).cloned().unwrap_or_else(|| {
        panic!("{} not built; run `cargo xtask test` (it builds every binary first)", candidates[1].display())
    })
}

/// Where a server runs.
#[derive(Clone, Debug, Default)]
pub struct ServerOptions<'a> {
    /// CPU to pin to.
    pub cpu: Option<usize>,
    /// cgroup to run in (not one with the programs: a backend's own sockets are not clients).
    pub home: Option<&'a Path>,
    /// File for the server's stderr (default: the caller's stderr).
    pub log: Option<&'a Path>,
    /// A real capacity limit on its TCP service (default: it answers at once).
    pub capacity: Option<crate::server::Capacity>,
}

/// A backend server process answering with its name.
#[derive(Debug)]
pub struct Server {
    _process: ProcessGuard,
}

impl Server {
    /// Starts `name` in `host`'s namespace on the given ports of both its addresses, TCP and UDP,
    /// and waits until it listens.
    pub fn start(host: &Host, name: &str, ports: &[u16]) -> Self {
        Self::start_with(host, name, ports, &ServerOptions::default())
    }

    /// Like [`Server::start`], with a CPU to pin to or a cgroup to run in.
    pub fn start_with(host: &Host, name: &str, ports: &[u16], options: &ServerOptions<'_>) -> Self {
        let mut command = Command::new(probe_binary());
        command.args(["--netns", host.netns.name()]);
        if let Some(cpu) = options.cpu {
            command.args(["--cpu", &cpu.to_string()]);
        }
        if let Some(home) = options.home {
            command.arg("--cgroup").arg(home);
        }
        if let Some(log) = options.log {
            command.stderr(std::fs::OpenOptions::new().create(true).append(true).open(log).expect("server log file"));
        }
        command.args(["serve", "--name", name]);
        if let Some(capacity) = options.capacity {
            command.args(["--workers", &capacity.workers.to_string()]);
            command.args(["--service-ms", &capacity.service.as_millis().to_string()]);
        }
        for port in ports {
            for addr in [SocketAddr::from((host.v4, *port)), SocketAddr::from((host.v6, *port))] {
                command.args(["--tcp", &addr.to_string(), "--udp", &addr.to_string()]);
            }
        }
        Self { _process: ProcessGuard::spawn_ready(&mut command, &format!("server {name}")) }
    }
}

/// Where and how a probe client runs.
#[derive(Clone, Debug)]
pub struct ClientPlace {
    /// Network namespace.
    pub netns: String,
    /// cgroup the client joins (where the programs are attached).
    pub cgroup: PathBuf,
    /// CPU the client is pinned to, if any.
    pub cpu: Option<usize>,
}

impl ClientPlace {
    fn command(&self, target: SocketAddr) -> Command {
        self.command_spread(&[target])
    }

    /// A client command whose attempts each dial one of `targets` at random.
    pub(crate) fn command_spread(&self, targets: &[SocketAddr]) -> Command {
        let mut command = Command::new(probe_binary());
        command.args(["--netns", &self.netns, "--cgroup"]).arg(&self.cgroup);
        if let Some(cpu) = self.cpu {
            command.args(["--cpu", &cpu.to_string()]);
        }
        command.arg("client");
        for target in targets {
            command.args(["--target", &target.to_string()]);
        }
        command.args(["--timeout-ms", "2000"]);
        command
    }

    /// `count` TCP connections to `target`, each from a socket that set `ttl` as its own.
    pub fn tcp_with_ttl(&self, target: SocketAddr, count: u64, ttl: u32) -> Report {
        let mut command = self.command(target);
        command.args(["--ttl", &ttl.to_string(), "tcp", "--count", &count.to_string()]);
        run_report(command)
    }

    /// `count` TCP connections to `target`.
    pub fn tcp(&self, target: SocketAddr, count: u64) -> Report {
        let mut command = self.command(target);
        command.args(["tcp", "--count", &count.to_string()]);
        run_report(command)
    }

    /// One TCP socket connecting to `target`, then on the same socket to `then`.
    pub fn reconnect(&self, target: SocketAddr, then: SocketAddr) -> Report {
        let mut command = self.command(target);
        command.args(["reconnect", "--then", &then.to_string()]);
        run_report(command)
    }

    /// One TCP socket, `rounds` times: connected to `target`, dissolved (`connect(AF_UNSPEC)`),
    /// connected to `then`.
    pub fn reconnect_elsewhere(&self, target: SocketAddr, then: SocketAddr, rounds: u32) -> Report {
        let mut command = self.command(target);
        command.args(["reconnect", "--disconnect", "--rounds", &rounds.to_string(), "--then", &then.to_string()]);
        run_report(command)
    }

    /// One UDP socket connected to `target`, then to `then`, a datagram exchanged after each
    /// (see `Client::udp_reconnect`).
    pub fn udp_reconnect(&self, target: SocketAddr, then: SocketAddr) -> Report {
        let mut command = self.command(target);
        command.args(["reconnect", "--udp", "--then", &then.to_string()]);
        run_report(command)
    }

    /// `count` times: resolve `name` through the DNS server `dns`, connect to an answer on `port`.
    pub fn resolve_tcp(&self, dns: SocketAddr, name: &str, port: u16, count: u64) -> Report {
        let mut command = self.command(dns);
        command.args(["resolve", "--count", &count.to_string(), "--name", name, "--port", &port.to_string()]);
        run_report(command)
    }

    /// `count` TCP connections, each to one of `targets` at random, recording every `connect()`
    /// duration.
    pub fn timed_tcp(&self, targets: &[SocketAddr], count: u64) -> Report {
        let mut command = self.command_spread(targets);
        command.args(["--time-connects", "tcp", "--count", &count.to_string()]);
        run_report(command)
    }

    /// `count` timed `connect()` calls of fresh UDP sockets, each to one of `targets` at random,
    /// sending nothing.
    pub fn timed_udp_connect(&self, targets: &[SocketAddr], count: u64) -> Report {
        let mut command = self.command_spread(targets);
        command.args(["udp-connect", "--count", &count.to_string()]);
        run_report(command)
    }

    /// `count` timed connects from this place's cgroup to `targets` and as many from
    /// `baseline_cgroup` to `baseline_targets`, alternating in blocks of `block` in one process (see
    /// [`Client::interleaved`](crate::traffic::Client::interleaved)).
    pub fn interleaved(
        &self,
        timed: Timed,
        targets: &[SocketAddr],
        baseline_cgroup: &Path,
        baseline_targets: &[SocketAddr],
        count: u64,
        block: u64,
    ) -> Report {
        let mut command = self.command_spread(targets);
        let timed = match timed {
            Timed::Tcp => "tcp",
            Timed::UdpConnect => "udp-connect",
        };
        command.args(["interleaved", "--timed", timed, "--count", &count.to_string(), "--block", &block.to_string()]);
        command.arg("--baseline-cgroup");
        command.arg(baseline_cgroup);
        for target in baseline_targets {
            command.args(["--baseline-target", &target.to_string()]);
        }
        run_report(command)
    }

    /// `count` UDP exchanges with `target`.
    pub fn udp(&self, target: SocketAddr, count: u64, mode: UdpMode) -> Report {
        let mut command = self.command(target);
        let mode = match mode {
            UdpMode::Unconnected => "unconnected",
            UdpMode::SameSocket => "same-socket",
            UdpMode::Connected => "connected",
        };
        command.args(["udp", "--count", &count.to_string(), "--mode", mode]);
        run_report(command)
    }

    /// Starts a client holding a TCP connection and a connected UDP socket to `target`; returns
    /// once both are connected.
    pub fn hold(&self, target: SocketAddr) -> HeldSockets {
        let mut command = self.command(target);
        command.arg("hold").stdin(Stdio::piped()).stdout(Stdio::piped());
        let mut process = ProcessGuard::new(command.spawn().expect("spawn probe holder"));
        let stdout = process.child().stdout.take().expect("piped stdout");
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        reader.read_line(&mut line).expect("holder readiness line");
        assert_eq!(line.trim(), "ready", "the holder could not connect");
        process.child().stdout = Some(reader.into_inner());
        HeldSockets { process }
    }

    /// Starts one connected UDP socket exchanging a datagram every `pause` with `target`, and
    /// waits for its first exchange.
    pub fn udp_stream(&self, target: SocketAddr, scratch: &Path, max: Duration, pause: Duration) -> StreamClient {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let stop = scratch.join(format!("stream{n}.stop"));
        let started = scratch.join(format!("stream{n}.started"));
        let _ = std::fs::remove_file(&stop);
        let _ = std::fs::remove_file(&started);
        let mut command = self.command(target);
        command.args(["udp-stream", "--stop-file"]).arg(&stop).arg("--started-file").arg(&started);
        command.args(["--max-ms", &max.as_millis().to_string(), "--pause-ms", &pause.as_millis().to_string()]);
        let process = ProcessGuard::new(command.stdout(Stdio::piped()).spawn().expect("spawn probe stream"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !started.exists() {
            assert!(Instant::now() < deadline, "stream client did not start within 10 s");
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = std::fs::remove_file(&started);
        StreamClient { process, stop }
    }

    /// Starts a client that connects in a loop until told to stop (or `max` passes), and waits
    /// until its first attempt is done. `scratch` is a directory for its control files.
    pub fn spawn_loop(&self, target: SocketAddr, scratch: &Path, max: Duration, udp: bool) -> LoopClient {
        self.spawn_loop_with(target, scratch, max, udp, Duration::ZERO, false)
    }

    /// Like [`ClientPlace::spawn_loop`], pausing `pause` between attempts and, with `stamp`,
    /// recording when and where each attempt landed.
    pub fn spawn_loop_with(
        &self,
        target: SocketAddr,
        scratch: &Path,
        max: Duration,
        udp: bool,
        pause: Duration,
        stamp: bool,
    ) -> LoopClient {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let stop = scratch.join(format!("loop{n}.stop"));
        let started = scratch.join(format!("loop{n}.started"));
        let _ = std::fs::remove_file(&stop);
        let _ = std::fs::remove_file(&started);
        let mut command = self.command(target);
        if stamp {
            command.arg("--record-landings");
        }
        command.args(["loop", "--stop-file"]).arg(&stop).arg("--started-file").arg(&started);
        command.args(["--max-ms", &max.as_millis().to_string(), "--pause-us", &pause.as_micros().to_string()]);
        if udp {
            command.arg("--udp");
        }
        let process = ProcessGuard::new(command.stdout(Stdio::piped()).spawn().expect("spawn probe loop"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !started.exists() {
            assert!(Instant::now() < deadline, "loop client did not start within 10 s");
            std::thread::sleep(Duration::from_millis(5));
        }
        LoopClient { process, stop, started }
    }
}

/// A client holding a TCP connection and a connected UDP socket (see [`ClientPlace::hold`]).
#[derive(Debug)]
pub struct HeldSockets {
    process: ProcessGuard,
}

impl HeldSockets {
    /// Checks the held sockets: both still show the address dialled as their peer, and the UDP
    /// socket still gets its reply from it.
    pub fn check(mut self) -> Report {
        let child = self.process.child();
        {
            use std::io::Write as _;
            let mut stdin = child.stdin.take().expect("piped stdin");
            stdin.write_all(b"check\n").expect("tell the holder to check");
        }
        let mut out = String::new();
        std::io::Read::read_to_string(&mut child.stdout.take().expect("piped stdout"), &mut out).expect("report");
        let status = child.wait().expect("wait for the holder");
        assert!(status.success(), "holder failed: {status}");
        serde_json::from_str(out.lines().last().unwrap_or_default())
            .unwrap_or_else(|e| panic!("hold report {out:?}: {e}"))
    }
}

/// A connected UDP socket exchanging datagrams in the background (see [`ClientPlace::udp_stream`]).
#[derive(Debug)]
pub struct StreamClient {
    process: ProcessGuard,
    stop: PathBuf,
}

impl StreamClient {
    /// Stops the stream and returns what it saw.
    pub fn finish(mut self) -> StreamReport {
        std::fs::write(&self.stop, b"stop").expect("write stop file");
        let child = self.process.child();
        let mut out = String::new();
        std::io::Read::read_to_string(&mut child.stdout.take().expect("piped stdout"), &mut out).expect("report");
        let status = child.wait().expect("wait for the stream client");
        let _ = std::fs::remove_file(&self.stop);
        assert!(status.success(), "stream client failed: {status}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("stream report {out:?}: {e}"))
    }
}

/// A client looping in the background.
#[derive(Debug)]
pub struct LoopClient {
    process: ProcessGuard,
    stop: PathBuf,
    started: PathBuf,
}

impl LoopClient {
    /// Stops the loop and returns its report.
    pub fn finish(mut self) -> Report {
        std::fs::write(&self.stop, b"stop").expect("write stop file");
        let child = self.process.child();
        let mut out = String::new();
        std::io::Read::read_to_string(&mut child.stdout.take().expect("piped stdout"), &mut out).expect("read report");
        let status = child.wait().expect("wait for loop client");
        let _ = std::fs::remove_file(&self.stop);
        let _ = std::fs::remove_file(&self.started);
        assert!(status.success(), "loop client failed: {status}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("loop report {out:?}: {e}"))
    }
}

fn run_report(mut command: Command) -> Report {
    let output = command.output().expect("run probe client");
    assert!(output.status.success(), "probe client failed: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("probe report {:?}: {e}", String::from_utf8_lossy(&output.stdout)))
}

/// A kube-proxy stand-in in one client namespace: the ClusterIP range routed out of `eth0`, and
/// an iptables `nat OUTPUT` DNAT of one service port to one endpoint. Without the route,
/// `connect()` to an unrewritten ClusterIP fails before DNAT runs. Goes with the namespace.
#[derive(Debug)]
pub struct KubeProxyStandIn {
    netns: String,
}

impl KubeProxyStandIn {
    /// Routes 10.96.0.0/16 (and fd00:96::/64) out of the namespace's `eth0`.
    pub fn new(netns: &str) -> Self {
        run("ip", &["-n", netns, "route", "add", "10.96.0.0/16", "dev", "eth0"]);
        run("ip", &["-n", netns, "-6", "route", "add", "fd00:96::/64", "dev", "eth0"]);
        Self { netns: netns.to_owned() }
    }

    /// Sends `protocol` (`tcp`/`udp`) to `vip` on to `endpoint`, replacing what was there.
    pub fn forward(&self, protocol: &str, vip: SocketAddr, endpoint: SocketAddr) {
        let tool = if vip.is_ipv4() { "iptables" } else { "ip6tables" };
        // One chain per service port; iptables chain names are at most 28 characters.
        let digest = vip
            .to_string()
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
        let chain = format!("TOPO-{}-{:016x}", protocol.to_uppercase(), digest);
        let exec = |args: &[&str]| {
            let mut full = vec!["netns", "exec", &self.netns, tool, "-w", "-t", "nat"];
            full.extend_from_slice(args);
            std::process::Command::new("ip").args(&full).output().expect("run iptables")
        };
        if exec(&["-N", &chain]).status.success() {
            let port = vip.port().to_string();
            let vip_ip = vip.ip().to_string();
            let jump = ["-A", "OUTPUT", "-d", &vip_ip, "-p", protocol, "--dport", &port, "-j", &chain];
            let output = exec(&jump);
            assert!(output.status.success(), "iptables: {}", String::from_utf8_lossy(&output.stderr));
        } else {
            exec(&["-F", &chain]);
        }
        let target = endpoint.to_string();
        let output = exec(&["-A", &chain, "-p", protocol, "-j", "DNAT", "--to-destination", &target]);
        assert!(output.status.success(), "iptables DNAT: {}", String::from_utf8_lossy(&output.stderr));
    }
}
