//! A Node's labels, compact: sorted pairs of shared strings instead of a tree of owned ones. At
//! 5,000 Nodes of twenty labels each the tree was 10 MB; the Nodes carry the same twenty keys and
//! a handful of values (zones, regions, machine types), which the cluster state keeps once.

use std::{collections::BTreeMap, sync::Arc};

/// Labels, sorted by key, each key once.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Labels(Box<[(Arc<str>, Arc<str>)]>);

impl Labels {
    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.get_shared(key).map(|value| &**value)
    }

    /// The value of `key` as held: once in the cluster state, the state's shared copy.
    pub fn get_shared(&self, key: &str) -> Option<&Arc<str>> {
        let at = self.0.binary_search_by(|(k, _)| (**k).cmp(key)).ok()?;
        Some(&self.0[at].1)
    }

    /// True if `key` is set (to any value, even empty).
    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Sets `key` to `value`.
    pub fn insert(&mut self, key: &str, value: &str) {
        *self = self.iter().filter(|(k, _)| *k != key).chain([(key, value)]).collect();
    }

    /// Every label, by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }

    /// Replaces every key and value with the copy `share` gives (the cluster state's).
    pub(crate) fn share(&mut self, mut share: impl FnMut(Arc<str>) -> Arc<str>) {
        for (key, value) in &mut self.0 {
            *key = share(Arc::clone(key));
            *value = share(Arc::clone(value));
        }
    }
}

impl<K: Into<Arc<str>>, V: Into<Arc<str>>> FromIterator<(K, V)> for Labels {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(pairs: I) -> Self {
        // The last value of a key repeated wins, as in a map.
        let sorted: BTreeMap<Arc<str>, Arc<str>> = pairs.into_iter().map(|(k, v)| (k.into(), v.into())).collect();
        Self(sorted.into_iter().collect())
    }
}

impl From<BTreeMap<String, String>> for Labels {
    fn from(map: BTreeMap<String, String>) -> Self {
        map.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_read_like_a_map() {
        let mut labels: Labels = [("b", "2"), ("a", "1"), ("b", "3")].into_iter().collect();
        assert_eq!(labels.get("a"), Some("1"));
        assert_eq!(labels.get("b"), Some("3"), "the last value of a repeated key");
        assert_eq!(labels.get("c"), None);
        labels.insert("c", "");
        labels.insert("a", "9");
        assert!(labels.contains_key("c"));
        assert_eq!(labels.iter().collect::<Vec<_>>(), [("a", "9"), ("b", "3"), ("c", "")]);
        let map = BTreeMap::from([("z".to_owned(), "1".to_owned())]);
        assert_eq!(Labels::from(map).get("z"), Some("1"));
    }

    #[test]
    fn shared_labels_are_the_same_labels() {
        let mut labels: Labels = [("zone", "a")].into_iter().collect();
        let before = labels.clone();
        let zone: Arc<str> = "a".into();
        labels.share(|text| if *text == *zone { Arc::clone(&zone) } else { text });
        assert_eq!(labels, before);
        assert!(Arc::ptr_eq(&labels.0[0].1, &zone));
    }
}
