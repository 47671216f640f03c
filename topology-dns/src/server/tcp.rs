//! DNS over TCP (RFC 7766): connections bounded in all and per client address, each closed when
//! idle and after a lifetime, its messages answered one at a time as the UDP socket answers them.

use std::{
    net::IpAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};
use tokio_util::sync::CancellationToken;

use super::{Admit, Handled, Responder};
use crate::connections::{Limits, Pool};

/// TCP connections open, in all and per client address; beyond, a new one replaces the oldest idle
/// connection of its bound, or is closed at once. One pod cannot hold them all.
const TCP_LIMITS: Limits = Limits { total: 256, per_source: 16 };
/// A TCP connection idle this long is closed.
const TCP_IDLE: Duration = Duration::from_secs(10);
/// A TCP connection is closed this long after it opened, busy or not (RFC 7766 lets a server
/// close one under pressure; a client that queries every few seconds keeps none forever).
const TCP_LIFETIME: Duration = Duration::from_secs(60);

/// Serves TCP on `listener` until `shutdown`.
pub async fn serve_tcp(listener: TcpListener, responder: Arc<Responder>, shutdown: CancellationToken) {
    let connections = Arc::new(Pool::new(TCP_LIMITS));
    loop {
        let (stream, source) = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::debug!(%error, "DNS TCP accept");
                    continue;
                }
            },
        };
        if !connections.make_room(source.ip()) {
            responder.metrics.query(None, "overloaded");
            continue;
        }
        let busy = Arc::new(AtomicBool::new(false));
        let (responder, shutdown, working) = (Arc::clone(&responder), shutdown.clone(), Arc::clone(&busy));
        connections.spawn(source.ip(), busy, async move {
            tokio::select! {
                () = shutdown.cancelled() => {}
                _ = tokio::time::timeout(TCP_LIFETIME, connection(stream, source.ip(), &responder, &working)) => {}
            }
        });
    }
}

/// Answers the messages of one connection; `busy` is set while one is being answered.
async fn connection(mut stream: TcpStream, source: IpAddr, responder: &Responder, busy: &AtomicBool) {
    loop {
        let Ok(Ok(bytes)) = tokio::time::timeout(TCP_IDLE, read_framed(&mut stream)).await else { return };
        busy.store(true, Ordering::Relaxed);
        let handled = match responder.admit(source, &bytes) {
            Admit::Yes => responder.handle(&bytes, true, None),
            Admit::Refuse(bytes) => {
                Handled::Reply { bytes, qtype: None, outcome: "refused_client", localities: vec![] }
            }
            Admit::Drop => return,
        };
        let reply = match handled {
            Handled::Reply { bytes, .. } => bytes,
            Handled::Drop => return,
            relayed => match responder.relay_entry(source, relayed, true) {
                Ok(admitted) => responder.relay(admitted, true, source).await,
                Err(Some(refusal)) => refusal,
                Err(None) => return,
            },
        };
        let Ok(len) = u16::try_from(reply.len()) else { return };
        if stream.write_all(&len.to_be_bytes()).await.is_err() || stream.write_all(&reply).await.is_err() {
            return;
        }
        busy.store(false, Ordering::Relaxed);
    }
}

async fn read_framed(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let len = stream.read_u16().await?;
    let mut message = vec![0u8; usize::from(len)];
    stream.read_exact(&mut message).await?;
    Ok(message)
}
