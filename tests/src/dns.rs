//! DNS for the responder's tests: a stand-in upstream that answers every name with one address,
//! and `dig` run inside a test namespace.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket},
    process::Command,
    time::{Duration, Instant},
};

use hickory_proto::{
    op::{Message, MessageType, OpCode, Query},
    rr::{Name, RData, Record, RecordType, rdata::A},
};

use crate::{
    net::{Host, Network, probe_binary},
    sandbox::ProcessGuard,
    traffic::{Client, Report, pick},
};

/// TTL of the stand-in upstream's answers, so a test can tell a relayed answer from ours.
pub const UPSTREAM_TTL: u32 = 42;

/// Answers every query on `listen` (UDP) with `answer` as an A record, `delay` after it came, or
/// never (`silent`), until the process is killed. Calls `ready` once bound.
pub fn serve_upstream(
    listen: SocketAddr,
    answer: Ipv4Addr,
    silent: bool,
    delay: Duration,
    ready: impl FnOnce(),
) -> anyhow::Result<()> {
    let socket = UdpSocket::bind(listen)?;
    ready();
    // Replies wait their turn on a thread of their own: the delay is the same for all, so the
    // queue is in order.
    let (later, due) = std::sync::mpsc::channel::<(Instant, Vec<u8>, SocketAddr)>();
    if !delay.is_zero() {
        let sender = socket.try_clone()?;
        std::thread::spawn(move || {
            for (at, reply, to) in due {
                std::thread::sleep(at.saturating_duration_since(Instant::now()));
                let _ = sender.send_to(&reply, to);
            }
        });
    }
    let mut buffer = [0u8; 4096];
    loop {
        let (len, source) = socket.recv_from(&mut buffer)?;
        if silent {
            continue;
        }
        let Ok(request) = Message::from_vec(&buffer[..len]) else { continue };
        let mut response = Message::new(request.metadata.id, MessageType::Response, request.metadata.op_code);
        response.metadata.recursion_desired = request.metadata.recursion_desired;
        response.metadata.recursion_available = true;
        response.add_queries(request.queries.iter().cloned());
        if let Some(query) = request.queries.first() {
            response.add_answer(Record::from_rdata(query.name().clone(), UPSTREAM_TTL, RData::A(A(answer))));
        }
        if delay.is_zero() {
            socket.send_to(&response.to_vec()?, source)?;
        } else {
            later.send((Instant::now() + delay, response.to_vec()?, source))?;
        }
    }
}

/// The stand-in upstream (the probe's `dns-upstream`) in a new host of `network`, answering
/// every name with 192.0.2.7 (or never, `silent`) on port 53 of the host's IPv4 address; the
/// process joins `home` and runs on `cpu` only, when given.
pub fn start_upstream(
    network: &mut Network,
    silent: bool,
    home: Option<&std::path::Path>,
    cpu: Option<usize>,
) -> (Host, ProcessGuard) {
    start_upstream_after(network, silent, home, cpu, Duration::ZERO)
}

/// [`start_upstream`], each answer sent `delay` after its query came (a slow upstream: queries
/// stay in flight).
pub fn start_upstream_after(
    network: &mut Network,
    silent: bool,
    home: Option<&std::path::Path>,
    cpu: Option<usize>,
    delay: Duration,
) -> (Host, ProcessGuard) {
    let host = network.host("up");
    let mut command = Command::new(probe_binary());
    command.args(["--netns", host.netns.name()]);
    if let Some(cpu) = cpu {
        command.args(["--cpu", &cpu.to_string()]);
    }
    command.args(["dns-upstream", "--listen", &format!("{}:53", host.v4)]);
    command.args(["--delay-ms", &delay.as_millis().to_string()]);
    if silent {
        command.arg("--silent");
    }
    if let Some(home) = home {
        crate::sandbox::join_cgroup_on_spawn(&mut command, home);
    }
    (host, ProcessGuard::spawn_ready(&mut command, "the upstream"))
}

