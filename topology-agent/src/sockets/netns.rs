//! The network namespaces whose sockets the programs may have rewritten, and a sock_diag channel
//! into each. Every pod has its own namespace; runtimes pin them as files (`/run/netns/cni-…`,
//! and `ip netns` the same way); host-network pods share the host's.

use std::{
    collections::BTreeSet,
    fs::File,
    io,
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
};

use super::diag::Channel;

/// A namespace, by the file that names it, and its identity (device and inode of that file).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Namespace {
    /// `(st_dev, st_ino)`: two paths to one namespace have the same.
    pub identity: (u64, u64),
    /// A path that opens it.
    pub path: PathBuf,
}

/// Every distinct namespace among the files in `dirs`, this process's own, and the host's
/// (`/proc/1/ns/net`, visible with the host's PID namespace). Unreadable entries are skipped.
pub fn namespaces(dirs: &[PathBuf]) -> Vec<Namespace> {
    let mut candidates: Vec<PathBuf> = vec!["/proc/self/ns/net".into(), "/proc/1/ns/net".into()];
    for dir in dirs {
        if let Ok(entries) = std::fs::read_dir(dir) {
            candidates.extend(entries.flatten().map(|entry| entry.path()));
        }
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for path in candidates {
        if let Ok(meta) = std::fs::metadata(&path)
            && seen.insert((meta.dev(), meta.ino()))
        {
            out.push(Namespace { identity: (meta.dev(), meta.ino()), path });
        }
    }
    out
}

/// A sock_diag channel inside the namespace at `path` (a socket keeps the namespace it was
/// made in).
pub fn channel_in(path: &Path) -> io::Result<Channel> {
    within(path, Channel::open)?
}

/// Runs `f` with the calling thread inside the namespace at `path`, then brings it back.
pub fn within<T>(path: &Path, f: impl FnOnce() -> T) -> io::Result<T> {
    let home = File::open("/proc/thread-self/ns/net")?;
    let target = File::open(path)?;
    setns(&target)?;
    let out = f();
    // Back home whatever `f` did; a thread left elsewhere would be worse.
    setns(&home)?;
    Ok(out)
}

fn setns(file: &File) -> io::Result<()> {
    // SAFETY: `file` is an open namespace descriptor; setns only moves the calling thread.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
