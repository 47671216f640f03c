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
