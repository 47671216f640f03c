//! Bulk transfers of known sizes, for the cross-zone accounting tests and the demo: a server that
//! reads everything a client sends and answers with as many bytes as the client asked for, and
//! the client. A client writes an 8-byte big-endian reply length, then its payload (spread over a
//! time when it holds the connection open), shuts its side, and reads the reply to the end.

use std::{
    io::{self, Read as _, Write as _},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    thread,
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};

/// Bytes of the header a client writes before its payload.
pub const HEADER: u64 = 8;

/// Serves bulk transfers on every address until the process ends; calls `ready` once bound.
/// With `hold`, accepts connections and only holds them (many idle connections, one thread per
/// address).
pub fn serve(addrs: &[SocketAddr], hold: bool, ready: impl FnOnce()) -> io::Result<()> {
    let listeners = addrs.iter().map(TcpListener::bind).collect::<io::Result<Vec<_>>>()?;
    ready();
    if hold {
        // Never accepted: each connection completes its handshake and waits in the accept queue
        // (as deep as `net.core.somaxconn` of the namespace allows), holding no descriptor here.
        for listener in &listeners {
            use std::os::fd::AsRawFd as _;
            // SAFETY: listen() again on a listening socket only sets its backlog.
            unsafe { libc::listen(listener.as_raw_fd(), 65_535) };
        }
        loop {
            thread::sleep(Duration::from_secs(3600));
        }
    }
    let threads: Vec<_> = listeners
        .into_iter()
        .map(|listener| {
            thread::spawn(move || {
                for stream in listener.incoming().flatten() {
                    thread::spawn(move || {
                        // A client that left half-way is not the server's failure.
                        let _ = answer(stream);
                    });
                }
            })
        })
        .collect();
    for thread in threads {
        let _ = thread.join();
    }
    Ok(())
}

fn answer(mut stream: TcpStream) -> io::Result<()> {
    let mut header = [0u8; HEADER as usize];
    stream.read_exact(&mut header)?;
    io::copy(&mut stream, &mut io::sink())?;
    write_zeros(&mut stream, u64::from_be_bytes(header), Duration::ZERO)?;
    stream.shutdown(Shutdown::Write)
}

/// Writes `count` zero bytes to `stream`, spread evenly over `over`.
fn write_zeros(stream: &mut TcpStream, count: u64, over: Duration) -> io::Result<()> {
    const CHUNK: u64 = 64 * 1024;
    let buffer = [0u8; CHUNK as usize];
    let chunks = count.div_ceil(CHUNK).max(1);
    let started = Instant::now();
    let mut written = 0;
    for chunk in 0..chunks {
        let len = CHUNK.min(count - written);
        stream.write_all(&buffer[..len as usize])?;
        written += len;
        let due = over.mul_f64((chunk + 1) as f64 / chunks as f64);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            thread::sleep(wait);
        }
    }
    Ok(())
}

/// What a client asks of each connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transfer {
    /// Payload bytes to send.
    pub send: u64,
    /// Bytes to ask the server for.
    pub receive: u64,
    /// How long the payload is spread over (the connection stays open at least that long).
    pub hold: Duration,
}

/// What a client moved.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkReport {
    /// Bytes written, headers included.
    pub sent: u64,
    /// Bytes read.
    pub received: u64,
    /// Connections that completed.
    pub completed: u64,
    /// Why the others did not.
    pub errors: Vec<String>,
}

/// Makes `connections` transfers to `target`, one after another.
pub fn run(target: SocketAddr, transfer: Transfer, connections: u64, timeout: Duration) -> BulkReport {
    let mut report = BulkReport::default();
    for _ in 0..connections {
        match one(target, transfer, timeout, &mut report) {
            Ok(()) => report.completed += 1,
            Err(error) => report.errors.push(error.to_string()),
        }
    }
    report
}

