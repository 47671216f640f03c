//! What this kernel runs of the programs: the object and index flavour the loader settled on, and
//! which optional tracing programs it accepted. Read from what is attached (the pinned links), so
//! a restart that kept a predecessor's programs says the same as a fresh load.

use topology_common::program_names;

use super::{layout::PinLayout, loader::Flavour};

/// The programs this kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelFeatures {
    /// The embedded object loaded (`topology`, `topology-acquire`).
    pub object: &'static str,
    /// Whether its programs probe the service index.
    pub index: bool,
    /// Outlier ejection's programs (`inet_sk_error_report`, Linux 5.15).
    pub outlier_ejection: bool,
    /// The program at a TCP connection's end: byte accounting and the load signal.
    pub connection_end: bool,
    /// UDP accounting's programs (`udp_*` tracepoints, Linux 6.3).
    pub udp_accounting: bool,
}

impl KernelFeatures {
    /// What is attached under `layout`, loaded as `flavour`.
    pub(crate) fn attached(layout: &PinLayout, flavour: Flavour) -> Self {
        let all = |programs: &[(&str, &str)]| programs.iter().all(|(name, _)| layout.link(name).exists());
        Self {
            object: flavour.object,
            index: flavour.index,
            outlier_ejection: all(&program_names::OUTLIER),
            connection_end: all(&program_names::CLOSED),
            udp_accounting: all(&program_names::UDP_ACCOUNTING),
        }
    }
}

impl std::fmt::Display for KernelFeatures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let on = |yes: bool| if yes { "on" } else { "off" };
        write!(
            f,
            "object={} index={} outlier_ejection={} connection_end={} udp_accounting={}",
            self.object,
            on(self.index),
            on(self.outlier_ejection),
            on(self.connection_end),
            on(self.udp_accounting)
        )
    }
}
