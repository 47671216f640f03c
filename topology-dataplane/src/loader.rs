//! Loads the embedded programs, opens (or creates and pins) the maps, and attaches every program
//! to the cgroup through a pinned link that outlives the agent.

use std::{
    fs::File,
    os::{fd::AsFd as _, unix::fs::MetadataExt as _},
    path::Path,
};

use aya::{
    Ebpf, EbpfLoader,
    programs::{BtfTracePoint, CgroupAttachMode, CgroupSockAddr, links::FdLink},
};
use topology_common::{
    BYTES_ACKED_OFFSET_GLOBAL, BYTES_RECEIVED_OFFSET_GLOBAL, CB_FLAGS_OFFSET_GLOBAL, INDEX_ENABLED_GLOBAL,
    INDEX_V4_MASK_GLOBAL, INDEX_V6_MASK_GLOBAL, LOAD_SIGNAL_GLOBAL, LOG_LEVEL_GLOBAL, OWN_TTL_OFFSETS_GLOBAL,
    RETRANSMIT_ERR_GLOBAL, SK_COOKIE_OFFSET_GLOBAL, SK_PROTOCOL_OFFSET_GLOBAL, SKC_DADDR_OFFSET_GLOBAL,
    SKC_DPORT_OFFSET_GLOBAL, SKC_STATE_OFFSET_GLOBAL, SKC_V6_DADDR_OFFSET_GLOBAL, SRTT_US_OFFSET_GLOBAL,
    TCP_BYTES_GLOBAL, TCP_CONNECTIONS_MASK_GLOBAL, TOTAL_RETRANS_OFFSET_GLOBAL, UDP_BYTES_GLOBAL, map_names,
    program_names,
};

use super::{
    error::DataplaneError,
    index::positions_for,
    layout::PinLayout,
    links,
    objects::{PROGRAMS, PROGRAMS_ACQUIRE},
    options::{IndexOrdering, KernelLogLevel, LoadOptions},
    pins,
};
use crate::{btf_offsets, mounts};

/// One way to load the programs: which object, and whether they probe the index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flavour {
    /// Name of the embedded object.
    pub object: &'static str,
    /// Whether the programs probe the service index.
    pub index: bool,
}

const PLAIN: Flavour = Flavour { object: "topology", index: true };
const ACQUIRE: Flavour = Flavour { object: "topology-acquire", index: true };
const NO_INDEX: Flavour = Flavour { object: "topology", index: false };
/// Every flavour, in a fixed order (a restart's marker names one by its position).
pub(super) const FLAVOURS: [Flavour; 3] = [PLAIN, ACQUIRE, NO_INDEX];

impl IndexOrdering {
    /// The flavours to try, in order, on this machine.
    fn candidates(self) -> &'static [Flavour] {
        match self {
            Self::Auto if cfg!(target_arch = "x86_64") => &[PLAIN],
            Self::Auto => &[ACQUIRE, NO_INDEX],
            Self::Plain => &[PLAIN],
            Self::Acquire => &[ACQUIRE],
            Self::Off => &[NO_INDEX],
        }
    }
}

impl Flavour {
    fn bytes(self) -> &'static [u8] {
        if self.object == ACQUIRE.object { PROGRAMS_ACQUIRE } else { PROGRAMS }
    }
}

impl KernelLogLevel {
    /// The value of aya-log's level global: 0 disables every statement.
    fn global(self) -> u8 {
        match self {
            Self::Off => 0,
            Self::Error => 1,
            Self::Warn => 2,
            Self::Info => 3,
            Self::Debug => 4,
            Self::Trace => 5,
        }
    }
}

/// The loaded object and, when kernel logging is on, its log reader.
pub struct Loaded {
    /// The object, its programs loaded (verified); the caller takes its persistent maps out.
    pub ebpf: Ebpf,
    /// Reader of the kernel log ring buffer; must live as long as the programs may log.
    pub logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    /// Which object was loaded, and whether its programs probe the index.
    pub flavour: Flavour,
}

/// Loads the object with its maps opened from, or created and pinned under, `layout`, and its
/// programs verified: the first flavour of `options.index` the kernel accepts.
pub fn load(layout: &PinLayout, options: &LoadOptions) -> Result<Loaded, DataplaneError> {
    options.capacities.validate()?;
    pins::prepare_dirs(layout)?;
    pins::prepare(layout, &options.capacities)?;
    let mut last = None;
    for &flavour in options.index.candidates() {
        match load_flavour(layout, options, flavour) {
            Ok(mut ebpf) => {
                let logger = match options.kernel_log {
                    KernelLogLevel::Off => None,
                    _ => Some(aya_log::EbpfLogger::init(&mut ebpf)?),
                };
                return Ok(Loaded { ebpf, logger, flavour });
            }
            Err(error) => {
                tracing::warn!(object = flavour.object, %error, "the kernel refused these programs");
                last = Some(error);
            }
        }
    }
    Err(last.expect("every ordering has a flavour"))
}

