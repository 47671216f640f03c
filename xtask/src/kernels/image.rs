//! The kernels' images: Debian's kernel packages, downloaded once into a cache keyed by package
//! name, and an initramfs of busybox and each kernel's own modules that boots into this machine's
//! tree, shared read-only over 9p.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context as _;

use crate::cmd;

/// A kernel of the matrix: its label and where its package comes from.
pub struct Kernel {
    /// `6.1`, `6.12`, `6.18`.
    pub label: &'static str,
    source: Source,
}

/// Where a kernel's image package comes from.
enum Source {
    /// This machine's own suites (bookworm): the newest image a meta-package depends on.
    Newest { meta: &'static str },
    /// One image of another Debian suite, named exactly, fetched with an apt configuration of our
    /// own (the machine's sources untouched), verified by the archive keyring bookworm ships.
    Pinned { suite: &'static str, package: &'static str },
}

/// The kernels the VMs boot: Debian 12's 6.1 (Amazon Linux 2023, COS and most LTS fleets run
/// 6.1), the 6.12 of Debian 13 and RHEL 10 (bookworm carries it), and 6.18 from Debian 13's
/// backports (bookworm has none; a suite's backports keep superseded builds, so a pin holds).
pub const KERNELS: [Kernel; 3] = [
    Kernel { label: "6.1", source: Source::Newest { meta: "linux-image-amd64" } },
    Kernel { label: "6.12", source: Source::Newest { meta: "linux-image-6.12-amd64" } },
    Kernel {
        label: "6.18",
        source: Source::Pinned { suite: "trixie-backports", package: "linux-image-6.18.15+deb13-amd64" },
    },
];

/// Modules the tests may load, by directory of the kernel's tree (9p, overlay, veth, netfilter...).
const MODULE_DIRS: [&str; 8] =
    ["net", "fs/9p", "fs/netfs", "fs/fscache", "fs/overlayfs", "drivers/virtio", "lib", "crypto"];
const MODULE_FILES: [&str; 4] = ["veth", "dummy", "virtio_net", "net_failover"];

/// A kernel ready to boot.
pub struct Prepared {
    /// Its label.
    pub label: &'static str,
    /// `uname -r` inside.
    pub release: String,
    pub(super) vmlinuz: PathBuf,
    pub(super) initrd: PathBuf,
}

/// The init of the initramfs: modules for 9p and overlay, the host's tree as the root (writable in
/// memory), the kernel's own modules beside it, then `/vm-out/script.sh` from the shared folder.
const INIT: &str = r#"#!/bin/sh
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
modprobe virtio_pci 2>/dev/null; modprobe 9pnet_virtio; modprobe 9p; modprobe overlay
mkdir -p /lower /upper /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose hostroot /lower || echo "VM-EXIT: 200"
mount -t tmpfs tmp /upper; mkdir -p /upper/u /upper/w
mount -t overlay overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w /newroot || echo "VM-EXIT: 201"
mkdir -p /newroot/lib/modules; cp -r /lib/modules/* /newroot/lib/modules/
mount --move /proc /newroot/proc; mount --move /sys /newroot/sys; mount --move /dev /newroot/dev
exec switch_root /newroot /bin/sh -c 'mount -t tmpfs t /tmp; mount -t tmpfs r /run; mount -t cgroup2 c /sys/fs/cgroup; mount -t bpf b /sys/fs/bpf; mount -t tracefs tr /sys/kernel/tracing 2>/dev/null; ip link set lo up; mkdir -p /vm-out; mount -t 9p -o trans=virtio,version=9p2000.L out /vm-out; bash /vm-out/script.sh; echo "VM-EXIT: $?"; echo o > /proc/sysrq-trigger; sleep 10'
"#;

/// Where the kernels and their initramfs are kept.
pub(super) fn cache() -> PathBuf {
    crate::kubernetes::cache_root().join("kernels")
}

/// Downloads, unpacks and wraps each kernel of [`KERNELS`] (cached by package name: a second run
/// costs nothing), and the packages qemu needs.
pub fn ensure() -> anyhow::Result<Vec<Prepared>> {
    KERNELS.iter().map(prepare).collect()
}

fn prepare(kernel: &Kernel) -> anyhow::Result<Prepared> {
    let package = match kernel.source {
        Source::Newest { meta } => match resolve(meta) {
            Ok(package) => package,
            Err(_) => {
                // Package lists never fetched, or stale: once more after an update.
                cmd::run(Command::new("apt-get").args(["update", "-qq"]))?;
                resolve(meta)?
            }
        },
        Source::Pinned { package, .. } => package.to_owned(),
    };
    let dir = cache().join(&package);
    let tree = dir.join("tree");
    if !tree.join("boot").exists() {
        std::fs::create_dir_all(&dir)?;
        eprintln!("kernels: downloading {package}");
        download(&kernel.source, &package, &dir)?;
        let deb = std::fs::read_dir(&dir)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "deb"))
            .context("the downloaded package")?;
        let unpacking = dir.join("tree.partial");
        let _ = std::fs::remove_dir_all(&unpacking);
        cmd::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacking))?;
        std::fs::rename(&unpacking, &tree)?;
        std::fs::remove_file(deb)?;
    }
    let modules = modules_dir(&tree)?;
    let release = std::fs::read_dir(&modules)?
        .filter_map(Result::ok)
        .find_map(|e| e.file_name().into_string().ok())
        .context("the package's modules")?;
    let initrd = dir.join("initrd.cpio");
    if !initrd.exists() {
        build_initrd(&modules.join(&release), &release, &initrd)?;
    }
    Ok(Prepared { label: kernel.label, vmlinuz: tree.join(format!("boot/vmlinuz-{release}")), release, initrd })
}

/// Where a package keeps its modules: `lib/modules` (bookworm), `usr/lib/modules` (merged /usr,
/// trixie on).
fn modules_dir(tree: &Path) -> anyhow::Result<PathBuf> {
    ["usr/lib/modules", "lib/modules"]
        .iter()
        .map(|dir| tree.join(dir))
        .find(|dir| dir.is_dir())
        .with_context(|| format!("{}: no lib/modules or usr/lib/modules", tree.display()))
}

/// Fetches `package`'s .deb into `dir`.
fn download(source: &Source, package: &str, dir: &Path) -> anyhow::Result<()> {
    let mut command = Command::new("apt-get");
    if let Source::Pinned { suite, .. } = source {
        // A sources list, package lists and a cache of our own: the machine's apt is not touched.
        let apt = cache().join(format!("apt-{suite}"));
        for sub in ["lists/partial", "parts", "cache/archives/partial"] {
            std::fs::create_dir_all(apt.join(sub))?;
        }
        let list = apt.join("sources.list");
        std::fs::write(
            &list,
            format!(
                "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian {suite} main\n"
            ),
        )?;
        let options = [
            format!("Dir::Etc::SourceList={}", list.display()),
            format!("Dir::Etc::SourceParts={}", apt.join("parts").display()),
            format!("Dir::State::Lists={}", apt.join("lists").display()),
            format!("Dir::Cache={}", apt.join("cache").display()),
        ];
        for option in &options {
            command.args(["-o", option]);
        }
        let mut update = Command::new("apt-get");
        for option in &options {
            update.args(["-o", option]);
        }
        cmd::run(update.args(["update", "-qq"])).with_context(|| format!("the package lists of {suite}"))?;
    }
    cmd::run(command.args(["download", "-q", package]).current_dir(dir))
        .with_context(|| format!("downloading {package} (pinned in xtask/src/kernels/image.rs)"))
}

/// The image package `meta` depends on (`linux-image-6.1.0-54-amd64`).
fn resolve(meta: &str) -> anyhow::Result<String> {
    let depends = cmd::output(Command::new("apt-cache").args(["depends", "--important", meta]))?;
    depends
        .lines()
        .filter_map(|line| line.trim().strip_prefix("Depends: "))
        .find(|name| name.starts_with("linux-image-") && !name.contains('<'))
        .map(str::to_owned)
        .with_context(|| format!("no kernel image among {meta}'s dependencies (apt-get update first?): {depends}"))
}

/// The initramfs of `release`, whose modules are under `source`.
fn build_initrd(source: &Path, release: &str, to: &Path) -> anyhow::Result<()> {
    let root = to.with_extension("root");
    let _ = std::fs::remove_dir_all(&root);
    let modules = root.join("lib/modules").join(release);
    for dir in ["bin", "proc", "sys", "dev", "tmp"] {
        std::fs::create_dir_all(root.join(dir))?;
    }
    std::fs::create_dir_all(modules.join("kernel/drivers/net"))?;
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).context("busybox (busybox-static)")?;
    for applet in ["sh", "mount", "modprobe", "mkdir", "cp", "switch_root", "echo"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet))?;
    }
    for file in ["modules.builtin", "modules.order", "modules.builtin.modinfo"] {
        std::fs::copy(source.join(file), modules.join(file))?;
    }
    for dir in MODULE_DIRS {
        let from = source.join("kernel").join(dir);
        if from.exists() {
            let to = modules.join("kernel").join(dir);
            std::fs::create_dir_all(to.parent().expect("a parent"))?;
            cmd::run(Command::new("cp").arg("-r").arg(&from).arg(&to))?;
        }
    }
    for module in MODULE_FILES {
        for suffix in [".ko", ".ko.xz"] {
            let from = source.join("kernel/drivers/net").join(format!("{module}{suffix}"));
            if from.exists() {
                std::fs::copy(&from, modules.join("kernel/drivers/net").join(format!("{module}{suffix}")))?;
            }
        }
    }
    cmd::run(Command::new("depmod").arg("-b").arg(&root).arg(release))?;
    let init = root.join("init");
    std::fs::write(&init, INIT)?;
    std::fs::set_permissions(&init, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let archive = std::fs::File::create(to.with_extension("partial"))?;
    cmd::run(
        Command::new("sh")
            .args(["-c", "find . | busybox cpio -o -H newc 2>/dev/null"])
            .current_dir(&root)
            .stdout(archive),
    )?;
    std::fs::rename(to.with_extension("partial"), to)?;
    std::fs::remove_dir_all(&root)?;
    Ok(())
}