fn one(target: SocketAddr, transfer: Transfer, timeout: Duration, report: &mut BulkReport) -> io::Result<()> {
    let mut stream = TcpStream::connect_timeout(&target, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(&transfer.receive.to_be_bytes())?;
    report.sent += HEADER;
    write_zeros(&mut stream, transfer.send, transfer.hold)?;
    report.sent += transfer.send;
    stream.shutdown(Shutdown::Write)?;
    report.received += io::copy(&mut stream, &mut io::sink())?;
    Ok(())
}

/// A bulk server process in a host's namespace, on one port of both its addresses.
#[derive(Debug)]
pub struct BulkServer {
    _process: crate::sandbox::ProcessGuard,
}

impl BulkServer {
    /// Starts one on `port` of `host` and waits until it listens; with `hold`, it only holds the
    /// connections it accepts.
    pub fn start(host: &crate::net::Host, port: u16, hold: bool) -> Self {
        Self::start_in(host, port, hold, None)
    }

    /// Like [`BulkServer::start`], in cgroup `home` if given (not one with the programs).
    pub fn start_in(host: &crate::net::Host, port: u16, hold: bool, home: Option<&std::path::Path>) -> Self {
        let mut command = std::process::Command::new(crate::net::probe_binary());
        command.args(["--netns", host.netns.name()]);
        if let Some(home) = home {
            command.arg("--cgroup").arg(home);
        }
        command.arg("serve-bulk");
        if hold {
            command.arg("--hold");
        }
        for addr in [SocketAddr::from((host.v4, port)), SocketAddr::from((host.v6, port))] {
            command.args(["--tcp", &addr.to_string()]);
        }
        Self { _process: crate::sandbox::ProcessGuard::spawn_ready(&mut command, "the bulk server") }
    }
}

/// A bulk client running at `place`: `connections` transfers to `target`, in a process of its own.
pub fn spawn(
    place: &crate::net::ClientPlace,
    target: SocketAddr,
    transfer: Transfer,
    connections: u64,
) -> crate::sandbox::ProcessGuard {
    let mut command = place.command_spread(&[target]);
    command.args(["bulk", "--count", &connections.to_string(), "--send", &transfer.send.to_string()]);
    command.args(["--receive", &transfer.receive.to_string(), "--hold-ms", &transfer.hold.as_millis().to_string()]);
    let child = command.stdout(std::process::Stdio::piped()).spawn().expect("spawn bulk client");
    crate::sandbox::ProcessGuard::new(child)
}

/// What a spawned client moved, once it ends (at most `within`).
pub fn finish(client: crate::sandbox::ProcessGuard, within: Duration) -> BulkReport {
    let output = client.wait_output(within);
    serde_json::from_slice(&output)
        .unwrap_or_else(|e| panic!("bulk report {:?}: {e}", String::from_utf8_lossy(&output)))
}

/// Many idle connections held open by client processes at `place` (as many as their open-file
/// limit needs), until dropped.
pub struct HeldConnections {
    processes: Vec<crate::sandbox::ProcessGuard>,
    /// Connections open.
    pub open: u64,
}

/// Connections one holding process opens at the most (below a common open-file hard limit).
const PER_PROCESS: u64 = 15_000;

impl HeldConnections {
    /// Opens `count` connections, each to one of `targets` at random, and waits until they are.
    pub fn open(place: &crate::net::ClientPlace, targets: &[SocketAddr], count: u64) -> Self {
        use std::io::BufRead as _;
        let mut held = Self { processes: Vec::new(), open: 0 };
        let mut left = count;
        while left > 0 {
            let here = left.min(PER_PROCESS);
            left -= here;
            let mut command = place.command_spread(targets);
            command.args(["open", "--count", &here.to_string()]);
            let child = command
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("spawn a holding client");
            let mut process = crate::sandbox::ProcessGuard::new(child);
            let stdout = process.child().stdout.take().expect("piped stdout");
            let mut line = String::new();
            io::BufReader::new(stdout).read_line(&mut line).expect("the holding client's line");
            held.open += line.trim().strip_prefix("open ").and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
            held.processes.push(process);
        }
        held
    }
}

impl Drop for HeldConnections {
    fn drop(&mut self) {
        // Closing its stdin ends a client, and its connections with it.
        for process in &mut self.processes {
            drop(process.child().stdin.take());
        }
    }
}

/// Opens `count` connections to `targets` (at random), prints `open N`, and holds them until a
/// line (or the end) comes on stdin. The open-file limit is raised as far as it goes.
pub fn hold_open(targets: &[SocketAddr], count: u64, timeout: Duration) -> io::Result<()> {
    raise_file_limit()?;
    let mut held = Vec::with_capacity(count as usize);
    let mut pick = 0u64;
    for _ in 0..count {
        pick = pick.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let target = targets[(pick >> 33) as usize % targets.len()];
        if let Ok(stream) = TcpStream::connect_timeout(&target, timeout) {
            held.push(stream);
        }
    }
    println!("open {}", held.len());
    io::stdout().flush()?;
    let mut line = String::new();
    let _ = io::stdin().read_line(&mut line);
    Ok(())
}

/// Raises this process's open-file limit to its hard limit.
fn raise_file_limit() -> io::Result<()> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: valid rlimit structures passed by reference.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return Err(io::Error::last_os_error());
        }
        limit.rlim_cur = limit.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
