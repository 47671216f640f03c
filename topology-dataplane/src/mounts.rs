//! Where cgroup v2 is mounted (from `/proc/self/mountinfo`, never assumed) and what filesystem a
//! path is on.

use std::{
    ffi::CString,
    io,
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
};

/// `statfs` magic of cgroup v2.
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
/// `statfs` magic of bpffs.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
/// `statfs` magic of a cgroup v1 controller hierarchy.
const CGROUP_SUPER_MAGIC: i64 = 0x0027_e0eb;
/// `statfs` magic of tmpfs (where a v1 or hybrid host mounts its hierarchies).
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// Failure to find the cgroup v2 mount.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// `/proc/self/mountinfo` could not be read.
    #[error("reading /proc/self/mountinfo: {0}")]
    Read(#[from] io::Error),
    /// No cgroup v2 filesystem is mounted.
    #[error("no cgroup v2 filesystem is mounted (no `cgroup2` entry in /proc/self/mountinfo)")]
    NoCgroup2,
    /// `--cgroup` is not a cgroup v2 directory, nor a hybrid host's mount with one below.
    #[error(
        "--cgroup {}: {layout}, not cgroup v2; the programs attach to cgroup v2 only: boot the node with the unified \
         hierarchy (systemd.unified_cgroup_hierarchy=1, the default since systemd 248) or keep the DaemonSet off such \
         nodes (docs/operating.md, Supported clusters)",
        path.display()
    )]
    NotCgroup2 {
        /// As given.
        path: PathBuf,
        /// What it is instead.
        layout: &'static str,
    },
}

/// Where the programs attach for `--cgroup path`: `path` itself when it is a cgroup v2 directory;
/// on a hybrid host (v1 controllers on a tmpfs, the unified hierarchy at `unified/`), the unified
/// hierarchy below it; else an error naming what the host has.
pub fn cgroup2_at(path: &Path) -> Result<PathBuf, MountError> {
    let magic = |path: &Path| fs_magic(path).ok();
    match magic(path) {
        Some(CGROUP2_SUPER_MAGIC) => return Ok(path.to_path_buf()),
        Some(TMPFS_MAGIC) if magic(&path.join("unified")) == Some(CGROUP2_SUPER_MAGIC) => {
            let unified = path.join("unified");
            tracing::info!(
                cgroup = %path.display(),
                unified = %unified.display(),
                "a hybrid cgroup host: attaching to its unified hierarchy"
            );
            return Ok(unified);
        }
        _ => {}
    }
    let layout = match magic(path) {
        None => "not found",
        Some(CGROUP_SUPER_MAGIC) => "a cgroup v1 controller hierarchy",
        Some(TMPFS_MAGIC) if has_v1_controllers(path) => {
            "a cgroup v1 host (controllers on a tmpfs, no unified hierarchy)"
        }
        Some(_) => "not a cgroup filesystem",
    };
    Err(MountError::NotCgroup2 { path: path.to_path_buf(), layout })
}

/// Whether a directory holds cgroup v1 controller mounts.
fn has_v1_controllers(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .any(|entry| fs_magic(&entry.path()).is_ok_and(|magic| magic == CGROUP_SUPER_MAGIC))
}

/// The mount point of the cgroup v2 hierarchy's root.
pub fn cgroup2_root() -> Result<PathBuf, MountError> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    cgroup2_root_in(&mountinfo).ok_or(MountError::NoCgroup2)
}