/// The agent serving DNS on port 53 of `host` (a pod of the node, steering the cluster DNS to
/// itself), relaying to `upstream`, from the cluster `file`; ready.
pub fn start_dns_agent(
    fx: &crate::fixture::Fixture,
    host: &Host,
    file: &std::path::Path,
    upstream: SocketAddr,
) -> crate::agent::Agent {
    start_dns_agent_with(fx, host, file, upstream, &[])
}

/// [`start_dns_agent`] with `extra` arguments.
pub fn start_dns_agent_with(
    fx: &crate::fixture::Fixture,
    host: &Host,
    file: &std::path::Path,
    upstream: SocketAddr,
    extra: &[&str],
) -> crate::agent::Agent {
    let mut args =
        vec!["--dns-listen".into(), format!("{}:53", host.v4), "--dns-upstream".into(), upstream.to_string()];
    args.extend(extra.iter().map(|arg| arg.to_string()));
    let mut agent = crate::agent::Agent::start(&crate::agent::AgentOptions {
        netns: Some(host.netns.name()),
        extra: args,
        ..crate::agent::AgentOptions::new(file, "node-a", fx.cgroup.path(), fx.pins.path())
    });
    agent.wait_ready(Duration::from_secs(30));
    agent
}

/// What `dig` saw.
#[derive(Debug)]
pub struct Dig {
    /// `status:` of the header (`NOERROR`, `NXDOMAIN`, `SERVFAIL`…).
    pub status: String,
    /// Answer records as dig prints them: `name ttl class type data`, whitespace-normalised.
    pub answers: Vec<String>,
    /// The data of each answer record (addresses, SRV data), sorted.
    pub data: Vec<String>,
    /// How long dig took.
    pub elapsed: Duration,
}

/// Runs `dig @server -p port name type [extra…]` inside `netns` (if any); one try, 4 s timeout.
pub fn dig(netns: Option<&str>, server: SocketAddr, name: &str, rtype: &str, extra: &[&str]) -> Dig {
    dig_from(netns, None, server, name, rtype, extra)
}

/// [`dig`], the process in `cgroup` (where the programs are attached) when given.
pub fn dig_from(
    netns: Option<&str>,
    cgroup: Option<&std::path::Path>,
    server: SocketAddr,
    name: &str,
    rtype: &str,
    extra: &[&str],
) -> Dig {
    let mut command = match netns {
        Some(netns) => {
            let mut command = Command::new("ip");
            command.args(["netns", "exec", netns, "dig"]);
            command
        }
        None => Command::new("dig"),
    };
    command
        .arg(format!("@{}", server.ip()))
        .args(["-p", &server.port().to_string(), "+tries=1", "+time=4", "+noall", "+comments", "+answer"])
        .args(extra)
        .args([name, rtype]);
    if let Some(cgroup) = cgroup {
        crate::sandbox::join_cgroup_on_spawn(&mut command, cgroup);
    }
    let started = Instant::now();
    let output = command.output().expect("dig (cargo xtask setup installs dnsutils)");
    let elapsed = started.elapsed();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let status = text.split("status: ").nth(1).and_then(|rest| rest.split(',').next()).unwrap_or("NO REPLY").to_owned();
    let answers: Vec<String> = text
        .lines()
        .filter(|line| !line.starts_with(';') && !line.trim().is_empty())
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    let mut data: Vec<String> = answers.iter().map(|a| a.split(' ').skip(4).collect::<Vec<_>>().join(" ")).collect();
    data.sort();
    Dig { status, answers, data, elapsed }
}

