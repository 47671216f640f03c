//! The transport protocol of a Service port, as the API names it and as the kernel numbers it.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};
use topology_common::{IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP};

/// Transport protocol of a service port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    /// The IP protocol number the kernel reports for sockets of this protocol.
    pub fn number(self) -> u8 {
        match self {
            Self::Tcp => IPPROTO_TCP,
            Self::Udp => IPPROTO_UDP,
            Self::Sctp => IPPROTO_SCTP,
        }
    }

    /// The protocol with the given IP protocol number.
    pub fn from_number(number: u8) -> Option<Self> {
        match number {
            IPPROTO_TCP => Some(Self::Tcp),
            IPPROTO_UDP => Some(Self::Udp),
            IPPROTO_SCTP => Some(Self::Sctp),
            _ => None,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
        })
    }
}

/// A protocol name that is not TCP, UDP or SCTP.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown protocol {0:?}; expected TCP, UDP or SCTP")]
pub struct UnknownProtocol(pub String);

impl FromStr for Protocol {
    type Err = UnknownProtocol;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_uppercase().as_str() {
            "TCP" => Ok(Self::Tcp),
            "UDP" => Ok(Self::Udp),
            "SCTP" => Ok(Self::Sctp),
            other => Err(UnknownProtocol(other.to_owned())),
        }
    }
}