/// Loads one flavour: maps opened or created, globals set, programs verified.
fn load_flavour(layout: &PinLayout, options: &LoadOptions, flavour: Flavour) -> Result<Ebpf, DataplaneError> {
    let mut loader = EbpfLoader::new();
    for name in map_names::PINNED {
        loader.map_pin_path(name, layout.map(name));
    }
    for (name, configured) in options.capacities.by_map() {
        loader.map_max_entries(name, configured);
    }
    let level = options.kernel_log.global();
    loader.override_global(LOG_LEVEL_GLOBAL, &level, true);
    let index_v4_mask = positions_for(options.capacities.services_v4) - 1;
    loader.override_global(INDEX_V4_MASK_GLOBAL, &index_v4_mask, true);
    let index_v6_mask = positions_for(options.capacities.services_v6) - 1;
    loader.override_global(INDEX_V6_MASK_GLOBAL, &index_v6_mask, true);
    let tcp_connections_mask = options.capacities.tcp_connections - 1;
    loader.override_global(TCP_CONNECTIONS_MASK_GLOBAL, &tcp_connections_mask, true);
    // The outlier programs read a socket's state where this kernel's BTF says it is, or do not run.
    let outlier_offset = match options.outlier_ejection.then(outlier_offsets) {
        Some(Ok(offset)) => Some(offset),
        Some(Err(error)) => {
            tracing::warn!(%error, "no socket state in the kernel's BTF; no backend is ejected");
            None
        }
        None => None,
    };
    if let Some((state, own_ttl, retransmit_err)) = &outlier_offset {
        loader.override_global(SKC_STATE_OFFSET_GLOBAL, state, true);
        loader.override_global(OWN_TTL_OFFSETS_GLOBAL, own_ttl, true);
        loader.override_global(RETRANSMIT_ERR_GLOBAL, retransmit_err, true);
    }
    // So do accounting and the load signal at a connection's end, at the offsets of a TCP
    // socket's counters.
    let wanted = options.byte_accounting.tcp() || options.load_signal.measures();
    let socket_offsets = match wanted.then(tcp_socket_offsets) {
        Some(Ok(offsets)) => Some(offsets),
        Some(Err(error)) => {
            tracing::warn!(%error, "no TCP socket counters in the kernel's BTF; no bytes are counted, no backend \
                            measured");
            None
        }
        None => None,
    };
    if let Some(offsets) = &socket_offsets {
        offsets.set(&mut loader);
    }
    let tcp_bytes = u32::from(socket_offsets.is_some() && options.byte_accounting.tcp());
    loader.override_global(TCP_BYTES_GLOBAL, &tcp_bytes, true);
    let load_signal = u32::from(socket_offsets.is_some() && options.load_signal.measures());
    loader.override_global(LOAD_SIGNAL_GLOBAL, &load_signal, true);
    let udp_bytes = u32::from(socket_offsets.is_some() && options.byte_accounting.udp());
    loader.override_global(UDP_BYTES_GLOBAL, &udp_bytes, true);
    let enabled = u32::from(flavour.index);
    loader.override_global(INDEX_ENABLED_GLOBAL, &enabled, true);
    let mut ebpf = loader.load(flavour.bytes())?;
    for name in program_names::SOCK_ADDR {
        program::<CgroupSockAddr>(&mut ebpf, name)?.load().map_err(DataplaneError::program(name))?;
    }
    // Outlier ejection is an addition too: without BTF or on a kernel that refuses the tracing
    // programs (before 5.15: no `inet_sk_error_report`; before 5.12: no socket cookie of a traced
    // socket), no backend is ejected.
    if outlier_offset.is_some()
        && let Err(error) = load_tracing(&mut ebpf, &program_names::OUTLIER)
    {
        tracing::warn!(%error, "the kernel refused the outlier ejection programs; no backend is ejected");
    }
    if socket_offsets.is_some()
        && let Err(error) = load_tracing(&mut ebpf, &program_names::CLOSED)
    {
        tracing::warn!(%error, "the kernel refused the program at a connection's end; no bytes are counted, no \
                        backend measured");
    }
    // UDP's tracepoints came with Linux 6.3.
    if udp_bytes == 1
        && let Err(error) = load_tracing(&mut ebpf, &program_names::UDP_ACCOUNTING)
    {
        tracing::warn!(%error, "the kernel refused the UDP accounting programs; no datagram is counted");
    }
    Ok(ebpf)
}

