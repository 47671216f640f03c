//! DNS for the responder's tests: a stand-in upstream that answers every name with one address,
//! and `dig` run inside a test namespace.

use std::{
    io::{BufRead as _, BufReader},
    net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket},
    process::{Command, Stdio},
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

/// Answers every query on `listen` (UDP) with `answer` as an A record, or never (`silent`),
/// until the process is killed. Calls `ready` once bound.
pub fn serve_upstream(listen: SocketAddr, answer: Ipv4Addr, silent: bool, ready: impl FnOnce()) -> anyhow::Result<()> {
    let socket = UdpSocket::bind(listen)?;
    ready();
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
        socket.send_to(&response.to_vec()?, source)?;
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
    let host = network.host("up");
    let mut command = Command::new(probe_binary());
    command.args(["--netns", host.netns.name()]);
    if let Some(cpu) = cpu {
        command.args(["--cpu", &cpu.to_string()]);
    }
    command.args(["dns-upstream", "--listen", &format!("{}:53", host.v4)]);
    if silent {
        command.arg("--silent");
    }
    if let Some(home) = home {
        crate::sandbox::join_cgroup_on_spawn(&mut command, home);
    }
    let mut process = ProcessGuard::new(command.stdout(Stdio::piped()).spawn().expect("spawn upstream"));
    let mut line = String::new();
    BufReader::new(process.child().stdout.take().expect("stdout")).read_line(&mut line).expect("ready line");
    assert_eq!(line.trim(), "ready");
    (host, process)
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
