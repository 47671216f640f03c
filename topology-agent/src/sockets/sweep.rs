//! The sweep of open connections' bytes (cross-zone accounting, see
//! `topology_common::bytes`): every [`INTERVAL`], the accounting iterator runs in each network
//! namespace, on a thread of its own (entering a namespace moves the calling thread), so a
//! connection of hours is counted as it goes. Connections that end are counted by the kernel
//! when they do; the sweep only brings the open ones' counts up to date.
//!
//! A sweep walks every TCP socket of the node once per namespace (the kernel's socket table is
//! shared by the namespaces; the iterator skips the others' sockets), so its cost grows with
//! sockets and pods: a node where one sweep takes more than [`CPU_BUDGET`] of a core over the
//! interval is swept less often, to stay within it (its open connections' counts lag more).

use std::{path::PathBuf, sync::Arc, thread::JoinHandle, time::Duration};

use super::netns;
use crate::{dataplane::BytesSweep, metrics::Metrics};

/// How often the open connections are counted: the lag of a long-lived connection's bytes.
pub const INTERVAL: Duration = Duration::from_secs(10);

/// The share of one core the sweeps may take at the most.
pub const CPU_BUDGET: f64 = 0.005;

/// The wait before the next sweep, after one that took `cpu`: [`INTERVAL`], or longer when the
/// sweep would take more than [`CPU_BUDGET`] of it.
pub fn next_wait(cpu: Duration) -> Duration {
    INTERVAL.max(cpu.div_f64(CPU_BUDGET))
}

/// The calling thread's CPU time.
pub fn thread_cpu() -> Duration {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

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
            let mut wait = INTERVAL;
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(wait) {
                let (started, cpu) = (std::time::Instant::now(), thread_cpu());
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
                wait = next_wait(thread_cpu().saturating_sub(cpu));
                metrics.bytes_sweep_interval.set(wait.as_secs_f64());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_over_its_budget_waits_longer() {
        assert_eq!(next_wait(Duration::from_millis(5)), INTERVAL, "10 s at 0.05 % of a core");
        assert_eq!(next_wait(Duration::from_millis(50)), INTERVAL, "exactly the budget");
        assert_eq!(next_wait(Duration::from_millis(200)), Duration::from_secs(40));
    }
}
