//! The agent's background chores beside the controller: the kernel log's reader, the memory
//! release after the first sync, the sweep of open connections' bytes, and the removal of the API
//! server's Service an earlier version programmed.

use std::{path::PathBuf, sync::Arc};

use tokio::io::unix::AsyncFd;
use tokio_util::sync::CancellationToken;
use topology_dataplane::{Dataplane, KernelLogger};

use crate::{controller::Health, metrics::Metrics, sockets::sweep::Sweeper};

/// Starts sweeping the open connections' bytes in every namespace under `netns_dirs`; `None`
/// (said once) when the sweep cannot load: connections are then counted only when they end.
/// Without `CAP_SYS_ADMIN` (`--terminate-sockets off` runs without it) only the agent's own
/// namespace is swept, as said once: the others' connections are counted when they end.
pub(super) fn start_sweeper(dataplane: &Dataplane, netns_dirs: &[PathBuf], metrics: &Arc<Metrics>) -> Option<Sweeper> {
    let can_enter =
        crate::caps::effective().is_ok_and(|caps| crate::caps::holds(caps, crate::caps::Capability::SysAdmin));
    let dirs = if can_enter {
        netns_dirs.to_vec()
    } else {
        tracing::warn!(
            "without CAP_SYS_ADMIN the sweep of open connections' bytes stays in the agent's own network \
             namespace: the pods' connections are counted when they end"
        );
        Vec::new()
    };
    let started = dataplane
        .bytes_sweep()
        .map_err(|error| error.to_string())
        .and_then(|sweep| Sweeper::start(sweep, dirs, Arc::clone(metrics)).map_err(|e| e.to_string()));
    started
        .inspect_err(|error| {
            tracing::warn!(%error, "the open connections' bytes cannot be swept: each is counted when it ends");
        })
        .ok()
}

/// Removes the API server's Service if an earlier version programmed it (this one leaves it to
/// kube-proxy): before anything else, or the agent's own first list would follow the adopted maps
/// to an API address that may be gone since, until the programs failed open.
pub(super) fn leave_the_api_service(dataplane: &mut Dataplane) {
    let prefix = format!("{}/{}:", topology_policy::policy::API_SERVICE.0, topology_policy::policy::API_SERVICE.1);
    let adopted: Vec<_> = dataplane
        .kernel()
        .services
        .iter()
        .filter(|(_, held)| held.name.starts_with(&prefix))
        .map(|(p, _)| *p)
        .collect();
    if adopted.is_empty() {
        return;
    }
    let report = dataplane.apply_changes(adopted.iter().map(|port| (*port, None)));
    match report.failed.first() {
        None => tracing::info!(ports = adopted.len(), "removed the API server's Service an earlier version programmed"),
        Some((port, error)) => tracing::warn!(%port, %error, "could not remove the API server's Service"),
    }
}

/// Forwards the kernel programs' log records to `tracing` until shutdown.
pub(super) async fn read_kernel_log(logger: KernelLogger, shutdown: CancellationToken) {
    // SAFETY: the logger owns its ring buffer's descriptor for as long as the AsyncFd owns the
    // logger, and nothing else closes it.
    let mut fd = match unsafe { AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE) } {
        Ok(fd) => fd,
        Err(error) => {
            tracing::warn!(%error, "kernel log unavailable");
            return;
        }
    };
    loop {
        let mut guard = tokio::select! {
            () = shutdown.cancelled() => return,
            ready = fd.readable_mut() => match ready {
                Ok(guard) => guard,
                Err(error) => {
                    tracing::warn!(%error, "kernel log unreadable");
                    return;
                }
            },
        };
        guard.get_inner_mut().flush();
        guard.clear_ready();
    }
}

/// The initial list is decoded on many threads and freed once the cluster state holds its lean
/// form; glibc keeps such memory in per-thread arenas. Hand it back once the first sync is done,
/// so the resident size reflects the state kept, not the list's peak.
pub(super) async fn release_memory_after_sync(health: Arc<Health>, shutdown: CancellationToken) {
    while health.readiness().is_err() {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(std::time::Duration::from_millis(200)) => {}
        }
    }
    // SAFETY: malloc_trim only returns free memory to the kernel; it has no preconditions.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
}
