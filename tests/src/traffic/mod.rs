//! Traffic the tests and the demo generate: clients that record where each connection or datagram
//! landed and what errno came back (the backends that answer are in `server`).

use std::{
    io::{self, Read as _},
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket},
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};

mod report;
pub use report::{Report, errno_name, monotonic_ns};

/// One of `targets`: the only one, or one picked by `attempt` pseudo-randomly.
pub(crate) fn pick(targets: &[SocketAddr], attempt: u64) -> SocketAddr {
    match targets {
        [only] => *only,
        targets => targets[(mix(attempt) % targets.len() as u64) as usize],
    }
}

/// splitmix64: a uniform, stateless mix of a counter.
fn mix(n: u64) -> u64 {
    let mut x = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// What a long-lived connected UDP socket saw (see [`Client::udp_stream`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamReport {
    /// Every exchange.
    pub report: Report,
    /// (ms since start, backend) whenever the answering backend changed.
    pub switches: Vec<(u64, String)>,
    /// (ms since start, errno) of every failed exchange.
    pub errors_at: Vec<(u64, String)>,
}

/// How a UDP client talks to the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
pub enum UdpMode {
    /// A new unconnected socket per request (`sendto`/`recvfrom`).
    Unconnected,
    /// One unconnected socket for every request, like a resolver.
    SameSocket,
    /// A new connected socket per request (`connect`/`send`/`recv`).
    Connected,
}

/// Which `connect()` an interleaved comparison times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Timed {
    /// A TCP connection: socket, connect (the handshake), read the backend's name, close.
    Tcp,
    /// `connect()` of a fresh UDP socket, which sends nothing.
    UdpConnect,
}

/// The other side of an interleaved comparison: another cgroup (where other programs, or none,
/// are attached) and the addresses dialled from it.
#[derive(Clone, Debug)]
pub struct Baseline {
    /// `cgroup.procs` of the cgroup the client lives in otherwise.
    pub home_procs: PathBuf,
    /// `cgroup.procs` of the baseline's cgroup.
    pub procs: PathBuf,
    /// Addresses dialled from the baseline, one picked at random per attempt.
    pub targets: Vec<SocketAddr>,
}

/// Options shared by the clients.
#[derive(Clone, Debug)]
pub struct Client {
    /// Addresses dialled (ClusterIPs or backends): one, or several picked at random per attempt,
    /// the way a load balancer spreads connections (a baseline for the balanced hook).
    pub targets: Vec<SocketAddr>,
    /// Timeout of each connect or reply.
    pub timeout: Duration,
    /// Record `connect()` durations.
    pub time_connects: bool,
    /// Record when and where each successful attempt landed (loops).
    pub record_landings: bool,
    /// TCP: the TTL (`IP_TTL`) each socket sets before it connects.
    pub ttl: Option<u32>,
}

impl Client {
    /// The address of attempt number `attempt`: the only target, or a pseudo-random one of them.
    fn target(&self, attempt: u64) -> SocketAddr {
        pick(&self.targets, attempt)
    }

    /// `count` TCP connections; each reads the backend's name and checks `getpeername()`.
    pub fn tcp(&self, count: u64) -> Report {
        let mut report = Report::default();
        for attempt in 0..count {
            self.tcp_once(self.target(attempt), &mut report, self.time_connects);
        }
        report
    }

    /// `count` `connect()` calls on fresh UDP sockets, timed, without sending anything: the
    /// syscall does no network I/O, so its duration is the route lookup plus any cgroup hook.
    pub fn udp_connects(&self, count: u64) -> Report {
        let mut report = Report::default();
        for attempt in 0..count {
            self.udp_connect_once(self.target(attempt), &mut report);
        }
        report
    }

    fn udp_connect_once(&self, target: SocketAddr, report: &mut Report) {
        let outcome = self.udp_socket(target).and_then(|socket| {
            let started = Instant::now();
            let connected = socket.connect(target);
            report.connect_ns.push(started.elapsed().as_nanos() as u64);
            connected.map(|()| "connected".to_owned())
        });
        report.record(outcome);
    }

