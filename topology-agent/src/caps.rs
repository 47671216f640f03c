//! The capabilities the agent needs, checked before it touches the kernel, so that a missing one
//! is an error naming it and saying why, not an `EPERM` from somewhere deep in a load.

use std::fmt;

/// A Linux capability the agent may need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capability {
    /// `CAP_NET_BIND_SERVICE` (10).
    NetBindService,
    /// `CAP_NET_ADMIN` (12).
    NetAdmin,
    /// `CAP_SYS_ADMIN` (21).
    SysAdmin,
    /// `CAP_PERFMON` (38).
    Perfmon,
    /// `CAP_BPF` (39).
    Bpf,
}

impl Capability {
    fn bit(self) -> u32 {
        match self {
            Self::NetBindService => 10,
            Self::NetAdmin => 12,
            Self::SysAdmin => 21,
            Self::Perfmon => 38,
            Self::Bpf => 39,
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NetBindService => "CAP_NET_BIND_SERVICE",
            Self::NetAdmin => "CAP_NET_ADMIN",
            Self::SysAdmin => "CAP_SYS_ADMIN",
            Self::Perfmon => "CAP_PERFMON",
            Self::Bpf => "CAP_BPF",
        })
    }
}

/// A capability the agent needs and does not have.
#[derive(Debug, thiserror::Error)]
pub enum CapabilityError {
    /// The effective set lacks it.
    #[error("missing capability {capability}: {why}")]
    Missing {
        /// The capability.
        capability: Capability,
        /// What it is needed for.
        why: &'static str,
    },
    /// `/proc/self/status` could not be read or has no `CapEff` line.
    #[error("reading this process's capabilities from /proc/self/status: {0}")]
    Unreadable(String),
}

/// The effective capability set of this process (the `CapEff` bits).
pub fn effective() -> Result<u64, CapabilityError> {
    let status =
        std::fs::read_to_string("/proc/self/status").map_err(|error| CapabilityError::Unreadable(error.to_string()))?;
    effective_in(&status).ok_or_else(|| CapabilityError::Unreadable("no CapEff line".into()))
}

/// The `CapEff` bits of a `/proc/<pid>/status` text.
pub fn effective_in(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|line| line.strip_prefix("CapEff:"))?.trim();
    u64::from_str_radix(hex, 16).ok()
}

/// Whether `effective` holds `capability`.
pub fn holds(effective: u64, capability: Capability) -> bool {
    effective & (1 << capability.bit()) != 0
}

/// Checks `effective` holds every `(capability, why)` of `needed`; the first missing one is the
/// error.
pub fn check(effective: u64, needed: &[(Capability, &'static str)]) -> Result<(), CapabilityError> {
    match needed.iter().find(|(capability, _)| effective & (1 << capability.bit()) == 0) {
        Some(&(capability, why)) => Err(CapabilityError::Missing { capability, why }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_effective_set_is_read_and_a_missing_capability_is_named() {
        let status = "Name:\ttopology-agent\nCapInh:\t0000000000000000\nCapEff:\t000000c000001000\n";
        let bits = effective_in(status).unwrap();
        let needed = [(Capability::Bpf, "load programs"), (Capability::NetAdmin, "attach them")];
        assert!(check(bits, &needed).is_ok());
        let error = check(bits, &[(Capability::SysAdmin, "enter network namespaces")]).unwrap_err();
        assert_eq!(error.to_string(), "missing capability CAP_SYS_ADMIN: enter network namespaces");
        assert_eq!(effective_in("Name: x\n"), None);
    }
}