/// `count` times, as a client-side balancer does: resolve `name` (A, over UDP) through `server`,
/// then connect to one of the answered addresses at random on `port` and read the backend's name.
/// A lookup that fails or answers no address counts as a failed attempt (`ENOENT`).
pub fn resolve_and_connect(client: &Client, server: SocketAddr, name: &str, port: u16, count: u64) -> Report {
    let mut report = Report::default();
    for attempt in 0..count {
        match resolve(server, name, client.timeout) {
            Ok(addresses) if !addresses.is_empty() => {
                let targets: Vec<SocketAddr> = addresses.into_iter().map(|ip| SocketAddr::new(ip, port)).collect();
                client.tcp_once(pick(&targets, attempt), &mut report, false);
            }
            Ok(_) => report.record(Err(std::io::Error::from_raw_os_error(libc::ENOENT))),
            Err(error) => report.record(Err(error)),
        }
    }
    report
}

/// The A records of `name` from `server`, over a connected UDP socket (as glibc asks).
fn resolve(server: SocketAddr, name: &str, timeout: Duration) -> std::io::Result<Vec<IpAddr>> {
    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    socket.set_read_timeout(Some(timeout))?;
    socket.connect(server)?;
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(1);
    let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) ^ (std::process::id() as u16);
    let mut query = Message::new(id, MessageType::Query, OpCode::Query);
    query.metadata.recursion_desired = true;
    let name = Name::from_ascii(name).map_err(std::io::Error::other)?;
    query.add_query(Query::query(name, RecordType::A));
    socket.send(&query.to_vec().map_err(std::io::Error::other)?)?;
    let mut buffer = [0u8; 4096];
    loop {
        let len = socket.recv(&mut buffer)?;
        let Ok(reply) = Message::from_vec(&buffer[..len]) else { continue };
        if reply.metadata.id != id {
            continue;
        }
        return Ok(reply
            .answers
            .iter()
            .filter_map(|record| match &record.data {
                RData::A(a) => Some(IpAddr::V4(a.0)),
                _ => None,
            })
            .collect());
    }
}

/// What [`lookups`] saw.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Lookups {
    /// Lookups made.
    pub made: u64,
    /// Lookups with no address in time (one try, no retry), with the first errors.
    pub failed: u64,
    /// The first few failures, and when (milliseconds after the start).
    pub failures: Vec<(u64, String)>,
    /// Answers by address.
    pub answers: std::collections::BTreeMap<String, u64>,
}

/// Numbers the lookups, for names with `{n}`.
static LOOKUP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Looks `name` up through `server` about `rate` times a second for `seconds`, each on a fresh
/// connected UDP socket, one try within `timeout` (no retry: a query a handover drops shows), from
/// `threads` threads (each waits for its lookup: enough for the rate times the latency); `{n}` in
/// `name` is a number of its own in each lookup.
pub fn lookups(server: SocketAddr, name: &str, rate: u64, seconds: u64, timeout: Duration, threads: u64) -> Lookups {
    let started = Instant::now();
    let every = Duration::from_secs_f64(threads as f64 / rate as f64);
    let until = started + Duration::from_secs(seconds);
    let report = std::sync::Mutex::new(Lookups::default());
    std::thread::scope(|scope| {
        for thread in 0..threads {
            let report = &report;
            scope.spawn(move || {
                let mut next = started + every.mul_f64(thread as f64 / threads as f64);
                while next < until {
                    std::thread::sleep(next.saturating_duration_since(Instant::now()));
                    next += every;
                    let unique = LOOKUP.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let result = resolve(server, &name.replace("{n}", &unique.to_string()), timeout);
                    let mut report = report.lock().expect("report");
                    report.made += 1;
                    match result {
                        Ok(addresses) if !addresses.is_empty() => {
                            for address in addresses {
                                *report.answers.entry(address.to_string()).or_default() += 1;
                            }
                        }
                        outcome => {
                            report.failed += 1;
                            if report.failures.len() < 10 {
                                let at = started.elapsed().as_millis() as u64;
                                report.failures.push((at, format!("{outcome:?}")));
                            }
                        }
                    }
                }
            });
        }
    });
    report.into_inner().expect("report")
}
