//! `NETLINK_SOCK_DIAG` in one network namespace: dump the connected sockets of a protocol with
//! their socket storage of one BPF map, and destroy one (`SOCK_DESTROY`, which aborts it with
//! `ECONNABORTED`). The kernel structures (`linux/inet_diag.h`, `linux/sock_diag.h`) are
//! written out here, as for `bpf_attr`: no crate covers socket storage or `SOCK_DESTROY`.

use std::{
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
};

/// `SOCK_DIAG_BY_FAMILY` message type.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `SOCK_DESTROY` message type.
const SOCK_DESTROY: u16 = 21;
/// `INET_DIAG_REQ_SK_BPF_STORAGES` request attribute (nested).
const INET_DIAG_REQ_SK_BPF_STORAGES: u16 = 2;
/// `SK_DIAG_BPF_STORAGE_REQ_MAP_FD`, inside it.
const SK_DIAG_BPF_STORAGE_REQ_MAP_FD: u16 = 1;
/// `INET_DIAG_SK_BPF_STORAGES` response attribute (nested).
const INET_DIAG_SK_BPF_STORAGES: u16 = 20;
/// `SK_DIAG_BPF_STORAGE`, inside it (nested).
const SK_DIAG_BPF_STORAGE: u16 = 1;
/// `SK_DIAG_BPF_STORAGE_MAP_VALUE`, inside that.
const SK_DIAG_BPF_STORAGE_MAP_VALUE: u16 = 3;
/// `NLA_F_NESTED`.
const NLA_F_NESTED: u16 = 1 << 15;
/// Attribute type bits (without the nested and byte-order flags).
const NLA_TYPE_MASK: u16 = !(3 << 14);
/// Socket states dumped and destroyed: every state but LISTEN (10), TIME_WAIT (6), CLOSE (7)
/// and NEW_SYN_RECV (12): only sockets with a peer.
const CONNECTED_STATES: u32 = !((1 << 10) | (1 << 6) | (1 << 7) | (1 << 12));

/// `struct inet_diag_sockid`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockId {
    /// Source port, network byte order.
    pub sport: [u8; 2],
    /// Destination port, network byte order.
    pub dport: [u8; 2],
    /// Source address (IPv4 in the first four bytes).
    pub src: [u8; 16],
    /// Destination address (IPv4 in the first four bytes).
    pub dst: [u8; 16],
    /// Bound interface.
    pub interface: u32,
    /// Socket cookie, low word first.
    pub cookie: [u32; 2],
}
const _: () = assert!(size_of::<SockId>() == 48);

impl SockId {
    /// The socket cookie as one number.
    pub fn cookie(&self) -> u64 {
        u64::from(self.cookie[0]) | (u64::from(self.cookie[1]) << 32)
    }
}

/// `struct inet_diag_req_v2`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Request {
    family: u8,
    protocol: u8,
    ext: u8,
    pad: u8,
    states: u32,
    id: SockId,
}
const _: () = assert!(size_of::<Request>() == 56);

/// `struct inet_diag_msg` (the part before the attributes).
const MSG_LEN: usize = 72;
/// Offset of `id` in `struct inet_diag_msg`.
const MSG_ID: usize = 4;

/// One connected socket and its storage in the requested map, if it has any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiagSocket {
    /// `AF_INET` or `AF_INET6`.
    pub family: u8,
    /// Its identity, as `SOCK_DESTROY` needs it.
    pub id: SockId,
    /// The storage value, raw.
    pub storage: Option<Vec<u8>>,
}

/// A `NETLINK_SOCK_DIAG` socket, bound to the network namespace it was made in.
pub struct Channel {
    fd: OwnedFd,
    seq: u32,
}

