//! Removing everything an agent leaves in the kernel: every pinned link detached, every pin
//! removed.

use std::path::{Path, PathBuf};

use super::{error::DataplaneError, layout::PinLayout, links, reuse, upgrade};

/// What [`cleanup`] removed.
#[derive(Debug, Default)]
pub struct CleanupReport {
    /// Link pins detached and removed.
    pub links: Vec<PathBuf>,
    /// Map pins removed.
    pub maps: Vec<PathBuf>,
}

/// Detaches every pinned link and removes every pin under `pin_path`. Idempotent.
pub fn cleanup(pin_path: &Path) -> Result<CleanupReport, DataplaneError> {
    let layout = PinLayout::new(pin_path);
    let mut report = CleanupReport::default();
    for path in entries(&layout.links_dir())? {
        links::detach_pinned(&path)?;
        report.links.push(path);
    }
    for path in entries(&layout.maps_dir())? {
        std::fs::remove_file(&path).map_err(|source| DataplaneError::PinDir { path: path.clone(), source })?;
        report.maps.push(path);
    }
    for path in entries(&layout.progs_dir())? {
        std::fs::remove_file(&path).map_err(|source| DataplaneError::PinDir { path: path.clone(), source })?;
    }
    reuse::forget(&layout)?;
    upgrade::forget(&layout)?;
    for dir in [layout.links_dir(), layout.maps_dir(), layout.progs_dir(), layout.root().to_path_buf()] {
        match std::fs::remove_dir(&dir) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(DataplaneError::PinDir { path: dir, source }),
        }
    }
    Ok(report)
}

/// The files in `dir`, sorted; none if it does not exist.
fn entries(dir: &Path) -> Result<Vec<PathBuf>, DataplaneError> {
    let read = match std::fs::read_dir(dir) {
        Ok(read) => read,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(DataplaneError::PinDir { path: dir.to_path_buf(), source });
        }
    };
    let mut paths = Vec::new();
    for entry in read {
        let entry = entry.map_err(|source| DataplaneError::PinDir { path: dir.to_path_buf(), source })?;
        paths.push(entry.path());
    }
    paths.sort();
    Ok(paths)
}

/// What is attached directly to a cgroup at the agent's hooks, pinned or not.
#[derive(Debug, Default)]
pub struct Attached {
    /// The agent's programs, by name.
    pub ours: Vec<String>,
    /// Programs that could not be named (listing programs needs `CAP_SYS_ADMIN`): maybe ours,
    /// maybe another tool's (Cilium and others attach at the same hooks).
    pub unnamed: usize,
}

/// The agent's programs still attached directly to `cgroup`: what `cleanup --check` must find
/// none of.
pub fn attached_programs(cgroup: &Path) -> Result<Attached, DataplaneError> {
    let ids =
        links::attached_to(cgroup).map_err(|source| DataplaneError::Cgroup { path: cgroup.to_path_buf(), source })?;
    let ours = topology_common::program_names::ALL;
    let named: Vec<(u32, String)> = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|program| ids.contains(&program.id()))
        .map(|program| (program.id(), program.name_as_str().unwrap_or_default().to_owned()))
        .collect();
    let mut attached = Attached {
        ours: named.iter().filter(|(_, name)| ours.contains(&name.as_str())).map(|(_, name)| name.clone()).collect(),
        unnamed: ids.iter().filter(|id| !named.iter().any(|(named, _)| named == *id)).count(),
    };
    attached.ours.sort();
    Ok(attached)
}