    /// `count` timed connects from this cgroup to `self.targets` and `count` from the baseline's
    /// cgroup to its targets, alternating in blocks of `block`, the two blocks of each pair in a
    /// random order. The process moves between the cgroups before each block (a socket runs the
    /// programs of the cgroup it was created in), so both sides share the process, the CPU, the
    /// namespace and the moment: drift of the machine cancels block by block. Each block starts
    /// with one untimed connect, so the move's own cache footprint is not measured; `block = 1`
    /// alternates connect by connect.
    pub fn interleaved(&self, timed: Timed, baseline: &Baseline, count: u64, block: u64) -> io::Result<Report> {
        let block = block.max(1);
        let mut report = Report::default();
        let mut here = true;
        let mut attempt = 0;
        for pair in 0..count.div_ceil(block) {
            let baseline_first = mix(pair ^ 0x5bd1_e995) & 1 == 1;
            for baseline_turn in [baseline_first, !baseline_first] {
                if here == baseline_turn {
                    let procs = if baseline_turn { &baseline.procs } else { &baseline.home_procs };
                    std::fs::write(procs, std::process::id().to_string())?;
                    here = !baseline_turn;
                }
                let targets = if baseline_turn { &baseline.targets } else { &self.targets };
                let first = attempt;
                for n in 0..=block.min(count - pair * block) {
                    let target = pick(targets, first + n);
                    let mut one = Report::default();
                    match timed {
                        Timed::Tcp => self.tcp_once(target, &mut one, true),
                        Timed::UdpConnect => self.udp_connect_once(target, &mut one),
                    }
                    let ns = one.connect_ns.pop().unwrap_or_default();
                    if n > 0 {
                        if baseline_turn { &mut report.baseline_ns } else { &mut report.connect_ns }.push(ns);
                    }
                    report.merge(&one);
                }
                attempt = first;
            }
            attempt += block + 1;
        }
        std::fs::write(&baseline.home_procs, std::process::id().to_string())?;
        Ok(report)
    }

    /// `count` UDP request/response exchanges.
    pub fn udp(&self, count: u64, mode: UdpMode) -> Report {
        let mut report = Report::default();
        let mut shared: Option<UdpSocket> = None;
        for attempt in 0..count {
            let target = self.target(attempt);
            let outcome = match mode {
                UdpMode::Unconnected => {
                    self.udp_socket(target).and_then(|socket| self.udp_exchange(&socket, target, &mut report))
                }
                UdpMode::SameSocket => match &shared {
                    Some(socket) => self.udp_exchange(socket, target, &mut report),
                    None => self.udp_socket(target).and_then(|socket| {
                        let outcome = self.udp_exchange(&socket, target, &mut report);
                        shared = Some(socket);
                        outcome
                    }),
                },
                UdpMode::Connected => self.udp_connected(target, &mut report),
            };
            report.record(outcome);
        }
        report
    }

    /// Repeats TCP (or UDP, one socket each) attempts until `stop` exists or `max` elapsed;
    /// `started` is called once after the first attempt.
    pub fn until(&self, stop: &Path, max: Duration, udp: bool, pause: Duration, started: impl FnOnce()) -> Report {
        let mut report = Report { stamp: self.record_landings, ..Report::default() };
        let begin = Instant::now();
        let mut started = Some(started);
        let mut attempt = 0;
        while !stop.exists() && begin.elapsed() < max {
            let target = self.target(attempt);
            attempt += 1;
            if udp {
                let outcome =
                    self.udp_socket(target).and_then(|socket| self.udp_exchange(&socket, target, &mut report));
                report.record(outcome);
            } else {
                self.tcp_once(target, &mut report, self.time_connects);
            }
            if let Some(started) = started.take() {
                started();
            }
            if !pause.is_zero() {
                thread::sleep(pause);
            }
        }
        report
    }

