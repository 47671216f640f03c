//! Kubeconfig files: one cluster (the API server's address and the CA), one user, one context.
//! Written as JSON, which kubectl, the Go components and kube-rs all read as the YAML it is.

use std::path::Path;

use serde_json::json;

use super::pki::CertFiles;

/// How a kubeconfig's user proves who it is.
#[derive(Clone, Debug)]
pub enum Credentials {
    /// A client certificate (the admin, the controller manager, a node, kube-proxy).
    Certificate(CertFiles),
    /// A bearer token (a service account's, from the TokenRequest API).
    Token(String),
}

/// Writes a kubeconfig for `user` at `path`.
pub fn write(path: &Path, server: &str, ca: &Path, user: &str, credentials: &Credentials) {
    let auth = match credentials {
        Credentials::Certificate(files) => json!({
            "client-certificate": files.cert,
            "client-key": files.key,
        }),
        Credentials::Token(token) => json!({ "token": token }),
    };
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": server, "certificate-authority": ca}}],
        "users": [{"name": user, "user": auth}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
        "current-context": "e2e",
    });
    let text = serde_json::to_string_pretty(&config).expect("kubeconfig JSON");
    std::fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}