/// Loads tracing programs, `(name, tracepoint)` (all, or none: one that fails unloads the others).
fn load_tracing(ebpf: &mut Ebpf, programs: &[(&'static str, &'static str)]) -> Result<(), DataplaneError> {
    let btf = aya::Btf::from_sys_fs()?;
    let mut loaded = Ok(());
    for &(name, tracepoint) in programs {
        loaded = program::<BtfTracePoint>(ebpf, name).and_then(|program| {
            program.load(tracepoint, &btf).map_err(|source| DataplaneError::Tracing {
                program: name,
                tracepoint,
                source,
            })
        });
        if loaded.is_err() {
            break;
        }
    }
    if loaded.is_err() {
        for &(name, _) in programs {
            if let Ok(program) = program::<BtfTracePoint>(ebpf, name) {
                let _ = program.unload();
            }
        }
    }
    loaded
}

/// The byte offsets the outlier ejection programs read a socket at in this kernel, from its BTF:
/// its state, and its own TTL and IPv6 hop limit; the programs are not loaded without them.
fn outlier_offsets() -> Result<(u32, [u32; 4], u32), btf_offsets::BtfOffsetError> {
    let path = Path::new(btf_offsets::VMLINUX);
    let common = btf_offsets::member_offset_in(path, "sock", "__sk_common")?;
    let state = common + btf_offsets::member_offset_in(path, "sock_common", "skc_state")?;
    // `struct inet_sock` begins with its `struct sock`: offsets in it are offsets from the socket.
    // The hop limit is a 9-bit field before Linux 6.5: its word and the shift that reads it.
    let (hop_word, hop_shift) = btf_offsets::signed16_in(path, "ipv6_pinfo", "hop_limit")?;
    let own_ttl = [
        btf_offsets::member_offset_in(path, "inet_sock", "uc_ttl")?,
        btf_offsets::member_offset_in(path, "inet_sock", "pinet6")?,
        hop_word,
        hop_shift,
    ];
    // From Linux 6.17 `tcp_retransmit_skb` reports failed retransmissions too, with their error
    // as a third argument; before, only those that left the host. The program reads it where
    // there is one, so that on every kernel a SYN this host failed to send (its own netfilter, a
    // full qdisc) is no evidence against the backend.
    let retransmit_err = btf_offsets::tracepoint_args_in(path, "tcp_retransmit_skb")?.is_some_and(|args| args >= 3);
    Ok((state, own_ttl, u32::from(retransmit_err)))
}

/// Where the programs at a connection's end (accounting, the load signal) and the sweep read a
/// TCP socket's counters, cookie and peer in this kernel.
#[derive(Clone, Copy, Debug)]
pub struct SocketOffsets {
    acked: u32,
    received: u32,
    cookie: u32,
    protocol: u32,
    /// The peer's IPv4 address, IPv6 address and port.
    peer: [u32; 3],
    /// `srtt_us`, `total_retrans`, `bpf_sock_ops_cb_flags`.
    load: [u32; 3],
}

impl SocketOffsets {
    /// Sets them as the programs' globals.
    pub fn set<'a>(&'a self, loader: &mut EbpfLoader<'a>) {
        loader.override_global(BYTES_ACKED_OFFSET_GLOBAL, &self.acked, true);
        loader.override_global(BYTES_RECEIVED_OFFSET_GLOBAL, &self.received, true);
        loader.override_global(SK_COOKIE_OFFSET_GLOBAL, &self.cookie, true);
        loader.override_global(SK_PROTOCOL_OFFSET_GLOBAL, &self.protocol, true);
        loader.override_global(SKC_DADDR_OFFSET_GLOBAL, &self.peer[0], true);
        loader.override_global(SKC_V6_DADDR_OFFSET_GLOBAL, &self.peer[1], true);
        loader.override_global(SKC_DPORT_OFFSET_GLOBAL, &self.peer[2], true);
        loader.override_global(SRTT_US_OFFSET_GLOBAL, &self.load[0], true);
        loader.override_global(TOTAL_RETRANS_OFFSET_GLOBAL, &self.load[1], true);
        loader.override_global(CB_FLAGS_OFFSET_GLOBAL, &self.load[2], true);
    }
}

