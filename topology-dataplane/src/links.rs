//! Pinned cgroup links: replaced without a gap, detached by force on cleanup.

use std::{
    ffi::CString,
    io,
    os::{
        fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::{Path, PathBuf},
};

use aya::programs::links::FdLink;

use super::error::DataplaneError;

/// `BPF_OBJ_GET` from `enum bpf_cmd`.
const BPF_OBJ_GET: libc::c_long = 7;
/// `BPF_LINK_DETACH` from `enum bpf_cmd`.
const BPF_LINK_DETACH: libc::c_long = 34;
/// `BPF_LINK_UPDATE` from `enum bpf_cmd`.
const BPF_LINK_UPDATE: libc::c_long = 29;
/// `BPF_OBJ_GET_INFO_BY_FD` from `enum bpf_cmd`.
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
/// `BPF_LINK_TYPE_CGROUP` from `enum bpf_link_type`.
const BPF_LINK_TYPE_CGROUP: u32 = 3;

/// Pins `link` at `path`, replacing any link pinned there (one attached elsewhere: a link attached
/// here is updated in place, see [`update_pinned`]). The new link is attached before the old one
/// is detached, so no connection is ever unhandled.
pub fn replace_pinned(link: FdLink, path: &Path) -> Result<(), DataplaneError> {
    let staging = staging_path(path);
    if staging.exists() {
        // Left by an agent that died between pinning and renaming: it is attached, drop it.
        detach_pinned(&staging)?;
    }
    let pinned = link
        .pin(&staging)
        .map_err(|error| DataplaneError::Link { path: staging.clone(), source: io::Error::other(error) })?;
    if path.exists() {
        detach_pinned(path)?;
    }
    std::fs::rename(&staging, path).map_err(|source| DataplaneError::Link { path: path.to_path_buf(), source })?;
    // Closing our descriptor leaves the link attached: the pin holds it now.
    drop(pinned);
    Ok(())
}

/// Swaps the program of the link pinned at `path` for `program`, in one step (`BPF_LINK_UPDATE`):
/// no moment runs both or neither, which a new link attached beside the old one cannot promise
/// (both would count one connection's load twice). False, and nothing changed, when no link is
/// pinned there or it is not attached to the cgroup `cgroup_id`.
pub fn update_pinned(path: &Path, program: BorrowedFd<'_>, cgroup_id: u64) -> Result<bool, DataplaneError> {
    /// The `link_update` member of `union bpf_attr`.
    #[repr(C)]
    struct UpdateAttr {
        link_fd: u32,
        new_prog_fd: u32,
        flags: u32,
        old_prog_fd: u32,
    }
    if !path.exists() || !cgroup_of(path).is_ok_and(|(id, cgroup)| id != 0 && cgroup == cgroup_id) {
        return Ok(false);
    }
    let link_error = |source: io::Error| DataplaneError::Link { path: path.to_path_buf(), source };
    let link = obj_get(path).map_err(link_error)?;
    let attr = UpdateAttr {
        link_fd: link.as_raw_fd() as u32,
        new_prog_fd: program.as_raw_fd() as u32,
        flags: 0,
        old_prog_fd: 0,
    };
    // SAFETY: `attr` is a valid `link_update` attribute; both descriptors outlive the call.
    let ret =
        unsafe { libc::syscall(libc::SYS_bpf, BPF_LINK_UPDATE, &attr as *const UpdateAttr, size_of::<UpdateAttr>()) };
    if ret < 0 {
        return Err(link_error(io::Error::last_os_error()));
    }
    Ok(true)
}

/// Detaches the link pinned at `path` even if other processes hold it, then removes the pin.
pub fn detach_pinned(path: &Path) -> Result<(), DataplaneError> {
    let link_error = |source: io::Error| DataplaneError::Link { path: path.to_path_buf(), source };
    let fd = obj_get(path).map_err(link_error)?;
    match link_detach(&fd) {
        Ok(()) => {}
        // A tracing link has no detach of its own: it goes with its last reference, the pin
        // (the agent keeps no descriptor of a pinned link).
        Err(error) if error.raw_os_error() == Some(libc::EOPNOTSUPP) => {}
        Err(error) => return Err(link_error(error)),
    }
    std::fs::remove_file(path).map_err(link_error)
}

/// The temporary name a new link is pinned under before it replaces the old one (bpffs rejects
/// dots in names).
pub fn staging_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push("_next");
    path.with_file_name(name)
}

