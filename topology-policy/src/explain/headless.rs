//! What `explain` shows for a headless Service: the answer this node's responder gives, and why,
//! from the node plan the responder's view shares.

use serde::Serialize;
use topology_model::ObjectKey;

use crate::{
    desired::Locality,
    plan::{NodePlan, headless::Chosen},
    policy::PolicyKind,
};

/// One headless Service, as this node answers it.
#[derive(Debug, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeadlessEntry {
    /// `namespace/name`.
    pub service: String,
    /// The name asked, without the cluster domain (`db.default.svc`).
    pub name: String,
    /// The mode that decided.
    pub policy: Option<PolicyKind>,
    /// Why, per family.
    pub reasons: Vec<String>,
    /// What an answer holds.
    pub answer: Answer,
    /// The chosen endpoints.
    pub addresses: Vec<AddressEntry>,
}

/// What an answer for a headless Service's name holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Answer {
    /// Every chosen address (their weights are equal).
    All,
    /// One address per answer, drawn by weight, so answers across queries follow the plan.
    OneByWeight,
    /// NXDOMAIN: no endpoint for this node.
    Nxdomain,
}

/// One endpoint an answer may hold.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct AddressEntry {
    /// Address.
    pub address: String,
    /// Its own name under the Service.
    pub label: String,
    /// Relative weight.
    pub weight: f64,
    /// Where it is relative to this node.
    pub locality: Locality,
}

/// The headless Services of `plan`, or `only`.
pub fn entries(plan: &NodePlan, only: Option<&ObjectKey>) -> Vec<HeadlessEntry> {
    plan.all_headless()
        .filter(|(key, _)| only.is_none_or(|only| only == *key))
        .map(|(key, headless)| entry(key, &headless.addresses))
        .collect()
}

fn entry(key: &ObjectKey, chosen: &Chosen) -> HeadlessEntry {
    let answer = if chosen.choices.is_empty() {
        Answer::Nxdomain
    } else if chosen.weighted {
        Answer::OneByWeight
    } else {
        Answer::All
    };
    HeadlessEntry {
        service: key.to_string(),
        name: format!("{}.{}.svc", key.name, key.namespace),
        policy: chosen.policy,
        reasons: chosen.reasons.clone(),
        answer,
        addresses: chosen
            .choices
            .iter()
            .map(|c| AddressEntry {
                address: c.address.to_string(),
                label: c.label.clone(),
                weight: c.weight,
                locality: c.locality,
            })
            .collect(),
    }
}
