//! Steering: on this node, the cluster DNS Service's port 53 (UDP and TCP) goes to the node-local
//! responder instead of CoreDNS, by the same socket hooks — a per-node rule, so kubelet's
//! `--cluster-dns` stays as it is.
//!
//! The rule fails open three times over. The programs apply it only while the responder's own
//! heartbeat (`map_names::DNS_STEER`) is fresh and names the address the entry steers to; the
//! agent refreshes that heartbeat only while the responder answers a probe and answers from a
//! complete, current view of the cluster (after the first sync, and not while a watch is stale);
//! and a starting agent turns off what a previous one left. A responder that stops answering, a
//! frozen agent or a dead one stop the steering within [`BEAT_GRACE`], a restarted one never
//! steers to its predecessor's address or from an empty view, and queries pass to the ClusterIP
//! untouched, where kube-proxy sends them to CoreDNS as if the agent were not there.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::Duration,
};

use hickory_proto::{
    op::{Message, MessageType, OpCode, Query},
    rr::{Name, RecordType},
};
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

use super::ViewCurrent;
use crate::dataplane::DnsBeat;

/// The Service steered by default: the cluster DNS, as kubeadm, kops and every managed offering
/// name it.
pub const DEFAULT_SERVICE: (&str, &str) = ("kube-system", "kube-dns");
/// How long a fresh heartbeat keeps the steering on.
pub const BEAT_GRACE: Duration = Duration::from_secs(1);
/// How often the responder is probed (and the heartbeat refreshed when it answers).
const PROBE_INTERVAL: Duration = Duration::from_millis(250);
/// How long the responder has to answer a probe.
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);
/// How long the responder keeps answering after the steering is off, on shutdown: what pods sent
/// before the kernel stopped steering (in the sockets' queues, relayed to the upstream, or
/// retried on a socket connected to the responder) is answered, not dropped.
pub const DRAIN: Duration = Duration::from_millis(super::upstream::UPSTREAM_TIMEOUT.as_millis() as u64 + 500);

pub use crate::plan::steering::Steering;

/// Probes the responder at `listen` and keeps the steering heartbeat fresh while it answers from a
/// current view (`current`); stops the steering at once when it does not, and on `shutdown`,
/// then returns after [`DRAIN`] (the sockets close after it).
pub async fn keep_steering(
    mut beat: DnsBeat,
    listen: SocketAddr,
    domain: Name,
    current: ViewCurrent,
    shutdown: CancellationToken,
) {
    let target = probe_target(listen);
    let mut ticks = tokio::time::interval(PROBE_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut steering = None;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = ticks.tick() => {}
        }
        let state = if !current.get() {
            Steer::NoCurrentView
        } else if answers(target, &domain).await {
            Steer::On
        } else {
            Steer::NotAnswering
        };
        let result = if state == Steer::On { beat.refresh(listen, BEAT_GRACE) } else { beat.stop() };
        if let Err(error) = result {
            tracing::warn!(%error, "writing the DNS steering heartbeat");
        }
        if steering != Some(state) {
            steering = Some(state);
            match state {
                Steer::On => tracing::info!(responder = %listen, "steering the cluster DNS to this node's responder"),
                Steer::NoCurrentView => tracing::info!(
                    responder = %listen,
                    "not steering the cluster DNS: no complete, current view of the cluster to answer from"
                ),
                Steer::NotAnswering => {
                    tracing::warn!(responder = %listen, "the DNS responder does not answer; DNS goes to the cluster DNS");
                }
            }
        }
    }
    if let Err(error) = beat.stop() {
        tracing::warn!(%error, "stopping the DNS steering");
    }
    tracing::info!(drain_ms = DRAIN.as_millis() as u64, "DNS steering off; answering what was already sent");
    tokio::time::sleep(DRAIN).await;
}

/// Whether the cluster DNS is steered to the responder, and if not, why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Steer {
    On,
    NoCurrentView,
    NotAnswering,
}

/// Where a probe goes: the listening address, or loopback when it listens on every address.
fn probe_target(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), listen.port()),
        IpAddr::V6(ip) if ip.is_unspecified() => SocketAddr::new(Ipv6Addr::LOCALHOST.into(), listen.port()),
        _ => listen,
    }
}

/// Whether the responder answers a probe over UDP and over TCP within [`PROBE_TIMEOUT`]: the
/// steering takes both protocols' port 53, so it needs both.
async fn answers(target: SocketAddr, domain: &Name) -> bool {
    let (udp, tcp) = tokio::join!(
        tokio::time::timeout(PROBE_TIMEOUT, probe(target, domain)),
        tokio::time::timeout(PROBE_TIMEOUT, probe_tcp(target, domain)),
    );
    matches!((udp, tcp), (Ok(Ok(())), Ok(Ok(()))))
}

/// The probe query: SOA for the cluster domain, answered by the responder itself (never
/// forwarded), and its random id.
fn probe_query(domain: &Name) -> std::io::Result<(u16, Vec<u8>)> {
    let id: u16 = rand::random();
    let mut query = Message::new(id, MessageType::Query, OpCode::Query);
    query.add_query(Query::query(domain.clone(), RecordType::SOA));
    Ok((id, query.to_vec().map_err(std::io::Error::other)?))
}

/// True when `reply` is a response to the query `id`.
fn is_reply(reply: &[u8], id: u16) -> bool {
    reply.len() >= 12 && u16::from_be_bytes([reply[0], reply[1]]) == id && reply[2] & 0x80 != 0
}

/// The probe over TCP: one framed query on a fresh connection.
async fn probe_tcp(target: SocketAddr, domain: &Name) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let (id, query) = probe_query(domain)?;
    let mut stream = tokio::net::TcpStream::connect(target).await?;
    let mut framed = u16::try_from(query.len()).map_err(std::io::Error::other)?.to_be_bytes().to_vec();
    framed.extend(query);
    stream.write_all(&framed).await?;
    let len = stream.read_u16().await?;
    let mut reply = vec![0u8; usize::from(len)];
    stream.read_exact(&mut reply).await?;
    if is_reply(&reply, id) { Ok(()) } else { Err(std::io::Error::other("not the probe's reply")) }
}

/// The probe over UDP.
async fn probe(target: SocketAddr, domain: &Name) -> std::io::Result<()> {
    let local: SocketAddr = match target {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(local).await?;
    socket.connect(target).await?;
    let (id, query) = probe_query(domain)?;
    socket.send(&query).await?;
    let mut buffer = [0u8; 1232];
    loop {
        let len = socket.recv(&mut buffer).await?;
        if is_reply(&buffer[..len], id) {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_responder_on_every_address_is_probed_on_loopback() {
        assert_eq!(probe_target("0.0.0.0:53".parse().unwrap()), "127.0.0.1:53".parse().unwrap());
        assert_eq!(probe_target("[::]:5353".parse().unwrap()), "[::1]:5353".parse().unwrap());
        assert_eq!(probe_target("10.0.0.5:53".parse().unwrap()), "10.0.0.5:53".parse().unwrap());
    }
}
