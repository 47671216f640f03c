//! The pin directory before a load: on bpffs, with its subdirectories, and holding only pins the
//! new programs can use.

use std::{collections::HashMap, path::Path};

use topology_common::map_names::{self, Kept, MapSpec};

use super::{
    error::{DataplaneError, MapLayout},
    layout::PinLayout,
    maps::{Capacities, pinned_info},
    mmap::BPF_F_MMAPABLE,
    objects::PROGRAMS,
};
use crate::mounts;

/// Checks the pin directory is on bpffs (its nearest existing ancestor, before creating it) and
/// creates its subdirectories.
pub fn prepare_dirs(layout: &PinLayout) -> Result<(), DataplaneError> {
    let root = layout.root();
    let existing = root.ancestors().find(|dir| dir.exists()).unwrap_or(root);
    let on_bpffs =
        mounts::is_bpffs(existing).map_err(|source| DataplaneError::PinDir { path: existing.to_path_buf(), source })?;
    if !on_bpffs {
        return Err(DataplaneError::NotBpffs { path: root.to_path_buf() });
    }
    for dir in [layout.maps_dir(), layout.links_dir(), layout.progs_dir()] {
        std::fs::create_dir_all(&dir).map_err(|source| DataplaneError::PinDir { path: dir.clone(), source })?;
    }
    Ok(())
}

/// Removes the pins a load must not reuse, and checks the others match these programs.
///
/// A map declared [`Kept::Rebuilt`] (the service index, derived from the service maps at
/// adoption; what is only measured) pinned with another layout or capacity — or, for the index,
/// without `BPF_F_MMAPABLE` — is removed and created anew. Any other map pinned with another
/// layout or capacity is refused: its state cannot be carried over.
pub fn prepare(layout: &PinLayout, capacities: &Capacities) -> Result<(), DataplaneError> {
    let object = aya_obj::Object::parse(PROGRAMS)
        .map_err(|error| DataplaneError::Object { object: "topology", reason: error.to_string() })?;
    let configured: HashMap<&str, u32> = capacities.by_map().into_iter().collect();
    for MapSpec { name, kept } in map_names::MAPS.into_iter().filter(MapSpec::pinned) {
        let path = layout.map(name);
        let Some(info) = pinned_info(&path, name)? else { continue };
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
        let capacity = configured.get(name).copied().unwrap_or_else(|| declared.max_entries());
        if let Kept::Rebuilt(what) = kept {
            let index = name == map_names::INDEX_V4 || name == map_names::INDEX_V6;
            let mappable = !index || info.map_flags() & BPF_F_MMAPABLE != 0;
            if pinned != expected || info.max_entries() != capacity || !mappable {
                tracing::info!(map = name, "rebuilding {what} pinned by another version or with another capacity");
                remove(&path)?;
            }
            continue;
        }
        if pinned != expected {
            return Err(DataplaneError::PinnedLayout { map: name, pinned, expected });
        }
        if info.max_entries() != capacity {
            return Err(DataplaneError::CapacityMismatch {
                map: name,
                pinned: info.max_entries(),
                configured: capacity,
            });
        }
    }
    Ok(())
}

/// Removes the pin at `path`, if any.
fn remove(path: &Path) -> Result<(), DataplaneError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(DataplaneError::PinDir { path: path.to_path_buf(), source }),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::objects::PROGRAMS_ACQUIRE;

    /// The eBPF crate must spell map names as literals (`#[btf_map(name = …)]`); this holds them
    /// to the one table of maps, `topology_common::map_names::MAPS`, in both builds of the object.
    #[test]
    fn the_objects_declare_exactly_the_maps_of_the_table() {
        let expected: BTreeSet<&str> = map_names::MAPS.iter().map(|spec| spec.name).collect();
        assert_eq!(expected.len(), map_names::MAPS.len(), "a name declared twice");
        for (object, bytes) in [("topology", PROGRAMS), ("topology-acquire", PROGRAMS_ACQUIRE)] {
            let parsed = aya_obj::Object::parse(bytes).unwrap_or_else(|error| panic!("{object}: {error}"));
            let declared: BTreeSet<&str> =
                parsed.maps.keys().map(String::as_str).filter(|name| name.starts_with("topo_")).collect();
            assert_eq!(declared, expected, "{object}: map names differ from topology_common::map_names::MAPS");
            for name in parsed.maps.keys().filter(|name| !name.starts_with("topo_")) {
                assert!(
                    name.starts_with('.') || name.starts_with("AYA_"),
                    "{object}: map {name} is neither the agent's nor a data section or aya-log's"
                );
            }
        }
    }
}
