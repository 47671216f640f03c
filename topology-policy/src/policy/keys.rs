//! Topology keys (KEP-536, `spec.topologyKeys` of Kubernetes 1.17-1.21, or the
//! `topology-agent.io/topology-keys` annotation): walk the keys in order, take the endpoints whose
//! node has this node's value for the key; the first key with any match wins; `*` matches every
//! endpoint; nothing matched and no `*` means refuse (a hard requirement). The
//! serving-and-terminating fallback takes no preference from the order of the keys: with `*`, every
//! one of them; without, every one any key admits (the hard scope still holds).

use std::fmt;

use topology_model::{Node, TopologyKeysSpec};

use super::{Candidate, PolicyKind, Selection, describe};

/// At most this many keys (KEP-536).
pub const MAX_KEYS: usize = topology_model::bounds::MAX_TOPOLOGY_KEYS;

/// One topology key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TopologyKey {
    /// `*`: any endpoint.
    Any,
    /// A node label key.
    Label(String),
}

impl fmt::Display for TopologyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Any => f.write_str("*"),
            Self::Label(key) => f.write_str(key),
        }
    }
}

/// Why a list of topology keys is refused (as a whole).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeysError {
    /// More than [`MAX_KEYS`].
    #[error("{0} keys; at most {MAX_KEYS} are allowed")]
    TooMany(usize),
    /// `*` before another key.
    #[error("\"*\" must be the last key")]
    AnyNotLast,
    /// A key that is not a label key.
    #[error("{key:?} is not a valid label key: {why}")]
    InvalidKey {
        /// The key.
        key: String,
        /// What is wrong with it.
        why: LabelKeyError,
    },
    /// A key listed twice.
    #[error("{0:?} appears more than once")]
    Duplicate(String),
}

/// What is wrong with a label key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LabelKeyError {
    /// The prefix before `/` is empty or too long.
    #[error("the prefix must be 1 to 253 characters")]
    PrefixLength,
    /// The prefix is not a lowercase DNS subdomain.
    #[error("the prefix {0:?} is not a lowercase DNS subdomain")]
    PrefixNotSubdomain(String),
    /// The name is empty or too long.
    #[error("the name must be 1 to 63 characters")]
    NameLength,
    /// The name starts or ends with something else than a letter or digit.
    #[error("the name must start and end with a letter or digit")]
    NameEnds,
    /// The name holds a character a label key may not.
    #[error("the name may only contain letters, digits, '-', '_' and '.'")]
    NameCharacters,
}

/// Validates a Service's keys as [`parse`] does, counting every key written (the spec keeps only
/// the first ones).
pub fn parse_spec(spec: &TopologyKeysSpec) -> Result<Vec<TopologyKey>, KeysError> {
    if spec.written > MAX_KEYS {
        return Err(KeysError::TooMany(spec.written));
    }
    parse(&spec.keys)
}

/// Validates keys as the KEP does: at most 16, each a valid label key or `*`, `*` only last, no
/// duplicates. An invalid list is rejected as a whole.
pub fn parse(raw: &[String]) -> Result<Vec<TopologyKey>, KeysError> {
    if raw.len() > MAX_KEYS {
        return Err(KeysError::TooMany(raw.len()));
    }
    let mut keys = Vec::with_capacity(raw.len());
    for (index, key) in raw.iter().enumerate() {
        if key == "*" {
            if index + 1 != raw.len() {
                return Err(KeysError::AnyNotLast);
            }
            keys.push(TopologyKey::Any);
            continue;
        }
        label_key(key).map_err(|why| KeysError::InvalidKey { key: key.clone(), why })?;
        if raw[..index].contains(key) {
            return Err(KeysError::Duplicate(key.clone()));
        }
        keys.push(TopologyKey::Label(key.clone()));
    }
    Ok(keys)
}

