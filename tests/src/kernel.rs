//! This kernel's release, for the tests of a feature that older kernels lack (they run in the VMs
//! of `cargo xtask kernels` too).

/// `uname -r`: its major and minor, and the whole text.
#[derive(Clone, Debug)]
pub struct Release {
    /// `6` of `6.1.0-57-amd64`.
    pub major: u32,
    /// `1` of `6.1.0-57-amd64`.
    pub minor: u32,
    /// `6.1.0-57-amd64`.
    pub text: String,
}

impl Release {
    /// Whether this release is `major.minor` or later.
    pub fn at_least(&self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }
}

/// The running kernel's release.
pub fn release() -> Release {
    let text = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("the kernel's release");
    let text = text.trim().to_owned();
    let mut parts = text.split(|c: char| !c.is_ascii_digit()).map(|p| p.parse().unwrap_or(0));
    Release { major: parts.next().unwrap_or(0), minor: parts.next().unwrap_or(0), text }
}
