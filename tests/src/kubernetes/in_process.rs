//! The agent's watch and controller run in this process, programming the real writer over
//! in-memory maps in place of a node's kernel: against the real API server with a token of the
//! deploy's own ServiceAccount ([`InProcessAgent`]), or the fake one (`kube_watch.rs`) — what the
//! source and the controller make of the server's lists, watches and Events, with nothing else in
//! the way.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::api::{authentication::v1::TokenRequest, core::v1::ServiceAccount};
use kube::{Api, Client, api::PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use topology_agent::{
    controller::{Controller, ControllerConfig, ControllerError, Health, recording::MemoryKernel},
    metrics::Metrics,
};
use topology_kube::{EventSender, events::KubeEvents, watch::KubeSource};
use topology_policy::desired::DesiredState;

use super::{Cluster, Credentials, agents::NAMESPACE, kubeconfig};

/// The deploy's ServiceAccount.
const ACCOUNT: &str = "topology-agent";

impl Cluster {
    /// A client of the deploy's ServiceAccount (`deploy()` first), on the harness's runtime: an
    /// unbound token from the TokenRequest API, so every request it makes is held to the deploy's
    /// RBAC.
    pub fn agent_client(&self) -> Client {
        self.api.client_of(&self.agent_kubeconfig())
    }

    /// A kubeconfig with a new token of the deploy's ServiceAccount.
    pub(super) fn agent_kubeconfig(&self) -> std::path::PathBuf {
        let admin = self.admin();
        let token = self.api.block(async move {
            let request: TokenRequest = serde_json::from_value(json!({
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"audiences": [], "expirationSeconds": 3600},
            }))
            .expect("a TokenRequest");
            let accounts: Api<ServiceAccount> = Api::namespaced(admin, NAMESPACE);
            let answer: TokenRequest = accounts
                .create_subresource("token", ACCOUNT, &PostParams::default(), &request)
                .await
                .unwrap_or_else(|e| panic!("TokenRequest for ServiceAccount {NAMESPACE}/{ACCOUNT}: {e}"));
            answer.status.map(|status| status.token).expect("the API server answers a token")
        });
        let path = self.dir.join("in-process-agent.kubeconfig");
        kubeconfig::write(&path, &self.server(), &self.pki.ca.cert, ACCOUNT, &Credentials::Token(token));
        path
    }

    /// The harness's runtime (its threads in the control plane's namespace), for tasks that must
    /// reach the API server: enter it to start them.
    pub fn runtime(&self) -> tokio::runtime::Handle {
        self.api.handle()
    }
}

/// The agent's source, controller and writer over in-memory maps for one node, in this process:
/// started on the current runtime (the fake API server's tier builds on it too).
pub struct Watching {
    /// The writer's maps.
    pub kernel: MemoryKernel,
    /// The controller's health (`/readyz`).
    pub health: Arc<Health>,
    /// Stops the source and the controller.
    pub shutdown: CancellationToken,
    /// The controller's thread.
    pub controller: Option<std::thread::JoinHandle<Result<MemoryKernel, ControllerError>>>,
    /// The source.
    pub source: Option<KubeSource>,
}

impl Watching {
    /// Starts the watch of `node`'s view with `client` and the controller over in-memory maps;
    /// its Events go to the API server with the same client. Call within a runtime.
    pub fn start(client: &Client, node: &str) -> Self {
        let shutdown = CancellationToken::new();
        let (events, receiver) = EventSender::channel();
        let source = KubeSource::start(client, Some(node), &events, &shutdown);
        let kernel = MemoryKernel::default();
        let health = Arc::new(Health::default());
        let (sink, _) = KubeEvents::start(client.clone(), node);
        let controller = Controller::new(
            ControllerConfig::new(node),
            kernel.clone(),
            Arc::clone(&health),
            Arc::new(Metrics::default()),
            Box::new(sink),
        );
        let token = shutdown.clone();
        let controller = std::thread::spawn(move || controller.run(&receiver, &token));
        Self { kernel, health, shutdown, controller: Some(controller), source: Some(source) }
    }

    /// Stops the controller and waits for its thread; returns the source, to be joined.
    pub fn stop(&mut self) -> Option<KubeSource> {
        self.shutdown.cancel();
        if let Some(controller) = self.controller.take() {
            let _ = controller.join();
        }
        self.source.take()
    }
}

/// [`Watching`] on the harness's runtime, against the real API server.
pub struct InProcessAgent {
    watching: Watching,
    runtime: tokio::runtime::Handle,
}

impl InProcessAgent {
    /// Starts the watch of `node`'s view with `client` and the controller over in-memory maps;
    /// its Events go to the API server with the same client.
    pub fn start(cluster: &Cluster, client: &Client, node: &str) -> Self {
        let runtime = cluster.runtime();
        let watching = {
            let _entered = runtime.enter();
            Watching::start(client, node)
        };
        Self { watching, runtime }
    }

    /// What is programmed now.
    pub fn current(&self) -> DesiredState {
        self.watching.kernel.record().current.clone()
    }

    /// How many times the writer was asked to program.
    pub fn applies(&self) -> usize {
        self.watching.kernel.record().applies()
    }

    /// The agent's readiness, as `/readyz` would answer it.
    pub fn readiness(&self) -> Result<(), String> {
        self.watching.health.readiness().map_err(|reason| reason.to_string())
    }

    /// Waits until the programmed state satisfies `check`, or fails naming `what`.
    pub fn wait_for(&self, what: &str, check: impl Fn(&DesiredState) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if check(&self.watching.kernel.record().current) {
                return;
            }
            let stopped = self.watching.controller.as_ref().is_some_and(std::thread::JoinHandle::is_finished);
            assert!(!stopped, "the controller stopped while waiting for {what}");
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {:?}",
                self.watching.kernel.record().current
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the controller ends by itself (an error that stops it), within `within`.
    pub fn ended(&mut self, within: Duration) -> Result<(), ControllerError> {
        let controller = self.watching.controller.take().expect("the controller runs");
        let deadline = Instant::now() + within;
        while !controller.is_finished() {
            assert!(Instant::now() < deadline, "the controller did not end within {within:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        controller.join().expect("the controller's thread").map(drop)
    }
}

impl Drop for InProcessAgent {
    fn drop(&mut self) {
        if let Some(source) = self.watching.stop() {
            let _ = self.runtime.block_on(self.runtime.spawn(source.join()));
        }
    }
}
