//! The end of a TCP socket (`tp_btf/tcp_destroy_sock`, node-wide: once per TCP socket, after its
//! last byte is acknowledged or the connection reset; never on the connect path). A connection
//! the connect hooks rewrote counts what it moved ([`crate::bytes`]) and, measured, its end
//! ([`crate::load`]); every other socket leaves after one read of its cookie.

use core::ffi::c_void;

use aya_ebpf::{helpers::generated::bpf_skc_to_tcp_sock, macros::btf_tracepoint, programs::BtfTracePointContext};

use crate::{bytes, load};

#[btf_tracepoint(function = "tcp_destroy_sock")]
pub fn tcp_closed(ctx: BtfTracePointContext) -> i32 {
    // Typed as the TCP socket it is, so its fields are read with plain loads.
    // SAFETY: the helper takes the traced socket as the kernel passed it; NULL if not TCP.
    let sk = unsafe { bpf_skc_to_tcp_sock(ctx.arg(0)) }.cast::<c_void>();
    if sk.is_null() {
        return 0;
    }
    let Some(cookie) = bytes::cookie(sk) else {
        return 0;
    };
    if load::on() {
        load::ended(sk, cookie);
    }
    if bytes::on() {
        bytes::closed(sk, cookie);
    }
    0
}
