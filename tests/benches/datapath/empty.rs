//! An empty `cgroup/connect4` program (`r0 = 1; exit`), loaded from its two instructions and
//! attached to a cgroup of the bench's own: what the kernel's cgroup hook costs a connect before a
//! program does anything — the floor under the "not a service" row.

use std::{
    ffi::CString,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use topology_tests::sandbox::CgroupGuard;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_DETACH: libc::c_long = 9;
const BPF_PROG_TYPE_CGROUP_SOCK_ADDR: u32 = 18;
const BPF_CGROUP_INET4_CONNECT: u32 = 10;

/// `union bpf_attr` as `BPF_PROG_LOAD` reads it, up to `expected_attach_type` (the kernel takes a
/// shorter attribute and reads the rest as zero).
#[repr(C)]
#[derive(Default)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}
const _: () = assert!(size_of::<ProgLoad>() == 72);

/// `union bpf_attr` as `BPF_PROG_ATTACH` and `BPF_PROG_DETACH` read it.
#[repr(C)]
struct ProgAttach {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
}
const _: () = assert!(size_of::<ProgAttach>() == 16);

fn bpf<T>(command: libc::c_long, attr: &mut T) -> std::io::Result<libc::c_long> {
    // SAFETY: `attr` is a `#[repr(C)]` prefix of `union bpf_attr` for `command`, valid for the
    // size passed; the kernel reads (and for a load, writes nothing back to) it.
    let result = unsafe { libc::syscall(libc::SYS_bpf, command, std::ptr::from_mut(attr), size_of::<T>()) };
    if result < 0 { Err(std::io::Error::last_os_error()) } else { Ok(result) }
}

/// The empty program attached to `cgroup`, detached when dropped (and with the cgroup, which is
/// removed after it).
pub struct EmptyHook {
    program: OwnedFd,
    cgroup_dir: OwnedFd,
    pub cgroup: CgroupGuard,
}

impl EmptyHook {
    /// Loads the empty program and attaches it to a new cgroup `name`.
    pub fn attach(name: &str) -> Self {
        let cgroup = CgroupGuard::new(name);
        // r0 = 1 (allow); exit.
        let insns: [u64; 2] = [0x0000_0001_0000_00b7, 0x0000_0000_0000_0095];
        let license = CString::new("GPL").expect("license");
        let mut load = ProgLoad {
            prog_type: BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            expected_attach_type: BPF_CGROUP_INET4_CONNECT,
            ..ProgLoad::default()
        };
        load.prog_name[..5].copy_from_slice(b"empty");
        let program = bpf(BPF_PROG_LOAD, &mut load).expect("load the empty connect4 program");
        // SAFETY: BPF_PROG_LOAD returned a new descriptor that nothing else owns.
        let program = unsafe { OwnedFd::from_raw_fd(program as i32) };
        let cgroup_dir: OwnedFd = std::fs::File::open(cgroup.path()).expect("open the cgroup").into();
        let mut attach = ProgAttach {
            target_fd: cgroup_dir.as_raw_fd() as u32,
            attach_bpf_fd: program.as_raw_fd() as u32,
            attach_type: BPF_CGROUP_INET4_CONNECT,
            attach_flags: 0,
        };
        bpf(BPF_PROG_ATTACH, &mut attach).expect("attach the empty connect4 program to the bench's cgroup");
        Self { program, cgroup_dir, cgroup }
    }
}

impl Drop for EmptyHook {
    fn drop(&mut self) {
        let mut detach = ProgAttach {
            target_fd: self.cgroup_dir.as_raw_fd() as u32,
            attach_bpf_fd: self.program.as_raw_fd() as u32,
            attach_type: BPF_CGROUP_INET4_CONNECT,
            attach_flags: 0,
        };
        // Removing the cgroup (next) detaches it anyway.
        let _ = bpf(BPF_PROG_DETACH, &mut detach);
    }
}
