//! A kernel booted with qemu on its initramfs, a script run inside as root, the serial console
//! read back. KVM is used only when asked (`TOPOLOGY_VM_ACCEL=kvm`): nested under another
//! hypervisor (this machine's kind) it hangs instead of failing, and emulation boots a kernel in
//! ~10 s.

use std::{
    io::Read as _,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::Context as _;

use super::image::{Prepared, cache};

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
