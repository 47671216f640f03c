//! The kernel's knobs: what the programs are loaded with, each declared once — its flag, help and
//! default on the agent's command line (`topology-agent run`, which flattens [`LoadOptions`]
//! into its own), and what it means to the loader and to the fingerprint a restart compares
//! (`reuse.rs`).

use clap::{ArgAction, Args, ValueEnum};
use serde::{Deserialize, Serialize};
use topology_policy::plan::MeasuredPorts;

use super::maps::Capacities;

/// What the programs are loaded with. The flags' defaults are the agent's; [`Default`] is a
/// library user's (no outlier ejection, no accounting).
#[derive(Args, Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// Map capacities: the defaults, with the agent's `--capacity MAP=ENTRIES` overrides.
    #[arg(skip = Capacities::default())]
    pub capacities: Capacities,
    /// Kernel-side diagnostics (aya-log); `off` costs nothing on the hot path.
    #[arg(long, value_enum, default_value_t = KernelLogLevel::Off)]
    pub kernel_log: KernelLogLevel,
    /// How the programs read the service index: `auto` picks what this CPU and kernel need.
    #[arg(long = "index-ordering", value_enum, default_value_t = IndexOrdering::Auto)]
    pub index: IndexOrdering,
    /// The load signal: per backend, the TCP connections the hooks rewrite for ports under
    /// feedback (`on`: counted by the connect hook and where the socket ends; no other socket
    /// pays anything), or for every port (`all`). `off`: nothing is measured, feedback keeps the
    /// static plan.
    ///
    /// Its ends are counted where the kernel destroys the socket (`tp_btf/tcp_destroy_sock`, once
    /// per TCP socket of the node); refused by the kernel, no backend is measured.
    #[arg(long, value_enum, default_value_t = LoadSignal::On)]
    pub load_signal: LoadSignal,
    /// Avoid a backend whose handshakes from this node failed 5 times in a row, for 10 s doubling
    /// with each ejection up to 5 min (its programs run only where a handshake fails): `on` or
    /// `off`.
    ///
    /// The programs are tracepoints where a handshake fails; refused by the kernel, no backend is
    /// ejected.
    #[arg(long, value_name = "on|off", value_parser = on_off, default_value = "on", action = ArgAction::Set)]
    pub outlier_ejection: bool,
    /// Count the bytes of the connections the hooks rewrite, per Service port and zone pair
    /// (`topology_agent_bytes_total`). `tcp`: TCP connections, read from each socket when it ends
    /// and every 10 s from the open ones; nothing is added to a connect or a send. `all`: UDP
    /// datagrams too, counted one by one, which adds a program run to every socket send and
    /// receive of the node. `off`: nothing.
    ///
    /// TCP is counted at `tp_btf/tcp_destroy_sock` (once per TCP socket of the node, at its end),
    /// UDP at `tp_btf/sock_send_length` and `sock_recv_length`; refused by the kernel, no bytes
    /// are counted.
    #[arg(long, value_enum, default_value_t = ByteAccounting::Tcp)]
    pub byte_accounting: ByteAccounting,
}

impl Default for LoadOptions {
    /// A library user's: default capacities, no kernel log, the index ordering this machine
    /// needs, the load signal on, no outlier ejection or accounting.
    fn default() -> Self {
        Self {
            capacities: Capacities::default(),
            kernel_log: KernelLogLevel::Off,
            index: IndexOrdering::Auto,
            load_signal: LoadSignal::On,
            outlier_ejection: false,
            byte_accounting: ByteAccounting::Off,
        }
    }
}

/// `--outlier-ejection`: `on` or `off`.
fn on_off(value: &str) -> Result<bool, String> {
    match value {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("{other:?} is neither on nor off")),
    }
}

/// Which ports the load signal measures, if any.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LoadSignal {
    /// Ports under feedback.
    #[default]
    On,
    /// Every port.
    All,
    /// None: the counting programs are not loaded.
    Off,
}

impl LoadSignal {
    /// Whether the counting programs are loaded.
    pub fn measures(self) -> bool {
        self != Self::Off
    }
}

impl From<LoadSignal> for MeasuredPorts {
    fn from(signal: LoadSignal) -> Self {
        match signal {
            LoadSignal::Off => Self::Off,
            LoadSignal::On => Self::Feedback,
            LoadSignal::All => Self::All,
        }
    }
}

/// How the programs read the service index (see `topology_common::index`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IndexOrdering {
    /// x86-64: plain loads, on any kernel. Elsewhere: load-acquire where the kernel has it, else
    /// the index is off and the programs use the hash maps.
    #[default]
    Auto,
    /// Plain loads in program order (sound on TSO CPUs only).
    Plain,
    /// BPF load-acquire (needs a kernel with it).
    Acquire,
    /// No index: every lookup asks the hash maps.
    Off,
}

/// Level of the kernel programs' own diagnostics. Anything but `off` costs a ring-buffer write per
/// logged event; `off` is removed by the verifier, so the hot path pays nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelLogLevel {
    /// No kernel diagnostics.
    #[default]
    Off,
    /// Internal failures only.
    Error,
    /// Failures and degraded operation (a slot of another set drawn).
    Warn,
    /// Informational events.
    Info,
    /// Every rewrite.
    Debug,
    /// Everything.
    Trace,
}

/// What cross-zone accounting counts (`--byte-accounting`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, ValueEnum)]
pub enum ByteAccounting {
    /// Nothing: no program loaded.
    #[default]
    Off,
    /// The TCP connections the hooks rewrite: read from each socket when it ends and by the
    /// sweeps, nothing on any connect or send.
    Tcp,
    /// Those, and every UDP datagram through a Service, counted where the kernel reports each
    /// send and receive of a socket of the node.
    All,
}

impl ByteAccounting {
    /// Whether TCP connections are counted.
    pub fn tcp(self) -> bool {
        self != Self::Off
    }

    /// Whether UDP datagrams are counted.
    pub fn udp(self) -> bool {
        self == Self::All
    }
}
