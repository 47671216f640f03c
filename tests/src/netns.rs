//! Running code inside a network namespace made with `ip netns add`: on a thread of its own that
//! enters the namespace, so the test's other threads stay where they are. Sockets made there keep
//! the namespace for life, wherever they are used afterwards.

use std::{fs::File, os::fd::AsRawFd as _, path::PathBuf};

/// The file `ip netns` pins a namespace at.
pub fn path(name: &str) -> PathBuf {
    PathBuf::from("/run/netns").join(name)
}

/// Runs `f` on a thread inside the namespace `name` and returns its result.
pub fn run_in<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let file = File::open(path(name)).unwrap_or_else(|e| panic!("opening network namespace {name}: {e}"));
    std::thread::spawn(move || {
        // SAFETY: `file` is an open namespace descriptor; setns changes only this thread.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            panic!("setns: {}", std::io::Error::last_os_error());
        }
        f()
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Makes a child process enter the namespace `name` between fork and exec.
pub fn enter_on_spawn(command: &mut std::process::Command, name: &str) {
    use std::os::unix::process::CommandExt as _;
    let file = File::open(path(name)).unwrap_or_else(|e| panic!("opening network namespace {name}: {e}"));
    // SAFETY: between fork and exec only setns runs, an async-signal-safe system call, on a
    // descriptor opened before the fork (and closed by exec: `File` is close-on-exec).
    unsafe {
        command.pre_exec(move || {
            if libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