impl Channel {
    /// A channel in the calling thread's network namespace.
    pub fn open() -> io::Result<Self> {
        // SAFETY: plain socket(2); the result is checked.
        let fd =
            unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, libc::NETLINK_SOCK_DIAG) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let timeout = libc::timeval { tv_sec: 5, tv_usec: 0 };
        // SAFETY: a valid timeval for SO_RCVTIMEO on our own socket.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                std::ptr::from_ref(&timeout).cast(),
                size_of::<libc::timeval>() as u32,
            )
        };
        Ok(Self { fd, seq: 0 })
    }

    /// Every connected socket of `family`/`protocol`, with its storage in the map `map_fd` when
    /// one is given (the kernel reports socket storage for TCP sockets only).
    pub fn dump(&mut self, family: u8, protocol: u8, map_fd: Option<RawFd>) -> io::Result<Vec<DiagSocket>> {
        let request = Request { family, protocol, states: CONNECTED_STATES, ..Request::default() };
        let mut body = pod_bytes(&request).to_vec();
        if let Some(map_fd) = map_fd {
            // A nested attribute holding one map descriptor.
            push_attr(&mut body, INET_DIAG_REQ_SK_BPF_STORAGES | NLA_F_NESTED, &{
                let mut inner = Vec::new();
                push_attr(&mut inner, SK_DIAG_BPF_STORAGE_REQ_MAP_FD, &(map_fd as u32).to_ne_bytes());
                inner
            });
        }
        let seq = self.send(SOCK_DIAG_BY_FAMILY, libc::NLM_F_REQUEST as u16 | libc::NLM_F_DUMP as u16, &body)?;
        let mut sockets = Vec::new();
        self.receive(seq, |payload| {
            if payload.len() >= MSG_LEN {
                let id = read_pod::<SockId>(&payload[MSG_ID..MSG_ID + size_of::<SockId>()]);
                let storage = find_storage(&payload[MSG_LEN..]);
                sockets.push(DiagSocket { family: payload[0], id, storage });
            }
        })?;
        Ok(sockets)
    }

    /// Destroys one socket: the application's next call on it fails with `ECONNABORTED`.
    pub fn destroy(&mut self, family: u8, protocol: u8, id: &SockId) -> io::Result<()> {
        let request = Request { family, protocol, states: CONNECTED_STATES, id: *id, ..Request::default() };
        let seq = self.send(SOCK_DESTROY, libc::NLM_F_REQUEST as u16 | libc::NLM_F_ACK as u16, pod_bytes(&request))?;
        self.receive(seq, |_| {})
    }

    fn send(&mut self, kind: u16, flags: u16, body: &[u8]) -> io::Result<u32> {
        self.seq = self.seq.wrapping_add(1);
        let header = libc::nlmsghdr {
            nlmsg_len: (size_of::<libc::nlmsghdr>() + body.len()) as u32,
            nlmsg_type: kind,
            nlmsg_flags: flags,
            nlmsg_seq: self.seq,
            nlmsg_pid: 0,
        };
        let mut message = pod_bytes(&header).to_vec();
        message.extend_from_slice(body);
        // SAFETY: sending our own initialised buffer on our own socket (to the kernel: no address).
        let sent = unsafe { libc::send(self.fd.as_raw_fd(), message.as_ptr().cast(), message.len(), 0) };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(self.seq)
    }

    /// Reads answers to `seq` until the dump ends or the request is acknowledged, handing each
    /// data payload to `each`.
    fn receive(&mut self, seq: u32, mut each: impl FnMut(&[u8])) -> io::Result<()> {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: receiving into our own buffer of the given length.
            let len = unsafe { libc::recv(self.fd.as_raw_fd(), buffer.as_mut_ptr().cast(), buffer.len(), 0) };
            if len < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut rest = &buffer[..len as usize];
            while rest.len() >= size_of::<libc::nlmsghdr>() {
                let header = read_pod::<libc::nlmsghdr>(&rest[..size_of::<libc::nlmsghdr>()]);
                let total = (header.nlmsg_len as usize).clamp(size_of::<libc::nlmsghdr>(), rest.len());
                let payload = &rest[size_of::<libc::nlmsghdr>()..total];
                rest = &rest[align4(total).min(rest.len())..];
                if header.nlmsg_seq != seq {
                    continue;
                }
                match i32::from(header.nlmsg_type) {
                    libc::NLMSG_DONE => return Ok(()),
                    libc::NLMSG_ERROR => {
                        let code = payload.get(..4).map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                        return if code == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(-code)) };
                    }
                    _ => each(payload),
                }
            }
        }
    }
}

/// The value of the first map's storage in a socket's attributes.
pub(super) fn find_storage(attributes: &[u8]) -> Option<Vec<u8>> {
    let storages = attrs(attributes).find(|(kind, _)| *kind == INET_DIAG_SK_BPF_STORAGES)?.1;
    let storage = attrs(storages).find(|(kind, _)| *kind == SK_DIAG_BPF_STORAGE)?.1;
    attrs(storage).find(|(kind, _)| *kind == SK_DIAG_BPF_STORAGE_MAP_VALUE).map(|(_, value)| value.to_vec())
}

/// The (type, payload) of each netlink attribute in `bytes`; stops at the first malformed one.
pub fn attrs(mut bytes: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if bytes.len() < 4 {
            return None;
        }
        let len = usize::from(u16::from_ne_bytes([bytes[0], bytes[1]]));
        let kind = u16::from_ne_bytes([bytes[2], bytes[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > bytes.len() {
            return None;
        }
        let payload = &bytes[4..len];
        bytes = &bytes[align4(len).min(bytes.len())..];
        Some((kind, payload))
    })
}

fn push_attr(out: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(payload);
    out.resize(align4(out.len()), 0);
}

fn align4(len: usize) -> usize {
    len.div_ceil(4) * 4
}

/// The bytes of a plain C struct.
fn pod_bytes<T: Copy>(value: &T) -> &[u8] {
    // SAFETY: `T` is a `repr(C)` struct of integers here, with no padding that is read
    // uninitialised by the kernel in a way that matters (the requests are zero-initialised).
    unsafe { std::slice::from_raw_parts(std::ptr::from_ref(value).cast::<u8>(), size_of::<T>()) }
}

/// A plain C struct from (at least) `size_of::<T>()` bytes.
fn read_pod<T: Copy>(bytes: &[u8]) -> T {
    assert!(bytes.len() >= size_of::<T>());
    // SAFETY: enough bytes, read unaligned; every bit pattern is valid for these integer structs.
    unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_nest_and_stop_at_garbage() {
        let mut value = Vec::new();
        push_attr(&mut value, SK_DIAG_BPF_STORAGE_MAP_VALUE, &[1, 2, 3, 4, 5]);
        let mut storage = Vec::new();
        push_attr(&mut storage, SK_DIAG_BPF_STORAGE | NLA_F_NESTED, &value);
        let mut outer = Vec::new();
        push_attr(&mut outer, 5, &[9; 3]);
        push_attr(&mut outer, INET_DIAG_SK_BPF_STORAGES | NLA_F_NESTED, &storage);
        assert_eq!(find_storage(&outer), Some(vec![1, 2, 3, 4, 5]));
        assert_eq!(find_storage(&[0xff, 0xff, 1, 0]), None, "a length beyond the buffer ends the walk");
        assert_eq!(attrs(&[2, 0, 0, 0]).count(), 0, "a length below the header ends the walk");
        assert_eq!(find_storage(&[]), None);
    }
}
