//! Waiting until no program can still use what it read before a map update.
//!
//! The socket programs run inside an RCU read-side critical section (`bpf_prog_run_array_cg`
//! holds `rcu_read_lock()` around them), so once an RCU grace period has passed after a service
//! entry was replaced, no program holds the old entry any more and its slots may be rewritten.
//! `membarrier(MEMBARRIER_CMD_GLOBAL)` is `synchronize_rcu()` from userspace.

use std::time::Duration;

/// `MEMBARRIER_CMD_GLOBAL` from `linux/membarrier.h`.
const MEMBARRIER_CMD_GLOBAL: libc::c_int = 1;

/// How long to wait instead when the kernel refuses the global membarrier (`nohz_full` kernels,
/// a seccomp filter): programs run for microseconds, so this is orders of magnitude beyond the
/// longest reader.
const FALLBACK: Duration = Duration::from_millis(50);

/// Returns once every program that started before the call has finished.
pub fn wait() {
    if synchronize_rcu().is_err() {
        std::thread::sleep(FALLBACK);
    }
}

/// `synchronize_rcu()` through the global membarrier.
fn synchronize_rcu() -> std::io::Result<()> {
    // SAFETY: membarrier takes no pointers; `cmd` is a valid command and flags are 0.
    let ret = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) };
    if ret == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_global_membarrier_is_available() {
        // Kernels built with nohz_full refuse it and the writer sleeps instead; the supported
        // machines (and CI) take the fast path.
        super::synchronize_rcu().expect("membarrier(MEMBARRIER_CMD_GLOBAL)");
    }
}