    /// One TCP socket connecting to the first target and then, on the same socket (as a client
    /// retrying after a refused connect does), to `then`, `rounds` times: one report entry per
    /// connect. With `disconnect`, a connection made is dissolved with `connect(AF_UNSPEC)`
    /// before the next connect (what a client reusing its socket elsewhere does).
    pub fn reconnect(&self, then: SocketAddr, disconnect: bool, rounds: u32) -> io::Result<Report> {
        let target = self.targets[0];
        let domain = socket2::Domain::for_address(target);
        let socket = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
        // A blocking connect, bounded by the send timeout.
        socket.set_write_timeout(Some(self.timeout))?;
        let mut report = Report::default();
        for _ in 0..rounds {
            for to in [target, then] {
                let outcome = socket.connect(&to.into()).and_then(|()| {
                    let mut stream: TcpStream = socket.try_clone()?.into();
                    stream.set_read_timeout(Some(self.timeout))?;
                    let mut name = String::new();
                    stream.read_to_string(&mut name)?;
                    Ok(name.trim().to_owned())
                });
                let connected = outcome.is_ok();
                report.record(outcome);
                if connected && disconnect {
                    dissolve(&socket)?;
                }
            }
        }
        Ok(report)
    }

    /// One UDP socket: connects to the target and exchanges a datagram, then connects to `then`
    /// and exchanges another; each exchange's `getpeername()` and reply source must name the
    /// address connected to (a mismatch is counted), so a rewrite the socket had is undone once it
    /// connects elsewhere.
    pub fn udp_reconnect(&self, then: SocketAddr) -> io::Result<Report> {
        let target = self.targets[0];
        let socket = self.udp_socket(target)?;
        let mut report = Report::default();
        for to in [target, then] {
            let outcome = socket.connect(to).and_then(|()| {
                if socket.peer_addr()? != to {
                    report.peer_mismatch += 1;
                }
                socket.send(b"who")?;
                let mut buf = [0u8; 256];
                let (len, from) = socket.recv_from(&mut buf)?;
                if from != to {
                    report.peer_mismatch += 1;
                }
                Ok(String::from_utf8_lossy(&buf[..len]).trim().to_owned())
            });
            report.record(outcome);
        }
        Ok(report)
    }

    /// Opens a TCP connection and a connected UDP socket to the first target, and sends one
    /// datagram from an unconnected UDP socket without reading the reply; calls `ready`, and once
    /// it returns checks that the connected sockets still show the target as their peer, that
    /// the connected UDP socket still gets its replies, and that the waiting reply reads as from
    /// the target: per-socket state that outlives any number of other sockets.
    pub fn hold(&self, ready: impl FnOnce()) -> io::Result<Report> {
        let target = self.targets[0];
        let tcp = TcpStream::connect_timeout(&target, self.timeout)?;
        let udp = self.udp_socket(target)?;
        udp.connect(target)?;
        let unconnected = self.udp_socket(target)?;
        unconnected.send_to(b"who", target)?;
        ready();
        let mut report = Report::default();
        for peer in [tcp.peer_addr(), udp.peer_addr()] {
            if peer? != target {
                report.peer_mismatch += 1;
            }
        }
        let outcome = udp.send(b"who").and_then(|_| {
            let mut buf = [0u8; 256];
            let len = udp.recv(&mut buf)?;
            Ok(String::from_utf8_lossy(&buf[..len]).trim().to_owned())
        });
        report.record(outcome);
        let waiting = {
            let mut buf = [0u8; 256];
            unconnected.recv_from(&mut buf).map(|(len, from)| {
                if from != target {
                    report.peer_mismatch += 1;
                }
                String::from_utf8_lossy(&buf[..len]).trim().to_owned()
            })
        };
        report.record(waiting);
        Ok(report)
    }

    /// One connected UDP socket exchanging a datagram every `pause` until `stop` exists, as a
    /// DNS client or a metrics sender does; on an error it records it, connects a new socket and
    /// goes on. `switches` holds (ms since start, backend) each time the answering backend
    /// changes, `errors_at` (ms since start, errno) each error.
    pub fn udp_stream(&self, stop: &Path, max: Duration, pause: Duration, started: impl FnOnce()) -> StreamReport {
        let target = self.targets[0];
        let begin = Instant::now();
        let mut out = StreamReport::default();
        let mut started = Some(started);
        let mut socket: Option<UdpSocket> = None;
        while !stop.exists() && begin.elapsed() < max {
            let at = begin.elapsed().as_millis() as u64;
            let outcome = match &socket {
                Some(socket) => Ok(socket),
                None => self.udp_socket(target).and_then(|s| s.connect(target).map(|()| &*socket.insert(s))),
            }
            .and_then(|socket| {
                socket.send(b"who")?;
                let mut buf = [0u8; 256];
                let len = socket.recv(&mut buf)?;
                Ok(String::from_utf8_lossy(&buf[..len]).trim().to_owned())
            });
            match outcome {
                Ok(name) => {
                    if out.switches.last().is_none_or(|(_, last)| *last != name) {
                        out.switches.push((at, name.clone()));
                    }
                    *out.report.landed.entry(name).or_default() += 1;
                }
                Err(error) => {
                    let errno = errno_name(&error);
                    out.errors_at.push((at, errno.clone()));
                    *out.report.errors.entry(errno).or_default() += 1;
                    socket = None;
                }
            }
            out.report.attempts += 1;
            if let Some(started) = started.take() {
                started();
            }
            thread::sleep(pause);
        }
        out
    }

