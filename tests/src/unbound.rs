//! unbound, the caching resolver, as the anchor of the DNS benchmark's relayed names: started in
//! a test namespace, forwarding every name to the same stand-in upstream as the responder, on the
//! same CPUs, its caches as large as the responder's.

use std::{
    net::SocketAddr,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::sandbox::ProcessGuard;

/// Starts unbound in `netns` on `listen`, forwarding to `upstream`, with `threads` threads, pinned
/// to `cpus` (a `taskset` list); its files under `dir`. Waits until it answers.
pub fn start(
    netns: &str,
    listen: SocketAddr,
    upstream: SocketAddr,
    threads: usize,
    cpus: &str,
    dir: &Path,
) -> ProcessGuard {
    let config = dir.join("unbound.conf");
    let text = format!(
        "server:\n  interface: {ip}@{port}\n  port: {port}\n  access-control: 0.0.0.0/0 allow\n  do-daemonize: no\n  \
         username: \"\"\n  chroot: \"\"\n  directory: \"{dir}\"\n  pidfile: \"\"\n  use-syslog: no\n  logfile: \"\"\n  \
         verbosity: 0\n  num-threads: {threads}\n  so-reuseport: yes\n  do-ip6: no\n  module-config: \"iterator\"\n  \
         qname-minimisation: no\n  do-not-query-localhost: no\n  prefetch: yes\n  msg-cache-size: 16m\n  \
         rrset-cache-size: 32m\n  num-queries-per-thread: 4096\n  outgoing-range: 8192\n\
         forward-zone:\n  name: \".\"\n  forward-addr: {up}@{up_port}\n",
        ip = listen.ip(),
        port = listen.port(),
        dir = dir.display(),
        up = upstream.ip(),
        up_port = upstream.port(),
    );
    std::fs::write(&config, text).expect("unbound.conf");
    let check = Command::new("unbound-checkconf").arg(&config).output().expect("unbound-checkconf (cargo xtask setup)");
    assert!(check.status.success(), "unbound.conf: {}", String::from_utf8_lossy(&check.stdout));
    let child = Command::new("ip")
        .args(["netns", "exec", netns, "taskset", "-c", cpus, "unbound", "-d", "-c"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("unbound (cargo xtask setup installs it)");
    let guard = ProcessGuard::new(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while crate::dns::dig(Some(netns), listen, "ready.example.com", "A", &[]).status != "NOERROR" {
        assert!(Instant::now() < deadline, "unbound did not answer within 10 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    guard
}
