//! When the load signal runs. The `sock_ops` program is called on every TCP connection of the
//! cgroup — five callbacks or more per connection, whether or not the connection is a Service's —
//! which costs each connect about 0.35 µs on our bench machine (`docs/benchmarks.md`). So it is
//! attached only while some TCP port the kernel holds is measured (under feedback, or every port
//! with `--load-signal all`), and detached when the last one goes.
//!
//! Detaching leaves the connections it measured uncounted when they close, so the measurements go
//! with it; a socket measured before a detach adds nothing after the next attach
//! (`BackendLoad::created_ns`).

use std::{fs::File, path::PathBuf};

use aya::programs::{CgroupAttachMode, SockOps, links::FdLink};
use topology_common::{map_names, program_names};

use super::{backend_load::LoadMap, error::DataplaneError, layout::PinLayout, links};

const NAME: &str = program_names::BACKEND_LOAD;

/// The load signal's attachment to one cgroup.
pub struct Signal {
    layout: PinLayout,
    cgroup: PathBuf,
}

impl Signal {
    pub(crate) fn new(layout: PinLayout, cgroup: PathBuf) -> Self {
        Self { layout, cgroup }
    }

    /// Whether the program was loaded (the option is on and the kernel accepted it).
    pub fn available(&self) -> bool {
        self.layout.program(NAME).exists()
    }

    /// Whether the program runs now.
    pub fn attached(&self) -> bool {
        self.layout.link(NAME).exists()
    }

    /// Attaches (`on`) or detaches the program, if it is not so already and it was loaded; a
    /// detach clears `load`. Returns whether anything changed.
    pub fn set(&mut self, on: bool, load: &mut LoadMap) -> Result<bool, DataplaneError> {
        if on == self.attached() || (on && !self.available()) {
            return Ok(false);
        }
        let path = self.layout.link(NAME);
        if on {
            let link_error = |error: &dyn std::fmt::Display| DataplaneError::Link {
                path: path.clone(),
                source: std::io::Error::other(error.to_string()),
            };
            let cgroup = File::open(&self.cgroup)
                .map_err(|source| DataplaneError::Cgroup { path: self.cgroup.clone(), source })?;
            let mut program = SockOps::from_pin(self.layout.program(NAME)).map_err(DataplaneError::program(NAME))?;
            let id = program.attach(&cgroup, CgroupAttachMode::Single).map_err(DataplaneError::program(NAME))?;
            let link: FdLink = program
                .take_link(id)
                .map_err(DataplaneError::program(NAME))?
                .try_into()
                .map_err(|error| link_error(&error))?;
            links::replace_pinned(link, &path)?;
            tracing::info!("load signal attached: a TCP port is measured");
        } else {
            links::detach_pinned(&path)?;
            let keys: Vec<_> =
                load.keys().collect::<Result<_, _>>().map_err(DataplaneError::map(map_names::BACKEND_LOAD))?;
            for key in &keys {
                match load.remove(key) {
                    Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                    Err(error) => return Err(DataplaneError::map(map_names::BACKEND_LOAD)(error)),
                }
            }
            tracing::info!(backends = keys.len(), "load signal detached: no TCP port is measured");
        }
        Ok(true)
    }
}
