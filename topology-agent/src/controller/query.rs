//! Questions to the running control loop, answered between batches from its own state: what this
//! node programs now, and why (`/debug/plan`, the same report as `explain`).

use std::{
    sync::mpsc::{self, Receiver, Sender},
    time::Duration,
};

use tokio::sync::oneshot;

use crate::{cluster::ObjectKey, explain::ExplainReport};

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
    /// The control loop has stopped.
    #[error("the control loop has stopped")]
    Gone,
}

/// The asking half, for the HTTP server.
#[derive(Clone, Debug)]
pub struct PlanClient(Sender<PlanQuery>);

impl PlanClient {
    /// A client and the receiving half the controller answers from.
    pub fn channel() -> (Self, Receiver<PlanQuery>) {
        let (tx, rx) = mpsc::channel();
        (Self(tx), rx)
    }

    /// The plan as the control loop holds it, within `within`.
    pub async fn ask(&self, service: Option<ObjectKey>, within: Duration) -> Result<ExplainReport, AskError> {
        let (reply, answer) = oneshot::channel();
        self.0.send(PlanQuery { service, reply }).map_err(|_| AskError::Gone)?;
        match tokio::time::timeout(within, answer).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(AskError::Gone),
            Err(_) => Err(AskError::NoAnswer(within)),
        }
    }
}
