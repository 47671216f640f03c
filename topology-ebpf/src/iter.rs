//! The socket iterator behind socket termination (see `topology-agent/src/sockets`): for every
//! UDP socket of the namespace the reader is in, it writes the socket's cookie and its
//! connected-socket translation, if it has one. `sock_diag` reports socket storage for TCP but
//! not for UDP; this is how the agent learns which UDP sockets went through which service.

use core::{ffi::c_void, ptr};

use aya_ebpf::helpers::generated::{bpf_get_socket_cookie, bpf_seq_write, bpf_sk_storage_get};
use topology_common::{IterRecord, SockTranslation};

use crate::maps::SOCK_CONNECTIONS;

/// `struct bpf_iter_meta`: the seq_file being written comes first.
#[repr(C)]
pub struct IterMeta {
    seq: *mut c_void,
    session_id: u64,
    seq_num: u64,
}

impl IterMeta {
    /// The seq_file of the iteration `meta` describes.
    ///
    /// # Safety
    /// `meta` is the non-null meta pointer of an iterator program's context.
    #[inline(always)]
    pub unsafe fn seq(meta: *mut IterMeta) -> *mut c_void {
        // SAFETY: as the caller promises.
        unsafe { (*meta).seq }
    }
}

/// `struct bpf_iter__udp`: each pointer occupies 8 bytes (`__bpf_md_ptr`).
#[repr(C)]
pub struct IterUdp {
    meta: *mut IterMeta,
    udp_sk: *mut c_void,
}

/// One UDP socket: writes `IterRecord` when the socket holds a translation.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/udp")]
pub extern "C" fn udp_translations(ctx: *mut IterUdp) -> i32 {
    // SAFETY: the kernel passes a valid context; `meta` and `udp_sk` are typed pointers the
    // verifier checks (the latter is NULL once, at the end of the walk).
    unsafe {
        let meta = (*ctx).meta;
        let sk = (*ctx).udp_sk;
        if sk.is_null() || meta.is_null() {
            return 0;
        }
        let map = ptr::from_ref(&SOCK_CONNECTIONS).cast_mut().cast::<c_void>();
        let storage = bpf_sk_storage_get(map, sk, ptr::null_mut(), 0).cast::<SockTranslation>();
        if storage.is_null() {
            return 0;
        }
        let mut record = IterRecord { cookie: bpf_get_socket_cookie(sk), translation: *storage };
        bpf_seq_write((*meta).seq.cast(), ptr::from_mut(&mut record).cast(), size_of::<IterRecord>() as u32);
    }
    0
}
