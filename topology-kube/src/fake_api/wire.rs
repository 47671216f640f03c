//! What the fake writes as the API server does: a Status, a JSON response, a watch event line.

use std::convert::Infallible;

use http_body_util::{BodyExt as _, combinators::BoxBody};
use hyper::{Response, StatusCode, body::Bytes};
use serde_json::{Value, json};

/// A response body.
pub(super) type Body = BoxBody<Bytes, std::io::Error>;

/// A watch event line, `type` first as the API server writes it (`json!` would sort `object`
/// first, and a client's decoder then has to buffer the whole object before it knows the type);
/// and the object's part of it.
pub(super) fn event_line(kind: &str, object: &Value) -> Bytes {
    event(kind, object).0
}

/// The event line and the object's part of it.
pub(super) fn event(kind: &str, object: &Value) -> (Bytes, Bytes) {
    let mut text = format!(r#"{{"type":"{kind}","object":"#).into_bytes();
    let start = text.len();
    serde_json::to_writer(&mut text, object).expect("JSON");
    let end = text.len();
    text.extend_from_slice(b"}\n");
    let line = Bytes::from(text);
    let json = line.slice(start..end);
    (line, json)
}

/// A Status object of a failure.
pub(super) fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

/// A response with a JSON body.
pub(super) fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    bytes_response(status, serde_json::to_vec(value).expect("JSON"))
}

/// A response with a JSON body already serialized.
pub(super) fn bytes_response(status: StatusCode, body: Vec<u8>) -> Response<Body> {
    let body = http_body_util::Full::new(Bytes::from(body)).map_err(|never: Infallible| match never {}).boxed();
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(hyper::header::CONTENT_TYPE, "application/json".parse().expect("header"));
    response
}
