//! Lists, with the API server's semantics for `resourceVersion`, `resourceVersionMatch`, `limit`
//! and `continue` (the "Semantics for get and list" table of the API concepts, and the etcd3
//! store's and cacher's behaviour behind it):
//! - no `resourceVersion`: the most recent state, paginated, every page as of the first page's
//!   resourceVersion (the continue token carries it);
//! - `resourceVersion=0`: any state, from the watch cache, whole (`limit` ignored);
//! - `resourceVersion=N` with `NotOlderThan` (or without a match and without a limit): from the
//!   watch cache once it is at N or later; a cache still behind after 3 s answers 504 with the
//!   `ResourceVersionTooLarge` cause;
//! - `resourceVersion=N` with `Exact` (or without a match but with a limit, the old semantics
//!   KEP-2523 describes): the state at N, 410 Expired once N is compacted;
//! - a continue token whose resourceVersion was compacted: 410 Expired, with a token that
//!   continues from the latest state (an inconsistent list), as the API server offers.

use std::{collections::HashMap, time::Duration};

use hyper::{Response, StatusCode};
use serde_json::{Value, json};

use super::{
    Resource,
    fields::Fields,
    server::{Server, Shape},
    store::Name,
    wire::{Body, bytes_response, json_response, status},
};

/// How long a read waits for the watch cache to reach the resourceVersion asked for (the
/// cacher's `blockTimeout`).
const CACHE_WAIT: Duration = Duration::from_secs(3);

/// Where a list reads from.
enum Read {
    /// The state at this version, paginated from after `after`.
    At { version: u64, after: Option<Name>, limit: usize },
    /// The watch cache, at least at `min`; paginated with `limit`.
    Cache { min: u64, limit: usize },
}