/// The byte offsets of `bytes_acked`, `bytes_received`, `srtt_us`, `total_retrans` and
/// `bpf_sock_ops_cb_flags` in this kernel's `struct tcp_sock` and of the cookie, protocol and peer
/// in its `struct sock` (`__sk_common.skc_cookie`, `sk_protocol`, `__sk_common.skc_daddr`,
/// `skc_v6_daddr`, `skc_dport`), from its BTF; the programs at a connection's end are not loaded
/// without them.
pub fn tcp_socket_offsets() -> Result<SocketOffsets, btf_offsets::BtfOffsetError> {
    let path = Path::new(btf_offsets::VMLINUX);
    let common = btf_offsets::member_offset_in(path, "sock", "__sk_common")?;
    let in_common = |member| btf_offsets::member_offset_in(path, "sock_common", member).map(|at| common + at);
    let in_tcp = |member| btf_offsets::member_offset_in(path, "tcp_sock", member);
    Ok(SocketOffsets {
        acked: btf_offsets::member_offset_in(path, "tcp_sock", "bytes_acked")?,
        received: btf_offsets::member_offset_in(path, "tcp_sock", "bytes_received")?,
        cookie: in_common("skc_cookie")?,
        protocol: btf_offsets::member_offset_in(path, "sock", "sk_protocol")?,
        peer: [in_common("skc_daddr")?, in_common("skc_v6_daddr")?, in_common("skc_dport")?],
        load: [in_tcp("srtt_us")?, in_tcp("total_retrans")?, in_tcp("bpf_sock_ops_cb_flags")?],
    })
}

/// A loaded object's program by name, as its type.
fn program<'a, P>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut P, DataplaneError>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(DataplaneError::Program { program: name, source: aya::programs::ProgramError::NotLoaded })?
        .try_into()
        .map_err(DataplaneError::program(name))
}

/// Attaches every (loaded) program to `cgroup`. A link a previous agent pinned here gets the new
/// program in place (`BPF_LINK_UPDATE`); one pinned for another cgroup is replaced. What agents
/// before these attached and these do not (the load signal's `sock_ops` program, the accounting
/// program of another name) is detached.
pub fn attach_all(ebpf: &mut Ebpf, layout: &PinLayout, cgroup: &Path) -> Result<(), DataplaneError> {
    let cgroup_error = |source| DataplaneError::Cgroup { path: cgroup.to_path_buf(), source };
    if !mounts::is_cgroup2(cgroup).map_err(cgroup_error)? {
        return Err(DataplaneError::NotCgroup2 { path: cgroup.to_path_buf() });
    }
    let cgroup_fd = File::open(cgroup).map_err(cgroup_error)?;
    let cgroup_id = std::fs::metadata(cgroup).map_err(cgroup_error)?.ino();
    let link_error = |name: &'static str| {
        move |error| DataplaneError::Link { path: layout.link(name), source: std::io::Error::other(error) }
    };
    // Cgroup bpf_links always coexist with other programs (BPF_F_ALLOW_MULTI semantics) and the
    // kernel rejects any attach flag on them, so the mode must be the flag-less one.
    for name in program_names::ALL {
        let path = layout.link(name);
        let program = program::<CgroupSockAddr>(ebpf, name)?;
        if links::update_pinned(&path, program.fd().map_err(DataplaneError::program(name))?.as_fd(), cgroup_id)? {
            continue;
        }
        let id = program.attach(&cgroup_fd, CgroupAttachMode::Single).map_err(DataplaneError::program(name))?;
        let link: FdLink =
            program.take_link(id).map_err(DataplaneError::program(name))?.try_into().map_err(link_error(name))?;
        links::replace_pinned(link, &path)?;
    }
    attach_tracing(ebpf, layout, &program_names::OUTLIER)?;
    attach_tracing(ebpf, layout, &program_names::CLOSED)?;
    attach_tracing(ebpf, layout, &program_names::UDP_ACCOUNTING)
}

/// Attaches tracing programs (outlier ejection, accounting), if they were loaded, and pins their
/// links (replacing those a previous agent left; a tracing link cannot take a new program in
/// place, so for a moment both run: a failure may count twice, and so may the bytes of a
/// connection destroyed in that moment). Not loaded: links left by a previous agent are detached.
fn attach_tracing(
    ebpf: &mut Ebpf,
    layout: &PinLayout,
    programs: &[(&'static str, &'static str)],
) -> Result<(), DataplaneError> {
    for &(name, _) in programs {
        let path = layout.link(name);
        let program = program::<BtfTracePoint>(ebpf, name)?;
        if program.fd().is_err() {
            if path.exists() {
                links::detach_pinned(&path)?;
            }
            continue;
        }
        let id = program.attach().map_err(DataplaneError::program(name))?;
        let link: FdLink = program.take_link(id).map_err(DataplaneError::program(name))?.into();
        links::replace_pinned(link, &path)?;
    }
    Ok(())
}
