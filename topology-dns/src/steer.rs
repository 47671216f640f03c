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
    time::{Duration, Instant},
};

use hickory_proto::{
    op::{Message, MessageType, OpCode, Query},
    rr::{Name, RecordType},
};
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

use super::ViewCurrent;

/// The Service steered by default: the cluster DNS, as kubeadm, kops and every managed offering
/// name it.
pub const DEFAULT_SERVICE: (&str, &str) = ("kube-system", "kube-dns");
/// How long a fresh heartbeat keeps the steering on.
pub const BEAT_GRACE: Duration = Duration::from_secs(1);
/// How often the responder is probed (and the heartbeat refreshed when it answers).
const PROBE_INTERVAL: Duration = Duration::from_millis(250);
/// How long the responder has to answer a probe.
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);
/// Probes in a row the responder may miss before the steering stops: one miss under a burst is
/// not an outage (the heartbeat's grace covers it), and turning the node's DNS over on it would
/// move every pod's queries to CoreDNS and back within a second.
const MISSES_TO_STOP: u32 = 2;
/// How long the responder must answer every probe before the steering is back after it stopped
/// for misses; doubled at each stop that follows a steering shorter than [`STABLE`], up to
/// [`MAX_HOLD`]: a responder that keeps failing under a flood is steered to less and less often.
const MIN_HOLD: Duration = Duration::from_secs(1);
/// The longest hold.
const MAX_HOLD: Duration = Duration::from_secs(60);
/// A steering that lasted this long resets the hold.
const STABLE: Duration = Duration::from_secs(60);

/// How long the responder keeps answering after the steering is off, on shutdown: what pods sent
/// before the kernel stopped steering (in the sockets' queues, relayed to the upstream, or
/// retried on a socket connected to the responder) is answered, not dropped.
pub const DRAIN: Duration = Duration::from_millis(super::upstream::UPSTREAM_TIMEOUT.as_millis() as u64 + 500);

/// The steering heartbeat the programs read (`map_names::DNS_STEER`). The agent writes it
/// through the dataplane's descriptor; the prober needs nothing else of the kernel.
pub trait Heartbeat: Send + 'static {
    /// What a failed write says.
    type Error: std::fmt::Display;
    /// Keeps the steering to `responder` on for `grace` from now.
    fn refresh(&mut self, responder: SocketAddr, grace: Duration) -> Result<(), Self::Error>;
    /// Turns the steering off now.
    fn stop(&mut self) -> Result<(), Self::Error>;
}

