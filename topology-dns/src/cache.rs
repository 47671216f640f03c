//! Answers already built, by query: while the view is the same, the same query bytes (all but the
//! id) get the same answer bytes, so a repeated name costs a hash lookup and a copy instead of a
//! parse, a policy lookup and an encode. Answers drawn by weight (spillover) are never kept: each
//! of those must be drawn anew. One cache per socket loop, so no lock.

use std::{collections::HashMap, sync::Arc};

use hickory_proto::rr::RecordType;
use topology_policy::desired::Locality;

use super::view::DnsView;

/// Entries kept before the cache starts over (a few hundred bytes each).
const MAX_ENTRIES: usize = 4096;

/// One answer, as sent but for its id.
#[derive(Clone, Debug)]
pub struct Cached {
    /// The encoded answer; bytes 0..2 (the id) are the request's.
    pub bytes: Box<[u8]>,
    /// Query type, for the metrics.
    pub qtype: Option<RecordType>,
    /// Outcome, for the metrics.
    pub outcome: &'static str,
    /// Localities of the endpoints answered, for the metrics.
    pub localities: Box<[Locality]>,
}

/// Answers by query bytes (without the id), valid for one view.
#[derive(Default)]
pub struct AnswerCache {
    /// The view the answers were built from; held, so its address cannot be reused meanwhile.
    view: Option<Arc<DnsView>>,
    answers: HashMap<Box<[u8]>, Cached>,
}

impl AnswerCache {
    /// The answer to `request` from `view`, with the request's id, if one was kept.
    pub fn get(&mut self, view: &Arc<DnsView>, request: &[u8]) -> Option<(Vec<u8>, &Cached)> {
        if !self.view.as_ref().is_some_and(|kept| Arc::ptr_eq(kept, view)) {
            self.answers.clear();
            self.view = Some(Arc::clone(view));
            return None;
        }
        let cached = self.answers.get(request.get(2..)?)?;
        let mut bytes = cached.bytes.to_vec();
        bytes.get_mut(..2)?.copy_from_slice(request.get(..2)?);
        Some((bytes, cached))
    }

    /// Keeps `cached` as the answer to `request` from the current view.
    pub fn put(&mut self, request: &[u8], cached: Cached) {
        let (Some(key), true) = (request.get(2..), request.len() >= 12) else { return };
        if self.answers.len() >= MAX_ENTRIES {
            self.answers.clear();
        }
        self.answers.insert(key.into(), cached);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cached(bytes: &[u8]) -> Cached {
        Cached { bytes: bytes.into(), qtype: Some(RecordType::A), outcome: "answer", localities: Box::new([]) }
    }

    #[test]
    fn a_kept_answer_carries_the_new_id_and_goes_with_its_view() {
        let (one, two) = (Arc::new(DnsView::default()), Arc::new(DnsView::default()));
        let mut cache = AnswerCache::default();
        let query = [0xaa, 0xbb, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 9];
        assert!(cache.get(&one, &query).is_none(), "empty");
        cache.put(&query, cached(&[0, 0, 0x81, 0x80, 7]));
        let again = [0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 9];
        assert_eq!(cache.get(&one, &again).map(|(bytes, _)| bytes), Some(vec![0x12, 0x34, 0x81, 0x80, 7]));
        let other = [0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 8];
        assert!(cache.get(&one, &other).is_none(), "another question");
        assert!(cache.get(&two, &again).is_none(), "a new view starts empty");
        assert!(cache.get(&two, &again).is_none());
        cache.put(&[1, 2, 3], cached(&[0, 0, 1]));
        assert!(cache.get(&two, &[1, 2, 3]).is_none(), "no header, nothing kept");
    }
}