    pub(crate) fn tcp_once(&self, target: SocketAddr, report: &mut Report, timed: bool) {
        let started = Instant::now();
        let stream = match self.ttl {
            None => TcpStream::connect_timeout(&target, self.timeout),
            Some(ttl) => connect_with_ttl(target, ttl, self.timeout),
        };
        if timed {
            report.connect_ns.push(started.elapsed().as_nanos() as u64);
        }
        let connected = stream.is_ok();
        let outcome = stream.and_then(|mut stream| {
            if stream.peer_addr()? != target {
                report.peer_mismatch += 1;
            }
            stream.set_read_timeout(Some(self.timeout))?;
            let mut name = String::new();
            stream.read_to_string(&mut name)?;
            Ok(name.trim().to_owned())
        });
        if connected && outcome.is_err() && report.stamp {
            report.broken_at.push(monotonic_ns());
        }
        report.record(outcome);
    }

    fn udp_socket(&self, target: SocketAddr) -> io::Result<UdpSocket> {
        let socket = UdpSocket::bind(unspecified(&target))?;
        socket.set_read_timeout(Some(self.timeout))?;
        Ok(socket)
    }

    fn udp_exchange(&self, socket: &UdpSocket, target: SocketAddr, report: &mut Report) -> io::Result<String> {
        socket.send_to(b"who", target)?;
        let mut buf = [0u8; 256];
        let (len, from) = socket.recv_from(&mut buf)?;
        if from != target {
            report.peer_mismatch += 1;
        }
        Ok(String::from_utf8_lossy(&buf[..len]).trim().to_owned())
    }

    fn udp_connected(&self, target: SocketAddr, report: &mut Report) -> io::Result<String> {
        let socket = self.udp_socket(target)?;
        socket.connect(target)?;
        if socket.peer_addr()? != target {
            report.peer_mismatch += 1;
        }
        socket.send(b"who")?;
        let mut buf = [0u8; 256];
        let len = socket.recv(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf[..len]).trim().to_owned())
    }
}

/// A TCP connection to `target` from a socket that set `ttl` as its own first.
fn connect_with_ttl(target: SocketAddr, ttl: u32, timeout: Duration) -> io::Result<TcpStream> {
    let socket = socket2::Socket::new(socket2::Domain::for_address(target), socket2::Type::STREAM, None)?;
    socket.set_ttl_v4(ttl)?;
    socket.connect_timeout(&target.into(), timeout)?;
    Ok(socket.into())
}

/// The wildcard address of the target's family.
fn unspecified(target: &SocketAddr) -> SocketAddr {
    match target {
        SocketAddr::V4(_) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
        SocketAddr::V6(_) => SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
    }
}

/// `connect(AF_UNSPEC)`: dissolves the socket's association (RFC-less but POSIX: a TCP socket
/// returns to CLOSE and may connect again).
fn dissolve(socket: &socket2::Socket) -> io::Result<()> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: a zeroed sockaddr whose family is AF_UNSPEC, passed with its own size.
    let unspec = libc::sockaddr { sa_family: libc::AF_UNSPEC as libc::sa_family_t, sa_data: [0; 14] };
    let size = std::mem::size_of::<libc::sockaddr>() as libc::socklen_t;
    // SAFETY: a valid descriptor and a sockaddr of `size` bytes.
    match unsafe { libc::connect(socket.as_raw_fd(), &raw const unspec, size) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}
