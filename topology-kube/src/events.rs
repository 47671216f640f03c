//! Problems users must see: objects skipped, annotations ignored, services the kernel maps could
//! not take. Each is logged with the object's name; connected to a cluster, each also becomes a
//! Kubernetes Event on the Service, so `kubectl describe service` shows it.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Client,
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use tokio::{sync::mpsc, task::JoinHandle};
use topology_model::ObjectKey;

/// One problem about one Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The Service concerned.
    pub service: ObjectKey,
    /// Short PascalCase cause (`InvalidObject`, `IgnoredAnnotation`, `MapFull`, ...).
    pub reason: &'static str,
    /// What is wrong and what the agent does about it.
    pub message: String,
}

/// Where problems go besides the log.
pub trait ProblemSink: Send {
    /// Publishes one problem. Must not block.
    fn publish(&self, problem: &Problem);
}

/// No cluster to publish to (file mode, tests): the log line is all.
#[derive(Debug, Default)]
pub struct LogOnly;

impl ProblemSink for LogOnly {
    fn publish(&self, _problem: &Problem) {}
}

/// Problems waiting to be published. Each agent publishes its own node's view of a Service, so one
/// tenant edit is one Event per node: past this many waiting, new ones are dropped (and logged)
/// rather than queued without bound while the API server is slow.
pub const QUEUED: usize = 256;
/// The longest `reportingInstance` `events.k8s.io/v1` accepts.
const INSTANCE_LIMIT: usize = 128;

/// Publishes problems as Events (events.k8s.io/v1) on their Service, from a background task.
pub struct KubeEvents {
    queue: mpsc::Sender<Problem>,
}

impl KubeEvents {
    /// Starts the publishing task; it ends when the sink is dropped.
    pub fn start(client: Client, node: &str) -> (Self, JoinHandle<()>) {
        // A node's name may be 253 characters; the API refuses a longer `reportingInstance` than
        // 128, and with it every Event.
        let instance = truncate(node, INSTANCE_LIMIT);
        let reporter = Reporter { controller: "topology-agent".into(), instance: Some(instance) };
        let recorder = Recorder::new(client, reporter);
        let (queue, mut problems) = mpsc::channel::<Problem>(QUEUED);
        let task = tokio::spawn(async move {
            while let Some(problem) = problems.recv().await {
                let reference = ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Service".into()),
                    namespace: Some(problem.service.namespace.to_string()),
                    name: Some(problem.service.name.to_string()),
                    ..ObjectReference::default()
                };
                let event = Event {
                    type_: EventType::Warning,
                    reason: problem.reason.into(),
                    note: Some(truncate(&problem.message, 1000)),
                    action: "ProgramDatapath".into(),
                    secondary: None,
                };
                if let Err(error) = recorder.publish(&event, &reference).await {
                    tracing::warn!(service = %problem.service, %error, "could not publish a Kubernetes Event");
                }
            }
        });
        (Self { queue }, task)
    }
}

impl ProblemSink for KubeEvents {
    fn publish(&self, problem: &Problem) {
        match self.queue.try_send(problem.clone()) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(problem)) => {
                tracing::debug!(service = %problem.service, reason = problem.reason, "Event queue full; not published");
            }
            // The task only ends at shutdown, when losing the event does not matter.
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }
}

/// At most `max` bytes, cut at a character boundary.
fn truncate(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}
