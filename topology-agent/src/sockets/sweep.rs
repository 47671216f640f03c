//! The sweep of open connections' bytes (cross-zone accounting, see
//! `topology_common::bytes`): every [`INTERVAL`], the accounting iterator runs in each network
//! namespace, on a thread of its own (entering a namespace moves the calling thread), so a
//! connection of hours is counted as it goes. Connections that end are counted by the kernel
//! when they do; the sweep only brings the open ones' counts up to date.

use std::{path::PathBuf, sync::Arc, thread::JoinHandle, time::Duration};

use super::netns;
use crate::{dataplane::BytesSweep, metrics::Metrics};

/// How often the open connections are counted: the lag of a long-lived connection's bytes.
pub const INTERVAL: Duration = Duration::from_secs(10);

/// The sweeping thread; it stops when dropped.
pub struct Sweeper {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Sweeper {
    /// Starts sweeping the namespaces under `netns_dirs` (and the agent's own) with `sweep`.
    pub fn start(mut sweep: BytesSweep, netns_dirs: Vec<PathBuf>, metrics: Arc<Metrics>) -> std::io::Result<Self> {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new().name("bytes-sweep".into()).spawn(move || {
            // Ends when the sender goes (the agent stops), else every interval.
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(INTERVAL) {
                let started = std::time::Instant::now();
                let mut failed = 0u64;
                for namespace in netns::namespaces(&netns_dirs) {
                    // A pod's namespace may go between the listing and the entering: nothing to count.
                    let outcome = netns::within(&namespace.path, || sweep.run_here());
                    if let Err(error) = outcome.map_err(|e| e.to_string()).and_then(|r| r.map_err(|e| e.to_string())) {
                        tracing::debug!(namespace = %namespace.path.display(), %error, "bytes sweep skipped a namespace");
                        failed += 1;
                    }
                }
                metrics.bytes_sweep_seconds.observe(started.elapsed().as_secs_f64());
                metrics.bytes_sweep_failures.inc_by(failed);
            }
        })?;
        Ok(Self { stop: Some(stop), thread: Some(thread) })
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
