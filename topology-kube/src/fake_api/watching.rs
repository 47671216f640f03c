//! Watches, as the API server's cacher serves them:
//! - from no `resourceVersion` or `0`: a synthetic ADDED event for every object (the most recent
//!   state, or the watch cache's), then the changes after it;
//! - from N: the changes after N, or an in-stream ERROR 410 once N is compacted;
//! - bookmarks (when asked for) about every minute and 2 s before the watch's deadline, carrying
//!   the latest resourceVersion; no `timeoutSeconds`: a deadline of 30 to 60 minutes, as the
//!   server draws for the request;
//! - changes past the watch cache's version are withheld while it lags;
//! - an ERROR event sent on demand ends the stream, as the server does after one.

use std::{collections::HashMap, sync::Arc, time::Duration};

use futures::{SinkExt as _, channel::mpsc};
use http_body_util::{BodyExt as _, StreamBody};
use hyper::{
    Response,
    body::{Bytes, Frame},
};
use serde_json::json;
use tokio::time::Instant;

use super::{
    Resource,
    fields::Fields,
    server::{Server, Shape},
    wire::{Body, event, status},
};

/// The server's request timeout for a watch without `timeoutSeconds`: drawn in [30, 60) minutes.
const DEFAULT_TIMEOUT_S: u64 = 1800;

impl Server {
    pub(super) fn watch(&self, resource: Resource, query: &HashMap<String, String>, shape: Shape) -> Response<Body> {
        let fields = match Fields::parse(query.get("fieldSelector").map(String::as_str)) {
            Ok(fields) => fields,
            Err(refusal) => return *refusal,
        };
        let asked = query.get("resourceVersion").map(String::as_str).filter(|v| !v.is_empty());
        let bookmarks = query.get("allowWatchBookmarks").is_some_and(|b| b == "true");
        let timeout = query
            .get("timeoutSeconds")
            .and_then(|t| t.parse::<u64>().ok())
            .unwrap_or_else(|| DEFAULT_TIMEOUT_S + rand::random_range(0..DEFAULT_TIMEOUT_S));
        let started = Instant::now();
        let ends = started + Duration::from_secs(timeout);
        let (mut tx, rx) = mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(64);
        let (store, mut changes, mut aborts, mut errors) =
            (Arc::clone(&self.store), self.changes.subscribe(), self.aborts.subscribe(), self.errors.subscribe());
        aborts.mark_unchanged();
        errors.mark_unchanged();
        // The state to start from: the synthetic ADDED events, and the version they are at.
        let (initial, mut sent) = {
            let store = store.lock().expect("store");
            let start = match asked {
                None => Some(store.resource_version),
                Some("0") => Some(store.cache_version()),
                Some(_) => None,
            };
            match start {
                Some(version) => {
                    let page = store.page_at(resource, version, (None, usize::MAX), &fields).map(|page| page.items);
                    (page.unwrap_or_default(), version)
                }
                None => (Vec::new(), asked.and_then(|v| v.parse().ok()).unwrap_or(0)),
            }
        };
        let every = self.store.lock().expect("store").bookmark_every();
        tokio::spawn(async move {
            for object in initial {
                let line = [&br#"{"type":"ADDED","object":"#[..], &shape.object(&object), b"}\n"].concat();
                if tx.send(Ok(Frame::data(Bytes::from(line)))).await.is_err() {
                    return;
                }
            }
            let last_bookmark = ends.checked_sub(Duration::from_secs(2)).unwrap_or(started);
            let mut bookmark_at = Some((started + every).min(last_bookmark));
            loop {
                if store.lock().expect("store").stalled {
                    // Hold the connection open, silent, until the stall ends or the client leaves.
                    while store.lock().expect("store").stalled {
                        if tx.is_closed() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                if Instant::now() >= ends {
                    // The server ends the watch, as asked; the client resumes from where it was.
                    return;
                }
                let pending = {
                    let store = store.lock().expect("store");
                    let upto = store.cache_version();
                    let events = store.events_after(resource, sent, upto, &fields);
                    sent = sent.max(upto);
                    events
                };
                let pending = pending.map(|lines| lines.iter().map(|line| shape.line(line)).collect::<Vec<_>>());
                let Some(pending) = pending else {
                    let compacted = store.lock().expect("store").compacted(resource);
                    let message = format!("too old resource version: {sent} ({compacted})");
                    let _ = tx.send(Ok(Frame::data(event("ERROR", &status(410, "Expired", &message)).0))).await;
                    return;
                };
                let bytes: usize = pending.iter().map(Bytes::len).sum();
                *store.lock().expect("store").sent.entry(resource).or_default() += bytes as u64;
                for event in pending {
                    if tx.send(Ok(Frame::data(event))).await.is_err() {
                        return;
                    }
                }
                tokio::select! {
                    () = tokio::time::sleep_until(ends) => return,
                    changed = changes.changed() => if changed.is_err() { return },
                    _ = aborts.changed() => {
                        let _ = tx.send(Err(std::io::Error::other("connection aborted by the fake API"))).await;
                        return;
                    }
                    _ = errors.changed() => {
                        let code = *errors.borrow_and_update();
                        let (reason, message) = match code {
                            410 => ("Expired", "too old resource version"),
                            _ => ("InternalError", "Internal error occurred: the fake API ends the watch with an error"),
                        };
                        let _ = tx.send(Ok(Frame::data(event("ERROR", &status(code, reason, message)).0))).await;
                        return;
                    }
                    // Other resources' changes wake this loop too; the bookmark keeps its own clock.
                    () = tokio::time::sleep_until(bookmark_at.unwrap_or(ends)), if bookmarks && bookmark_at.is_some() => {
                        if store.lock().expect("store").stalled {
                            // A stalled server sends nothing, bookmarks neither.
                            continue;
                        }
                        let now = Instant::now();
                        bookmark_at = (now < last_bookmark).then(|| (now + every).min(last_bookmark));
                        let (api_version, kind) = match shape {
                            Shape::Full => resource.list_kind(),
                            Shape::Metadata => ("meta.k8s.io/v1", "PartialObjectMetadataList"),
                        };
                        let object = json!({"apiVersion": api_version, "kind": kind.trim_end_matches("List"),
                            "metadata": {"resourceVersion": sent.to_string()}});
                        if tx.send(Ok(Frame::data(event("BOOKMARK", &object).0))).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let mut response = Response::new(StreamBody::new(rx).boxed());
        response.headers_mut().insert(hyper::header::CONTENT_TYPE, "application/json".parse().expect("header"));
        response
    }
}
