//! The network namespaces whose sockets the programs may have rewritten, and a sock_diag channel
//! into each. Every pod has its own namespace; runtimes pin them as files (`/run/netns/cni-…`,
//! and `ip netns` the same way); host-network pods and the node's own processes share the host's,
//! which an agent in a pod reaches only through a file: `/proc/1/ns/net` with the host's PID
//! namespace, else the host's `/proc/1/ns/net` mounted into the pod (`--host-netns`).

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

/// Every distinct namespace among `places` — each a directory of namespace files or a namespace
/// file itself — and this process's own. Unreadable entries are skipped.
pub fn namespaces(places: &[PathBuf]) -> Vec<Namespace> {
    let mut candidates: Vec<PathBuf> = vec!["/proc/self/ns/net".into()];
    for place in places {
        match std::fs::read_dir(place) {
            Ok(entries) => candidates.extend(entries.flatten().map(|entry| entry.path())),
            Err(_) => candidates.push(place.clone()),
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

/// Why each of `places` that names no namespace cannot be searched, said once at start: a socket
/// there would never be ended.
pub fn unreachable(places: &[PathBuf]) -> Vec<String> {
    places
        .iter()
        .filter(|place| !place.is_dir())
        .filter_map(|place| match File::open(place) {
            Ok(_) => None,
            Err(error) => Some(format!("{}: {error}", place.display())),
        })
        .collect()
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
