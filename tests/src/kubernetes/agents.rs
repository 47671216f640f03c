//! The agent as a user deploys it: `deploy/` applied with `kubectl apply --server-side -k` (every
//! object admitted and validated by the real API server), then on each node the DaemonSet's pod —
//! its object made from the admitted template as the DaemonSet controller would, bound to the
//! node — run as a process: the container's own arguments and environment, its capabilities (and
//! no others, through `capsh`), its volumes mapped onto this node's cgroup, pins and namespaces,
//! and a token of the deploy's ServiceAccount from the TokenRequest API, bound to that pod. Its
//! readiness probe decides when the pod is reported Ready. The init container (it mounts bpffs on
//! hosts that have none) is not run: bpffs is mounted here.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddr},
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use k8s_openapi::api::{
    apps::v1::DaemonSet,
    authentication::v1::TokenRequest,
    core::v1::{Container, ServiceAccount},
};
use kube::{
    Client,
    api::{Api, PostParams},
};
use serde_json::json;

use super::{Cluster, eventually, kubeconfig, kubeconfig::Credentials, pods};
use crate::{agent, net::agent_binary, netns, sandbox::ProcessGuard};

/// The deploy's namespace, DaemonSet and ServiceAccount.
pub const NAMESPACE: &str = "topology-agent";
const NAME: &str = "topology-agent";

/// An agent pod on a node: its object, its namespace and address, its process.
pub struct AgentPod {
    /// Its node.
    pub node: String,
    /// Its pod name.
    pub name: String,
    /// Its pod address (where `--metrics-addr` and `--dns-listen` bind).
    pub ip: Ipv4Addr,
    /// Its IPv6 pod address.
    pub ip6: std::net::Ipv6Addr,
    /// Its kubeconfig: the ServiceAccount's bound token.
    pub kubeconfig: PathBuf,
    /// Its log.
    pub log: PathBuf,
    /// The arguments it was started with (the DaemonSet's, mapped to this node).
    pub args: Vec<String>,
    netns: crate::sandbox::NetnsGuard,
    process: Option<ProcessGuard>,
}

impl AgentPod {
    /// Its network namespace.
    pub fn netns(&self) -> &str {
        self.netns.name()
    }

    /// `topology-agent ARGS` in its pod (what `kubectl exec` would run): stdout, or the error.
    pub fn exec(&self, args: &[&str]) -> Result<String, String> {
        let mut command = Command::new(agent_binary());
        command.args(args).stdin(Stdio::null());
        netns::enter_on_spawn(&mut command, self.netns());
        let output = command.output().map_err(|e| e.to_string())?;
        match output.status.success() {
            true => Ok(String::from_utf8_lossy(&output.stdout).into_owned()),
            false => {
                Err(format!("{}{}", String::from_utf8_lossy(&output.stderr), String::from_utf8_lossy(&output.stdout)))
            }
        }
    }

    /// GET `path` on its probe port (kubelet's view: `/healthz`, `/readyz`).
    pub fn probe(&self, path: &str) -> std::io::Result<(u16, String)> {
        let (address, path) = (SocketAddr::from((self.ip, 9465)), path.to_owned());
        netns::run_in(self.netns(), move || agent::get(address, &path))
    }

    /// GET `path` on its metrics port.
    pub fn metrics(&self) -> std::io::Result<String> {
        let address = SocketAddr::from((self.ip, 9464));
        netns::run_in(self.netns(), move || agent::get(address, "/metrics")).map(|(_, body)| body)
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(ProcessGuard::id)
    }

    /// Sends `signal` to its process (SIGSTOP freezes it, SIGKILL ends it without cleanup).
    pub fn signal(&self, signal: i32) {
        if let Some(pid) = self.pid() {
            // SAFETY: kill with the pid of a child we have not reaped.
            unsafe { libc::kill(pid as i32, signal) };
        }
    }

    /// Whether its process is still running.
    pub fn running(&mut self) -> bool {
        self.process.as_mut().is_some_and(|process| process.child().try_wait().ok().flatten().is_none())
    }

