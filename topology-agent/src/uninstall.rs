//! `topology-agent cleanup`: what an uninstall runs on each node, and its readiness check.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

/// Detaches every program and removes every pin under `pin_path`, saying what went.
pub fn clean(pin_path: &Path) -> anyhow::Result<()> {
    let report =
        topology_dataplane::cleanup(pin_path).with_context(|| format!("cleaning up {}", pin_path.display()))?;
    println!(
        "detached {} programs, removed {} map pins under {}",
        report.links.len(),
        report.maps.len(),
        pin_path.display()
    );
    Ok(())
}

/// `--check`: an error unless nothing is pinned under `pin_path` and none of the agent's programs
/// is attached to `cgroup` (default: the cgroup v2 root). A link pinned elsewhere, or held by a
/// process, keeps running without any pin here.
pub fn check(pin_path: &Path, cgroup: Option<PathBuf>) -> anyhow::Result<()> {
    if pin_path.exists() {
        bail!("{} still exists: the cleanup has not run or failed", pin_path.display());
    }
    let cgroup = match cgroup {
        Some(cgroup) => cgroup,
        None => topology_dataplane::mounts::cgroup2_root()?,
    };
    let attached = topology_dataplane::attached_programs(&cgroup)
        .with_context(|| format!("listing the programs attached to {}", cgroup.display()))?;
    if !attached.ours.is_empty() {
        bail!(
            "nothing pinned under {}, but still attached to {}: {}",
            pin_path.display(),
            cgroup.display(),
            attached.ours.join(", ")
        );
    }
    let unnamed = match attached.unnamed {
        0 => String::new(),
        n => format!(" ({n} programs attached at the same hooks could not be named without CAP_SYS_ADMIN)"),
    };
    println!(
        "nothing pinned under {} and none of the agent's programs attached to {}{unnamed}",
        pin_path.display(),
        cgroup.display()
    );
    Ok(())
}
