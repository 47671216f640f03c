//! Connections kept up in the background while a test changes the cluster: batches of TCP
//! connections from one client to one Service address until stopped, bounded in time.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::{net::ClientPlace, traffic::Report};

/// Connections in each probe run.
const BATCH: u64 = 25;
/// The pause between runs: a few hundred connections a second from each client, evidence enough
/// without taking the CPUs the control plane restarts on.
const PAUSE: Duration = Duration::from_millis(50);

/// A background client.
pub struct Load {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<Report>>>,
}

impl Load {
    /// Starts connecting from `place` to `target`, batch after batch, for at most `limit`.
    pub fn start(place: ClientPlace, target: SocketAddr, limit: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let deadline = Instant::now() + limit;
            let mut batches = Vec::new();
            while !stopping.load(Ordering::SeqCst) && Instant::now() < deadline {
                batches.push(place.tcp(target, BATCH));
                std::thread::sleep(PAUSE);
            }
            batches
        });
        Self { stop, thread: Some(thread) }
    }

    /// Stops, and returns every batch's report in order.
    pub fn stop(mut self) -> Vec<Report> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().expect("running").join().expect("the load thread")
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The batches merged.
pub fn total(batches: &[Report]) -> Report {
    let mut total = Report::default();
    for batch in batches {
        total.merge(batch);
    }
    total
}