    /// Stops its process with SIGTERM (the kernel state stays, as on a rollout) and waits.
    pub fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            // SAFETY: kill with the pid of a child we have not reaped.
            unsafe { libc::kill(process.id() as i32, libc::SIGTERM) };
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while process.child().try_wait().ok().flatten().is_none() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

impl Cluster {
    /// `kubectl apply --server-side -k deploy/` as the admin; panics with kubectl's words if any
    /// object is refused.
    pub fn deploy(&self) -> String {
        let deploy = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy");
        let deploy = deploy.to_string_lossy();
        let applied = self
            .kubectl(&["apply", "--server-side", "--field-manager=topology-e2e", "-k", &deploy])
            .unwrap_or_else(|error| panic!("kubectl apply --server-side -k deploy/: {error}"));
        // Quota admission refuses the agent's pods until the quota controller has counted its
        // usage once, as on a cluster just installed.
        eventually("deploy/'s ResourceQuota counted by its controller", Duration::from_secs(60), || {
            let jsonpath = "jsonpath={.items[*].status.hard.pods}";
            match self.kubectl(&["-n", NAMESPACE, "get", "resourcequota", "-o", jsonpath]) {
                Ok(hard) if !hard.trim().is_empty() => Ok(()),
                other => Err(format!("{other:?}")),
            }
        });
        applied
    }

    /// Starts the DaemonSet's pod on `node` and waits until its readiness probe passes, then
    /// reports it Ready; `extra` arguments go after the DaemonSet's own.
    pub fn start_agent(&self, node: &str, extra: &[&str]) -> AgentPod {
        let mut agent = self.launch_agent(node, extra);
        let log = agent.log.clone();
        eventually(&format!("agent on {node} ready (log {})", log.display()), Duration::from_secs(60), || {
            if !agent.running() {
                panic!("the agent on {node} exited: {}", std::fs::read_to_string(&log).unwrap_or_default());
            }
            match agent.probe("/readyz") {
                Ok((200, _)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        });
        let node = self.node(node);
        let (node_client, name) = (node.client.clone(), agent.name.clone());
        self.api.block(pods::report(
            node_client,
            NAMESPACE.to_owned(),
            name,
            (agent.ip, agent.ip6),
            node.address(),
            true,
        ));
        agent
    }

    /// Creates the DaemonSet's pod on `node` and starts its process, without waiting for it.
    pub fn launch_agent(&self, node: &str, extra: &[&str]) -> AgentPod {
        let node = self.node(node);
        let admin = self.admin();
        let daemonset: DaemonSet = self
            .api
            .block(async move { Api::<DaemonSet>::namespaced(admin, NAMESPACE).get(NAME).await })
            .unwrap_or_else(|e| panic!("reading DaemonSet {NAMESPACE}/{NAME} (deploy first): {e}"));
        let template = daemonset.spec.as_ref().map(|spec| spec.template.clone()).expect("a pod template");
        let name = format!("{NAME}-{}", node.spec.name);
        let mut object = serde_json::to_value(&template).expect("template");
        object["apiVersion"] = "v1".into();
        object["kind"] = "Pod".into();
        object["metadata"]["name"] = name.clone().into();
        object["metadata"]["namespace"] = NAMESPACE.into();
        object["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "apps/v1", "kind": "DaemonSet", "name": NAME,
            "uid": daemonset.metadata.uid, "controller": true, "blockOwnerDeletion": true,
        }]);
        object["spec"]["nodeName"] = node.spec.name.clone().into();
        let uid = self.api.block(pods::create(self.admin(), object));
        let (ip, ip6, pod_netns) = node.attach_pod();
        let kubeconfig = self.dir.join(format!("agent-{}.kubeconfig", node.spec.name));
        let token = self.bound_token(&name, &uid);
        kubeconfig::write(&kubeconfig, &self.server(), &self.pki.ca.cert, NAME, &Credentials::Token(token));
        let container = template.spec.as_ref().and_then(|spec| spec.containers.first().cloned()).expect("a container");
        let env =
            BTreeMap::from([("NODE_NAME".to_owned(), node.spec.name.clone()), ("POD_IP".to_owned(), ip.to_string())]);
        let paths = [
            ("/host/cgroup", node.cgroup().to_path_buf()),
            ("/sys/fs/bpf/topology", node.pins().to_path_buf()),
            ("/run/topology-agent/host-netns", netns::path(node.netns())),
            ("/run/netns", node.netns_dir.clone()),
        ];
        let mut args = container_args(&container, &env, &paths);
        args.extend(["--kubeconfig".to_owned(), kubeconfig.to_string_lossy().into_owned()]);
        args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        let log = self.dir.join("logs").join(format!("agent-{}.log", node.spec.name));
        let mut command = under_capabilities(&container);
        command.arg(agent_binary()).args(&args).envs(&env).stdin(Stdio::null()).stdout(Stdio::null());
        command.stderr(std::fs::File::create(&log).expect("agent log"));
        netns::enter_on_spawn(&mut command, pod_netns.name());
        let process = ProcessGuard::new(command.spawn().expect("spawn topology-agent"));
        AgentPod {
            node: node.spec.name.clone(),
            name,
            ip,
            ip6,
            kubeconfig,
            log,
            args,
            netns: pod_netns,
            process: Some(process),
        }
    }

