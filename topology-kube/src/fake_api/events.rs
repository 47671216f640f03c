//! `events.k8s.io/v1` Events: created (POST) and updated (merge PATCH, as a recorder does for a
//! series), validated as the API server validates them (`ValidateEventCreate` and
//! `ValidateEventUpdate` of `pkg/apis/core/validation/events.go`): a refusal is a 422 naming each
//! field, which a real cluster would answer too.

use hyper::{Method, Response, StatusCode};
use serde_json::{Value, json};

use super::{
    server::Server,
    store::Store,
    wire::{Body, json_response, status},
};

/// `reportingInstance`, `action` and `reason` may be at most this long.
const FIELD_LIMIT: usize = 128;
/// `note` may be at most this many bytes.
const NOTE_LIMIT: usize = 1024;

impl Server {
    /// Answers a request under `/apis/events.k8s.io/v1/namespaces/`: `rest` is what follows.
    pub(super) fn event_request(&self, method: &Method, rest: &str, body: &[u8]) -> Response<Body> {
        let (namespace, name) = match rest.split_once('/') {
            Some((namespace, tail)) => (namespace, tail.strip_prefix("events").map(|n| n.trim_start_matches('/'))),
            None => (rest, None),
        };
        let Some(name) = name else {
            return json_response(
                StatusCode::NOT_FOUND,
                &status(404, "NotFound", "the server could not find the requested resource"),
            );
        };
        let Ok(sent) = serde_json::from_slice::<Value>(body) else {
            return json_response(StatusCode::BAD_REQUEST, &status(400, "BadRequest", "the body is not JSON"));
        };
        let mut store = self.store.lock().expect("store");
        match (method, name) {
            (&Method::POST, "") => create(&mut store, namespace, sent),
            (&Method::PATCH, name) if !name.is_empty() => patch(&mut store, namespace, name, &sent),
            _ => json_response(StatusCode::METHOD_NOT_ALLOWED, &status(405, "MethodNotAllowed", "not supported")),
        }
    }
}

fn create(store: &mut Store, namespace: &str, mut event: Value) -> Response<Body> {
    match event["metadata"]["namespace"].as_str() {
        None | Some("") => event["metadata"]["namespace"] = namespace.into(),
        Some(given) if given != namespace => {
            let message = "the namespace of the provided object does not match the namespace sent on the request";
            return json_response(StatusCode::BAD_REQUEST, &status(400, "BadRequest", message));
        }
        Some(_) => {}
    }
    let name = event["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    let mut problems = validate(&event);
    if name.is_empty() {
        problems.insert(0, ("metadata.name", "Required value: name or generateName is required".into()));
    } else if let Some(why) = dns_subdomain(&name) {
        problems.insert(0, ("metadata.name", format!("Invalid value: {name:?}: {why}")));
    }
    if !problems.is_empty() {
        return refused(&name, &problems);
    }
    if find(store, namespace, &name).is_some() {
        let message = format!("events.events.k8s.io \"{name}\" already exists");
        let mut body = status(409, "AlreadyExists", &message);
        body["details"] = json!({"name": name, "group": "events.k8s.io", "kind": "events"});
        return json_response(StatusCode::CONFLICT, &body);
    }
    store.resource_version += 1;
    event["metadata"]["resourceVersion"] = store.resource_version.to_string().into();
    store.events.push(event.clone());
    json_response(StatusCode::CREATED, &event)
}

fn patch(store: &mut Store, namespace: &str, name: &str, change: &Value) -> Response<Body> {
    let Some(at) = find(store, namespace, name) else {
        let message = format!("events.events.k8s.io \"{name}\" not found");
        return json_response(StatusCode::NOT_FOUND, &status(404, "NotFound", &message));
    };
    let old = store.events[at].clone();
    let mut new = old.clone();
    merge(&mut new, change);
    let mut problems = validate(&new);
    for field in ["reason", "action", "reportingController", "reportingInstance", "type", "regarding", "eventTime"] {
        if new[field] != old[field] {
            problems.push((field, "Invalid value: field is immutable".into()));
        }
    }
    if !problems.is_empty() {
        return refused(name, &problems);
    }
    store.resource_version += 1;
    new["metadata"]["resourceVersion"] = store.resource_version.to_string().into();
    store.events[at] = new.clone();
    json_response(StatusCode::OK, &new)
}

fn find(store: &Store, namespace: &str, name: &str) -> Option<usize> {
    store.events.iter().position(|e| e["metadata"]["namespace"] == namespace && e["metadata"]["name"] == name)
}

/// RFC 7386 merge patch.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    for (key, value) in fields {
        if value.is_null() {
            target.as_object_mut().expect("object").remove(key);
        } else {
            merge(&mut target[key.as_str()], value);
        }
    }
}

