//! Fields decoded without building a `String` on the way: the names a list repeats on every
//! endpoint (its node, its zone) come out of the parser as shared strings, and an address as an
//! address. A list of 500,000 endpoints otherwise allocates and frees six strings per endpoint
//! between the parser and the cluster state, which keeps one shared copy of each name anyway.

use std::{cell::RefCell, collections::HashSet, fmt, net::IpAddr, sync::Arc};

use serde::{
    Deserialize, Deserializer,
    de::{self, IgnoredAny, SeqAccess, Visitor},
};

/// Names a decoding thread keeps to share; past this many it starts over (a cluster's node names
/// and zones are far fewer, so this only bounds what a thread holds after an unusual list).
const SHARED_NAMES: usize = 16_384;

thread_local! {
    /// The names this thread decoded, each once.
    static NAMES: RefCell<HashSet<Arc<str>, foldhash::fast::RandomState>> = RefCell::default();
}

/// A string many objects repeat, decoded into a copy shared with every other occurrence this
/// thread decoded: no allocation per occurrence.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SharedName(pub Arc<str>);

impl SharedName {
    /// The shared copy of `text`.
    pub fn new(text: &str) -> Self {
        Self(NAMES.with_borrow_mut(|names| {
            if let Some(shared) = names.get(text) {
                return Arc::clone(shared);
            }
            if names.len() >= SHARED_NAMES {
                names.clear();
            }
            let shared: Arc<str> = Arc::from(text);
            names.insert(Arc::clone(&shared));
            shared
        }))
    }
}

impl<'de> Deserialize<'de> for SharedName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Shared;
        impl Visitor<'_> for Shared {
            type Value = SharedName;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<SharedName, E> {
                Ok(SharedName::new(text))
            }
        }
        deserializer.deserialize_str(Shared)
    }
}

/// The first of an endpoint's `addresses` (the one kube-proxy routes to), parsed as it is read;
/// the others are skipped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum FirstAddress {
    /// The list is empty.
    #[default]
    Missing,
    /// An IP address.
    Ip(IpAddr),
    /// Not an IP address: the text, for the error.
    Invalid(Box<str>),
}

impl<'de> Deserialize<'de> for FirstAddress {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Address;
        impl Visitor<'_> for Address {
            type Value = FirstAddress;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an IP address")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<FirstAddress, E> {
                Ok(text.parse().map_or_else(|_| FirstAddress::Invalid(text.into()), FirstAddress::Ip))
            }
        }
        /// One element of the list, read by [`Address`].
        struct One(FirstAddress);
        impl<'de> Deserialize<'de> for One {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                deserializer.deserialize_str(Address).map(One)
            }
        }
        struct List;
        impl<'de> Visitor<'de> for List {
            type Value = FirstAddress;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of IP addresses")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<FirstAddress, A::Error> {
                let first = seq.next_element::<One>()?.map_or(FirstAddress::Missing, |one| one.0);
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(first)
            }
        }
        deserializer.deserialize_seq(List)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_decoded_twice_is_one_shared_string() {
        let [a, b]: [SharedName; 2] = serde_json::from_str(r#"["node-7","node-7"]"#).unwrap();
        assert!(Arc::ptr_eq(&a.0, &b.0));
        assert_eq!(&*a.0, "node-7");
        let escaped: SharedName = serde_json::from_str(r#""node-\u0037""#).unwrap();
        assert!(Arc::ptr_eq(&a.0, &escaped.0), "an escaped string is the same name");
    }

    #[test]
    fn the_first_address_is_parsed_and_the_rest_skipped() {
        let parse = |json: &str| serde_json::from_str::<FirstAddress>(json).unwrap();
        assert_eq!(parse(r#"["10.0.0.1","not read"]"#), FirstAddress::Ip("10.0.0.1".parse().unwrap()));
        assert_eq!(parse(r#"["fd00::1"]"#), FirstAddress::Ip("fd00::1".parse().unwrap()));
        assert_eq!(parse("[]"), FirstAddress::Missing);
        assert_eq!(parse(r#"["10.0.0.300"]"#), FirstAddress::Invalid("10.0.0.300".into()));
        assert!(serde_json::from_str::<FirstAddress>("[1]").is_err(), "an address is a string");
        assert!(serde_json::from_str::<FirstAddress>(r#""10.0.0.1""#).is_err(), "addresses are a list");
    }
}
