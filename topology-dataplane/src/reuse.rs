//! A restart without reloading. The programs a previous agent loaded stay in the kernel, held by
//! their pinned links; loading and verifying them again is most of a restart's time. When the
//! programs would be the very same — the same embedded objects, load options and map capacities,
//! attached to the same cgroup — a restart keeps them and only opens the pinned maps.
//!
//! What was loaded is named by a marker directory (bpffs holds no plain files) under the pin path:
//! `programs/p<fingerprint>_f<flavour>`. It is removed before a load starts and
//! written once every link is attached, so a marker always names the programs the links hold.
//! Anything that does not match — an upgrade, another flag, a link detached or on another
//! cgroup, a marker missing — loads as before.

use std::{
    hash::{DefaultHasher, Hash as _, Hasher as _},
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use topology_common::program_names;

use super::{
    error::DataplaneError,
    layout::PinLayout,
    links,
    loader::{self, Flavour},
    objects,
    options::{KernelLogLevel, LoadOptions},
};

/// What a previous agent loaded, as its marker says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Previous {
    /// The object and index mode.
    pub flavour: Flavour,
}

/// The directory of the marker.
fn markers_dir(layout: &PinLayout) -> PathBuf {
    layout.root().join("programs")
}

/// A hash of everything that makes the loaded programs what they are: both embedded objects,
/// the load options, the cgroup and this agent's version.
pub fn fingerprint(options: &LoadOptions, cgroup: &Path) -> String {
    let mut hasher = DefaultHasher::new();
    objects::PROGRAMS.hash(&mut hasher);
    objects::PROGRAMS_ACQUIRE.hash(&mut hasher);
    format!("{options:?}").hash(&mut hasher);
    cgroup.hash(&mut hasher);
    env!("CARGO_PKG_VERSION").hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

fn marker_name(fingerprint: &str, previous: Previous) -> Option<String> {
    let flavour = loader::FLAVOURS.iter().position(|f| *f == previous.flavour)?;
    Some(format!("p{fingerprint}_f{flavour}"))
}

fn parse_marker(name: &str, fingerprint: &str) -> Option<Previous> {
    let flavour = name.strip_prefix('p')?.strip_prefix(fingerprint)?.strip_prefix("_f")?;
    let flavour = *loader::FLAVOURS.get(flavour.parse::<usize>().ok()?)?;
    Some(Previous { flavour })
}

/// The programs a previous agent left attached, if a restart with `options` may keep them: the
/// marker matches, and every link it implies is pinned and attached to `cgroup`.
pub fn find(layout: &PinLayout, options: &LoadOptions, cgroup: &Path) -> Option<Previous> {
    if options.kernel_log != KernelLogLevel::Off {
        // The kernel log's reader needs the loaded object.
        return None;
    }
    let fingerprint = fingerprint(options, cgroup);
    let previous = std::fs::read_dir(markers_dir(layout))
        .ok()?
        .filter_map(Result::ok)
        .find_map(|entry| parse_marker(&entry.file_name().to_string_lossy(), &fingerprint))?;
    let cgroup_id = std::fs::metadata(cgroup).ok()?.ino();
    let tracing_links = |programs: &[(&str, &str)]| programs.iter().all(|(name, _)| layout.link(name).exists());
    if (options.outlier_ejection && !tracing_links(&program_names::OUTLIER))
        || ((options.byte_accounting.tcp() || options.load_signal.measures()) && !tracing_links(&program_names::CLOSED))
        || (options.byte_accounting.udp() && !tracing_links(&program_names::UDP_ACCOUNTING))
    {
        // Detached, or refused by this kernel before: loading tries again.
        return None;
    }
    for name in program_names::ALL {
        let path = layout.link(name);
        let attached = links::cgroup_of(&path).is_ok_and(|(program, cgroup)| program != 0 && cgroup == cgroup_id);
        if !attached {
            tracing::info!(link = %path.display(), "a pinned link is no longer attached here; loading the programs");
            return None;
        }
    }
    Some(previous)
}

/// Forgets what was loaded: a load is starting.
pub fn forget(layout: &PinLayout) -> Result<(), DataplaneError> {
    let dir = markers_dir(layout);
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(DataplaneError::PinDir { path: dir, source }),
    };
    for entry in entries {
        let path = entry.map_err(|source| DataplaneError::PinDir { path: dir.clone(), source })?.path();
        std::fs::remove_dir(&path).map_err(|source| DataplaneError::PinDir { path, source })?;
    }
    match std::fs::remove_dir(&dir) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(DataplaneError::PinDir { path: dir, source }),
    }
}

/// Records what was just loaded and attached with `options`.
pub fn record(
    layout: &PinLayout,
    options: &LoadOptions,
    cgroup: &Path,
    flavour: Flavour,
) -> Result<(), DataplaneError> {
    if options.kernel_log != KernelLogLevel::Off {
        return Ok(());
    }
    let Some(name) = marker_name(&fingerprint(options, cgroup), Previous { flavour }) else { return Ok(()) };
    let path = markers_dir(layout).join(name);
    std::fs::create_dir_all(&path).map_err(|source| DataplaneError::PinDir { path, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ByteAccounting, Capacities, IndexOrdering, LoadSignal};

    fn options() -> LoadOptions {
        LoadOptions {
            capacities: Capacities::default(),
            kernel_log: KernelLogLevel::Off,
            index: IndexOrdering::Auto,
            load_signal: LoadSignal::On,
            outlier_ejection: true,
            byte_accounting: ByteAccounting::All,
        }
    }

    #[test]
    fn the_fingerprint_changes_with_anything_the_load_depends_on() {
        let cgroup = Path::new("/sys/fs/cgroup/a");
        let base = fingerprint(&options(), cgroup);
        assert_eq!(base, fingerprint(&options(), cgroup), "stable");
        let mut capacities = options();
        capacities.capacities.slots += 1;
        let mut signal = options();
        signal.load_signal = LoadSignal::Off;
        let mut ejection = options();
        ejection.outlier_ejection = false;
        let mut accounting = options();
        accounting.byte_accounting = ByteAccounting::Tcp;
        let mut no_accounting = options();
        no_accounting.byte_accounting = ByteAccounting::Off;
        for other in [capacities, signal, ejection, accounting, no_accounting] {
            assert_ne!(base, fingerprint(&other, cgroup), "{other:?}");
        }
        assert_ne!(base, fingerprint(&options(), Path::new("/sys/fs/cgroup/b")));
    }

    #[test]
    fn markers_round_trip_and_other_fingerprints_do_not_match() {
        for flavour in loader::FLAVOURS {
            let previous = Previous { flavour };
            let name = marker_name("00ff", previous).unwrap();
            assert_eq!(parse_marker(&name, "00ff"), Some(previous));
            assert_eq!(parse_marker(&name, "00fe"), None);
        }
        assert_eq!(parse_marker("p00ff_f9", "00ff"), None, "no such flavour");
        assert_eq!(parse_marker("p00ff_f0_s1", "00ff"), None, "an earlier agent's marker");
    }
}
