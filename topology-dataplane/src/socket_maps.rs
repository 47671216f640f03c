//! What socket termination reads of the programs' state, handed out by the dataplane (the one
//! owner of the BPF object and maps): the connected sockets' storage map, for `sock_diag` to
//! report with each TCP socket, the unmeasured TCP connections' translations by cookie, and the UDP socket iterator (`iter/udp` in the kernel programs):
//! the translation of every UDP socket of one namespace, by socket cookie (`sock_diag` reports
//! socket storage only for TCP).

use std::{collections::HashMap, io::Read as _};

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{Array, MapData},
    programs::{Iter, ProgramError},
};
use topology_common::{IterRecord, SockTranslation, TcpTranslation, map_names, program_names};

use super::{DataplaneError, PROGRAMS, PinLayout};

/// The sockets' view of the programs' state.
pub struct SocketMaps {
    layout: PinLayout,
    /// Loaded at the first UDP read, kept for the next ones.
    udp: Option<UdpTranslations>,
}

impl SocketMaps {
    pub(super) fn new(layout: PinLayout) -> Self {
        Self { layout, udp: None }
    }

    /// The connected sockets' storage map, for `sock_diag` requests.
    pub fn connections(&self) -> Result<MapData, DataplaneError> {
        MapData::from_pin(self.layout.map(map_names::SOCK_CONNECTIONS))
            .map_err(DataplaneError::map(map_names::SOCK_CONNECTIONS))
    }

    /// The unmeasured TCP connections' translations, by socket cookie (a direct-mapped table,
    /// which `sock_diag` does not report: look each socket's cookie up).
    pub fn tcp_connections(&self) -> Result<TcpConnections, DataplaneError> {
        let name = map_names::TCP_CONNECTIONS;
        let data = MapData::from_pin(self.layout.map(name)).map_err(DataplaneError::map(name))?;
        let positions = data.info().map_err(DataplaneError::map(name))?.max_entries();
        let array = Array::try_from(aya::maps::Map::Array(data)).map_err(DataplaneError::map(name))?;
        Ok(TcpConnections { array, mask: positions.saturating_sub(1) })
    }

    /// Translations of the UDP sockets of the calling thread's network namespace, by cookie.
    pub fn udp_translations_here(&mut self) -> Result<HashMap<u64, SockTranslation>, IterError> {
        let udp = match &mut self.udp {
            Some(udp) => udp,
            empty => empty.insert(UdpTranslations::load(&self.layout)?),
        };
        udp.read_here()
    }
}

/// The TCP connections table (see `TcpTranslation`).
pub struct TcpConnections {
    array: Array<MapData, TcpTranslation>,
    mask: u32,
}

impl TcpConnections {
    /// The translation of the TCP socket `cookie`, if the table still holds it.
    pub fn get(&self, cookie: u64) -> Option<SockTranslation> {
        self.array.get(&(cookie as u32 & self.mask), 0).ok()?.of(cookie)
    }
}

/// Why the iterator cannot run.
#[derive(Debug, thiserror::Error)]
pub enum IterError {
    /// The object could not be loaded against the pinned maps.
    #[error("loading the socket iterator: {0}")]
    Load(#[from] aya::EbpfError),
    /// The kernel's BTF, which an iterator is verified against, could not be read.
    #[error("reading the kernel's BTF: {0}")]
    Btf(#[from] aya::BtfError),
    /// The program could not be loaded, attached or read.
    #[error("socket iterator udp_translations: {0}")]
    Program(#[from] ProgramError),
    /// The iterator's reader could not be created.
    #[error("socket iterator reader: {0}")]
    Link(#[from] aya::programs::links::LinkError),
    /// A namespace could not be entered, or the iterator not read.
    #[error("socket iterator: {0}")]
    Io(#[from] std::io::Error),
}

/// The loaded iterator.
struct UdpTranslations {
    ebpf: Ebpf,
}

impl UdpTranslations {
    /// Loads the iterator against the pinned maps under `pins` (it reads their socket storage).
    fn load(pins: &PinLayout) -> Result<Self, IterError> {
        let mut loader = EbpfLoader::new();
        for name in map_names::PINNED {
            loader.map_pin_path(name, pins.map(name));
        }
        let mut ebpf = loader.load(PROGRAMS)?;
        let btf = Btf::from_sys_fs()?;
        program(&mut ebpf)?.load("udp", &btf)?;
        Ok(Self { ebpf })
    }

    /// Translations of the UDP sockets of the calling thread's namespace, by cookie: the
    /// namespace an iterator walks is the one its reader is created in.
    fn read_here(&mut self) -> Result<HashMap<u64, SockTranslation>, IterError> {
        let program = program(&mut self.ebpf)?;
        let link = program.attach()?;
        let mut file = program.take_link(link)?.into_file()?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(bytes
            .chunks_exact(size_of::<IterRecord>())
            .map(|chunk| {
                // SAFETY: exactly one record's bytes, read unaligned; any bit pattern is valid.
                let record = unsafe { std::ptr::read_unaligned(chunk.as_ptr().cast::<IterRecord>()) };
                (record.cookie, record.translation)
            })
            .collect())
    }
}

fn program(ebpf: &mut Ebpf) -> Result<&mut Iter, ProgramError> {
    ebpf.program_mut(program_names::UDP_TRANSLATIONS).ok_or(ProgramError::NotLoaded)?.try_into()
}