/// Walks `keys` over the usable endpoints.
pub fn select(this: &Node, keys: &[TopologyKey], usable: &[Candidate<'_>], terminating: bool) -> Selection {
    let listed = keys.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
    if usable.is_empty() {
        let reason =
            format!("topology keys [{listed}]: no ready or serving-and-terminating endpoint; connections are refused");
        return Selection::equal(PolicyKind::TopologyKeys, reason, this, &[]);
    }
    if terminating {
        return terminating_fallback(this, keys, &listed, usable);
    }
    let mut tried = Vec::new();
    for key in keys {
        let label = match key {
            TopologyKey::Any => {
                let before = if tried.is_empty() { String::new() } else { format!("{}; ", tried.join("; ")) };
                let reason = format!(
                    "topology keys [{listed}]: {before}\"*\" takes all {}",
                    describe(usable.len(), terminating)
                );
                return Selection::equal(PolicyKind::TopologyKeys, reason, this, usable);
            }
            TopologyKey::Label(label) => label,
        };
        let Some(value) = this.topology_value(label) else {
            tried.push(format!("node {} has no {label} label", this.name));
            continue;
        };
        let matched: Vec<Candidate<'_>> =
            usable.iter().filter(|c| c.topology_value(label) == Some(value)).cloned().collect();
        if !matched.is_empty() {
            let before = if tried.is_empty() { String::new() } else { format!("{}; ", tried.join("; ")) };
            let reason = format!(
                "topology keys [{listed}]: {before}{label}={value} matched {} of {}",
                matched.len(),
                describe(usable.len(), terminating)
            );
            return Selection::equal(PolicyKind::TopologyKeys, reason, this, &matched);
        }
        tried.push(format!("{label}={value} matched none"));
    }
    let reason =
        format!("topology keys [{listed}]: {}; no \"*\" fallback, so connections are refused", tried.join("; "));
    Selection::equal(PolicyKind::TopologyKeys, reason, this, &[])
}

/// The serving-and-terminating fallback: no order of preference, only the scope the keys allow.
fn terminating_fallback(this: &Node, keys: &[TopologyKey], listed: &str, usable: &[Candidate<'_>]) -> Selection {
    if keys.contains(&TopologyKey::Any) {
        return super::terminating_fallback(
            PolicyKind::TopologyKeys,
            &format!("topology keys [{listed}]"),
            this,
            usable,
        );
    }
    let admitted: Vec<Candidate<'_>> = usable
        .iter()
        .filter(|c| {
            keys.iter().any(|key| match key {
                TopologyKey::Any => true,
                TopologyKey::Label(label) => {
                    this.topology_value(label).is_some_and(|value| c.topology_value(label) == Some(value))
                }
            })
        })
        .cloned()
        .collect();
    let reason = if admitted.is_empty() {
        format!(
            "topology keys [{listed}]: none of {} shares a key with this node; no \"*\" fallback, so connections are refused",
            describe(usable.len(), true)
        )
    } else {
        format!(
            "topology keys [{listed}]: no preference among the serving-and-terminating fallback (kube-proxy's rule), only the keys' scope: {} of {}",
            admitted.len(),
            describe(usable.len(), true)
        )
    };
    Selection::equal(PolicyKind::TopologyKeys, reason, this, &admitted)
}

/// Checks a Kubernetes label key: an optional DNS-subdomain prefix and `/`, then a name of at most
/// 63 characters, alphanumeric at both ends, with `-`, `_` and `.` inside.
pub fn label_key(key: &str) -> Result<(), LabelKeyError> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() || prefix.len() > 253 {
            return Err(LabelKeyError::PrefixLength);
        }
        for label in prefix.split('.') {
            let ok = !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-');
            if !ok {
                return Err(LabelKeyError::PrefixNotSubdomain(prefix.to_owned()));
            }
        }
    }
    if name.is_empty() || name.len() > 63 {
        return Err(LabelKeyError::NameLength);
    }
    let alnum = |b: u8| b.is_ascii_alphanumeric();
    let bytes = name.as_bytes();
    if !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return Err(LabelKeyError::NameEnds);
    }
    if !bytes.iter().all(|&b| alnum(b) || b == b'-' || b == b'_' || b == b'.') {
        return Err(LabelKeyError::NameCharacters);
    }
    Ok(())
}
