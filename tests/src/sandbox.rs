//! Kernel state a test owns and always gives back: a child cgroup, network namespaces, a pin
//! directory and processes, each behind a guard whose `Drop` removes it, on panic too. Names carry
//! the creating process id, so state left by a killed run is recognised and swept by the next one.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command},
    sync::{
        Once,
        atomic::{AtomicU32, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use topology_dataplane::mounts;

/// Prefix of every test-made object's name; followed by the pid, `x` and a sequence number.
pub const PREFIX: &str = "tt";

/// True when running as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Returns early from a test that needs root, saying why.
#[macro_export]
macro_rules! require_root {
    () => {
        if !$crate::sandbox::is_root() {
            eprintln!(
                "SKIPPED {}: needs root (BPF programs, cgroups and network namespaces); run `cargo xtask test` as root",
                module_path!()
            );
            return;
        }
    };
}

/// A fresh name unique to this process: `tt<pid>x<seq>`.
/// True if `program` is on the PATH.
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

pub fn unique_id() -> String {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    sweep_stale_once();
    format!("{PREFIX}{}x{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed))
}

/// Runs a command, panicking with its stderr if it fails.
pub fn run(program: &str, args: &[&str]) -> String {
    let output =
        Command::new(program).args(args).output().unwrap_or_else(|e| panic!("{program} {}: {e}", args.join(" ")));
    assert!(
        output.status.success(),
        "{program} {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A child cgroup of the cgroup v2 root, removed with everything in it.
#[derive(Debug)]
pub struct CgroupGuard {
    path: PathBuf,
}

impl CgroupGuard {
    /// Creates `<cgroup2 root>/<name>`.
    pub fn new(name: &str) -> Self {
        let root = mounts::cgroup2_root().expect("cgroup v2 mount");
        let path = root.join(name);
        fs::create_dir(&path).unwrap_or_else(|e| panic!("creating cgroup {}: {e}", path.display()));
        Self { path }
    }

    /// The cgroup directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for CgroupGuard {
    fn drop(&mut self) {
        remove_cgroup(&self.path);
    }
}

/// Kills every process in the cgroup and removes it, waiting up to five seconds.
fn remove_cgroup(path: &Path) {
    // cgroup.kill (Linux 5.14+) kills the whole subtree at once.
    let _ = fs::write(path.join("cgroup.kill"), "1");
    let deadline = Instant::now() + Duration::from_secs(5);
    while fs::remove_dir(path).is_err() && path.exists() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
}

/// A network namespace made with `ip netns add`.
#[derive(Debug)]
pub struct NetnsGuard {
    name: String,
}

impl NetnsGuard {
    /// Creates the namespace with its loopback up.
    pub fn new(name: &str) -> Self {
        run("ip", &["netns", "add", name]);
        let guard = Self { name: name.to_owned() };
        run("ip", &["-n", name, "link", "set", "lo", "up"]);
        guard
    }

    /// The namespace name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

/// A pin directory under /sys/fs/bpf, cleaned up (links detached, pins removed) on drop.
#[derive(Debug)]
pub struct PinGuard {
    path: PathBuf,
}

impl PinGuard {
    /// Reserves `/sys/fs/bpf/<name>`; the dataplane creates it.
    pub fn new(name: &str) -> Self {
        ensure_bpffs();
        Self { path: Path::new("/sys/fs/bpf").join(name) }
    }

    /// The pin directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for PinGuard {
    fn drop(&mut self) {
        if let Err(error) = topology_dataplane::cleanup(&self.path) {
            eprintln!("cleaning up {}: {error}", self.path.display());
        }
    }
}

/// A child process killed and reaped on drop.
#[derive(Debug)]
pub struct ProcessGuard {
    child: Child,
}

impl ProcessGuard {
    /// Guards `child`.
    pub fn new(child: Child) -> Self {
        Self { child }
    }

    /// Spawns `command` with its stdout piped and waits for its first line, which must be
    /// `ready` (a server bound and listening); `what` names it in the failure.
    pub fn spawn_ready(command: &mut Command, what: &str) -> Self {
        use std::io::BufRead as _;
        let child = command.stdout(std::process::Stdio::piped()).spawn();
        let mut process = Self::new(child.unwrap_or_else(|e| panic!("spawning {what}: {e}")));
        let stdout = process.child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        std::io::BufReader::new(stdout).read_line(&mut line).unwrap_or_else(|e| panic!("{what}'s first line: {e}"));
        assert_eq!(line.trim(), "ready", "{what} did not start");
        process
    }

    /// The guarded process.
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Reads the process's whole stdout (piped) until it exits, at most `within`: a process still
    /// running then is killed, and the test fails.
    pub fn wait_output(mut self, within: Duration) -> Vec<u8> {
        use std::io::Read as _;
        let mut stdout = self.child.stdout.take().expect("a piped stdout");
        let reader = std::thread::spawn(move || {
            let mut out = Vec::new();
            let _ = stdout.read_to_end(&mut out);
            out
        });
        let deadline = std::time::Instant::now() + within;
        while self.child.try_wait().ok().flatten().is_none() {
            assert!(std::time::Instant::now() < deadline, "the process did not end within {within:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        reader.join().expect("stdout reader")
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ProcessGuard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Pins every thread of the process `pid` to `cpus` (a `taskset` list such as `0-2`); the
/// threads it starts later inherit it.
pub fn pin_process(pid: u32, cpus: &str) {
    run("taskset", &["-a", "-p", "-c", cpus, &pid.to_string()]);
}

/// Pins the calling thread to `cpu`; the threads and processes it starts later inherit it.
pub fn pin_this_thread(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET and sched_setaffinity read and write
    // only the set passed, whose size is given.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set),
            0,
            "pinning to CPU {cpu}: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Makes the child process join `cgroup` between fork and exec, so it starts inside it.
pub fn join_cgroup_on_spawn(command: &mut Command, cgroup: &Path) {
    use std::os::unix::{ffi::OsStrExt as _, process::CommandExt as _};
    let procs = std::ffi::CString::new(cgroup.join("cgroup.procs").as_os_str().as_bytes()).expect("cgroup path");
    // SAFETY: between fork and exec only async-signal-safe calls run: open, write, close on a
    // path prepared before the fork; "0" names the writing process itself.
    unsafe {
        command.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let written = libc::write(fd, b"0".as_ptr().cast(), 1);
            libc::close(fd);
            if written != 1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Mounts bpffs at /sys/fs/bpf if nothing is mounted there (`cargo xtask setup` does the same).
pub fn ensure_bpffs() {
    let dir = Path::new("/sys/fs/bpf");
    if !mounts::is_bpffs(dir).unwrap_or(false) {
        run("mount", &["-t", "bpf", "bpf", "/sys/fs/bpf"]);
    }
}

fn sweep_stale_once() {
    static SWEEP: Once = Once::new();
    SWEEP.call_once(|| {
        if is_root() {
            let _ = sweep_stale();
        }
    });
}

/// Removes namespaces, cgroups (and the processes in them), pin directories and scratch
/// directories left by runs whose process is gone; returns how many objects it removed.
pub fn sweep_stale() -> usize {
    let mut removed = 0;
    let dead = |name: &str| -> bool {
        let Some(rest) = name.strip_prefix(PREFIX) else {
            return false;
        };
        let Some((pid, _)) = rest.split_once('x') else {
            return false;
        };
        pid.parse::<u32>().is_ok_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
    };
    let pins = Path::new("/sys/fs/bpf");
    if let Ok(entries) = fs::read_dir(pins) {
        for entry in entries.flatten() {
            if dead(&entry.file_name().to_string_lossy()) {
                let _ = topology_dataplane::cleanup(&entry.path());
                removed += 1;
            }
        }
    }
    if let Ok(root) = mounts::cgroup2_root()
        && let Ok(entries) = fs::read_dir(&root)
    {
        for entry in entries.flatten() {
            if dead(&entry.file_name().to_string_lossy()) {
                remove_cgroup(&entry.path());
                removed += 1;
            }
        }
    }
    // Scratch directories (a cluster's etcd data, certificates and logs among them).
    if let Ok(entries) = fs::read_dir(std::env::temp_dir()) {
        for entry in entries.flatten() {
            if dead(&entry.file_name().to_string_lossy()) && entry.path().is_dir() {
                let _ = fs::remove_dir_all(entry.path());
                removed += 1;
            }
        }
    }
    if let Ok(output) = Command::new("ip").args(["netns", "list"]).output() {
        for line in String::from_utf8_lossy(&output.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or_default();
            if dead(name) {
                let _ = Command::new("ip").args(["netns", "del", name]).output();
                removed += 1;
            }
        }
    }
    removed
}