/// The first cgroup v2 mount of the hierarchy's root in `mountinfo` text. A mount of a
/// sub-cgroup (root field other than `/`, as inside a container) is used only when there is no
/// full mount.
pub fn cgroup2_root_in(mountinfo: &str) -> Option<PathBuf> {
    let mut partial = None;
    for line in mountinfo.lines() {
        let Some((mount, fs)) = line.split_once(" - ") else {
            continue;
        };
        if fs.split_whitespace().next() != Some("cgroup2") {
            continue;
        }
        let fields: Vec<&str> = mount.split_whitespace().collect();
        let (Some(root), Some(point)) = (fields.get(3), fields.get(4)) else {
            continue;
        };
        let point = PathBuf::from(unescape(point));
        if *root == "/" {
            return Some(point);
        }
        partial.get_or_insert(point);
    }
    partial
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo` octal.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|digits| digits.iter().all(|b| (b'0'..=b'7').contains(b)));
        let value = octal.map(|d| u16::from(d[0] - b'0') * 64 + u16::from(d[1] - b'0') * 8 + u16::from(d[2] - b'0'));
        if bytes[i] == b'\\'
            && let Some(Ok(byte)) = value.map(u8::try_from)
        {
            out.push(byte);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// True if `path` is on a cgroup v2 filesystem.
pub fn is_cgroup2(path: &Path) -> io::Result<bool> {
    Ok(fs_magic(path)? == CGROUP2_SUPER_MAGIC)
}

/// What [`mount_bpffs`] found or did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BpffsMount {
    /// `path` was a BPF filesystem already.
    Present,
    /// One was mounted there.
    Mounted,
}

/// Mounts a BPF filesystem at `path` (created if missing) unless one is there: kind's nodes and
/// some images mount none, and the pins must outlive the agent on the host's own bpffs.
pub fn mount_bpffs(path: &Path) -> io::Result<BpffsMount> {
    std::fs::create_dir_all(path)?;
    if fs_magic(path)? == BPF_FS_MAGIC {
        return Ok(BpffsMount::Present);
    }
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    // SAFETY: NUL-terminated strings that outlive the call; no mount data.
    let mounted = unsafe { libc::mount(c"bpf".as_ptr(), c_path.as_ptr(), c"bpf".as_ptr(), 0, std::ptr::null()) };
    if mounted != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(BpffsMount::Mounted)
}

/// True if `path` is on a BPF filesystem.
pub fn is_bpffs(path: &Path) -> io::Result<bool> {
    Ok(fs_magic(path)? == BPF_FS_MAGIC)
}

fn fs_magic(path: &Path) -> io::Result<i64> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    // SAFETY: `statfs` only writes into the zeroed struct we pass; the path is NUL-terminated.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statfs(c_path.as_ptr(), &mut stat) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stat.f_type as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn finds_the_unified_mount_of_a_hybrid_layout() {
        assert_eq!(cgroup2_root_in(HYBRID), Some(PathBuf::from("/sys/fs/cgroup/unified")));
    }

    #[test]
    fn finds_a_pure_v2_mount_with_optional_fields() {
        let info = "29 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(cgroup2_root_in(info), Some(PathBuf::from("/sys/fs/cgroup")));
    }

    #[test]
    fn prefers_the_root_of_the_hierarchy_over_a_sub_cgroup_mount() {
        let info = "\
50 40 0:26 /kubepods/pod1 /host/cg rw - cgroup2 cgroup2 rw
51 40 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw
";
        assert_eq!(cgroup2_root_in(info), Some(PathBuf::from("/sys/fs/cgroup")));
        let only_partial = "50 40 0:26 /kubepods /host/cg rw - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_root_in(only_partial), Some(PathBuf::from("/host/cg")));
    }

    #[test]
    fn unescapes_octal_in_mount_points() {
        let info = "41 31 0:38 / /mnt/my\\040cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_root_in(info), Some(PathBuf::from("/mnt/my cgroup")));
    }

    #[test]
    fn an_escape_beyond_a_byte_is_kept_as_text() {
        let info = "41 31 0:38 / /mnt/a\\777b rw - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_root_in(info), Some(PathBuf::from("/mnt/a\\777b")));
        assert_eq!(unescape("\\1"), "\\1");
    }

    #[test]
    fn a_cgroup_flag_resolves_to_cgroup_v2_or_names_the_hosts_layout() {
        // This machine's layout, whatever it is; the hybrid case where it is one (tests never
        // attach here: resolving reads the filesystem types only).
        let host = Path::new("/sys/fs/cgroup");
        match fs_magic(host) {
            Ok(CGROUP2_SUPER_MAGIC) => assert_eq!(cgroup2_at(host).unwrap(), host),
            Ok(TMPFS_MAGIC) if fs_magic(&host.join("unified")).ok() == Some(CGROUP2_SUPER_MAGIC) => {
                assert_eq!(cgroup2_at(host).unwrap(), host.join("unified"), "a hybrid host's unified hierarchy");
                let v1 = std::fs::read_dir(host)
                    .unwrap()
                    .flatten()
                    .map(|e| e.path())
                    .find(|p| fs_magic(p).ok() == Some(CGROUP_SUPER_MAGIC));
                if let Some(v1) = v1 {
                    let error = cgroup2_at(&v1).unwrap_err().to_string();
                    assert!(error.contains("a cgroup v1 controller hierarchy, not cgroup v2"), "{error}");
                }
            }
            _ => eprintln!("SKIPPED the hybrid case: /sys/fs/cgroup is neither cgroup2 nor a hybrid tmpfs here"),
        }
        let plain = std::env::temp_dir();
        let error = cgroup2_at(&plain).unwrap_err().to_string();
        assert!(error.starts_with(&format!("--cgroup {}: not a cgroup filesystem, not cgroup v2", plain.display())));
        assert!(error.contains("systemd.unified_cgroup_hierarchy=1"), "{error}");
        let missing = cgroup2_at(Path::new("/nonexistent/cgroup")).unwrap_err().to_string();
        assert!(missing.starts_with("--cgroup /nonexistent/cgroup: not found"), "{missing}");
    }

    #[test]
    fn no_cgroup2_mount() {
        assert_eq!(cgroup2_root_in("32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"), None);
        assert_eq!(cgroup2_root_in(""), None);
    }
}
