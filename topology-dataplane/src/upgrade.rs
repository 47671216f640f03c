//! The pin layout's version, and the one upgrade step this agent makes.
//!
//! A pin directory carries the version of its layout — which maps, links and programs live where,
//! with which keys and values — as a marker directory, `layout/v<N>` (bpffs holds no plain
//! files). This agent writes layout [`CURRENT`] and upgrades from exactly one layout before it,
//! [`PREVIOUS`]: the unversioned pins of the 0.x agents. Changing the layout bumps [`CURRENT`] and
//! replaces the step below with the new one, so the window an agent must read is one version
//! wide. Pins of any other layout — older, or written by a newer agent — are refused before
//! anything is touched, naming the directory and both versions.
//!
//! The marker is written once every link is attached, so an upgrade interrupted half way (some
//! retired pins removed, the rest not) is found unversioned again and finished by the next start.

use std::{
    io,
    path::{Path, PathBuf},
};

use super::{error::DataplaneError, layout::PinLayout, links};

/// The layout this agent writes.
pub const CURRENT: u32 = 1;
/// The one layout it upgrades from: pins with no version marker.
pub const PREVIOUS: u32 = 0;

/// Maps of layout 0 that layout 1 no longer has: `topo_dns_beat` held a deadline only, which
/// steered to whatever address an entry named; `topo_agent_cg` the agent's cgroup, exempt from the
/// API server's Service, which is no longer programmed; `topo_sock_load` each measured
/// connection's start in socket storage, now in its entry of `topo_tcp_conns`; the rest are maps
/// of the first datapath (affinity and reverse translation before their LRU maps).
const RETIRED_MAPS: [&str; 6] =
    ["topo_affinity", "topo_revnat", "topo_sock_xlate", "topo_dns_beat", "topo_agent_cg", "topo_sock_load"];

/// Programs of layout 0 whose pinned links layout 1 detaches once its own are attached: one
/// outlier program on `inet_sock_set_state` (now three, on the events themselves), the accounting
/// program at a TCP socket's end (now `tcp_closed`, with the load signal), and the load signal's
/// `sock_ops` program on the cgroup.
const RETIRED_LINKS: [&str; 3] = ["outlier", "bytes_closed", "backend_load"];

/// A program of layout 0 pinned unattached (the load signal's, attached only while needed).
const RETIRED_PROGRAM: &str = "backend_load";

/// The layout of the pins under `layout`: `None` when there are none.
pub fn found(layout: &PinLayout) -> Result<Option<u32>, DataplaneError> {
    let markers = entries(&markers_dir(layout))?;
    let versions: Vec<u32> =
        markers.iter().filter_map(|path| path.file_name()?.to_str()?.strip_prefix('v')?.parse().ok()).collect();
    match versions.as_slice() {
        [] if entries(&layout.maps_dir())?.is_empty() && entries(&layout.links_dir())?.is_empty() => Ok(None),
        [] => Ok(Some(PREVIOUS)),
        [version] => Ok(Some(*version)),
        _ => Err(DataplaneError::PinLayout {
            path: layout.root().to_path_buf(),
            found: versions,
            writes: CURRENT,
            upgrades_from: PREVIOUS,
        }),
    }
}

/// The layout of the pins under `layout`, if this agent can read it (`None`: no pins).
pub fn check(layout: &PinLayout) -> Result<Option<u32>, DataplaneError> {
    match found(layout)? {
        Some(version) if version != CURRENT && version != PREVIOUS => Err(DataplaneError::PinLayout {
            path: layout.root().to_path_buf(),
            found: vec![version],
            writes: CURRENT,
            upgrades_from: PREVIOUS,
        }),
        found => Ok(found),
    }
}

/// The first half of the upgrade, before the programs are loaded or kept: the retired maps'
/// pins go (programs still attached keep their own reference until their links are replaced).
pub fn remove_retired_maps(layout: &PinLayout) -> Result<(), DataplaneError> {
    RETIRED_MAPS.into_iter().try_for_each(|name| remove(&layout.map(name)))
}

/// The second half, once this layout's programs are attached (or kept): the retired links are
/// detached and the retired program's pin removed.
pub fn detach_retired(layout: &PinLayout) -> Result<(), DataplaneError> {
    for name in RETIRED_LINKS {
        let link = layout.link(name);
        if link.exists() {
            links::detach_pinned(&link)?;
        }
    }
    remove(&layout.program(RETIRED_PROGRAM))
}