    /// Deletes an agent's pod for good (its process stopped first), as a rollout replaces it.
    pub fn remove_agent(&self, mut agent: AgentPod) {
        agent.stop();
        let (admin, name) = (self.admin(), agent.name.clone());
        self.api.block(async move {
            use kube::api::DeleteParams;
            let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(admin, NAMESPACE);
            let params = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
            pods.delete(&name, &params).await.unwrap_or_else(|e| panic!("deleting Pod {NAMESPACE}/{name}: {e}"));
        });
    }

    /// A token of the deploy's ServiceAccount bound to the pod `name` (as kubelet requests one
    /// for a projected volume): valid while the pod exists.
    fn bound_token(&self, name: &str, uid: &str) -> String {
        let request: TokenRequest = serde_json::from_value(json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {
                "audiences": [],
                "expirationSeconds": 3607,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid},
            },
        }))
        .expect("a TokenRequest");
        let admin = self.admin();
        let answer: TokenRequest = self.api.block(async move { request_token(admin, request).await });
        answer.status.map(|status| status.token).expect("the API server answers a token")
    }
}

async fn request_token(admin: Client, request: TokenRequest) -> TokenRequest {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin, NAMESPACE);
    accounts
        .create_subresource("token", NAME, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("TokenRequest for ServiceAccount {NAMESPACE}/{NAME}: {e}"))
}

/// The container's arguments with `$(VAR)` expanded from `env` and paths inside its volumes
/// mapped to this node's (`paths`: mount path → host path).
pub fn container_args(container: &Container, env: &BTreeMap<String, String>, paths: &[(&str, PathBuf)]) -> Vec<String> {
    let args = container.args.clone().unwrap_or_default();
    args.iter()
        .map(|arg| {
            let mut arg = arg.clone();
            for (name, value) in env {
                arg = arg.replace(&format!("$({name})"), value);
            }
            if let Some((flag, value)) = arg.split_once('=')
                && let Some(mapped) = map_path(value, paths)
            {
                return format!("{flag}={}", mapped.display());
            }
            arg
        })
        .collect()
}

/// `value` under one of `paths`' mount paths, as the host path.
fn map_path(value: &str, paths: &[(&str, PathBuf)]) -> Option<PathBuf> {
    paths.iter().find_map(|(mount, host)| {
        let rest = value.strip_prefix(mount)?;
        match rest {
            "" => Some(host.clone()),
            rest => rest.strip_prefix('/').map(|rest| host.join(rest)),
        }
    })
}

/// `capsh` keeping exactly the container's added capabilities (its `drop: [ALL]` honoured), as a
/// container's root gets them; the program and its arguments follow.
fn under_capabilities(container: &Container) -> Command {
    let capabilities = container.security_context.as_ref().and_then(|context| context.capabilities.as_ref());
    let dropped = capabilities.and_then(|caps| caps.drop.clone()).unwrap_or_default();
    assert_eq!(dropped, ["ALL"], "the agent's container drops every capability and adds what it needs");
    let added: Vec<String> = capabilities
        .and_then(|caps| caps.add.clone())
        .unwrap_or_default()
        .iter()
        .map(|cap| format!("cap_{}", cap.to_lowercase()))
        .collect();
    let keep: Vec<&str> = added.iter().map(String::as_str).collect();
    let wrapper = crate::caps::capsh_keeping(&keep);
    let mut command = Command::new(&wrapper[0]);
    command.args(&wrapper[1..]);
    command
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_args_expand_the_environment_and_map_the_volumes() {
        let container: Container = serde_json::from_value(json!({
            "name": "agent",
            "args": ["run", "--cgroup=/host/cgroup", "--pin-path=/sys/fs/bpf/topology", "--metrics-addr=[$(POD_IP)]:9464",
                     "--host-netns=/run/topology-agent/host-netns", "--log-format=json"],
        }))
        .expect("container");
        let env = BTreeMap::from([("POD_IP".to_owned(), "10.244.1.2".to_owned())]);
        let paths =
            [("/host/cgroup", PathBuf::from("/cg/n1")), ("/sys/fs/bpf/topology", PathBuf::from("/sys/fs/bpf/x"))];
        assert_eq!(
            container_args(&container, &env, &paths),
            [
                "run",
                "--cgroup=/cg/n1",
                "--pin-path=/sys/fs/bpf/x",
                "--metrics-addr=[10.244.1.2]:9464",
                "--host-netns=/run/topology-agent/host-netns",
                "--log-format=json"
            ]
        );
        assert_eq!(map_path("/host/cgroupx", &paths), None);
        assert_eq!(map_path("/host/cgroup/a", &paths), Some(PathBuf::from("/cg/n1/a")));
    }
}
