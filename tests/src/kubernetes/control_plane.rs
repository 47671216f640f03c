//! etcd, kube-apiserver and kube-controller-manager as processes in the control plane's network
//! namespace and a cgroup of their own (so a crashed run's processes are killed by the next run's
//! sweep with the cgroup), flagged the way kubeadm and envtest start them: TLS, client
//! certificates, Node and RBAC authorization, NodeRestriction on top of the default admission
//! plugins, service-account tokens signed by the cluster's key, and only the controllers the
//! agent's objects depend on.

use std::{
    fs,
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::Stdio,
    thread,
    time::{Duration, Instant},
};

use super::{
    binaries::Binaries,
    kubeconfig::{self, Credentials},
    pki::{CertFiles, Pki},
};
use crate::{
    netns,
    sandbox::{CgroupGuard, ProcessGuard, join_cgroup_on_spawn},
};

/// The ClusterIP range the API server allocates from (`kubernetes` gets its first address).
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The IPv6 ClusterIP range (the cluster is dual-stack; a Service is IPv4 unless it asks).
pub const SERVICE_CIDR_V6: &str = "fd00:96::/108";
/// The port the API server serves on.
pub const API_PORT: u16 = 6443;
/// etcd's client address, on the control plane namespace's loopback.
const ETCD: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 2379);

/// The controllers the agent's objects depend on: the EndpointSlice controller writes every slice
/// and hint the agent reads, the mirroring controller the slices of selectorless Services, the
/// namespace and garbage collectors clean up after the tests, the service-account controllers give
/// the deploy's ServiceAccount its tokens and every namespace its CA, and the quota controller
/// keeps deploy/'s ResourceQuota's status, without which quota admission refuses the agent's pods.
const CONTROLLERS: [&str; 8] = [
    "endpointslice-controller",
    "endpointslice-mirroring-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "resourcequota-controller",
];

/// The API server's audit policy: the agents' requests at `Metadata` (who, what, the URI with its
/// resourceVersion, the answer's code), nothing else.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    userGroups: [\"system:serviceaccounts:topology-agent\"]
  - level: None
";

/// A control-plane component.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    /// etcd.
    Etcd,
    /// kube-apiserver.
    ApiServer,
    /// kube-controller-manager.
    ControllerManager,
}

impl Component {
    /// The binary's name.
    pub fn binary(self) -> &'static str {
        match self {
            Component::Etcd => "etcd",
            Component::ApiServer => "kube-apiserver",
            Component::ControllerManager => "kube-controller-manager",
        }
    }
}

/// The running control plane's processes and the files they read.
pub struct ControlPlane {
    binaries: Binaries,
    dir: PathBuf,
    netns: String,
    address: Ipv4Addr,
    ca: CertFiles,
    service_account_key: PathBuf,
    service_account_public: PathBuf,
    serving: CertFiles,
    controller_manager_kubeconfig: PathBuf,
    etcd: Option<ProcessGuard>,
    apiserver: Option<ProcessGuard>,
    controller_manager: Option<ProcessGuard>,
    // Declared last: dropped after the processes above are killed and reaped.
    cgroup: CgroupGuard,
}

