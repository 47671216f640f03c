//! `service.kubernetes.io/topology-mode: Auto` as the EndpointSlice controller computes the hints
//! (`topologycache`) and kube-proxy uses them.
//!
//! Each zone should get endpoints in proportion to its allocatable CPU (`desired`), but at least
//! `⌈desired / 1.2⌉` so no endpoint is expected to be more than 20 % overloaded. Every endpoint
//! starts hinted for its own zone; zones holding more than they should give whole endpoints to
//! zones that hold less, largest difference first, while both sides differ by at least half an
//! endpoint. No hints at all (every zone uses every endpoint) when there are fewer endpoints
//! than zones, or when the minimums do not fit in the endpoints there are.

use crate::space::{Input, ZONES};

/// The most any endpoint should be overloaded.
const OVERLOAD_THRESHOLD: f64 = 0.2;

/// `groups[r][j]`: endpoints of zone `j` hinted for zone `r`; `None`: no hints.
pub fn auto(input: &Input) -> Option<Vec<Vec<u32>>> {
    let total = input.total_endpoints();
    let cpu: u32 = input.nodes.iter().sum();
    if (ZONES as u32) > total {
        return None;
    }
    let mut target = [0.0; ZONES];
    let mut minimums = 0;
    for (target, &nodes) in target.iter_mut().zip(&input.nodes) {
        let desired = f64::from(nodes) / f64::from(cpu) * f64::from(total);
        let minimum = (desired * (1.0 / (1.0 + OVERLOAD_THRESHOLD))).ceil();
        *target = desired.max(minimum);
        minimums += minimum as u32;
        if minimums > total {
            return None;
        }
    }
    // How many endpoints each zone gives away or receives.
    let mut giving = [0.0; ZONES];
    let mut receiving = [0.0; ZONES];
    for zone in 0..ZONES {
        let held = f64::from(input.endpoints[zone]);
        if held > target[zone] {
            giving[zone] = held - target[zone];
        } else if held < target[zone] {
            receiving[zone] = target[zone] - held;
        }
    }
    let mut gives = [0u32; ZONES];
    let mut receives = [0u32; ZONES];
    loop {
        let (giver, to_give) = most(&giving);
        let (receiver, to_receive) = most(&receiving);
        let (Some(giver), Some(receiver)) = (giver, receiver) else { break };
        if (to_give < 1.0 && to_receive < 1.0) || to_give < 0.5 || to_receive < 0.5 {
            break;
        }
        gives[giver] += 1;
        giving[giver] -= 1.0;
        receives[receiver] += 1;
        receiving[receiver] -= 1.0;
    }
    // Hand the given endpoints to the receivers (which giver serves which receiver does not
    // change any load: a zone's traffic spreads evenly over the endpoints hinted for it).
    let mut groups = vec![vec![0u32; ZONES]; ZONES];
    for zone in 0..ZONES {
        groups[zone][zone] = input.endpoints[zone] - gives[zone];
    }
    let mut givers = (0..ZONES).flat_map(|g| std::iter::repeat_n(g, gives[g] as usize));
    for (receiver, &count) in receives.iter().enumerate() {
        for _ in 0..count {
            let giver = givers.next().expect("as many endpoints given as received");
            groups[receiver][giver] += 1;
        }
    }
    Some(groups)
}

/// The zone with the largest positive value (the first of equals), as `getMost` finds it.
fn most(values: &[f64; ZONES]) -> (Option<usize>, f64) {
    let mut best = (None, 0.0);
    for (zone, &value) in values.iter().enumerate() {
        if value > best.1 {
            best = (Some(zone), value);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auto_of(nodes: [u32; 3], endpoints: [u32; 3]) -> Option<Vec<Vec<u32>>> {
        auto(&Input { nodes, endpoints })
    }

    #[test]
    fn no_hints_below_one_endpoint_per_zone_or_when_minimums_do_not_fit() {
        assert_eq!(auto_of([1, 1, 1], [0, 1, 1]), None, "2 endpoints, 3 zones");
        assert!(auto_of([1, 1, 1], [0, 0, 3]).is_some());
        // 4 endpoints, demand 1/1/8: minimums ⌈0.33⌉ + ⌈0.33⌉ + ⌈2.67⌉ = 5 > 4.
        assert_eq!(auto_of([1, 1, 8], [1, 1, 2]), None);
    }

    #[test]
    fn endpoints_move_from_giving_to_receiving_zones() {
        // 12 endpoints, equal CPU: 4 each. Zone 1 has 0, zone 3 has 8: zone 3 gives 4.
        let groups = auto_of([1, 1, 1], [0, 4, 8]).unwrap();
        assert_eq!(groups, vec![vec![0, 0, 4], vec![0, 4, 0], vec![0, 0, 4]]);
        // Differences under half an endpoint stay.
        let groups = auto_of([1, 1, 1], [3, 3, 4]).unwrap();
        assert_eq!(groups, vec![vec![3, 0, 0], vec![0, 3, 0], vec![0, 0, 4]]);
    }
}
