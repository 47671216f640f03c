//! The kernel programs, embedded: `build.rs` builds them from `topology-ebpf` with the nightly
//! toolchain.

/// The kernel programs, built by `build.rs` from `topology-ebpf`: index loads in program order.
pub static PROGRAMS: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/topology"));
/// The same programs with every index load a BPF load-acquire (ISA v4, kernel 6.15+).
pub static PROGRAMS_ACQUIRE: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/topology-acquire"));
