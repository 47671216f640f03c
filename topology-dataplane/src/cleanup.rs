//! Removing everything an agent leaves in the kernel: every pinned link detached, every pin
//! removed.

use std::path::{Path, PathBuf};

use super::{error::DataplaneError, layout::PinLayout, links, reuse};

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
