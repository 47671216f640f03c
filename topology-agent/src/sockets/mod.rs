//! Ending sockets connected through a service to a backend that left its set.
//!
//! A connected UDP socket (a resolver, a metrics sender) keeps sending to the backend its
//! `connect()` was rewritten to, even after that backend left the service: kube-proxy flushes
//! conntrack for this, Cilium destroys such sockets. So does the agent: when a backend leaves a
//! service port's set on this node, it finds, in every network namespace, the sockets whose
//! socket storage says they reached that backend through that service port and are still
//! connected to it, and destroys them with `SOCK_DESTROY`: the application's next call fails
//! with `ECONNABORTED`, and its reconnect is rewritten to a current backend. UDP always; TCP
//! only with `--terminate-sockets all` (a TCP peer that is gone resets the connection itself, and
//! a live one may still be serving it).
//!
//! Entering other namespaces needs `CAP_SYS_ADMIN`; `--terminate-sockets off` does without.

mod diag;
mod ledger;
mod lingering;
pub mod metrics;
mod netns;
pub mod sweep;

#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing {
    //! Entry points for the fuzz targets.

    /// Walks every attribute of a sock_diag answer and looks for socket storage in it.
    pub fn attributes(data: &[u8]) {
        let _ = super::diag::find_storage(data);
        for (_, payload) in super::diag::attrs(data) {
            let _ = super::diag::attrs(payload).count();
        }
    }
}

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    os::fd::{AsFd as _, AsRawFd as _},
    path::PathBuf,
    sync::{Arc, mpsc},
    thread::JoinHandle,
};

use clap::ValueEnum;
use topology_common::{AF_INET, AF_INET6, IPPROTO_TCP, IPPROTO_UDP, SockTranslation};
use topology_dataplane::SocketMaps;
use topology_model::Protocol;

use self::metrics::ProtocolLabels;
use crate::metrics::Metrics;

/// Which sockets are destroyed when their backend leaves the set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum TerminateSockets {
    /// Connected UDP sockets.
    #[default]
    Udp,
    /// Connected UDP sockets and TCP connections.
    All,
    /// None (the agent then needs no `CAP_SYS_ADMIN`).
    Off,
}

pub use topology_dataplane::Departure;

/// Whether a socket's storage and current peer say it reached `departure.backend` through
/// `departure.service` and is still connected there.
pub fn reached_through(translation: &SockTranslation, peer: SocketAddr, departure: &Departure) -> bool {
    let family = if departure.service.vip.is_ipv4() { AF_INET } else { AF_INET6 };
    translation.family == family
        && translation.proto == departure.service.protocol.number()
        && translation.vip_port == departure.service.port
        && translation.vip == maps_form(departure.service.vip)
        && translation.backend_port == departure.backend.port()
        && translation.backend == maps_form(departure.backend.ip())
        && unmapped(peer) == departure.backend
}

/// An address in the maps' 16-byte form (IPv4 first, zeros after).
fn maps_form(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => {
            let mut out = [0; 16];
            out[..4].copy_from_slice(&v4.octets());
            out
        }
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// An IPv4-mapped peer of an AF_INET6 socket as the IPv4 address it is.
fn unmapped(peer: SocketAddr) -> SocketAddr {
    match peer.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer, |v4| SocketAddr::new(IpAddr::V4(v4), peer.port())),
        IpAddr::V4(_) => peer,
    }
}

/// The peer of a dumped socket.
fn peer_of(socket: &diag::DiagSocket) -> SocketAddr {
    let port = u16::from_be_bytes(socket.id.dport);
    let ip = if socket.family == AF_INET {
        IpAddr::from([socket.id.dst[0], socket.id.dst[1], socket.id.dst[2], socket.id.dst[3]])
    } else {
        IpAddr::from(socket.id.dst)
    };
    SocketAddr::new(ip, port)
}

/// How the terminator runs.
pub struct TerminateConfig {
    /// Which sockets.
    pub mode: TerminateSockets,
    /// The programs' socket state, from the dataplane.
    pub maps: SocketMaps,
    /// Where to find namespaces besides this process's own: directories of namespace files
    /// (`--netns-dir`) and namespace files (`--host-netns`).
    pub netns_dirs: Vec<PathBuf>,
}

