//! Questions to the running control loop, answered between batches from its own state: what this
//! node programs now, and why (`/debug/plan`, the same report as `explain`).

use std::{
    sync::mpsc::{self, Receiver, SyncSender, TrySendError},
    time::Duration,
};

use tokio::sync::oneshot;
use topology_model::ObjectKey;
use topology_policy::explain::ExplainReport;

/// One question: the plan, whole or for one Service.
pub struct PlanQuery {
    /// Only this Service.
    pub service: Option<ObjectKey>,
    /// Where the answer goes.
    pub reply: oneshot::Sender<Result<ExplainReport, AskError>>,
}

/// Why a question got no report.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AskError {
    /// Nothing was programmed yet (the initial lists are not complete, or this node is unknown).
    #[error("nothing is programmed yet: the agent has no complete view of the cluster")]
    NotProgrammed,
    /// The Service asked about is not in the cluster.
    #[error("service {0} is not in the cluster")]
    UnknownService(ObjectKey),
    /// The control loop did not answer in time.
    #[error("the control loop did not answer within {} ms", .0.as_millis())]
    NoAnswer(Duration),
    /// As many questions as the loop answers at once are already waiting.
    #[error("busy: {} questions are already waiting; ask again", QUEUED)]
    Busy,
    /// The control loop has stopped.
    #[error("the control loop has stopped")]
    Gone,
}

/// Questions waiting at most; more are refused at once ([`AskError::Busy`]). Each answer is built
/// in the control loop, so a flood of them must not be able to delay the kernel.
pub const QUEUED: usize = 4;

/// The asking half, for the HTTP server.
#[derive(Clone, Debug)]
pub struct PlanClient(SyncSender<PlanQuery>);

impl PlanClient {
    /// A client and the receiving half the controller answers from.
    pub fn channel() -> (Self, Receiver<PlanQuery>) {
        let (tx, rx) = mpsc::sync_channel(QUEUED);
        (Self(tx), rx)
    }

    /// The plan as the control loop holds it, within `within`.
    pub async fn ask(&self, service: Option<ObjectKey>, within: Duration) -> Result<ExplainReport, AskError> {
        let (reply, answer) = oneshot::channel();
        self.0.try_send(PlanQuery { service, reply }).map_err(|error| match error {
            TrySendError::Full(_) => AskError::Busy,
            TrySendError::Disconnected(_) => AskError::Gone,
        })?;
        match tokio::time::timeout(within, answer).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(AskError::Gone),
            Err(_) => Err(AskError::NoAnswer(within)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_queue_is_busy_at_once_an_idle_loop_times_out_a_stopped_one_is_gone() {
        let (client, queries) = PlanClient::channel();
        let short = Duration::from_millis(20);
        assert_eq!(client.ask(None, short).await.err(), Some(AskError::NoAnswer(short)));
        while queries.try_recv().is_ok() {}
        for _ in 0..QUEUED {
            let (reply, _) = oneshot::channel();
            client.0.try_send(PlanQuery { service: None, reply }).expect("room in the queue");
        }
        assert_eq!(client.ask(None, Duration::from_secs(5)).await.err(), Some(AskError::Busy));
        drop(queries);
        assert_eq!(client.ask(None, short).await.err(), Some(AskError::Gone));
    }
}
