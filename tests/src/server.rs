//! The backend side of the tests' traffic: a server that answers every TCP connection and UDP
//! datagram with its name, at once or through a fixed number of workers (a real capacity limit).

use std::{
    io::{self, Write as _},
    net::{SocketAddr, TcpListener, TcpStream, UdpSocket},
    sync::{Arc, Mutex, mpsc},
    thread,
    time::Duration,
};

/// A server's real capacity limit: `workers` requests served at once, each taking `service`.
/// Connections beyond it wait (in the server's queue and the kernel's accept queue), as they do in
/// front of a saturated pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Requests served at once.
    pub workers: usize,
    /// Time to serve one.
    pub service: Duration,
}

/// Whether the client closed its end before a worker got to it (it timed out waiting): a worker
/// does not spend its service time on it. This favours a queue that overflows (the static plan in
/// the overload demo), which then recovers as soon as the excess stops.
fn client_left(stream: &TcpStream) -> bool {
    use std::os::fd::AsRawFd as _;
    let mut byte = 0u8;
    // SAFETY: a one-byte buffer for a non-blocking peek on a descriptor this function borrows.
    let read =
        unsafe { libc::recv(stream.as_raw_fd(), (&raw mut byte).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    // 0: end of stream; -1 with EAGAIN: still there, silent; another error: gone (reset).
    read == 0 || (read < 0 && io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock)
}

/// Serves `name` on every TCP and UDP address until the process ends: TCP connections get the
/// name and are closed (after `capacity`'s service time, by one of its workers, if given), UDP
/// datagrams get the name back. Calls `ready` once everything is bound.
pub fn serve(
    name: &str,
    tcp: &[SocketAddr],
    udp: &[SocketAddr],
    capacity: Option<Capacity>,
    ready: impl FnOnce(),
) -> io::Result<()> {
    let mut threads = Vec::new();
    let queue = capacity.map(|capacity| {
        let (send, receive) = mpsc::channel::<TcpStream>();
        let receive = Arc::new(Mutex::new(receive));
        for _ in 0..capacity.workers.max(1) {
            let (receive, name) = (Arc::clone(&receive), name.to_owned());
            threads.push(thread::spawn(move || {
                loop {
                    let next = receive.lock().map_err(|_| ()).and_then(|r| r.recv().map_err(|_| ()));
                    let Ok(mut stream) = next else { return };
                    if client_left(&stream) {
                        continue;
                    }
                    thread::sleep(capacity.service);
                    let _ = stream.write_all(format!("{name}\n").as_bytes());
                }
            }));
        }
        send
    });
    for addr in tcp {
        let listener = TcpListener::bind(addr)?;
        let (name, queue) = (name.to_owned(), queue.clone());
        threads.push(thread::spawn(move || {
            // A failed accept or a client that left before the answer is not the server's failure.
            for mut stream in listener.incoming().flatten() {
                match &queue {
                    Some(queue) => {
                        let _ = queue.send(stream);
                    }
                    None => {
                        let _ = stream.write_all(format!("{name}\n").as_bytes());
                    }
                }
            }
        }));
    }
    for addr in udp {
        let socket = UdpSocket::bind(addr)?;
        let name = name.to_owned();
        threads.push(thread::spawn(move || {
            let mut buf = [0u8; 512];
            loop {
                if let Ok((_, from)) = socket.recv_from(&mut buf) {
                    let _ = socket.send_to(name.as_bytes(), from);
                }
            }
        }));
    }
    ready();
    for thread in threads {
        let _ = thread.join();
    }
    Ok(())
}
