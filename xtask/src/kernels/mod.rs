//! The kernels people run, in virtual machines: Debian's 6.1 (Debian 12, Amazon Linux 2023, COS
//! and most LTS fleets) and 6.12 (Debian 13, RHEL 10) kernel packages, booted with qemu on an
//! initramfs of our own that mounts the host's tree read-only over 9p under a tmpfs overlay, so
//! the very test binaries this checkout built run inside as root; results come back on the serial
//! console. KVM is used only when asked (`TOPOLOGY_VM_ACCEL=kvm`): nested under another hypervisor
//! (this machine's kind) it hangs instead of failing, and emulation boots a kernel in ~10 s.
//! This machine's own 6.18 runs the whole root tier natively.

use std::{
    io::Read as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::cmd;

/// A kernel of the matrix: its label and the Debian package that names its newest build.
pub struct Kernel {
    /// `6.1`, `6.12`.
    pub label: &'static str,
    /// The meta-package whose dependency is the newest image of that series.
    meta: &'static str,
}

/// The kernels the VMs boot.
pub const KERNELS: [Kernel; 2] =
    [Kernel { label: "6.1", meta: "linux-image-amd64" }, Kernel { label: "6.12", meta: "linux-image-6.12-amd64" }];

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
    vmlinuz: PathBuf,
    initrd: PathBuf,
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

fn cache() -> PathBuf {
    crate::kubernetes::cache_root().join("kernels")
}

/// Downloads, unpacks and wraps each kernel of [`KERNELS`] (cached by package name: a second run
/// costs nothing), and the packages qemu needs.
pub fn ensure() -> anyhow::Result<Vec<Prepared>> {
    KERNELS.iter().map(prepare).collect()
}

fn prepare(kernel: &Kernel) -> anyhow::Result<Prepared> {
    let package = match resolve(kernel.meta) {
        Ok(package) => package,
        Err(_) => {
            // Package lists never fetched, or stale: once more after an update.
            cmd::run(Command::new("apt-get").args(["update", "-qq"]))?;
            resolve(kernel.meta)?
        }
    };
    let dir = cache().join(&package);
    let tree = dir.join("tree");
    if !tree.join("boot").exists() {
        std::fs::create_dir_all(&dir)?;
        eprintln!("kernels: downloading {package}");
        cmd::run(Command::new("apt-get").args(["download", "-q", &package]).current_dir(&dir))?;
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
    let release = std::fs::read_dir(tree.join("lib/modules"))?
        .filter_map(Result::ok)
        .find_map(|e| e.file_name().into_string().ok())
        .context("the package's modules")?;
    let initrd = dir.join("initrd.cpio");
    if !initrd.exists() {
        build_initrd(&tree, &release, &initrd)?;
    }
    Ok(Prepared { label: kernel.label, vmlinuz: tree.join(format!("boot/vmlinuz-{release}")), release, initrd })
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

fn build_initrd(tree: &Path, release: &str, to: &Path) -> anyhow::Result<()> {
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
    let source = tree.join("lib/modules").join(release);
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

/// What a VM said and how it ended.
pub struct Outcome {
    /// The script's exit status (`None`: the VM never said: it hung or crashed).
    pub status: Option<i32>,
    /// The console.
    pub console: String,
    /// How long the VM ran.
    pub elapsed: Duration,
}

/// Boots `kernel` and runs `script` (sh, in the host's tree, as root) within `timeout`.
pub fn run(kernel: &Prepared, script: &str, timeout: Duration) -> anyhow::Result<Outcome> {
    let out = cache().join(format!("run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("script.sh"), script)?;
    let kvm = std::env::var("TOPOLOGY_VM_ACCEL").is_ok_and(|accel| accel == "kvm");
    let mut command = Command::new("qemu-system-x86_64");
    if kvm {
        command.args(["-accel", "kvm", "-cpu", "host"]);
    } else {
        command.args(["-accel", "tcg,thread=multi", "-cpu", "max"]);
    }
    command
        .args(["-m", "2048", "-smp", "2", "-display", "none", "-serial", "stdio", "-no-reboot", "-nodefaults"])
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(&kernel.initrd)
        .args(["-append", "console=ttyS0 panic=-1 quiet"])
        .args(["-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"])
        .arg("-virtfs")
        .arg(format!("local,path={},mount_tag=out,security_model=none", out.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let started = Instant::now();
    let mut child = command.spawn().context("qemu-system-x86_64 (qemu-system-x86)")?;
    let mut stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut console = String::new();
        let _ = stdout.read_to_string(&mut console);
        console
    });
    while child.try_wait()?.is_none() {
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let console = reader.join().unwrap_or_default();
    let _ = std::fs::remove_dir_all(&out);
    let status = console.lines().rev().find_map(|line| line.trim().strip_prefix("VM-EXIT: ")?.parse().ok());
    Ok(Outcome { status, console, elapsed: started.elapsed() })
}

/// The executables of `tests/tests/<name>.rs`, built.
pub fn test_binaries(names: &[&str]) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let mut command = cmd::cargo();
    command.args(["test", "-p", "topology-tests", "--bins", "--no-run", "--message-format=json"]);
    for name in names {
        command.args(["--test", name]);
    }
    let json = cmd::output(command.current_dir(cmd::workspace_root()))?;
    let mut found = Vec::new();
    for line in json.lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let (Some(name), Some(executable)) = (message["target"]["name"].as_str(), message["executable"].as_str())
        else {
            continue;
        };
        if names.contains(&name) && message["target"]["kind"][0] == "test" {
            found.push((name.to_owned(), PathBuf::from(executable)));
        }
    }
    if found.len() != names.len() {
        bail!("built {found:?}, wanted {names:?}");
    }
    Ok(found)
}

/// The script that runs `tests` (a binary and its filters) one at a time, with the helpers beside
/// them, and prints each one's summary.
pub fn script(tests: &[(PathBuf, Vec<&str>)]) -> String {
    let root = cmd::workspace_root();
    let mut script = format!(
        "cd {root}\nexport TOPOLOGY_PROBE={probe}\nstatus=0\necho \"KERNEL: $(uname -r)\"\n",
        root = root.display(),
        probe = root.join("target/debug/topology-probe").display(),
    );
    for (binary, filters) in tests {
        script.push_str(&format!(
            "{} --test-threads=1 --nocapture {} > /tmp/out 2>&1; r=$?; grep -aE '^test |FEATURES: | WARN |panicked|test result' /tmp/out | cut -c1-400; [ $r = 0 ] || status=1\n",
            binary.display(),
            filters.join(" ")
        ));
    }
    script.push_str("exit $status\n");
    script
}

/// The datapath's root tests that apply on every kernel: connect rewrite (TCP and UDP, IPv4, IPv6,
/// v4-mapped), UDP replies from the ClusterIP, no backends refused, atomic swaps under load.
const DATAPATH: &str = "datapath";
/// What the loader's probes took on this kernel, against what its release says they should (the
/// `FEATURES:` line of the table), with a connect through all of them.
const FEATURES: &str = "kernel_features";
/// What CI runs in each kernel besides [`FEATURES`]: the programs load and attach, one set is
/// programmed and connects land on it; an empty set refuses.
const SMOKE: [&str; 2] = ["tcp_ipv4_lands_on_every_backend", "an_empty_set_refuses_tcp_and_udp"];

/// One kernel's row.
struct Row {
    label: &'static str,
    release: String,
    seconds: f64,
    passed: usize,
    failed: usize,
    features: String,
}

/// Runs the kernel tests in a VM of each kernel (`full`: every datapath test; else [`SMOKE`]),
/// prints the matrix and, when `full`, writes it into `docs/operating.md`; an error when any test
/// fails in any kernel.
pub fn matrix(full: bool) -> anyhow::Result<()> {
    let kernels = ensure()?;
    let binaries = test_binaries(&[DATAPATH, FEATURES])?;
    let binary = |name: &str| binaries.iter().find(|(n, _)| n == name).map(|(_, path)| path.clone()).expect("built");
    let filters: Vec<&str> = if full { Vec::new() } else { SMOKE.to_vec() };
    let script = script(&[(binary(FEATURES), Vec::new()), (binary(DATAPATH), filters)]);
    let mut failed = Vec::new();
    let mut rows = Vec::new();
    for kernel in &kernels {
        let outcome = run(kernel, &script, Duration::from_secs(if full { 2400 } else { 600 }))?;
        // From the summaries ("test result: ok. 2 passed; 0 failed; ..."): with --nocapture a
        // test's own line may be split by what it prints.
        let count = |word: &str| -> usize {
            let summaries = outcome.console.lines().filter_map(|l| l.split_once("test result: ").map(|s| s.1));
            summaries
                .filter_map(|summary| {
                    summary
                        .split("; ")
                        .find_map(|part| part.trim_start_matches(|c: char| !c.is_ascii_digit()).strip_suffix(word))
                })
                .filter_map(|n| n.trim().parse::<usize>().ok())
                .sum()
        };
        let features = outcome
            .console
            .lines()
            .find_map(|line| line.split_once("FEATURES: ").map(|(_, rest)| rest.split_once(' ').map_or(rest, |r| r.1)))
            .unwrap_or("(not reported)")
            .to_owned();
        rows.push(Row {
            label: kernel.label,
            release: kernel.release.clone(),
            seconds: outcome.elapsed.as_secs_f64(),
            passed: count(" passed"),
            failed: count(" failed"),
            features,
        });
        if outcome.status != Some(0) {
            eprintln!("--- kernel {} ({}):\n{}", kernel.label, kernel.release, outcome.console);
            failed.push(kernel.label);
        }
    }
    let table = table(&rows);
    eprintln!("kernel matrix ({}):\n{table}", if full { "every datapath test" } else { "load and connect" });
    if full && failed.is_empty() {
        write_table(&table)?;
    }
    if !failed.is_empty() {
        bail!("the kernel tests failed on {failed:?}");
    }
    Ok(())
}

/// The matrix as a Markdown table.
fn table(rows: &[Row]) -> String {
    let mut table = String::from(
        "| Kernel | Release | Tests passed | Failed | Seconds (emulated) | What the probes took |\n| --- | --- | --- | --- | --- | --- |\n",
    );
    for row in rows {
        table.push_str(&format!(
            "| {} | `{}` | {} | {} | {:.0} | {} |\n",
            row.label, row.release, row.passed, row.failed, row.seconds, row.features
        ));
    }
    table
}

/// Puts `table` between the kernel matrix's markers of `docs/operating.md`.
fn write_table(table: &str) -> anyhow::Result<()> {
    const BEGIN: &str = "<!-- kernel-matrix:begin (cargo xtask kernels --full) -->\n";
    const END: &str = "<!-- kernel-matrix:end -->";
    let path = cmd::workspace_root().join("docs/operating.md");
    let text = std::fs::read_to_string(&path)?;
    let (Some(begin), Some(end)) = (text.find(BEGIN), text.find(END)) else {
        bail!("{}: no kernel matrix markers", path.display());
    };
    let text = format!("{}{BEGIN}{table}{}", &text[..begin], &text[end..]);
    std::fs::write(&path, text)?;
    eprintln!("kernels: the matrix written into {}", path.display());
    Ok(())
}
