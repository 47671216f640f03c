//! Datagrams of known sizes, for the UDP accounting test: a server that answers each datagram
//! with as many bytes as its first four (big-endian) ask for, and a client that sends one datagram
//! at a time to each of its targets in turn and waits for each answer.

use std::{
    io,
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket},
    thread,
    time::Duration,
};

use serde::{Deserialize, Serialize};

/// The largest UDP payload over IPv4.
pub const MAX_DATAGRAM: usize = 65_507;

/// Serves on every address until the process ends; calls `ready` once bound.
pub fn serve(addrs: &[SocketAddr], ready: impl FnOnce()) -> io::Result<()> {
    let sockets = addrs.iter().map(UdpSocket::bind).collect::<io::Result<Vec<_>>>()?;
    ready();
    let threads: Vec<_> = sockets
        .into_iter()
        .map(|socket| {
            thread::spawn(move || {
                let (mut buffer, zeros) = (vec![0u8; MAX_DATAGRAM], vec![0u8; MAX_DATAGRAM]);
                loop {
                    let Ok((len, from)) = socket.recv_from(&mut buffer) else { continue };
                    let Some(&[a, b, c, d]) = buffer.get(..len.min(4)) else { continue };
                    let want = (u32::from_be_bytes([a, b, c, d]) as usize).min(MAX_DATAGRAM);
                    let _ = socket.send_to(&zeros[..want], from);
                }
            })
        })
        .collect();
    for thread in threads {
        let _ = thread.join();
    }
    Ok(())
}

/// What the client does with each target, `count` times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exchange {
    /// Datagrams sent to each target.
    pub count: u64,
    /// Bytes of each (at least 4, at most [`MAX_DATAGRAM`]).
    pub size: usize,
    /// Bytes each asks back.
    pub reply: u32,
    /// One connected socket per target (`send`/`recv`), else one unconnected socket for all
    /// (`send_to`/`recv_from`, as a resolver does).
    pub connected: bool,
    /// Peek at each answer before receiving it (a peek moves nothing).
    pub peek: bool,
}

/// What moved with one target.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moved {
    pub target: Option<SocketAddr>,
    /// Bytes sent.
    pub sent: u64,
    /// Bytes received (not counting peeks).
    pub received: u64,
    /// Answers that did not come in time.
    pub lost: u64,
}

/// Runs the exchanges; per target, in their order.
pub fn run(targets: &[SocketAddr], exchange: Exchange, timeout: Duration) -> io::Result<Vec<Moved>> {
    let bind = |target: &SocketAddr| {
        let socket = UdpSocket::bind(match target {
            SocketAddr::V4(_) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            SocketAddr::V6(_) => SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
        })?;
        socket.set_read_timeout(Some(timeout))?;
        if exchange.connected {
            socket.connect(target)?;
        }
        Ok::<_, io::Error>(socket)
    };
    let sockets = if exchange.connected {
        targets.iter().map(bind).collect::<io::Result<Vec<_>>>()?
    } else {
        vec![bind(&targets[0])?]
    };
    let mut moved: Vec<Moved> = targets.iter().map(|t| Moved { target: Some(*t), ..Moved::default() }).collect();
    let size = exchange.size.clamp(4, MAX_DATAGRAM);
    let mut datagram = vec![0u8; size];
    datagram[..4].copy_from_slice(&exchange.reply.to_be_bytes());
    let mut answer = vec![0u8; MAX_DATAGRAM];
    for _ in 0..exchange.count {
        for (n, target) in targets.iter().enumerate() {
            let socket = &sockets[if exchange.connected { n } else { 0 }];
            let sent = if exchange.connected { socket.send(&datagram)? } else { socket.send_to(&datagram, target)? };
            moved[n].sent += sent as u64;
            if exchange.peek {
                let _ = socket.peek_from(&mut answer);
            }
            match socket.recv_from(&mut answer) {
                Ok((len, _)) => moved[n].received += len as u64,
                Err(_) => moved[n].lost += 1,
            }
        }
    }
    Ok(moved)
}

/// A datagram server process in a host's namespace, on ports of both its addresses.
#[derive(Debug)]
pub struct DatagramServer {
    _process: crate::sandbox::ProcessGuard,
}

impl DatagramServer {
    /// Starts one on `ports` of `host` and waits until it is bound.
    pub fn start(host: &crate::net::Host, ports: &[u16]) -> Self {
        let mut command = std::process::Command::new(crate::net::probe_binary());
        command.args(["--netns", host.netns.name(), "serve-datagrams"]);
        for &port in ports {
            for addr in [SocketAddr::from((host.v4, port)), SocketAddr::from((host.v6, port))] {
                command.args(["--udp", &addr.to_string()]);
            }
        }
        Self { _process: crate::sandbox::ProcessGuard::spawn_ready(&mut command, "the datagram server") }
    }
}

/// A client running at `place`: `exchange` with each of `targets`, in a process of its own.
pub fn spawn(
    place: &crate::net::ClientPlace,
    targets: &[SocketAddr],
    exchange: Exchange,
) -> crate::sandbox::ProcessGuard {
    let mut command = place.command_spread(targets);
    command.args(["datagrams", "--count", &exchange.count.to_string(), "--size", &exchange.size.to_string()]);
    command.args(["--reply", &exchange.reply.to_string()]);
    if exchange.connected {
        command.arg("--connected");
    }
    if exchange.peek {
        command.arg("--peek");
    }
    let child = command.stdout(std::process::Stdio::piped()).spawn().expect("spawn datagram client");
    crate::sandbox::ProcessGuard::new(child)
}

/// What a spawned client moved per target, once it ends (at most `within`).
pub fn finish(client: crate::sandbox::ProcessGuard, within: Duration) -> Vec<Moved> {
    let output = client.wait_output(within);
    serde_json::from_slice(&output)
        .unwrap_or_else(|e| panic!("datagram report {:?}: {e}", String::from_utf8_lossy(&output)))
}
