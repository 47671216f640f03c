//! The traffic probe: a backend server or a client, optionally placed in a network namespace and a
//! cgroup first. Clients print a JSON `Report` on stdout.

use std::{
    fs::File,
    io::Write as _,
    net::SocketAddr,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use topology_tests::{
    server,
    traffic::{Baseline, Client, Timed, UdpMode},
};

#[derive(Parser)]
#[command(about = "Backend server and traffic client for topology-agent tests and demos")]
struct Args {
    /// Network namespace (`ip netns` name) to enter first.
    #[arg(long)]
    netns: Option<String>,
    /// cgroup v2 directory to join first (before any socket exists).
    #[arg(long)]
    cgroup: Option<PathBuf>,
    /// Run on this CPU only (benchmarks pin clients and servers apart to cut noise).
    #[arg(long)]
    cpu: Option<usize>,
    #[command(subcommand)]
    command: Mode,
}

#[derive(Subcommand)]
enum Mode {
    /// Answer TCP connections and UDP datagrams with a name.
    Serve {
        /// Name to answer with.
        #[arg(long)]
        name: String,
        /// TCP address to listen on (repeatable).
        #[arg(long)]
        tcp: Vec<SocketAddr>,
        /// UDP address to listen on (repeatable).
        #[arg(long)]
        udp: Vec<SocketAddr>,
        /// Serve TCP with this many workers (a real capacity limit); default: answer at once.
        #[arg(long)]
        workers: Option<usize>,
        /// Time each worker takes per connection, milliseconds.
        #[arg(long, default_value_t = 0)]
        service_ms: u64,
    },
    /// Serve bulk transfers (see `topology_tests::bulk`).
    ServeBulk {
        /// TCP address to listen on (repeatable).
        #[arg(long, required = true)]
        tcp: Vec<SocketAddr>,
        /// Only hold the connections accepted (many idle connections).
        #[arg(long)]
        hold: bool,
    },
    /// Serve datagrams of known sizes (see `topology_tests::datagrams`).
    ServeDatagrams {
        /// UDP address to listen on (repeatable).
        #[arg(long, required = true)]
        udp: Vec<SocketAddr>,
    },
    /// A stand-in DNS upstream: answers every UDP query with one A record, or never (`--silent`).
    DnsUpstream {
        /// UDP address to listen on.
        #[arg(long)]
        listen: SocketAddr,
        /// The address every answer holds.
        #[arg(long, default_value = "192.0.2.7")]
        answer: std::net::Ipv4Addr,
        /// Receive queries and never answer.
        #[arg(long)]
        silent: bool,
        /// Answer each query this long after it came.
        #[arg(long, default_value_t = 0)]
        delay_ms: u64,
    },
    /// Dial a target and report where each attempt landed.
    Client {
        /// Address to dial; repeated, each attempt picks one at random (all of one family).
        #[arg(long, required = true)]
        target: Vec<SocketAddr>,
        /// Timeout of each connect or reply, in milliseconds.
        #[arg(long, default_value_t = 2000)]
        timeout_ms: u64,
        /// Record every connect() duration.
        #[arg(long)]
        time_connects: bool,
        /// Record when and where each attempt of a loop landed.
        #[arg(long)]
        record_landings: bool,
        /// TCP: set this TTL (IP_TTL) on each socket before it connects.
        #[arg(long)]
        ttl: Option<u32>,
        #[command(subcommand)]
        traffic: Traffic,
    },
}

#[derive(Subcommand)]
enum Traffic {
    /// TCP connections.
    Tcp {
        #[arg(long)]
        count: u64,
    },
    /// One TCP socket: connect to the target, then on the same socket to `then`.
    Reconnect {
        #[arg(long)]
        then: SocketAddr,
        /// A UDP socket instead, exchanging a datagram after each connect.
        #[arg(long)]
        udp: bool,
        /// TCP: dissolve the first connection with `connect(AF_UNSPEC)` before the second.
        #[arg(long)]
        disconnect: bool,
        /// TCP: this many rounds of both connects on the one socket.
        #[arg(long, default_value_t = 1)]
        rounds: u32,
    },
    /// Resolve a name through the target (a DNS server), then connect over TCP to one of the
    /// addresses answered, at random, as a client-side balancer does.
    Resolve {
        #[arg(long)]
        count: u64,
        /// The name to resolve (A).
        #[arg(long)]
        name: String,
        /// The port to connect to on the answered addresses.
        #[arg(long)]
        port: u16,
    },
    /// Look a name up through the target (a DNS server) at a steady rate, each on a fresh socket,
    /// one try: prints what answered and what failed.
    Lookups {
        /// Lookups per second.
        #[arg(long)]
        rate: u64,
        #[arg(long)]
        seconds: u64,
        /// The name to look up (A); `{n}` becomes a number of its own in each lookup.
        #[arg(long)]
        name: String,
        /// Threads asking, each one lookup at a time: at least the rate times the latency.
        #[arg(long, default_value_t = 32)]
        threads: u64,
    },
    /// Bulk transfers of known sizes, one connection after another; prints what moved.
    Bulk {
        /// Connections.
        #[arg(long, default_value_t = 1)]
        count: u64,
        /// Payload bytes each sends.
        #[arg(long)]
        send: u64,
        /// Bytes each asks the server for.
        #[arg(long, default_value_t = 0)]
        receive: u64,
        /// Milliseconds each spreads its payload over (holding the connection open).
        #[arg(long, default_value_t = 0)]
        hold_ms: u64,
    },
    /// Datagrams of known sizes to each target in turn, each answered; prints what moved.
    Datagrams {
        /// Datagrams to each target.
        #[arg(long)]
        count: u64,
        /// Bytes of each.
        #[arg(long)]
        size: usize,
        /// Bytes each asks back.
        #[arg(long, default_value_t = 0)]
        reply: u32,
        /// One connected socket per target, else one unconnected socket for all.
        #[arg(long)]
        connected: bool,
        /// Peek at each answer before receiving it.
        #[arg(long)]
        peek: bool,
    },
    /// Open TCP connections and hold them: prints `open N`, ends at a line on stdin.
    Open {
        #[arg(long)]
        count: u64,
    },
    /// UDP request/response exchanges.
    Udp {
        #[arg(long)]
        count: u64,
        #[arg(long, value_enum, default_value = "unconnected")]
        mode: UdpMode,
    },
    /// Timed connect() calls on fresh UDP sockets, sending nothing.
    UdpConnect {
        #[arg(long)]
        count: u64,
    },
    /// Timed connects alternating with connects from a baseline cgroup, pair by pair in one
    /// process (needs --cgroup: the process moves between the two).
    Interleaved {
        #[arg(long, value_enum)]
        timed: Timed,
        /// Timed connects on each side.
        #[arg(long)]
        count: u64,
        /// Connects per stay in one cgroup, after one untimed connect (1: alternate every connect).
        #[arg(long, default_value_t = 1)]
        block: u64,
        /// cgroup v2 directory of the baseline side.
        #[arg(long)]
        baseline_cgroup: PathBuf,
        /// Address the baseline side dials (repeatable; one at random per attempt).
        #[arg(long, required = true)]
        baseline_target: Vec<SocketAddr>,
    },
    /// Hold a TCP connection and a connected UDP socket to the target; print `ready`, wait for a
    /// line on stdin, then check both still show the target as their peer.
    Hold,
    /// One connected UDP socket exchanging datagrams until the stop file exists, reconnecting
    /// after an error.
    UdpStream {
        #[arg(long)]
        stop_file: PathBuf,
        #[arg(long)]
        started_file: Option<PathBuf>,
        #[arg(long, default_value_t = 60_000)]
        max_ms: u64,
        /// Pause between exchanges, in milliseconds.
        #[arg(long, default_value_t = 10)]
        pause_ms: u64,
    },
    /// Open-loop TCP connections: Poisson arrivals at each phase's rate, whatever became of the
    /// earlier ones; prints every connection's arrival, latency and outcome.
    OpenLoop {
        /// `NAME:RATE_PER_S:SECONDS` (repeatable, in order).
        #[arg(long, required = true)]
        phase: Vec<topology_tests::openloop::Phase>,
        /// Seed of the arrival times.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Most connections in flight; arrivals beyond fail as `overflow`.
        #[arg(long, default_value_t = 10_000)]
        max_in_flight: usize,
    },
    /// Connect in a loop until the stop file exists.
    Loop {
        #[arg(long)]
        stop_file: PathBuf,
        /// File created once the first attempt is done.
        #[arg(long)]
        started_file: Option<PathBuf>,
        /// Upper bound on the loop's duration, in milliseconds.
        #[arg(long, default_value_t = 60_000)]
        max_ms: u64,
        /// UDP exchanges instead of TCP connections.
        #[arg(long)]
        udp: bool,
        /// Pause between attempts, in microseconds.
        #[arg(long, default_value_t = 0)]
        pause_us: u64,
    },
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Both must happen before any thread or socket exists: cgroup membership and namespace are
    // what the kernel stamps on every socket this process creates.
    if let Some(cgroup) = &args.cgroup {
        join_cgroup(cgroup)?;
    }
    if let Some(netns) = &args.netns {
        enter_netns(netns)?;
    }
    if let Some(cpu) = args.cpu {
        pin_to_cpu(cpu)?;
    }
    match args.command {
        Mode::Serve { name, tcp, udp, workers, service_ms } => {
            let capacity =
                workers.map(|workers| server::Capacity { workers, service: Duration::from_millis(service_ms) });
            server::serve(&name, &tcp, &udp, capacity, || {
                println!("ready");
                let _ = std::io::stdout().flush();
            })
            .with_context(|| format!("serving {name}"))?;
        }
        Mode::ServeBulk { tcp, hold } => {
            topology_tests::bulk::serve(&tcp, hold, || {
                println!("ready");
                let _ = std::io::stdout().flush();
            })
            .context("serving bulk transfers")?;
        }
        Mode::ServeDatagrams { udp } => {
            topology_tests::datagrams::serve(&udp, || {
                println!("ready");
                let _ = std::io::stdout().flush();
            })
            .context("serving datagrams")?;
        }
        Mode::DnsUpstream { listen, answer, silent, delay_ms } => {
            topology_tests::dns::serve_upstream(listen, answer, silent, Duration::from_millis(delay_ms), || {
                println!("ready");
                let _ = std::io::stdout().flush();
            })?;
        }
        Mode::Client { target, timeout_ms, time_connects, record_landings, ttl, traffic } => {
            if target.iter().any(|t| t.is_ipv4() != target[0].is_ipv4()) {
                bail!("--target: every target must be of one address family");
            }
            let client = Client {
                targets: target,
                timeout: Duration::from_millis(timeout_ms),
                time_connects,
                record_landings,
                ttl,
            };
            let report = match traffic {
                Traffic::Hold => client
                    .hold(|| {
                        println!("ready");
                        let _ = std::io::stdout().flush();
                        let mut line = String::new();
                        let _ = std::io::stdin().read_line(&mut line);
                    })
                    .context("holding the sockets")?,
                Traffic::UdpStream { stop_file, started_file, max_ms, pause_ms } => {
                    let started = || {
                        if let Some(path) = &started_file {
                            let _ = std::fs::write(path, b"started");
                        }
                    };
                    let stream = client.udp_stream(
                        &stop_file,
                        Duration::from_millis(max_ms),
                        Duration::from_millis(pause_ms),
                        started,
                    );
                    println!("{}", serde_json::to_string(&stream)?);
                    return Ok(());
                }
                Traffic::OpenLoop { phase, seed, max_in_flight } => {
                    let report =
                        topology_tests::openloop::run(&client.targets, &phase, client.timeout, max_in_flight, seed)
                            .context("open loop")?;
                    println!("{}", serde_json::to_string(&report)?);
                    return Ok(());
                }
                Traffic::Bulk { count, send, receive, hold_ms } => {
                    let [target] = client.targets[..] else { bail!("bulk: one --target") };
                    let transfer =
                        topology_tests::bulk::Transfer { send, receive, hold: Duration::from_millis(hold_ms) };
                    let report = topology_tests::bulk::run(target, transfer, count, client.timeout);
                    println!("{}", serde_json::to_string(&report)?);
                    return Ok(());
                }
                Traffic::Datagrams { count, size, reply, connected, peek } => {
                    let exchange = topology_tests::datagrams::Exchange { count, size, reply, connected, peek };
                    let moved = topology_tests::datagrams::run(&client.targets, exchange, client.timeout)
                        .context("datagrams")?;
                    println!("{}", serde_json::to_string(&moved)?);
                    return Ok(());
                }
                Traffic::Open { count } => {
                    topology_tests::bulk::hold_open(&client.targets, count, client.timeout)?;
                    return Ok(());
                }
                Traffic::Lookups { rate, seconds, name, threads } => {
                    let [server] = client.targets[..] else { bail!("lookups: one --target, the DNS server") };
                    let report = topology_tests::dns::lookups(server, &name, rate, seconds, client.timeout, threads);
                    println!("{}", serde_json::to_string(&report)?);
                    return Ok(());
                }
                Traffic::Tcp { count } => client.tcp(count),
                Traffic::Reconnect { then, udp: false, disconnect, rounds } => {
                    client.reconnect(then, disconnect, rounds).context("reconnecting")?
                }
                Traffic::Reconnect { then, udp: true, .. } => client.udp_reconnect(then).context("reconnecting")?,
                Traffic::Resolve { count, name, port } => {
                    let [server] = client.targets[..] else { bail!("resolve: one --target, the DNS server") };
                    topology_tests::dns::resolve_and_connect(&client, server, &name, port, count)
                }
                Traffic::UdpConnect { count } => client.udp_connects(count),
                Traffic::Udp { count, mode } => client.udp(count, mode),
                Traffic::Interleaved { timed, count, block, baseline_cgroup, baseline_target } => {
                    let Some(home) = &args.cgroup else { bail!("interleaved: --cgroup is required") };
                    let baseline = Baseline {
                        home_procs: home.join("cgroup.procs"),
                        procs: baseline_cgroup.join("cgroup.procs"),
                        targets: baseline_target,
                    };
                    client.interleaved(timed, &baseline, count, block).context("moving between cgroups")?
                }
                Traffic::Loop { stop_file, started_file, max_ms, udp, pause_us } => {
                    let started = || {
                        if let Some(path) = &started_file {
                            // The parent polls for this file; a failure to write it shows as a timeout there.
                            let _ = std::fs::write(path, b"started");
                        }
                    };
                    client.until(
                        &stop_file,
                        Duration::from_millis(max_ms),
                        udp,
                        Duration::from_micros(pause_us),
                        started,
                    )
                }
            };
            println!("{}", serde_json::to_string(&report)?);
        }
    }
    Ok(())
}

fn join_cgroup(cgroup: &Path) -> anyhow::Result<()> {
    let procs = cgroup.join("cgroup.procs");
    std::fs::write(&procs, std::process::id().to_string()).with_context(|| format!("joining {}", procs.display()))
}

fn enter_netns(name: &str) -> anyhow::Result<()> {
    let path = Path::new("/var/run/netns").join(name);
    let file = File::open(&path).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: `file` is an open namespace descriptor; setns only changes this thread's namespace,
    // and this runs before any other thread exists.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!("setns({name}): {}", std::io::Error::last_os_error());
    }
    Ok(())
}

fn pin_to_cpu(cpu: usize) -> anyhow::Result<()> {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes inside it; sched_setaffinity
    // reads it. Threads spawned later inherit the mask.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            bail!("pinning to CPU {cpu}: {}", std::io::Error::last_os_error());
        }
    }
    Ok(())
}
