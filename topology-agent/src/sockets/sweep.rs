//! The sweep of open connections' bytes (cross-zone accounting, see
//! `topology_common::bytes`): every [`INTERVAL`], the accounting iterator runs in each network
//! namespace, on a thread of its own (entering a namespace moves the calling thread), so a
//! connection of hours is counted as it goes. Connections that end are counted by the kernel
//! when they do; the sweep only brings the open ones' counts up to date.
//!
//! A sweep walks every TCP socket of the node once per namespace (the kernel's socket table is
//! shared by the namespaces; the iterator skips the others' sockets), so its cost grows with
//! sockets and pods. Two things bound it: a namespace where the last sweep found no connection
//! of ours (most pods hold none open at a given moment: servers, batch jobs, idle clients) is
//! swept only one time in [`IDLE_EVERY`] ([`Rota`]); and a node where a sweep still takes more
//! than [`CPU_BUDGET`] of a core over the interval is swept less often, to stay within it (its
//! open connections' counts lag more).

use std::{collections::HashMap, path::PathBuf, sync::Arc, thread::JoinHandle, time::Duration};

use topology_dataplane::BytesSweep;

use super::netns;
use crate::metrics::Metrics;

/// How often the open connections are counted: the lag of a long-lived connection's bytes.
pub const INTERVAL: Duration = Duration::from_secs(10);

/// The share of one core the sweeps may take at the most.
pub const CPU_BUDGET: f64 = 0.005;

/// A namespace whose last sweep found none of ours is swept once in this many sweeps (once a
/// minute at [`INTERVAL`]): a connection opened there meanwhile is counted when it ends, or at
/// most that much later.
pub const IDLE_EVERY: u32 = 6;

/// Which namespaces a sweep walks: every one, but those whose last sweep found none of ours
/// only one time in [`IDLE_EVERY`]. Namespaces are known by identity (device and inode).
#[derive(Debug, Default)]
pub struct Rota {
    /// Namespaces whose last sweep found none of ours, and the sweeps they sat out since.
    idle: HashMap<(u64, u64), u32>,
}

impl Rota {
    /// Whether the namespace `identity` is swept this time.
    pub fn due(&self, identity: (u64, u64)) -> bool {
        self.idle.get(&identity).is_none_or(|&skipped| skipped + 1 >= IDLE_EVERY)
    }

    /// Records that the namespace `identity` was swept and held `ours` connections of ours, or
    /// (`None`) sat this sweep out.
    pub fn record(&mut self, identity: (u64, u64), ours: Option<u64>) {
        match ours {
            Some(0) => {
                self.idle.insert(identity, 0);
            }
            Some(_) => {
                self.idle.remove(&identity);
            }
            None => {
                if let Some(skipped) = self.idle.get_mut(&identity) {
                    *skipped += 1;
                }
            }
        }
    }

    /// Forgets the namespaces not among `present` (gone with their pods).
    pub fn retain(&mut self, present: &[(u64, u64)]) {
        self.idle.retain(|identity, _| present.contains(identity));
    }
}

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
            let (mut wait, mut rota) = (INTERVAL, Rota::default());
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(wait) {
                let (started, cpu) = (std::time::Instant::now(), thread_cpu());
                let mut failed = 0u64;
                let namespaces = netns::namespaces(&netns_dirs);
                rota.retain(&namespaces.iter().map(|n| n.identity).collect::<Vec<_>>());
                for namespace in namespaces {
                    if !rota.due(namespace.identity) {
                        rota.record(namespace.identity, None);
                        continue;
                    }
                    // A pod's namespace may go between the listing and the entering: nothing to count.
                    let outcome = netns::within(&namespace.path, || sweep.run_here());
                    match outcome.map_err(|e| e.to_string()).and_then(|r| r.map_err(|e| e.to_string())) {
                        Ok(ours) => rota.record(namespace.identity, Some(ours)),
                        Err(error) => {
                            tracing::debug!(namespace = %namespace.path.display(), %error, "bytes sweep skipped a namespace");
                            failed += 1;
                        }
                    }
                }
                metrics.sockets.sweep_seconds.observe(started.elapsed().as_secs_f64());
                metrics.sockets.sweep_failures.inc_by(failed);
                wait = next_wait(thread_cpu().saturating_sub(cpu));
                metrics.sockets.sweep_interval.set(wait.as_secs_f64());
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
    fn a_namespace_without_ours_is_swept_one_time_in_six() {
        let (busy, idle, new) = ((0, 1), (0, 2), (0, 3));
        let mut rota = Rota::default();
        rota.record(busy, Some(3));
        rota.record(idle, Some(0));
        let mut swept = Vec::new();
        for _ in 0..12 {
            let due: Vec<bool> = [busy, idle, new].iter().map(|&n| rota.due(n)).collect();
            swept.push(due.clone());
            for (n, due) in [busy, idle].into_iter().zip(due) {
                rota.record(n, if due { Some(if n == busy { 3 } else { 0 }) } else { None });
            }
        }
        assert!(swept.iter().all(|due| due[0] && due[2]), "busy and unknown namespaces, every time");
        let idle_sweeps: Vec<usize> = swept.iter().enumerate().filter(|(_, d)| d[1]).map(|(i, _)| i).collect();
        assert_eq!(idle_sweeps, [5, 11], "the idle one, one time in {IDLE_EVERY}");
        // One of ours found there: every time again; a namespace gone is forgotten.
        rota.record(idle, Some(1));
        assert!(rota.due(idle));
        rota.record(idle, Some(0));
        rota.retain(&[busy]);
        assert!(rota.due(idle), "a namespace forgotten is swept as a new one");
    }

    #[test]
    fn a_sweep_over_its_budget_waits_longer() {
        assert_eq!(next_wait(Duration::from_millis(5)), INTERVAL, "10 s at 0.05 % of a core");
        assert_eq!(next_wait(Duration::from_millis(50)), INTERVAL, "exactly the budget");
        assert_eq!(next_wait(Duration::from_millis(200)), Duration::from_secs(40));
    }
}