/// Marks the pins as of layout [`CURRENT`] (and of no other).
pub fn mark(layout: &PinLayout) -> Result<(), DataplaneError> {
    let dir = markers_dir(layout);
    let current = dir.join(format!("v{CURRENT}"));
    for marker in entries(&dir)? {
        if marker != current {
            remove_dir(&marker)?;
        }
    }
    std::fs::create_dir_all(&current).map_err(|source| DataplaneError::PinDir { path: current, source })
}

/// Removes the marker (`cleanup`).
pub fn forget(layout: &PinLayout) -> Result<(), DataplaneError> {
    let dir = markers_dir(layout);
    entries(&dir)?.iter().try_for_each(|marker| remove_dir(marker))?;
    remove_dir(&dir)
}

/// The directory of the version marker.
fn markers_dir(layout: &PinLayout) -> PathBuf {
    layout.root().join("layout")
}

/// The entries of `dir`; none if it does not exist.
fn entries(dir: &Path) -> Result<Vec<PathBuf>, DataplaneError> {
    match std::fs::read_dir(dir) {
        Ok(read) => read
            .map(|entry| entry.map(|e| e.path()))
            .collect::<Result<_, _>>()
            .map_err(|source| DataplaneError::PinDir { path: dir.to_path_buf(), source }),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(DataplaneError::PinDir { path: dir.to_path_buf(), source }),
    }
}

/// Removes a pin, if it is there.
fn remove(path: &Path) -> Result<(), DataplaneError> {
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => {
            Err(DataplaneError::PinDir { path: path.to_path_buf(), source: error })
        }
        _ => Ok(()),
    }
}

/// Removes an empty directory, if it is there.
fn remove_dir(path: &Path) -> Result<(), DataplaneError> {
    match std::fs::remove_dir(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => {
            Err(DataplaneError::PinDir { path: path.to_path_buf(), source: error })
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pins() -> (tempfile::TempDir, PinLayout) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let layout = PinLayout::new(dir.path().join("topology"));
        (dir, layout)
    }

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("create the parent");
        std::fs::write(path, b"").expect("create a stand-in pin");
    }

    #[test]
    fn no_pins_unversioned_pins_and_marked_pins_are_told_apart() {
        let (_dir, layout) = pins();
        assert_eq!(check(&layout).unwrap(), None, "nothing there");
        touch(&layout.map("topo_svc4"));
        assert_eq!(check(&layout).unwrap(), Some(PREVIOUS), "pins without a marker: layout 0");
        mark(&layout).unwrap();
        assert_eq!(check(&layout).unwrap(), Some(CURRENT));
        mark(&layout).unwrap();
        assert_eq!(check(&layout).unwrap(), Some(CURRENT), "marking again changes nothing");
        forget(&layout).unwrap();
        assert!(!layout.root().join("layout").exists());
        assert_eq!(check(&layout).unwrap(), Some(PREVIOUS));
    }

    #[test]
    fn another_layout_is_refused_naming_the_directory_and_the_versions() {
        let (_dir, layout) = pins();
        std::fs::create_dir_all(layout.root().join("layout/v7")).unwrap();
        let error = check(&layout).unwrap_err().to_string();
        let path = layout.root().display().to_string();
        assert!(error.contains(&path) && error.contains("layout v7"), "{error}");
        assert!(error.contains(&format!("writes v{CURRENT}")), "{error}");
        // Marking (an agent that got past the check some other way) leaves one marker.
        mark(&layout).unwrap();
        assert_eq!(check(&layout).unwrap(), Some(CURRENT));
        std::fs::create_dir_all(layout.root().join("layout/v9")).unwrap();
        assert!(check(&layout).unwrap_err().to_string().contains("v1, v9"));
    }

    #[test]
    fn the_upgrade_removes_exactly_the_retired_pins() {
        let (_dir, layout) = pins();
        for name in RETIRED_MAPS.into_iter().chain(["topo_svc4", "topo_slots"]) {
            touch(&layout.map(name));
        }
        touch(&layout.program(RETIRED_PROGRAM));
        touch(&layout.program("tcp_bytes"));
        remove_retired_maps(&layout).unwrap();
        detach_retired(&layout).unwrap();
        let left: Vec<String> = entries(&layout.maps_dir())
            .unwrap()
            .into_iter()
            .chain(entries(&layout.progs_dir()).unwrap())
            .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        let mut left = left;
        left.sort();
        assert_eq!(left, ["tcp_bytes", "topo_slots", "topo_svc4"]);
        // Again, with nothing left to remove.
        remove_retired_maps(&layout).unwrap();
        detach_retired(&layout).unwrap();
    }
}
