//! TCP to the upstreams, for answers too large for UDP (RFC 7766): connections kept open and
//! reused, one exchange at a time each, at most [`IDLE_PER_UPSTREAM`] idle per upstream and none
//! idle longer than [`IDLE_FOR`] (servers close idle ones: CoreDNS after 10 s). A kept connection
//! the upstream closed meanwhile costs one retry on a fresh one; an exchange cut short (its
//! future dropped at a timeout) takes its connection with it, so no reply is ever read by the
//! wrong query.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

/// Idle connections kept per upstream.
pub const IDLE_PER_UPSTREAM: usize = 4;
/// The longest a connection is kept idle.
pub const IDLE_FOR: Duration = Duration::from_secs(8);

/// Connections to the upstreams, idle between exchanges.
#[derive(Default)]
pub struct TcpPool {
    idle: Mutex<HashMap<SocketAddr, Vec<(TcpStream, Instant)>>>,
}

impl TcpPool {
    /// Sends `query` (its length prefix added) to `upstream` and reads one reply: on a kept
    /// connection if there is one, else (or if the upstream closed it) on a new one, kept after.
    pub async fn exchange(&self, upstream: SocketAddr, query: &[u8]) -> std::io::Result<Vec<u8>> {
        if let Some(mut stream) = self.take(upstream)
            && let Ok(reply) = exchange_on(&mut stream, query).await
        {
            self.keep(upstream, stream);
            return Ok(reply);
        }
        let mut stream = TcpStream::connect(upstream).await?;
        let reply = exchange_on(&mut stream, query).await?;
        self.keep(upstream, stream);
        Ok(reply)
    }

    /// An idle connection to `upstream` not idle too long, if any (the longer idle dropped).
    fn take(&self, upstream: SocketAddr) -> Option<TcpStream> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let kept = idle.get_mut(&upstream)?;
        kept.retain(|(_, since)| since.elapsed() < IDLE_FOR);
        kept.pop().map(|(stream, _)| stream)
    }

    /// Keeps `stream` for the next exchange with `upstream`, if there is room.
    fn keep(&self, upstream: SocketAddr, stream: TcpStream) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let kept = idle.entry(upstream).or_default();
        if kept.len() < IDLE_PER_UPSTREAM {
            kept.push((stream, Instant::now()));
        }
    }
}

/// One length-prefixed query and its reply on `stream`.
async fn exchange_on(stream: &mut TcpStream, query: &[u8]) -> std::io::Result<Vec<u8>> {
    let len = u16::try_from(query.len()).map_err(|_| std::io::Error::other("query over 65535 bytes"))?;
    let mut framed = Vec::with_capacity(query.len() + 2);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(query);
    stream.write_all(&framed).await?;
    let len = stream.read_u16().await?;
    let mut reply = vec![0u8; usize::from(len)];
    stream.read_exact(&mut reply).await?;
    Ok(reply)
}
