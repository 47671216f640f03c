//! A connection whose writes must make progress: a response the client does not read for
//! [`WRITE_TIMEOUT`] ends the connection, so a client that sends requests and never reads the
//! answers cannot keep them (a `/metrics` body is megabytes at scale) in the agent's memory.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    time::Sleep,
};

/// How long a write may wait for the client to read before the connection is closed.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// `io`, whose writes and flushes fail with `TimedOut` once they have waited `timeout` without
/// progress.
pub struct WriteDeadline<T> {
    io: T,
    timeout: Duration,
    /// Running while a write or flush waits.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> WriteDeadline<T> {
    /// Wraps `io`.
    pub fn new(io: T, timeout: Duration) -> Self {
        Self { io, timeout, stalled: None }
    }

    /// Books the outcome of one write attempt: progress resets the clock, waiting starts it,
    /// and waiting past the timeout is an error.
    fn judge<R>(&mut self, cx: &mut Context<'_>, outcome: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        if outcome.is_ready() {
            self.stalled = None;
            return outcome;
        }
        let timeout = self.timeout;
        let stalled = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {} s", timeout.as_secs()),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteDeadline<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let outcome = Pin::new(&mut self.io).poll_write(cx, buf);
        self.judge(cx, outcome)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let outcome = Pin::new(&mut self.io).poll_flush(cx);
        self.judge(cx, outcome)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt as _;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_stops_reading_ends_the_write() {
        let (ours, theirs) = tokio::io::duplex(64);
        let mut ours = WriteDeadline::new(ours, Duration::from_secs(10));
        // Fits the pipe: no wait.
        ours.write_all(&[0; 64]).await.unwrap();
        let error = ours.write_all(&[0; 64]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        drop(theirs);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_that_keeps_reading_is_served() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let mut ours = WriteDeadline::new(ours, Duration::from_secs(10));
        let reader = tokio::spawn(async move {
            let mut buffer = [0u8; 64];
            let mut read = 0;
            while read < 640 {
                tokio::time::sleep(Duration::from_secs(5)).await;
                read += tokio::io::AsyncReadExt::read(&mut theirs, &mut buffer).await.unwrap();
            }
            read
        });
        ours.write_all(&[0; 640]).await.expect("each wait is under the timeout");
        assert_eq!(reader.await.unwrap(), 640);
    }
}
