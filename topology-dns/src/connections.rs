//! The connections one listener serves (HTTP, DNS over TCP): at most a total and at most a few per
//! client address, so one pod (or a few) can neither exhaust the agent's descriptors nor keep
//! kubelet's probes, the scrapes or other pods' queries out. Past either bound, a new connection
//! replaces the oldest idle one of the same bound (waiting for its next request) that has had
//! [`FRESH`] to send one, or is closed unserved when there is none: a client that keeps opening
//! connections cannot evict another's before its request arrives.

use std::{
    collections::VecDeque,
    net::IpAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::task::AbortHandle;

/// A connection this young is not evicted: it has not had the time to send its request.
pub const FRESH: Duration = Duration::from_millis(250);

/// Bounds of one listener's connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once.
    pub total: usize,
    /// Connections served at once from one client address.
    pub per_source: usize,
}

/// The connections being served, oldest first.
pub struct Pool {
    limits: Limits,
    open: Mutex<VecDeque<Connection>>,
    next: AtomicU64,
}

struct Connection {
    id: u64,
    source: IpAddr,
    opened: Instant,
    /// Set while it is busy with a request.
    busy: Arc<AtomicBool>,
    task: AbortHandle,
}

impl Pool {
    /// An empty pool with `limits`.
    pub fn new(limits: Limits) -> Self {
        Self { limits, open: Mutex::default(), next: AtomicU64::new(0) }
    }

    /// Makes room for one more connection from `source`: true if there is room, after evicting an
    /// idle connection if one is needed (of the same source when that source is at its bound).
    pub fn make_room(&self, source: IpAddr) -> bool {
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let from_source = open.iter().filter(|c| c.source == source).count();
        if from_source >= self.limits.per_source {
            return evict(&mut open, |c| c.source == source);
        }
        if open.len() >= self.limits.total {
            return evict(&mut open, |_| true);
        }
        true
    }

    /// Registers a connection being served; its id for [`Pool::remove`].
    pub fn add(&self, source: IpAddr, busy: Arc<AtomicBool>, task: AbortHandle) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let connection = Connection { id, source, opened: Instant::now(), busy, task };
        self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push_back(connection);
        id
    }

    /// Forgets a connection that ended.
    pub fn remove(&self, id: u64) {
        self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner).retain(|c| c.id != id);
    }

    /// Serves a connection from `source` with `serve` on a task of its own, registered here (and
    /// evictable while `busy` is unset) until it ends.
    pub fn spawn(
        self: &Arc<Self>,
        source: IpAddr,
        busy: Arc<AtomicBool>,
        serve: impl Future<Output = ()> + Send + 'static,
    ) {
        let (ready, registered) = tokio::sync::oneshot::channel::<u64>();
        let pool = Arc::clone(self);
        let task = tokio::spawn(async move {
            serve.await;
            if let Ok(id) = registered.await {
                pool.remove(id);
            }
        });
        let id = self.add(source, busy, task.abort_handle());
        let _ = ready.send(id);
    }
}

/// Ends the oldest idle connection among those `of` that is not [`FRESH`]; false if there is none.
fn evict(open: &mut VecDeque<Connection>, of: impl Fn(&Connection) -> bool) -> bool {
    let evictable = |c: &Connection| of(c) && !c.busy.load(Ordering::Relaxed) && c.opened.elapsed() >= FRESH;
    let Some(idle) = open.iter().position(evictable) else {
        return false;
    };
    if let Some(evicted) = open.remove(idle) {
        evicted.task.abort();
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[tokio::test]
    async fn one_source_cannot_take_the_others_room() {
        let pool = Pool::new(Limits { total: 4, per_source: 2 });
        let task = || tokio::spawn(std::future::pending::<()>()).abort_handle();
        let busy = || Arc::new(AtomicBool::new(true));
        // A source at its bound with requests in flight gets no more.
        assert!(pool.make_room(ip(1)));
        pool.add(ip(1), busy(), task());
        assert!(pool.make_room(ip(1)));
        pool.add(ip(1), busy(), task());
        assert!(!pool.make_room(ip(1)), "a third from the same source, all busy, is refused");
        // Others still get in, up to the total.
        assert!(pool.make_room(ip(2)));
        let idle = Arc::new(AtomicBool::new(false));
        let idle_task = task();
        pool.add(ip(2), Arc::clone(&idle), idle_task.clone());
        assert!(pool.make_room(ip(3)));
        pool.add(ip(3), busy(), task());
        // Full: a new source evicts the oldest idle connection, of any source, once it had the
        // time to send its request.
        assert!(!pool.make_room(ip(4)), "the idle connection has just opened");
        tokio::time::sleep(FRESH).await;
        assert!(pool.make_room(ip(4)));
        tokio::task::yield_now().await;
        assert!(idle_task.is_finished(), "the idle connection was ended");
        pool.add(ip(4), busy(), task());
        assert!(!pool.make_room(ip(5)), "full and every connection mid-request");
    }
}
