//! Field selectors, as the API server takes them on every resource's lists and watches:
//! `metadata.name` and `metadata.namespace`, each term `field=value`, `field==value` or
//! `field!=value`, terms joined by `,` (all must hold). A field label the fake does not model is
//! refused with the server's 400 for a label a resource does not support (the server has a few
//! per kind, such as a Node's `spec.unschedulable`; nothing here asks for them).

use hyper::{Response, StatusCode};

use super::wire::{Body, json_response, status};

/// A parsed `fieldSelector`: every object when empty.
#[derive(Clone, Debug, Default)]
pub(super) struct Fields {
    terms: Vec<Term>,
}

#[derive(Clone, Debug)]
struct Term {
    /// `metadata.name` (else `metadata.namespace`).
    name: bool,
    equal: bool,
    value: String,
}

impl Fields {
    /// The selector of `text` (`None` or empty: everything), or the server's refusal.
    pub(super) fn parse(text: Option<&str>) -> Result<Self, Box<Response<Body>>> {
        let mut terms = Vec::new();
        for term in text.unwrap_or_default().split(',').map(str::trim).filter(|term| !term.is_empty()) {
            let (field, equal, value) = if let Some((field, value)) = term.split_once("!=") {
                (field, false, value)
            } else if let Some((field, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (field, true, value)
            } else {
                let message = format!("invalid selector: '{term}'; can't understand '{term}'");
                return Err(Box::new(json_response(StatusCode::BAD_REQUEST, &status(400, "BadRequest", &message))));
            };
            let name = match field.trim() {
                "metadata.name" => true,
                "metadata.namespace" => false,
                other => {
                    let message = format!("field label not supported: {other}");
                    return Err(Box::new(json_response(StatusCode::BAD_REQUEST, &status(400, "BadRequest", &message))));
                }
            };
            terms.push(Term { name, equal, value: value.trim().to_owned() });
        }
        Ok(Self { terms })
    }

    /// Whether it selects every object (no term).
    pub(super) fn everything(&self) -> bool {
        self.terms.is_empty()
    }

    /// Whether the object `name` of `namespace` is selected. Both fields are immutable, so an
    /// object is selected before and after any change alike: a watch filters its events one by
    /// one, with no ADDED or DELETED made up for objects moving in or out.
    pub(super) fn selects(&self, namespace: &str, name: &str) -> bool {
        self.terms.iter().all(|term| {
            let field = if term.name { name } else { namespace };
            (field == term.value) == term.equal
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_select_by_name_and_namespace() {
        let all = Fields::parse(None).unwrap();
        assert!(all.selects("", "a"));
        let one = Fields::parse(Some("metadata.name=node-a")).unwrap();
        assert!(one.selects("", "node-a") && !one.selects("", "node-b"));
        let both = Fields::parse(Some("metadata.namespace==shop,metadata.name!=web")).unwrap();
        assert!(both.selects("shop", "api"));
        assert!(!both.selects("shop", "web") && !both.selects("kube-system", "api"));
    }

    #[test]
    fn fields_the_fake_does_not_model_are_refused() {
        assert!(Fields::parse(Some("spec.unschedulable=true")).is_err());
        assert!(Fields::parse(Some("metadata.name")).is_err());
    }
}
