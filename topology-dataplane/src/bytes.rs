//! Cross-zone accounting's kernel side as the agent reads it (see `topology_common::bytes`):
//! the bytes counted per Service port and backend, and the sweep that counts the open
//! connections of one network namespace (`iter/tcp`, run by the agent in each namespace in turn:
//! an iterator walks the namespace its reader is created in).

use std::{
    io::Read as _,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
};

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{HashMap, MapData},
    programs::Iter,
};
use topology_common::{
    AF_INET, AF_INET6, ByteCount, SockTranslation, TCP_CONNECTIONS_MASK_GLOBAL, map_names, program_names,
};

use super::{DataplaneError, IterError, PROGRAMS, PinLayout, loader};

/// The bytes of one Service port and backend, since the map's entry was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CountedBytes {
    /// ClusterIP and Service port.
    pub service: SocketAddr,
    /// IP protocol number.
    pub protocol: u8,
    /// Backend address and port.
    pub backend: SocketAddr,
    /// Both directions, as the clients' sockets counted them.
    pub bytes: ByteCount,
}

/// Every count in the map (a count of an entry the LRU forgot starts again from zero).
pub fn read(layout: &PinLayout) -> Result<Vec<CountedBytes>, DataplaneError> {
    let map: HashMap<MapData, SockTranslation, ByteCount> =
        layout.open_map(map_names::BYTES)?.try_into().map_err(DataplaneError::map(map_names::BYTES))?;
    let mut counted = Vec::new();
    for entry in map.iter() {
        let (key, bytes) = entry.map_err(DataplaneError::map(map_names::BYTES))?;
        let (Some(service), Some(backend)) =
            (address(key.family, key.vip, key.vip_port), address(key.family, key.backend, key.backend_port))
        else {
            continue;
        };
        counted.push(CountedBytes { service, protocol: key.proto, backend, bytes });
    }
    counted.sort_by_key(|c| (c.service, c.protocol, c.backend));
    Ok(counted)
}

/// The address a family and 16 bytes name (IPv4 in the first four), if valid.
fn address(family: u8, addr: [u8; 16], port: u16) -> Option<SocketAddr> {
    let ip = match family {
        AF_INET => {
            let [a, b, c, d, rest @ ..] = addr;
            (rest == [0; 12]).then_some(IpAddr::V4(Ipv4Addr::new(a, b, c, d)))?
        }
        AF_INET6 => IpAddr::V6(Ipv6Addr::from(addr)),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// The sweep of open connections: the iterator program, loaded against the pinned maps.
pub struct BytesSweep {
    ebpf: Ebpf,
}

impl BytesSweep {
    /// Loads the iterator against the pinned maps under `layout`, reading a TCP socket's byte
    /// counters where this kernel's BTF says they are.
    pub fn load(layout: &PinLayout) -> Result<Self, IterError> {
        let offsets = loader::tcp_socket_offsets().map_err(|e| IterError::Io(std::io::Error::other(e)))?;
        let name = map_names::TCP_CONNECTIONS;
        let connections = MapData::from_pin(layout.map(name)).map_err(|e| IterError::Io(std::io::Error::other(e)))?;
        let positions = connections.info().map_err(|e| IterError::Io(std::io::Error::other(e)))?.max_entries();
        let mask = positions.saturating_sub(1);
        let mut loader = EbpfLoader::new();
        for name in map_names::PINNED {
            loader.map_pin_path(name, layout.map(name));
        }
        offsets.set(&mut loader);
        loader.override_global(TCP_CONNECTIONS_MASK_GLOBAL, &mask, true);
        let mut ebpf = loader.load(PROGRAMS)?;
        let btf = Btf::from_sys_fs()?;
        program(&mut ebpf)?.load("tcp", &btf)?;
        Ok(Self { ebpf })
    }

    /// Counts the open connections of the calling thread's network namespace (the namespace an
    /// iterator walks is the one its reader is created in); returns how many were ours.
    pub fn run_here(&mut self) -> Result<u64, IterError> {
        let program = program(&mut self.ebpf)?;
        let link = program.attach()?;
        let mut file = program.take_link(link)?.into_file()?;
        // One byte per connection of ours (a connection shown again after the reader's buffer
        // filled counts once more here, and nothing more in the maps).
        let mut ours = Vec::new();
        file.read_to_end(&mut ours)?;
        Ok(ours.len() as u64)
    }
}

fn program(ebpf: &mut Ebpf) -> Result<&mut Iter, aya::programs::ProgramError> {
    ebpf.program_mut(program_names::TCP_BYTES).ok_or(aya::programs::ProgramError::NotLoaded)?.try_into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_of_both_families_and_nothing_else() {
        let mut v4 = [0u8; 16];
        v4[..4].copy_from_slice(&[10, 96, 0, 1]);
        assert_eq!(address(AF_INET, v4, 80), Some("10.96.0.1:80".parse().unwrap()));
        v4[5] = 1;
        assert_eq!(address(AF_INET, v4, 80), None, "IPv4 with bytes beyond the fourth");
        let v6: Ipv6Addr = "fd00::1".parse().unwrap();
        assert_eq!(address(AF_INET6, v6.octets(), 443), Some("[fd00::1]:443".parse().unwrap()));
        assert_eq!(address(0, [0; 16], 1), None);
    }
}
