//! Loads the embedded programs, opens (or creates and pins) the maps, and attaches every program
//! to the cgroup through a pinned link that outlives the agent.

use std::{fs::File, path::Path};

use aya::{
    Ebpf, EbpfLoader,
    programs::{CgroupAttachMode, CgroupSockAddr, links::FdLink},
};
use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use topology_common::{
    INDEX_V4_MASK_GLOBAL, INDEX_V6_MASK_GLOBAL, LOG_LEVEL_GLOBAL, SOCK_TRANSLATION_MASK_GLOBAL, map_names,
    program_names,
};

use super::{
    error::{DataplaneError, MapLayout},
    index::positions_for,
    links,
    maps::{Capacities, PinLayout, pinned_info},
};
use crate::mounts;

/// The kernel programs, built by `build.rs` from `topology-ebpf`.
static PROGRAMS: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/topology"));

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
    /// The object; its maps of the persistent state have been taken out by the caller.
    pub ebpf: Ebpf,
    /// Reader of the kernel log ring buffer; must live as long as the programs may log.
    pub logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
}

/// Loads the object with its maps opened from, or created and pinned under, `layout`.
pub fn load(layout: &PinLayout, capacities: &Capacities, log_level: KernelLogLevel) -> Result<Loaded, DataplaneError> {
    capacities.validate().map_err(DataplaneError::Config)?;
    prepare_pin_dirs(layout)?;
    check_pinned(layout, capacities)?;
    let mut loader = EbpfLoader::new();
    for name in map_names::PINNED {
        loader.map_pin_path(name, layout.map(name));
    }
    for (name, configured) in capacities.by_map() {
        loader.map_max_entries(name, configured);
    }
    let level = log_level.global();
    loader.override_global(LOG_LEVEL_GLOBAL, &level, true);
    let mask = capacities.sock_translations - 1;
    loader.override_global(SOCK_TRANSLATION_MASK_GLOBAL, &mask, true);
    let index_v4_mask = positions_for(capacities.services_v4) - 1;
    loader.override_global(INDEX_V4_MASK_GLOBAL, &index_v4_mask, true);
    let index_v6_mask = positions_for(capacities.services_v6) - 1;
    loader.override_global(INDEX_V6_MASK_GLOBAL, &index_v6_mask, true);
    let mut ebpf = loader.load(PROGRAMS)?;
    let logger = match log_level {
        KernelLogLevel::Off => None,
        _ => Some(aya_log::EbpfLogger::init(&mut ebpf)?),
    };
    Ok(Loaded { ebpf, logger })
}

/// Checks that every map a previous agent pinned has the type, key size and value size this
/// agent's programs declare, and the configured capacity: maps pinned by another version would
/// otherwise be reused and fail the verifier with a wall of text.
fn check_pinned(layout: &PinLayout, capacities: &Capacities) -> Result<(), DataplaneError> {
    let object = aya_obj::Object::parse(PROGRAMS)
        .map_err(|error| DataplaneError::Config(format!("parsing the embedded eBPF object: {error}")))?;
    for (name, configured) in capacities.by_map() {
        let Some(info) = pinned_info(&layout.map(name), name)? else { continue };
        let declared = object
            .maps
            .get(name)
            .ok_or(DataplaneError::MapMissing { map: name, location: "the eBPF object".into() })?;
        let pinned = MapLayout {
            map_type: info.map_type().map_or(u32::MAX, |kind| kind as u32),
            key_size: info.key_size(),
            value_size: info.value_size(),
        };
        let expected = MapLayout {
            map_type: declared.map_type(),
            key_size: declared.key_size(),
            value_size: declared.value_size(),
        };
        if pinned != expected {
            return Err(DataplaneError::PinnedLayout { map: name, pinned, expected });
        }
        if info.max_entries() != configured {
            return Err(DataplaneError::CapacityMismatch { map: name, pinned: info.max_entries(), configured });
        }
    }
    Ok(())
}

/// Loads every program and attaches it to `cgroup`, replacing the links a previous agent pinned.
pub fn attach_all(ebpf: &mut Ebpf, layout: &PinLayout, cgroup: &Path) -> Result<(), DataplaneError> {
    let cgroup_error = |source| DataplaneError::Cgroup { path: cgroup.to_path_buf(), source };
    if !mounts::is_cgroup2(cgroup).map_err(cgroup_error)? {
        return Err(DataplaneError::NotCgroup2 { path: cgroup.to_path_buf() });
    }
    let cgroup_fd = File::open(cgroup).map_err(cgroup_error)?;
    for name in program_names::ALL {
        let program: &mut CgroupSockAddr = ebpf
            .program_mut(name)
            .ok_or_else(|| DataplaneError::Program { program: name, source: aya::programs::ProgramError::NotLoaded })?
            .try_into()
            .map_err(DataplaneError::program(name))?;
        program.load().map_err(DataplaneError::program(name))?;
        // Cgroup bpf_links always coexist with other programs (BPF_F_ALLOW_MULTI semantics) and the
        // kernel rejects any attach flag on them, so the mode must be the flag-less one.
        let link_id = program.attach(&cgroup_fd, CgroupAttachMode::Single).map_err(DataplaneError::program(name))?;
        let link: FdLink =
            program.take_link(link_id).map_err(DataplaneError::program(name))?.try_into().map_err(|error| {
                DataplaneError::Link { path: layout.link(name), source: std::io::Error::other(error) }
            })?;
        links::replace_pinned(link, &layout.link(name))?;
    }
    Ok(())
}

/// Checks the pin directory is on bpffs (its nearest existing ancestor, before creating it) and
/// creates its subdirectories.
fn prepare_pin_dirs(layout: &PinLayout) -> Result<(), DataplaneError> {
    let root = layout.root();
    let existing = root.ancestors().find(|dir| dir.exists()).unwrap_or(root);
    let on_bpffs =
        mounts::is_bpffs(existing).map_err(|source| DataplaneError::PinDir { path: existing.to_path_buf(), source })?;
    if !on_bpffs {
        return Err(DataplaneError::NotBpffs { path: root.to_path_buf() });
    }
    for dir in [layout.maps_dir(), layout.links_dir()] {
        std::fs::create_dir_all(&dir).map_err(|source| DataplaneError::PinDir { path: dir.clone(), source })?;
    }
    Ok(())
}
