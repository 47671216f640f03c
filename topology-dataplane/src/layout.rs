//! Where the pins live: one directory, `maps/<name>`, `links/<program>` and `progs/<program>`
//! under it.

use std::path::{Path, PathBuf};

use aya::maps::{Map, MapData};

use crate::error::DataplaneError;

/// Layout of a pin directory.
#[derive(Clone, Debug)]
pub struct PinLayout {
    root: PathBuf,
}

impl PinLayout {
    /// The layout under `root` (e.g. `/sys/fs/bpf/topology`).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The pin directory itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Directory of the pinned maps.
    pub fn maps_dir(&self) -> PathBuf {
        self.root.join("maps")
    }

    /// The map pinned here as `name`.
    pub(crate) fn open_map(&self, name: &'static str) -> Result<Map, DataplaneError> {
        let path = self.map(name);
        if !path.exists() {
            return Err(DataplaneError::MapMissing { map: name, location: self.maps_dir().display().to_string() });
        }
        let data = MapData::from_pin(&path).map_err(DataplaneError::map(name))?;
        Map::from_map_data(data).map_err(DataplaneError::map(name))
    }

    /// Directory of the pinned links.
    pub fn links_dir(&self) -> PathBuf {
        self.root.join("links")
    }

    /// Pin path of a map.
    pub fn map(&self, name: &str) -> PathBuf {
        self.maps_dir().join(name)
    }

    /// Directory of the programs pinned to be attached later (the load signal's).
    pub fn progs_dir(&self) -> PathBuf {
        self.root.join("progs")
    }

    /// Pin path of a program loaded but attached only while needed.
    pub fn program(&self, program: &str) -> PathBuf {
        self.progs_dir().join(program)
    }

    /// Pin path of the link of a program.
    pub fn link(&self, program: &str) -> PathBuf {
        self.links_dir().join(program)
    }
}