/// The program a pinned cgroup link runs and the id of the cgroup it is attached to (0 once
/// detached, e.g. its cgroup was removed).
pub fn cgroup_of(path: &Path) -> io::Result<(u32, u64)> {
    /// The head of `struct bpf_link_info` and its `cgroup` member.
    #[repr(C)]
    #[derive(Default)]
    struct LinkInfo {
        kind: u32,
        id: u32,
        prog_id: u32,
        _pad: u32,
        cgroup_id: u64,
        attach_type: u32,
        _pad2: u32,
    }
    /// The `info` member of `union bpf_attr`.
    #[repr(C)]
    struct InfoAttr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    let fd = obj_get(path)?;
    let mut info = LinkInfo::default();
    let attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: size_of::<LinkInfo>() as u32,
        info: &mut info as *mut LinkInfo as u64,
    };
    // SAFETY: `attr` is a valid `info` attribute; the kernel writes at most `info_len` bytes
    // into `info`, which outlives the call.
    let ret = unsafe {
        libc::syscall(libc::SYS_bpf, BPF_OBJ_GET_INFO_BY_FD, &attr as *const InfoAttr, size_of::<InfoAttr>())
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    if info.kind != BPF_LINK_TYPE_CGROUP {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("link type {} is not a cgroup link", info.kind),
        ));
    }
    Ok((info.prog_id, info.cgroup_id))
}

/// `BPF_OBJ_GET`: a descriptor for the object pinned at `path`.
fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    /// The `obj_get` member of `union bpf_attr`.
    #[repr(C)]
    struct ObjGetAttr {
        pathname: u64,
        bpf_fd: u32,
        file_flags: u32,
    }
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    let attr = ObjGetAttr { pathname: c_path.as_ptr() as u64, bpf_fd: 0, file_flags: 0 };
    // SAFETY: `attr` is a valid `obj_get` attribute whose path outlives the call.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, BPF_OBJ_GET, &attr as *const ObjGetAttr, size_of::<ObjGetAttr>()) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `BPF_LINK_DETACH`: the program stops running now, whoever else holds the link.
fn link_detach(link: &OwnedFd) -> io::Result<()> {
    let attr: u32 = link.as_raw_fd() as u32;
    // SAFETY: `attr` is the `link_detach` member of `union bpf_attr` (one u32); the kernel reads
    // that many bytes and treats the rest as zero.
    let ret = unsafe { libc::syscall(libc::SYS_bpf, BPF_LINK_DETACH, &attr as *const u32, size_of::<u32>()) };
    if ret < 0 {
        let error = io::Error::last_os_error();
        // ENOLINK: already detached, e.g. its cgroup was removed.
        if error.raw_os_error() != Some(libc::ENOLINK) {
            return Err(error);
        }
    }
    Ok(())
}

/// `BPF_PROG_QUERY` from `enum bpf_cmd`.
const BPF_PROG_QUERY: libc::c_long = 16;
/// The cgroup hooks the agent attaches to, from `enum bpf_attach_type`: `SOCK_OPS`,
/// `INET4_CONNECT`, `INET6_CONNECT`, `UDP4_SENDMSG`, `UDP6_SENDMSG`, `UDP4_RECVMSG`,
/// `UDP6_RECVMSG`, `INET4_GETPEERNAME`, `INET6_GETPEERNAME`.
const AGENT_HOOKS: [u32; 9] = [3, 10, 11, 14, 15, 19, 20, 29, 30];

/// The ids of the programs attached directly to `cgroup` at the agent's hooks (`BPF_PROG_QUERY`),
/// pinned or not: what is still running there.
pub fn attached_to(cgroup: &Path) -> io::Result<Vec<u32>> {
    /// The head of the `query` member of `union bpf_attr`.
    #[repr(C)]
    struct QueryAttr {
        target_fd: u32,
        attach_type: u32,
        query_flags: u32,
        attach_flags: u32,
        prog_ids: u64,
        prog_cnt: u32,
        _pad: u32,
    }
    let dir = std::fs::File::open(cgroup)?;
    let mut found = Vec::new();
    for attach_type in AGENT_HOOKS {
        let mut ids = [0u32; 64];
        let mut attr = QueryAttr {
            target_fd: dir.as_raw_fd() as u32,
            attach_type,
            query_flags: 0,
            attach_flags: 0,
            prog_ids: ids.as_mut_ptr() as u64,
            prog_cnt: ids.len() as u32,
            _pad: 0,
        };
        // SAFETY: `attr` is a valid `query` attribute; the kernel writes at most `prog_cnt` ids into
        // `ids`, which outlives the call, and updates `prog_cnt`.
        let ret = unsafe {
            libc::syscall(libc::SYS_bpf, BPF_PROG_QUERY, &mut attr as *mut QueryAttr, size_of::<QueryAttr>())
        };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        found.extend_from_slice(&ids[..(attr.prog_cnt as usize).min(ids.len())]);
    }
    Ok(found)
}