/// What `events.k8s.io/v1` refuses in `event`: (field, problem).
fn validate(event: &Value) -> Vec<(&'static str, String)> {
    let text = |field: &str| event[field].as_str().unwrap_or_default().to_owned();
    let mut problems = Vec::new();
    let namespace = event["metadata"]["namespace"].as_str().unwrap_or_default();
    if event["eventTime"].as_str().is_none_or(str::is_empty) {
        problems.push(("eventTime", "Required value".into()));
    }
    if event["regarding"]["namespace"].as_str().is_none_or(str::is_empty)
        && namespace != "default"
        && namespace != "kube-system"
    {
        problems.push(("involvedObject.namespace", "Invalid value: \"\": does not match event.namespace".into()));
    }
    let controller = text("reportingController");
    if controller.is_empty() {
        problems.push(("reportingController", "Required value".into()));
    } else if let Some(why) = qualified_name(&controller) {
        problems.push(("reportingController", format!("Invalid value: {controller:?}: {why}")));
    }
    for field in ["reportingInstance", "action", "reason"] {
        let value = text(field);
        if value.is_empty() {
            problems.push((field, "Required value".into()));
        } else if value.len() > FIELD_LIMIT {
            problems.push((field, format!("Invalid value: \"\": can have at most {FIELD_LIMIT} characters")));
        }
    }
    if text("note").len() > NOTE_LIMIT {
        problems.push(("note", format!("Invalid value: \"\": can have at most {NOTE_LIMIT} characters")));
    }
    if !matches!(event["type"].as_str(), Some("Normal" | "Warning")) {
        problems.push(("type", format!("Invalid value: \"\": has invalid value: {}", text("type"))));
    }
    for field in ["deprecatedFirstTimestamp", "deprecatedLastTimestamp", "deprecatedCount", "deprecatedSource"] {
        if !event[field].is_null() && event[field] != json!({}) && event[field] != json!(0) {
            problems.push((field, "Invalid value: \"\": needs to be unset".into()));
        }
    }
    if let Some(series) = event.get("series").filter(|s| !s.is_null()) {
        if series["count"].as_i64().unwrap_or(0) < 2 {
            problems.push(("series.count", "Invalid value: \"\": should be at least 2".into()));
        }
        if series["lastObservedTime"].as_str().is_none_or(str::is_empty) {
            problems.push(("series.lastObservedTime", "Required value".into()));
        }
    }
    if let Some(why) = dns_subdomain(namespace) {
        problems.push(("namespace", format!("Invalid value: {namespace:?}: {why}")));
    }
    problems
}

/// Why `name` is not a DNS-1123 subdomain, if it is not.
fn dns_subdomain(name: &str) -> Option<&'static str> {
    let valid = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    (!valid).then_some("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character")
}

/// Why `name` is not a qualified name (`[prefix/]name`, the name at most 63 characters), if not.
fn qualified_name(name: &str) -> Option<&'static str> {
    let (prefix, local) = name.rsplit_once('/').map_or((None, name), |(p, l)| (Some(p), l));
    if prefix.is_some_and(|p| dns_subdomain(p).is_some()) {
        return Some("prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters");
    }
    let edge = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_alphanumeric());
    let valid = !local.is_empty()
        && local.len() <= 63
        && edge(local.bytes().next())
        && edge(local.bytes().last())
        && local.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    (!valid).then_some("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character")
}

/// 422 Invalid naming every field refused.
fn refused(name: &str, problems: &[(&str, String)]) -> Response<Body> {
    let listed: Vec<String> = problems.iter().map(|(field, problem)| format!("{field}: {problem}")).collect();
    let message = format!("Event.events.k8s.io \"{name}\" is invalid: [{}]", listed.join(", "));
    let causes: Vec<Value> = problems
        .iter()
        .map(|(field, problem)| {
            let reason = if problem.starts_with("Required") { "FieldValueRequired" } else { "FieldValueInvalid" };
            json!({"reason": reason, "message": problem, "field": field})
        })
        .collect();
    let mut body = status(422, "Invalid", &message);
    body["details"] = json!({"name": name, "group": "events.k8s.io", "kind": "Event", "causes": causes});
    json_response(StatusCode::UNPROCESSABLE_ENTITY, &body)
}
