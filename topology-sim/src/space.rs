//! The KubeCon input space, generated as the k8s-topology-simulator generated it: three zones,
//! each zone's node count from 1 to 10 and endpoint count from 0 to 100, as sorted tuples
//! (`combinations_with_replacement`, so the zone with the most nodes also has the most endpoints),
//! every combination except "no endpoint at all"; plus a section of larger clusters: 30 nodes per
//! zone and 100 to 1000 endpoints per zone in steps of 7. 39,273,145 inputs in all.

/// Zones of every input.
pub const ZONES: usize = 3;
/// Node counts of the main section.
const NODES: std::ops::RangeInclusive<u32> = 1..=10;
/// Endpoint counts of the main section.
const ENDPOINTS: std::ops::RangeInclusive<u32> = 0..=100;
/// Nodes per zone of the large section.
const LARGE_NODES: u32 = 30;

/// One cluster: nodes and endpoints per zone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Input {
    /// Nodes per zone (demand: every node has the same allocatable CPU).
    pub nodes: [u32; ZONES],
    /// Endpoints per zone.
    pub endpoints: [u32; ZONES],
}

impl Input {
    /// Every endpoint.
    pub fn total_endpoints(&self) -> u32 {
        self.endpoints.iter().sum()
    }
}

/// Sorted triples of `values` (with repetition), in lexicographic order.
fn triples(values: &[u32]) -> Vec<[u32; 3]> {
    let mut out = Vec::new();
    for (i, &a) in values.iter().enumerate() {
        for (j, &b) in values.iter().enumerate().skip(i) {
            for &c in &values[j..] {
                out.push([a, b, c]);
            }
        }
    }
    out
}

/// A unit of work: one node triple of the main section, or the large section.
#[derive(Clone, Debug)]
pub struct Chunk {
    /// Position of the chunk's first input in the whole space (for sampling).
    pub first_index: u64,
    nodes: [u32; 3],
    endpoints: std::sync::Arc<Vec<[u32; 3]>>,
}

impl Chunk {
    /// Every input of the chunk with its index in the space.
    pub fn inputs(&self) -> impl Iterator<Item = (u64, Input)> + '_ {
        self.endpoints
            .iter()
            .filter(|e| **e != [0, 0, 0])
            .enumerate()
            .map(|(k, &endpoints)| (self.first_index + k as u64, Input { nodes: self.nodes, endpoints }))
    }

    /// Number of inputs.
    pub fn len(&self) -> u64 {
        self.endpoints.iter().filter(|e| **e != [0, 0, 0]).count() as u64
    }

    /// True when the chunk has no input.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The whole space in chunks, in order.
pub fn chunks() -> Vec<Chunk> {
    let small: Vec<u32> = ENDPOINTS.collect();
    let small = std::sync::Arc::new(triples(&small));
    let nodes: Vec<u32> = NODES.collect();
    let mut out = Vec::new();
    let mut index = 0;
    for triple in triples(&nodes) {
        let chunk = Chunk { first_index: index, nodes: triple, endpoints: std::sync::Arc::clone(&small) };
        index += chunk.len();
        out.push(chunk);
    }
    let large: Vec<u32> = (100..=1000).step_by(7).collect();
    out.push(Chunk { first_index: index, nodes: [LARGE_NODES; 3], endpoints: std::sync::Arc::new(triples(&large)) });
    out
}

/// Whether input `index` is in a sample of one in `every` (all when `every` is 1): a fixed hash
/// of the index, so the sample is spread over the whole space and the same on every run.
pub fn sampled(index: u64, every: u64) -> bool {
    every <= 1 || splitmix64(index).is_multiple_of(every)
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_space_has_the_simulators_39273145_inputs_in_sorted_tuples() {
        let chunks = chunks();
        assert_eq!(chunks.len(), 221, "220 node triples and the large section");
        let total: u64 = chunks.iter().map(Chunk::len).sum();
        assert_eq!(total, 39_273_145);
        let last = chunks.last().unwrap();
        assert_eq!(last.first_index + last.len(), total);
        let (_, first) = chunks[0].inputs().next().unwrap();
        assert_eq!(first, Input { nodes: [1, 1, 1], endpoints: [0, 0, 1] });
        assert!(chunks[5].inputs().all(|(_, i)| i.endpoints.windows(2).all(|w| w[0] <= w[1])));
    }

    #[test]
    fn a_sample_is_about_one_in_every() {
        let kept = (0..1_000_000u64).filter(|&i| sampled(i, 16)).count();
        assert!((kept as f64 / 62_500.0 - 1.0).abs() < 0.02, "{kept}");
        assert!((0..100).all(|i| sampled(i, 1)));
    }
}