/// Probes the responder at `listen` and keeps the steering heartbeat fresh while it answers from a
/// current view (`current`); stops the steering at once when it does not, and on `shutdown`,
/// then returns after [`DRAIN`] (the sockets close after it).
pub async fn keep_steering(
    mut beat: impl Heartbeat,
    listen: SocketAddr,
    domain: Name,
    current: ViewCurrent,
    shutdown: CancellationToken,
) {
    let target = probe_target(listen);
    let mut ticks = tokio::time::interval(PROBE_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut steering = None;
    let mut damping = Damping::default();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = ticks.tick() => {}
        }
        let state = if current.get() {
            let answered = answers(target, &domain).await;
            damping.probed(tokio::time::Instant::now().into_std(), answered)
        } else {
            damping.reset();
            Steer::NoCurrentView
        };
        let result = match state {
            Steer::On => beat.refresh(listen, BEAT_GRACE),
            // A miss the steering rides out: the heartbeat is left to its grace.
            Steer::Missed => Ok(()),
            Steer::NoCurrentView | Steer::NotAnswering => beat.stop(),
        };
        if let Err(error) = result {
            tracing::warn!(%error, "writing the DNS steering heartbeat");
        }
        let state = if state == Steer::Missed { Steer::On } else { state };
        if steering != Some(state) {
            steering = Some(state);
            match state {
                Steer::On => tracing::info!(responder = %listen, "steering the cluster DNS to this node's responder"),
                Steer::NoCurrentView => tracing::info!(
                    responder = %listen,
                    "not steering the cluster DNS: no complete, current view of the cluster to answer from"
                ),
                Steer::NotAnswering => tracing::warn!(
                    responder = %listen,
                    hold_s = damping.hold.as_secs(),
                    "the DNS responder does not answer; DNS goes to the cluster DNS until it answers for the hold"
                ),
                Steer::Missed => {}
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
    /// On, but the last probe went unanswered.
    Missed,
    NoCurrentView,
    NotAnswering,
}

/// The steering's hysteresis for a responder that misses probes: off after [`MISSES_TO_STOP`]
/// misses in a row, back on after answering every probe for the hold, which doubles with each
/// short-lived steering.
#[derive(Debug)]
struct Damping {
    on: bool,
    /// Probes missed in a row while on.
    misses: u32,
    /// Since when every probe was answered, while off.
    answering_since: Option<Instant>,
    /// When the steering last went on.
    on_since: Option<Instant>,
    hold: Duration,
}

impl Default for Damping {
    fn default() -> Self {
        // A start steers as soon as the responder answers: there is nothing to damp yet.
        Self { on: false, misses: 0, answering_since: None, on_since: None, hold: Duration::ZERO }
    }
}

impl Damping {
    /// The steering after a probe at `now` that was `answered`.
    fn probed(&mut self, now: Instant, answered: bool) -> Steer {
        if self.on {
            if answered {
                self.misses = 0;
                return Steer::On;
            }
            self.misses += 1;
            if self.misses < MISSES_TO_STOP {
                return Steer::Missed;
            }
            self.on = false;
            let lasted = self.on_since.map_or(Duration::ZERO, |since| now - since);
            self.hold = if lasted >= STABLE { MIN_HOLD } else { (self.hold * 2).clamp(MIN_HOLD, MAX_HOLD) };
            self.answering_since = None;
            return Steer::NotAnswering;
        }
        if !answered {
            self.answering_since = None;
            return Steer::NotAnswering;
        }
        let since = *self.answering_since.get_or_insert(now);
        if now - since < self.hold {
            return Steer::NotAnswering;
        }
        (self.on, self.misses, self.on_since) = (true, 0, Some(now));
        Steer::On
    }

    /// The view is not current: the steering is off for that, and starts afresh once it is.
    fn reset(&mut self) {
        (self.on, self.misses, self.answering_since) = (false, 0, None);
    }
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

    /// Runs `damping` over probes every [`PROBE_INTERVAL`] for `seconds`, answered as `answered`
    /// says of each tick: the number of times the steering went on or off, and the last state.
    fn run(damping: &mut Damping, start: Instant, seconds: u64, answered: impl Fn(u64) -> bool) -> (usize, Steer) {
        let ticks = seconds * 1000 / PROBE_INTERVAL.as_millis() as u64;
        let (mut flips, mut last) = (0, Steer::NotAnswering);
        let mut on = damping.on;
        for tick in 0..ticks {
            last = damping.probed(start + PROBE_INTERVAL * tick as u32, answered(tick));
            if damping.on != on {
                (flips, on) = (flips + 1, damping.on);
            }
        }
        (flips, last)
    }

    #[test]
    fn a_responder_that_answers_is_steered_to_at_once_and_a_dead_one_left_within_two_probes() {
        let (mut damping, start) = (Damping::default(), Instant::now());
        assert_eq!(damping.probed(start, true), Steer::On, "a start steers at the first answer");
        assert_eq!(damping.probed(start + PROBE_INTERVAL, false), Steer::Missed, "one miss is ridden out");
        assert_eq!(damping.probed(start + PROBE_INTERVAL * 2, true), Steer::On);
        assert_eq!(damping.probed(start + PROBE_INTERVAL * 3, false), Steer::Missed);
        assert_eq!(damping.probed(start + PROBE_INTERVAL * 4, false), Steer::NotAnswering, "two in a row stop it");
        assert_eq!(damping.hold, MIN_HOLD);
        // Back after answering for the hold.
        let back = start + PROBE_INTERVAL * 5;
        assert_eq!(damping.probed(back, true), Steer::NotAnswering);
        assert_eq!(damping.probed(back + MIN_HOLD, true), Steer::On);
    }

    #[test]
    fn a_flooded_responder_does_not_turn_the_nodes_dns_over_every_second() {
        // Under a flood the responder misses two probes in a row every 5 s: without damping the
        // steering would go off and on again every time, 24 changes a minute.
        let flooded = |tick: u64| tick % 20 >= 2;
        let (mut damping, start) = (Damping::default(), Instant::now());
        let (flips, _) = run(&mut damping, start, 60, flooded);
        assert!(flips <= 8, "{flips} changes of steering in a minute");
        assert!(damping.hold >= Duration::from_secs(8) && !damping.on, "the hold outgrew the answering: {damping:?}");
        // Once the flood is over the steering comes back within the hold, and stays.
        let later = start + Duration::from_secs(60);
        let (flips, last) = run(&mut damping, later, 90, |_| true);
        assert_eq!((flips, last), (1, Steer::On));
        // A steering that lasts resets the hold: the next outage is left for a second only.
        let (_, last) = run(&mut damping, later + Duration::from_secs(90), 1, |_| false);
        assert_eq!((last, damping.hold), (Steer::NotAnswering, MIN_HOLD));
    }

    #[test]
    fn a_responder_on_every_address_is_probed_on_loopback() {
        assert_eq!(probe_target("0.0.0.0:53".parse().unwrap()), "127.0.0.1:53".parse().unwrap());
        assert_eq!(probe_target("[::]:5353".parse().unwrap()), "[::1]:5353".parse().unwrap());
        assert_eq!(probe_target("10.0.0.5:53".parse().unwrap()), "10.0.0.5:53".parse().unwrap());
    }
}