impl Server {
    pub(super) async fn list(
        &self,
        resource: Resource,
        query: &HashMap<String, String>,
        shape: Shape,
    ) -> Response<Body> {
        let mut released = self.releases.subscribe();
        let continues = query.get("continue").is_some_and(|token| !token.is_empty());
        while {
            let store = self.store.lock().expect("store");
            store.held.contains(&resource) || (continues && store.held_continues.contains(&resource))
        } {
            // A dropped sender means the server is going away; answer anyway.
            if released.changed().await.is_err() {
                break;
            }
        }
        let read = match parse(query, self.store.lock().expect("store").resource_version) {
            Ok(read) => read,
            Err(refusal) => return *refusal,
        };
        let fields = match Fields::parse(query.get("fieldSelector").map(String::as_str)) {
            Ok(fields) => fields,
            Err(refusal) => return *refusal,
        };
        let (version, after, limit) = match read {
            Read::At { version, after, limit } => (version, after, limit),
            Read::Cache { min, limit } => match self.cache_at_least(min).await {
                Some(version) => (version, None, limit),
                None => return too_large(min, self.store.lock().expect("store").cache_version()),
            },
        };
        let mut store = self.store.lock().expect("store");
        if after.is_none() {
            *store.lists.entry(resource).or_default() += 1;
        }
        if version > store.resource_version {
            let current = store.resource_version;
            return too_large(version, current);
        }
        let Some(page) = store.page_at(resource, version, (after.as_ref(), limit), &fields) else {
            return match after {
                Some((namespace, name)) => expired_continue(&format!("0~{namespace}~{name}")),
                None => {
                    let compacted = store.compacted(resource);
                    let message = format!("too old resource version: {version} ({compacted})");
                    json_response(StatusCode::GONE, &status(410, "Expired", &message))
                }
            };
        };
        let (api_version, kind) = match shape {
            Shape::Full => resource.list_kind(),
            Shape::Metadata => ("meta.k8s.io/v1", "PartialObjectMetadataList"),
        };
        let mut metadata = json!({"resourceVersion": version.to_string()});
        if let Some((namespace, name)) = page.next {
            metadata["continue"] = format!("{version}~{namespace}~{name}").into();
        }
        if let Some(remaining) = page.remaining {
            metadata["remainingItemCount"] = remaining.into();
        }
        let head = json!({"apiVersion": api_version, "kind": kind, "metadata": metadata});
        let mut body = serde_json::to_vec(&head).expect("JSON");
        body.pop();
        body.extend_from_slice(br#","items":["#);
        for (n, json) in page.items.iter().enumerate() {
            if n > 0 {
                body.push(b',');
            }
            body.extend_from_slice(&shape.object(json));
        }
        body.extend_from_slice(b"]}");
        *store.sent.entry(resource).or_default() += body.len() as u64;
        bytes_response(StatusCode::OK, body)
    }

    /// The watch cache's version once it is at least `min`, waiting up to [`CACHE_WAIT`].
    async fn cache_at_least(&self, min: u64) -> Option<u64> {
        let give_up = tokio::time::Instant::now() + CACHE_WAIT;
        loop {
            let version = self.store.lock().expect("store").cache_version();
            if version >= min {
                return Some(version);
            }
            if tokio::time::Instant::now() >= give_up {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// What a list's parameters ask for, or the API server's refusal of them.
fn parse(query: &HashMap<String, String>, current: u64) -> Result<Read, Box<Response<Body>>> {
    let given = |name: &str| query.get(name).map(String::as_str).filter(|v| !v.is_empty());
    let limit = given("limit").and_then(|l| l.parse::<usize>().ok()).filter(|l| *l > 0);
    let paged = limit.unwrap_or(usize::MAX);
    let version = given("resourceVersion");
    let matching = given("resourceVersionMatch");
    if let Some(token) = given("continue") {
        if matching.is_some() {
            return Err(Box::new(invalid("resourceVersionMatch", "is forbidden when continue is provided")));
        }
        if version.is_some_and(|v| v != "0") {
            let message = "specifying resource version is not allowed when using continue";
            return Err(Box::new(json_response(StatusCode::BAD_REQUEST, &status(400, "BadRequest", message))));
        }
        let Some((at, after)) = decode_continue(token) else {
            let message = "continue key is not valid: the fake's tokens are `version~namespace~name`";
            return Err(Box::new(json_response(StatusCode::BAD_REQUEST, &status(400, "BadRequest", message))));
        };
        // A token from a 410's answer continues from the latest state.
        let version = if at == 0 { current } else { at };
        return Ok(Read::At { version, after: Some(after), limit: paged });
    }
    let Some(version) = version else {
        if matching.is_some() {
            return Err(Box::new(invalid("resourceVersionMatch", "is forbidden unless resourceVersion is provided")));
        }
        return Ok(Read::At { version: current, after: None, limit: paged });
    };
    let Ok(number) = version.parse::<u64>() else {
        let message = format!("Invalid value: \"{version}\": resourceVersion must be a number");
        return Err(Box::new(json_response(StatusCode::BAD_REQUEST, &status(400, "BadRequest", &message))));
    };
    match (matching, number) {
        (Some("Exact"), 0) => {
            Err(Box::new(invalid("resourceVersionMatch", "\"Exact\" is forbidden for resourceVersion \"0\"")))
        }
        (Some("Exact"), _) => Ok(Read::At { version: number, after: None, limit: paged }),
        (None, 1..) if limit.is_some() => Ok(Read::At { version: number, after: None, limit: paged }),
        (None | Some("NotOlderThan"), 0) => Ok(Read::Cache { min: 0, limit: usize::MAX }),
        (None | Some("NotOlderThan"), _) => Ok(Read::Cache { min: number, limit: paged }),
        (Some(other), _) => {
            let problem = format!("Unsupported value: \"{other}\": supported values: \"Exact\", \"NotOlderThan\"");
            Err(Box::new(invalid("resourceVersionMatch", &problem)))
        }
    }
}

/// `version~namespace~name`.
fn decode_continue(token: &str) -> Option<(u64, Name)> {
    let (version, rest) = token.split_once('~')?;
    let (namespace, name) = rest.split_once('~')?;
    Some((version.parse().ok()?, (namespace.to_owned(), name.to_owned())))
}

/// 422 Invalid on the list options, as the API server's validation words it.
fn invalid(field: &str, problem: &str) -> Response<Body> {
    let message = format!("ListOptions.meta.k8s.io \"\" is invalid: {field}: Forbidden: {problem}");
    let mut body = status(422, "Invalid", &message);
    body["details"] = json!({"group": "meta.k8s.io", "kind": "ListOptions",
        "causes": [{"reason": "FieldValueForbidden", "message": format!("Forbidden: {problem}"), "field": field}]});
    json_response(StatusCode::UNPROCESSABLE_ENTITY, &body)
}

/// 504 Timeout with the `ResourceVersionTooLarge` cause: the server is behind what was asked.
fn too_large(asked: u64, current: u64) -> Response<Body> {
    let message = format!("Too large resource version: {asked}, current: {current}");
    let mut body = status(504, "Timeout", &message);
    body["details"] = json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 1});
    let mut response = json_response(StatusCode::GATEWAY_TIMEOUT, &body);
    response.headers_mut().insert(hyper::header::RETRY_AFTER, "1".parse().expect("header"));
    response
}

/// 410 Expired for a continue token whose snapshot was compacted, offering `inconsistent`.
fn expired_continue(inconsistent: &str) -> Response<Body> {
    let message = "The provided continue parameter is too old to display a consistent list result. You can start \
                   a new list without the continue parameter, or use the continue token in this response to \
                   retrieve the remainder of the results. Continuing with the provided token results in an \
                   inconsistent list - objects that were created, modified, or deleted between the time the first \
                   chunk was returned and now may show up in the list.";
    let mut body: Value = status(410, "Expired", message);
    body["metadata"] = json!({"continue": inconsistent});
    json_response(StatusCode::GONE, &body)
}
