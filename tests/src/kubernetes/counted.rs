//! A client that counts the bytes of the API server's answers per resource, as they arrive: what
//! a watch costs the agent, measured where the agent reads it (the client's stack, under the
//! agent's own decoding), from the real API server.

use std::{
    collections::HashMap,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body as HttpBody, Frame, SizeHint};
use kube::{
    Client,
    client::{Body, ClientBuilder, DynBody},
};
use tower::{BoxError, Service, util::BoxService};

use super::Cluster;

/// Bytes received so far, per resource (`nodes`, `services`, ...).
#[derive(Clone, Default)]
pub struct Received(Arc<Mutex<HashMap<String, Arc<AtomicU64>>>>);

impl Received {
    /// Bytes received of `resource` so far.
    pub fn bytes(&self, resource: &str) -> u64 {
        let counters = self.0.lock().expect("counters");
        counters.get(resource).map_or(0, |counter| counter.load(Ordering::Relaxed))
    }

    fn counter(&self, resource: &str) -> Arc<AtomicU64> {
        let mut counters = self.0.lock().expect("counters");
        Arc::clone(counters.entry(resource.to_owned()).or_default())
    }
}

/// The resource a request's path names: the segment after the version (or after the namespace).
fn resource(path: &str) -> String {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let after_version = match segments.first() {
        Some(&"api") => 2,
        Some(&"apis") => 3,
        _ => return String::new(),
    };
    let rest = &segments[after_version.min(segments.len())..];
    match rest {
        ["namespaces", _, resource, ..] => (*resource).to_owned(),
        [resource, ..] => (*resource).to_owned(),
        [] => String::new(),
    }
}

type Generic = BoxService<Request<Body>, Response<Box<DynBody>>, BoxError>;

/// The default stack, its answers counted.
struct Counting {
    inner: Generic,
    received: Received,
}

impl Service<Request<Body>> for Counting {
    type Response = Response<CountedBody>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let counter = self.received.counter(&resource(request.uri().path()));
        let answer = self.inner.call(request);
        Box::pin(async move { Ok(answer.await?.map(|inner| CountedBody { inner, counter })) })
    }
}

/// A body counting its data as it is read.
struct CountedBody {
    inner: Box<DynBody>,
    counter: Arc<AtomicU64>,
}

impl HttpBody for CountedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            self.counter.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Cluster {
    /// A client of the deploy's ServiceAccount (see [`Cluster::agent_client`]) whose answers'
    /// bytes are counted per resource.
    pub fn counted_agent_client(&self) -> (Client, Received) {
        let path = self.agent_kubeconfig();
        let received = Received::default();
        let counting = received.clone();
        let client = self.api.block(async move {
            let file = kube::config::Kubeconfig::read_from(&path).expect("the agent's kubeconfig");
            let options = kube::config::KubeConfigOptions::default();
            let config = kube::Config::from_custom_kubeconfig(file, &options).await.expect("the agent's kubeconfig");
            let builder = ClientBuilder::try_from(config).expect("the agent's client");
            builder
                .with_layer(&tower::layer::layer_fn(move |inner| Counting { inner, received: counting.clone() }))
                .build()
        });
        (client, received)
    }
}

#[cfg(test)]
mod tests {
    use super::resource;

    #[test]
    fn the_resource_is_read_from_the_path() {
        assert_eq!(resource("/api/v1/nodes"), "nodes");
        assert_eq!(resource("/api/v1/nodes/node-a/status"), "nodes");
        assert_eq!(resource("/apis/discovery.k8s.io/v1/endpointslices"), "endpointslices");
        assert_eq!(resource("/apis/events.k8s.io/v1/namespaces/shop/events"), "events");
        assert_eq!(resource("/api/v1/namespaces/shop/services"), "services");
        assert_eq!(resource("/version"), "");
    }
}
