//! A Node's labels, compact: sorted pairs of shared strings instead of a tree of owned ones. At
//! 5,000 Nodes of twenty labels each the tree was 10 MB; the Nodes carry the same twenty keys and
//! a handful of values (zones, regions, machine types), which the cluster state keeps once.
//!
//! The zone and region are found once, when the labels are made: the policy reads them for every
//! endpoint it weighs, and a search among twenty keys that share their first 23 bytes was a fifth
//! of deciding a Service.

use std::{collections::BTreeMap, sync::Arc};

use super::objects::{LABEL_REGION, LABEL_ZONE};

/// Labels, sorted by key, each key once.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Labels {
    pairs: Box<[(Arc<str>, Arc<str>)]>,
    /// Where the zone and region labels are among `pairs`.
    zone: Option<u32>,
    region: Option<u32>,
}

impl Labels {
    fn new(pairs: Box<[(Arc<str>, Arc<str>)]>) -> Self {
        let at = |key: &str| pairs.binary_search_by(|(k, _)| (**k).cmp(key)).ok().and_then(|at| u32::try_from(at).ok());
        let (zone, region) = (at(LABEL_ZONE), at(LABEL_REGION));
        Self { pairs, zone, region }
    }

    /// `topology.kubernetes.io/zone`, as held (the cluster state's shared copy).
    pub fn zone(&self) -> Option<&Arc<str>> {
        self.zone.map(|at| &self.pairs[at as usize].1)
    }

    /// `topology.kubernetes.io/region`, as held.
    pub fn region(&self) -> Option<&Arc<str>> {
        self.region.map(|at| &self.pairs[at as usize].1)
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.get_shared(key).map(|value| &**value)
    }

    /// The value of `key` as held: once in the cluster state, the state's shared copy.
    pub fn get_shared(&self, key: &str) -> Option<&Arc<str>> {
        let at = self.pairs.binary_search_by(|(k, _)| (**k).cmp(key)).ok()?;
        Some(&self.pairs[at].1)
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
        self.pairs.iter().map(|(k, v)| (&**k, &**v))
    }

    /// Replaces every key and value with the copy `share` gives (the cluster state's).
    pub(crate) fn share(&mut self, mut share: impl FnMut(Arc<str>) -> Arc<str>) {
        // Keys keep their order: the positions found stay right.
        for (key, value) in &mut self.pairs {
            *key = share(Arc::clone(key));
            *value = share(Arc::clone(value));
        }
    }
}

impl<K: Into<Arc<str>>, V: Into<Arc<str>>> FromIterator<(K, V)> for Labels {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(pairs: I) -> Self {
        // The last value of a key repeated wins, as in a map.
        let sorted: BTreeMap<Arc<str>, Arc<str>> = pairs.into_iter().map(|(k, v)| (k.into(), v.into())).collect();
        Self::new(sorted.into_iter().collect())
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
    fn the_zone_and_region_are_found_wherever_they_sort() {
        let mut labels: Labels = [("z", "1"), (LABEL_REGION, "eu"), ("a", "0")].into_iter().collect();
        assert_eq!((labels.zone(), labels.region().map(|r| &**r)), (None, Some("eu")));
        labels.insert(LABEL_ZONE, "eu-1");
        labels.insert("topology.kubernetes.io/a", "moves the others");
        assert_eq!(labels.zone().map(|z| &**z), Some("eu-1"));
        assert_eq!(labels.region().map(|r| &**r), Some("eu"));
        labels.insert(LABEL_REGION, "us");
        assert_eq!(labels.region().map(|r| &**r), Some("us"));
        assert_eq!(Labels::default().zone(), None);
    }

    #[test]
    fn shared_labels_are_the_same_labels() {
        let mut labels: Labels = [("zone", "a")].into_iter().collect();
        let before = labels.clone();
        let zone: Arc<str> = "a".into();
        labels.share(|text| if *text == *zone { Arc::clone(&zone) } else { text });
        assert_eq!(labels, before);
        assert!(Arc::ptr_eq(&labels.pairs[0].1, &zone));
    }
}
