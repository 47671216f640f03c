//! The real agent binary as a child process: started with a cluster file, a cgroup and a pin
//! directory, observed through its HTTP endpoints, stopped with SIGTERM or SIGKILL.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    path::Path,
    process::{Command, ExitStatus, Stdio},
    thread,
    time::{Duration, Instant},
};

use crate::{net::agent_binary, sandbox::ProcessGuard};

/// A running agent.
#[derive(Debug)]
pub struct Agent {
    process: ProcessGuard,
    /// Its /healthz, /readyz and /metrics address.
    pub http: SocketAddr,
    /// The network namespace it runs in, if not the test's.
    netns: Option<String>,
}

/// How to start the agent.
#[derive(Clone, Debug)]
pub struct AgentOptions<'a> {
    /// Cluster file (`--cluster`); with `kubeconfig` unset, required.
    pub cluster: &'a Path,
    /// Kubeconfig (`--kubeconfig`) instead of a cluster file.
    pub kubeconfig: Option<&'a Path>,
    /// Network namespace the agent runs in (its HTTP address is inside it).
    pub netns: Option<&'a str>,
    /// More arguments of `run`.
    pub extra: Vec<String>,
    /// A command the agent runs under (`capsh ... --`), its arguments ending where the agent's
    /// path goes.
    pub wrapper: Vec<String>,
    /// Node name.
    pub node: &'a str,
    /// cgroup to attach to.
    pub cgroup: &'a Path,
    /// Pin directory.
    pub pins: &'a Path,
    /// File to append the agent's log to (default: the test's stderr).
    pub log: Option<&'a Path>,
    /// cgroup the agent process itself joins (default: the caller's).
    pub home: Option<&'a Path>,
    /// `--metrics-addr` (default: a free port on 127.0.0.1).
    pub metrics_addr: Option<SocketAddr>,
}

impl<'a> AgentOptions<'a> {
    /// Options for an agent reading `cluster` as `node`, attached to `cgroup`, pinning under
    /// `pins`; everything else as the agent defaults it.
    pub fn new(cluster: &'a Path, node: &'a str, cgroup: &'a Path, pins: &'a Path) -> Self {
        Self {
            cluster,
            kubeconfig: None,
            netns: None,
            extra: Vec::new(),
            wrapper: Vec::new(),
            node,
            cgroup,
            pins,
            log: None,
            home: None,
            metrics_addr: None,
        }
    }
}

impl Agent {
    /// Starts the agent (stderr goes to the test's stderr).
    pub fn start(options: &AgentOptions<'_>) -> Self {
        let http = options.metrics_addr.unwrap_or_else(free_port);
        let mut command = match options.wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(agent_binary());
                command
            }
            None => Command::new(agent_binary()),
        };
        command.arg("run");
        match options.kubeconfig {
            Some(kubeconfig) => command.arg("--kubeconfig").arg(kubeconfig),
            None => command.arg("--cluster").arg(options.cluster),
        };
        command
            .args(["--node", options.node])
            .arg("--cgroup")
            .arg(options.cgroup)
            .arg("--pin-path")
            .arg(options.pins)
            .args(["--metrics-addr", &http.to_string()])
            .args(&options.extra)
            .stdout(Stdio::null());
        if let Some(log) = options.log {
            let file = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("agent log file");
            command.stderr(file);
        }
        if let Some(home) = options.home {
            crate::sandbox::join_cgroup_on_spawn(&mut command, home);
        }
        if let Some(netns) = options.netns {
            crate::netns::enter_on_spawn(&mut command, netns);
        }
        let child = command.spawn().expect("spawn topology-agent");
        Self { process: ProcessGuard::new(child), http, netns: options.netns.map(str::to_owned) }
    }

    /// Waits until /readyz answers 200, or panics after `timeout` with the last answer.
    pub fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.process.child().try_wait() {
                panic!("agent exited before it was ready: {status}");
            }
            match self.get("/readyz") {
                Ok((200, _)) => return,
                Ok((status, body)) => last = format!("{status} {body}"),
                Err(error) => last = error.to_string(),
            }
            thread::sleep(Duration::from_millis(50));
        }
        panic!("agent not ready after {timeout:?}: {last}");
    }

    /// GET `path` on the agent's HTTP address: (status, body).
    pub fn get(&self, path: &str) -> std::io::Result<(u16, String)> {
        let (addr, path) = (self.http, path.to_owned());
        match &self.netns {
            Some(netns) => crate::netns::run_in(netns, move || get(addr, &path)),
            None => get(addr, &path),
        }
    }

    /// Whether the agent says its kernel runs `feature`'s programs
    /// (`topology_agent_kernel_feature`).
    pub fn kernel_feature(&self, feature: &str) -> bool {
        let (_, text) = self.get("/metrics").expect("GET /metrics");
        let series = format!("topology_agent_kernel_feature{{feature=\"{feature}\"}} ");
        match text.lines().find_map(|line| line.strip_prefix(&series)) {
            Some(value) => value.trim() == "1",
            None => panic!("no {series} in /metrics:\n{text}"),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.process.id()
    }

    /// Its memory and CPU time so far.
    pub fn usage(&self) -> Usage {
        Usage::of(self.process.id())
    }

    /// Sends a signal.
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill with a pid we own (the child is not reaped until we wait on it).
        unsafe { libc::kill(self.process.id() as i32, signal) };
    }

    /// Waits for the process to exit, up to `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.process.child().try_wait().expect("wait for the agent") {
                return status;
            }
            assert!(Instant::now() < deadline, "agent still running after {timeout:?}");
            thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A free TCP port on 127.0.0.1 (bound and released; the agent binds it right after).
fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port")
}

/// A minimal HTTP/1.0 GET.
pub fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default();
    Ok((status, body))
}

/// What a process uses, from `/proc/<pid>/status` and `/proc/<pid>/stat`.
#[derive(Clone, Copy, Debug)]
pub struct Usage {
    /// Resident memory, MiB.
    pub rss_mib: f64,
    /// The highest resident memory so far, MiB.
    pub peak_mib: f64,
    /// CPU time, user and system, so far.
    pub cpu: Duration,
}

impl Usage {
    /// Reads `pid`'s usage; panics if it is gone.
    pub fn of(pid: u32) -> Self {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("process status");
        let kib = |name: &str| -> f64 {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next()?.parse::<f64>().ok())
                .expect("a memory field")
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("process stat");
        // After the command name in parentheses: state is field 3, utime 14 and stime 15.
        let fields: Vec<&str> =
            stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or_default().split_whitespace().collect();
        let ticks = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok()).expect("a CPU field");
        // SAFETY: sysconf has no preconditions.
        let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        Self {
            rss_mib: kib("VmRSS:") / 1024.0,
            peak_mib: kib("VmHWM:") / 1024.0,
            cpu: Duration::from_secs_f64((ticks(14) + ticks(15)) as f64 / per_second),
        }
    }
}
