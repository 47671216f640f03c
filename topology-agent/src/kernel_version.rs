//! The oldest kernel the programs run on, checked at start so that an old node fails with one line
//! naming its kernel, not with a verifier log.
//!
//! 5.11: `bpf_ktime_get_coarse_ns` (the heartbeat's clock), and BPF map memory charged to memory
//! cgroups instead of `RLIMIT_MEMLOCK` (so no limit needs raising). The other features the programs
//! use came earlier (socket storage in sock_addr hooks and `getpeername` hooks 5.8, socket
//! iterators 5.9, pinned links 5.7, mmapable arrays 5.5).

/// The oldest kernel the programs run on.
pub const MINIMUM: (u32, u32) = (5, 11);

/// The kernel is older than [`MINIMUM`], or its release cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// Too old.
    #[error(
        "kernel {release} is older than {}.{}, the oldest the programs run on (bpf_ktime_get_coarse_ns; BPF map \
         memory charged to memory cgroups, not RLIMIT_MEMLOCK): keep the DaemonSet off such nodes \
         (docs/operating.md, Supported clusters)",
        MINIMUM.0,
        MINIMUM.1
    )]
    TooOld {
        /// `uname -r`.
        release: String,
    },
    /// `uname` failed.
    #[error("reading the kernel release (uname): {0}")]
    Uname(std::io::Error),
}

/// Checks the running kernel is at least [`MINIMUM`].
pub fn check() -> Result<(), KernelError> {
    let release = release().map_err(KernelError::Uname)?;
    match version(&release) {
        Some(found) if found >= MINIMUM => Ok(()),
        // A release that does not read as x.y is not refused: the load would say what is missing.
        None => Ok(()),
        Some(_) => Err(KernelError::TooOld { release }),
    }
}

/// `uname -r`.
fn release() -> std::io::Result<String> {
    // SAFETY: `uname` only writes into the zeroed struct passed to it.
    let mut name: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::uname(&mut name) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel NUL-terminates `release` within the array.
    let release = unsafe { std::ffi::CStr::from_ptr(name.release.as_ptr()) };
    Ok(release.to_string_lossy().into_owned())
}

/// `(major, minor)` of a release such as `6.18.0-1-amd64` or `5.15.0-1050-azure`.
fn version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_read_as_major_and_minor() {
        assert_eq!(version("6.18.0-1-amd64"), Some((6, 18)));
        assert_eq!(version("5.15.0-1050-azure"), Some((5, 15)));
        assert_eq!(version("5.4.0-150-generic"), Some((5, 4)));
        assert_eq!(version("4.19.112+"), Some((4, 19)));
        assert_eq!(version("garbage"), None);
        assert!(version("5.4.0").unwrap() < MINIMUM && version("5.11.0").unwrap() >= MINIMUM);
        assert!(version("10.0.0").unwrap() >= MINIMUM, "compared as numbers, not text");
        let too_old = KernelError::TooOld { release: "5.4.0-150-generic".into() }.to_string();
        assert!(too_old.starts_with("kernel 5.4.0-150-generic is older than 5.11"), "{too_old}");
        assert!(check().is_ok(), "this machine runs the programs");
    }
}