impl ControlPlane {
    /// Prepares the files of a control plane serving on `address` in the namespace `netns`;
    /// starts nothing.
    pub fn new(binaries: Binaries, dir: &Path, netns: &str, address: Ipv4Addr, pki: &Pki, cgroup: CgroupGuard) -> Self {
        let service_ip: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);
        let serving = pki.serving(
            "apiserver",
            &[address.into(), service_ip.into(), Ipv4Addr::LOCALHOST.into()],
            &["kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"],
        );
        let manager = pki.client("controller-manager", "system:kube-controller-manager", None);
        let controller_manager_kubeconfig = dir.join("controller-manager.kubeconfig");
        kubeconfig::write(
            &controller_manager_kubeconfig,
            &server_url(address),
            &pki.ca.cert,
            "system:kube-controller-manager",
            &Credentials::Certificate(manager),
        );
        fs::create_dir_all(dir.join("logs")).expect("logs directory");
        fs::write(dir.join("audit-policy.yaml"), AUDIT_POLICY).expect("audit policy");
        Self {
            binaries,
            dir: dir.to_path_buf(),
            netns: netns.to_owned(),
            address,
            ca: pki.ca.clone(),
            service_account_key: pki.service_account_key.clone(),
            service_account_public: pki.service_account_public.clone(),
            serving,
            controller_manager_kubeconfig,
            etcd: None,
            apiserver: None,
            controller_manager: None,
            cgroup,
        }
    }

    /// The API server's URL, reachable from every namespace on the fabric.
    pub fn server(&self) -> String {
        server_url(self.address)
    }

    /// The namespace the control plane runs in.
    pub fn netns(&self) -> &str {
        &self.netns
    }

    /// The API server's audit log: every request of the agents' ServiceAccount, one JSON line
    /// per stage (what the agent asks of the API server, in the API server's own words).
    pub fn audit_log(&self) -> PathBuf {
        self.dir.join("logs").join("audit.jsonl")
    }

    /// The log file of a component.
    pub fn log(&self, component: Component) -> PathBuf {
        self.dir.join("logs").join(format!("{}.log", component.binary()))
    }

    /// Starts a component (it must not be running) and waits until etcd answers its health check;
    /// the API server's and the controller manager's readiness are the cluster's to check.
    pub fn start(&mut self, component: Component) {
        let args = match component {
            Component::Etcd => self.etcd_args(),
            Component::ApiServer => self.apiserver_args(),
            Component::ControllerManager => self.controller_manager_args(),
        };
        let process = self.spawn(component, &args);
        let slot = self.slot(component);
        assert!(slot.is_none(), "{} is already running", component.binary());
        *slot = Some(process);
        if component == Component::Etcd {
            self.wait_etcd_healthy(Duration::from_secs(30));
        }
    }

    /// Stops a component with SIGTERM (as a node's reboot or a static pod's update does), waiting
    /// for it to exit; SIGKILL after 20 s.
    pub fn stop(&mut self, component: Component) {
        let Some(mut process) = self.slot(component).take() else { return };
        // SAFETY: kill with the pid of a child we have not reaped.
        unsafe { libc::kill(process.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while process.child().try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(50));
        }
        drop(process);
    }

    /// Whether a component's process is running.
    pub fn running(&mut self, component: Component) -> bool {
        self.slot(component).as_mut().is_some_and(|process| process.child().try_wait().ok().flatten().is_none())
    }

    /// Moves etcd's revision past every resourceVersion a client has seen (a write to a key
    /// outside `/registry/`, which the API server never reads), then compacts its history up to
    /// it (what the API server does every five minutes): a watch from any resourceVersion handed
    /// out before can only get 410 Gone. Returns the revision.
    pub fn compact_etcd(&self) -> u64 {
        // Key and value in base64: `/topology-e2e/revision`, `1`.
        let put = r#"{"key":"L3RvcG9sb2d5LWUyZS9yZXZpc2lvbg==","value":"MQ=="}"#;
        let range = etcd_post(&self.netns, "/v3/kv/put", put);
        let revision: u64 = range["header"]["revision"]
            .as_str()
            .and_then(|text| text.parse().ok())
            .unwrap_or_else(|| panic!("etcd's put answer has no revision: {range}"));
        etcd_post(&self.netns, "/v3/kv/compaction", &format!(r#"{{"revision":"{revision}","physical":true}}"#));
        revision
    }

    fn slot(&mut self, component: Component) -> &mut Option<ProcessGuard> {
        match component {
            Component::Etcd => &mut self.etcd,
            Component::ApiServer => &mut self.apiserver,
            Component::ControllerManager => &mut self.controller_manager,
        }
    }

    fn spawn(&self, component: Component, args: &[String]) -> ProcessGuard {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log(component))
            .unwrap_or_else(|e| panic!("{}'s log: {e}", component.binary()));
        let mut command = self.binaries.command(component.binary());
        command.args(args).stdin(Stdio::null()).stdout(log.try_clone().expect("log")).stderr(log);
        netns::enter_on_spawn(&mut command, &self.netns);
        join_cgroup_on_spawn(&mut command, self.cgroup.path());
        ProcessGuard::new(command.spawn().unwrap_or_else(|e| panic!("starting {}: {e}", component.binary())))
    }

    fn etcd_args(&self) -> Vec<String> {
        let data = self.dir.join("etcd");
        let client = format!("http://{ETCD}");
        let peer = "http://127.0.0.1:2380";
        owned(&[
            "--name=control-plane",
            &format!("--data-dir={}", data.display()),
            &format!("--listen-client-urls={client}"),
            &format!("--advertise-client-urls={client}"),
            &format!("--listen-peer-urls={peer}"),
            &format!("--initial-advertise-peer-urls={peer}"),
            &format!("--initial-cluster=control-plane={peer}"),
            // A test's etcd loses nothing it needs on a crash; fsync would only make it slow.
            "--unsafe-no-fsync",
            "--log-level=warn",
        ])
    }

    fn apiserver_args(&self) -> Vec<String> {
        let key = self.service_account_key.display();
        owned(&[
            &format!("--etcd-servers=http://{ETCD}"),
            "--bind-address=0.0.0.0",
            &format!("--secure-port={API_PORT}"),
            &format!("--advertise-address={}", self.address),
            &format!("--tls-cert-file={}", self.serving.cert.display()),
            &format!("--tls-private-key-file={}", self.serving.key.display()),
            &format!("--client-ca-file={}", self.ca.cert.display()),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            &format!("--service-account-key-file={}", self.service_account_public.display()),
            &format!("--service-account-signing-key-file={key}"),
            "--authorization-mode=Node,RBAC",
            // The default plugins, and the one kubeadm adds: a node may only touch its own objects.
            "--enable-admission-plugins=NodeRestriction",
            &format!("--service-cluster-ip-range={SERVICE_CIDR},{SERVICE_CIDR_V6}"),
            "--allow-privileged=true",
            &format!("--cert-dir={}", self.dir.join("apiserver").display()),
            &format!("--audit-policy-file={}", self.dir.join("audit-policy.yaml").display()),
            &format!("--audit-log-path={}", self.audit_log().display()),
            "--audit-log-format=json",
            "--profiling=false",
            "--v=1",
        ])
    }

    fn controller_manager_args(&self) -> Vec<String> {
        let kubeconfig = self.controller_manager_kubeconfig.display();
        owned(&[
            &format!("--kubeconfig={kubeconfig}"),
            &format!("--authentication-kubeconfig={kubeconfig}"),
            &format!("--authorization-kubeconfig={kubeconfig}"),
            &format!("--controllers={}", CONTROLLERS.join(",")),
            &format!("--service-account-private-key-file={}", self.service_account_key.display()),
            &format!("--root-ca-file={}", self.ca.cert.display()),
            // Each controller with its own service account's rights, as kubeadm runs it.
            "--use-service-account-credentials=true",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            "--secure-port=10257",
            "--v=1",
        ])
    }

    fn wait_etcd_healthy(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let answer = netns::run_in(&self.netns, || http(ETCD, "GET", "/health", None));
            if let Ok((200, body)) = &answer
                && body.contains("\"health\":\"true\"")
            {
                return;
            }
            assert!(self.running(Component::Etcd), "etcd exited; see {}", self.log(Component::Etcd).display());
            assert!(Instant::now() < deadline, "etcd not healthy after {timeout:?}: {answer:?}");
            thread::sleep(Duration::from_millis(100));
        }
    }
}

/// `https://ADDRESS:6443`.
pub fn server_url(address: Ipv4Addr) -> String {
    format!("https://{address}:{API_PORT}")
}

/// A POST to etcd's JSON gateway, its answer.
fn etcd_post(netns_name: &str, path: &'static str, body: &str) -> serde_json::Value {
    let body = body.to_owned();
    let answer = netns::run_in(netns_name, move || http(ETCD, "POST", path, Some(&body)));
    match answer {
        Ok((200, text)) => serde_json::from_str(&text).unwrap_or_else(|e| panic!("etcd {path}: {e}: {text}")),
        other => panic!("etcd {path}: {other:?}"),
    }
}

/// A minimal HTTP/1.0 exchange: (status, body).
fn http(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let body = body.unwrap_or_default();
    write!(stream, "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n{body}", body.len())?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default();
    Ok((status, body))
}

fn owned(args: &[&str]) -> Vec<String> {
    args.iter().map(|arg| (*arg).to_owned()).collect()
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane").field("dir", &self.dir).field("netns", &self.netns).finish_non_exhaustive()
    }
}