/// Destroys sockets of departed backends on a thread of its own, so the control loop never
/// waits for a namespace walk.
pub struct Terminator {
    sender: Option<mpsc::Sender<Vec<(Departure, u64)>>>,
    thread: Option<JoinHandle<()>>,
    ledger: Arc<ledger::Ledger>,
    lingering: std::sync::Mutex<lingering::Lingering>,
}

impl Terminator {
    /// Starts the terminator; `None` when `mode` is off.
    pub fn start(mut config: TerminateConfig, metrics: Arc<Metrics>) -> Option<Self> {
        if config.mode == TerminateSockets::Off {
            return None;
        }
        for place in netns::unreachable(&config.netns_dirs) {
            tracing::warn!(namespace = %place, "a network namespace cannot be entered: its sockets are never ended");
        }
        let (sender, receiver) = mpsc::channel::<Vec<(Departure, u64)>>();
        let ledger = Arc::new(ledger::Ledger::default());
        let recorded = Arc::clone(&ledger);
        let thread = std::thread::Builder::new()
            .name("terminator".into())
            .spawn(move || {
                while let Ok(mut batch) = receiver.recv() {
                    // Everything queued meanwhile joins this walk.
                    while let Ok(more) = receiver.try_recv() {
                        batch.extend(more);
                    }
                    terminate(&mut config, &batch, &recorded, &metrics);
                    recorded.done(batch);
                }
            })
            .ok()?;
        Some(Self { sender: Some(sender), thread: Some(thread), ledger, lingering: std::sync::Mutex::default() })
    }

    /// Takes what an apply did: queues the departures of backends that left their Service (UDP
    /// ones, and TCP ones when configured, are acted on), holds back those of backends that
    /// `still_serves` says serve until they stop (looked at again where `recheck` says), and
    /// cancels the pending departures of backends that `returned` to their set.
    pub fn submit(
        &self,
        departed: &[Departure],
        returned: &[Departure],
        recheck: impl Fn(&Departure) -> bool,
        still_serves: impl Fn(&Departure) -> bool,
    ) {
        let departures = {
            let mut lingering = self.lingering.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if departed.is_empty() && returned.is_empty() && lingering.is_empty() {
                return;
            }
            lingering.settle(departed, returned, recheck, still_serves)
        };
        if departures.is_empty() && returned.is_empty() {
            return;
        }
        let departures = departures.as_slice();
        let round = self.ledger.record(departures, returned);
        if let Some(sender) = &self.sender
            && !departures.is_empty()
        {
            // A gone thread has logged why; nothing more to do here.
            let _ = sender.send(departures.iter().map(|departure| (*departure, round)).collect());
        }
    }
}

