//! The harness's own clients of the API server, on a runtime whose threads live in the control
//! plane's network namespace (sockets keep the namespace they were made in, so every connection
//! the clients open reaches the API server however the test's own threads are placed). Blocking
//! calls for the tests: each runs as a task on that runtime.

use std::{future::Future, path::Path, time::Duration};

use kube::{
    Client, Config,
    api::{Api, DynamicObject, Patch, PatchParams},
    config::{KubeConfigOptions, Kubeconfig},
    core::GroupVersionKind,
    discovery::{self, Scope},
};
use serde_json::Value;

use crate::netns;

/// The field manager of everything the harness applies.
pub const FIELD_MANAGER: &str = "topology-e2e";

/// A runtime in the control plane's namespace and the admin's client on it.
pub struct ApiClients {
    runtime: tokio::runtime::Runtime,
    admin: Client,
}

impl ApiClients {
    /// A runtime whose threads enter `netns_name`, and the client of the admin kubeconfig.
    pub fn new(netns_name: &str, admin_kubeconfig: &Path) -> Self {
        let path = netns::path(netns_name);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .thread_name("e2e-api")
            .on_thread_start(move || {
                let file = std::fs::File::open(&path).expect("the control plane's namespace");
                // SAFETY: an open namespace descriptor; setns changes only this new thread.
                let entered = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) };
                assert_eq!(entered, 0, "setns: {}", std::io::Error::last_os_error());
            })
            .build()
            .expect("the harness's runtime");
        let kubeconfig = admin_kubeconfig.to_path_buf();
        let admin =
            runtime.block_on(runtime.spawn(async move { client(&kubeconfig).await })).expect("the admin client's task");
        Self { runtime, admin }
    }

    /// Runs `future` on the runtime (in the control plane's namespace) and waits for it.
    pub fn block<F>(&self, future: F) -> F::Output
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.runtime
            .block_on(self.runtime.spawn(future))
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic()))
    }

    /// Spawns `future` on the runtime, to run in the background (a node's heartbeat).
    pub fn spawn<F>(&self, future: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.runtime.spawn(future)
    }

    /// The runtime's handle.
    pub fn handle(&self) -> tokio::runtime::Handle {
        self.runtime.handle().clone()
    }

    /// The admin's client (`system:masters`).
    pub fn admin(&self) -> Client {
        self.admin.clone()
    }

    /// A client of another kubeconfig (a node's, the agent's).
    pub fn client_of(&self, kubeconfig: &Path) -> Client {
        let kubeconfig = kubeconfig.to_path_buf();
        self.block(async move { client(&kubeconfig).await })
    }

    /// Waits until `/readyz` answers `ok`, or panics with the last answer after `timeout`.
    pub fn wait_ready(&self, timeout: Duration, mut alive: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let admin = self.admin();
            let answer = self.block(async move {
                let request = http::Request::get("/readyz").body(Vec::new()).expect("request");
                admin.request_text(request).await
            });
            match answer {
                Ok(text) if text.trim() == "ok" => return,
                other if std::time::Instant::now() >= deadline => {
                    panic!("the API server is not ready after {timeout:?}: {other:?}")
                }
                _ => {}
            }
            assert!(alive(), "the API server exited before it was ready");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Server-side applies `object` (any kind the server knows) as the admin.
    pub fn apply(&self, object: &Value) -> Value {
        self.try_apply(object).unwrap_or_else(|error| panic!("applying {}: {error}", describe(&error.object)))
    }

    /// [`ApiClients::apply`], the server's refusal returned.
    pub fn try_apply(&self, object: &Value) -> Result<Value, ApplyError> {
        let admin = self.admin();
        let object = object.clone();
        self.block(async move { apply(&admin, &object).await })
    }
}

/// What failed to apply, and the object.
#[derive(Debug)]
pub struct ApplyError {
    /// The object.
    pub object: Value,
    /// Why.
    pub error: String,
}

impl std::fmt::Display for ApplyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.error)
    }
}

/// Server-side applies `object` with `client`, returning what the server stored.
pub async fn apply(client: &Client, object: &Value) -> Result<Value, ApplyError> {
    let fail = |error: String| ApplyError { object: object.clone(), error };
    let (api, name) = dynamic_api(client, object).await.map_err(fail)?;
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let stored = api.patch(&name, &params, &Patch::Apply(object)).await.map_err(|e| fail(e.to_string()))?;
    serde_json::to_value(stored).map_err(|e| fail(e.to_string()))
}

/// The API of `object`'s kind (found by discovery) in its namespace, and its name.
pub async fn dynamic_api(client: &Client, object: &Value) -> Result<(Api<DynamicObject>, String), String> {
    let api_version = object["apiVersion"].as_str().ok_or("no apiVersion")?;
    let kind = object["kind"].as_str().ok_or("no kind")?;
    let name = object["metadata"]["name"].as_str().ok_or("no metadata.name")?.to_owned();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, capabilities) =
        discovery::pinned_kind(client, &gvk).await.map_err(|e| format!("discovering {api_version} {kind}: {e}"))?;
    let api = match (capabilities.scope, object["metadata"]["namespace"].as_str()) {
        (Scope::Namespaced, Some(namespace)) => Api::namespaced_with(client.clone(), namespace, &resource),
        (Scope::Namespaced, None) => Api::default_namespaced_with(client.clone(), &resource),
        (Scope::Cluster, _) => Api::all_with(client.clone(), &resource),
    };
    Ok((api, name))
}

/// `Kind namespace/name` of an object, for messages.
pub fn describe(object: &Value) -> String {
    let metadata = &object["metadata"];
    let name = metadata["name"].as_str().unwrap_or("?");
    match metadata["namespace"].as_str() {
        Some(namespace) => format!("{} {namespace}/{name}", object["kind"].as_str().unwrap_or("?")),
        None => format!("{} {name}", object["kind"].as_str().unwrap_or("?")),
    }
}

/// A client from a kubeconfig file.
pub async fn client(kubeconfig: &Path) -> Client {
    let file = Kubeconfig::read_from(kubeconfig).unwrap_or_else(|e| panic!("reading {}: {e}", kubeconfig.display()));
    let mut config = Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", kubeconfig.display()));
    // The harness sees every answer as the API server gives it: no retry of 429, 503 or 504
    // behind its back (kube-rs would retry a 504 for minutes).
    config.default_retry = false;
    Client::try_from(config).unwrap_or_else(|e| panic!("a client of {}: {e}", kubeconfig.display()))
}