impl Drop for Terminator {
    fn drop(&mut self) {
        drop(self.sender.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One walk: every namespace, every wanted protocol and family, every matching socket.
fn terminate(
    config: &mut TerminateConfig,
    departures: &[(Departure, u64)],
    ledger: &ledger::Ledger,
    metrics: &Metrics,
) {
    let wanted: Vec<&Departure> = departures
        .iter()
        .filter(|(d, round)| {
            (d.service.protocol == Protocol::Udp || config.mode == TerminateSockets::All) && ledger.holds(d, *round)
        })
        .map(|(d, _)| d)
        .collect();
    if wanted.is_empty() {
        return;
    }
    let failed = |what: &str, error: &dyn std::fmt::Display| {
        tracing::warn!(%error, "socket termination: {what}");
        metrics.sockets.termination_errors.inc();
    };
    let map = match config.maps.connections() {
        Ok(map) => map,
        Err(error) => return failed("socket storage map unreadable", &error),
    };
    let tcp_connections = match config.maps.tcp_connections() {
        Ok(map) => map,
        Err(error) => return failed("TCP connections map unreadable", &error),
    };
    let udp = wanted.iter().any(|d| d.service.protocol == Protocol::Udp);
    for namespace in netns::namespaces(&config.netns_dirs) {
        let udp_translations = if udp {
            // The namespace an iterator walks is the one its reader is created in.
            match netns::within(&namespace.path, || config.maps.udp_translations_here()) {
                Ok(Ok(translations)) => translations,
                Ok(Err(error)) => {
                    failed(&format!("reading UDP sockets of {}", namespace.path.display()), &error);
                    continue;
                }
                Err(error) => {
                    failed(&format!("entering {}", namespace.path.display()), &error);
                    continue;
                }
            }
        } else {
            HashMap::new()
        };
        let mut channel = match netns::channel_in(&namespace.path) {
            Ok(channel) => channel,
            Err(error) => {
                failed(&format!("entering {}", namespace.path.display()), &error);
                continue;
            }
        };
        for (protocol, storage) in [(IPPROTO_UDP, None), (IPPROTO_TCP, Some(map.fd().as_fd().as_raw_fd()))] {
            if !wanted.iter().any(|d| d.service.protocol.number() == protocol) {
                continue;
            }
            for family in [AF_INET, AF_INET6] {
                let sockets = match channel.dump(family, protocol, storage) {
                    Ok(sockets) => sockets,
                    Err(error) => {
                        failed(&format!("listing sockets of {}", namespace.path.display()), &error);
                        continue;
                    }
                };
                for socket in sockets {
                    let translation = match protocol {
                        IPPROTO_UDP => udp_translations.get(&socket.id.cookie()).copied(),
                        // Measured connections keep theirs in storage, the others by cookie.
                        _ => socket
                            .storage
                            .as_deref()
                            .and_then(translation_of)
                            .or_else(|| tcp_connections.get(socket.id.cookie())),
                    };
                    let Some(translation) = translation else { continue };
                    let Some(departure) = wanted.iter().find(|d| reached_through(&translation, peer_of(&socket), d))
                    else {
                        continue;
                    };
                    // Checked again here: the backend may have come back since the walk began.
                    let round = departures.iter().find(|(d, _)| d == *departure).map_or(0, |(_, round)| *round);
                    if !ledger.holds(departure, round) {
                        continue;
                    }
                    let labels = ProtocolLabels { protocol: departure.service.protocol.to_string() };
                    match channel.destroy(family, protocol, &socket.id) {
                        Ok(()) => {
                            tracing::info!(service = %departure.service, backend = %departure.backend, "socket terminated");
                            metrics.sockets.terminated.get_or_create(&labels).inc();
                        }
                        // Closed meanwhile: nothing left to do.
                        Err(error) if error.raw_os_error() == Some(libc::ENOENT) => {}
                        Err(error) => failed("SOCK_DESTROY", &error),
                    }
                }
            }
        }
    }
}

/// A storage value as the programs wrote it.
fn translation_of(bytes: &[u8]) -> Option<SockTranslation> {
    (bytes.len() >= size_of::<SockTranslation>()).then(|| {
        // SAFETY: enough bytes, read unaligned; every bit pattern is a valid SockTranslation.
        unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<SockTranslation>()) }
    })
}

#[cfg(test)]
mod tests {
    use topology_policy::desired::ServicePort;

    use super::*;

    fn departure() -> Departure {
        Departure {
            service: ServicePort { vip: "10.96.0.53".parse().unwrap(), port: 53, protocol: Protocol::Udp },
            backend: "10.244.0.7:8053".parse().unwrap(),
        }
    }

    fn translation() -> SockTranslation {
        SockTranslation {
            vip: maps_form("10.96.0.53".parse().unwrap()),
            backend: maps_form("10.244.0.7".parse().unwrap()),
            vip_port: 53,
            backend_port: 8053,
            family: AF_INET,
            proto: IPPROTO_UDP,
            flags: 0,
        }
    }

    #[test]
    fn only_sockets_that_went_through_the_service_to_that_backend_match() {
        let peer: SocketAddr = "10.244.0.7:8053".parse().unwrap();
        assert!(reached_through(&translation(), peer, &departure()));
        let mapped: SocketAddr = "[::ffff:10.244.0.7]:8053".parse().unwrap();
        assert!(reached_through(&translation(), mapped, &departure()), "an AF_INET6 socket to a mapped backend");
        assert!(!reached_through(&translation(), "10.244.0.8:8053".parse().unwrap(), &departure()), "reconnected");
        let other_service = SockTranslation { vip_port: 54, ..translation() };
        assert!(!reached_through(&other_service, peer, &departure()), "the same backend via another service");
        let forgotten = SockTranslation { family: 0, ..translation() };
        assert!(!reached_through(&forgotten, peer, &departure()), "connected elsewhere since");
        let tcp = SockTranslation { proto: IPPROTO_TCP, ..translation() };
        assert!(!reached_through(&tcp, peer, &departure()));
    }

    #[test]
    fn storage_values_shorter_than_a_translation_are_ignored() {
        assert!(translation_of(&[0; 8]).is_none());
        let bytes = [0u8; 40];
        assert_eq!(translation_of(&bytes).map(|t| t.family), Some(0));
    }
}
