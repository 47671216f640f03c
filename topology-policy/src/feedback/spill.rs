//! Overload answered per connection. The controller moves traffic once an interval; between two
//! looks a surge queues on this zone's backends. So, on a port under feedback, the connect hook
//! itself moves a connection off a backend that has [`PortInput::spill_at`](super::PortInput)
//! or more connections in flight from this node, to a second backend of the set drawn uniformly
//! if that one carries fewer than half as many ([`topology_common::spill`]): the other zones'
//! endpoints stay in the set for it, in reserve, at a weight the weighted draw never picks.
//!
//! The limit is a multiple of the port's usual load: the most connections in flight to one of
//! this zone's backends at a look while the zone was calm (for request-per-connection traffic a
//! few; for a pool of long-lived connections its size, which is not an overload), and never below
//! [`Tuning::spill_min`]. It rises slowly (a surge's first moment, read before its latency shows,
//! does not raise it much) and falls by a tenth an interval.

use super::Tuning;

/// The most a limit can be: what the kernel's options hold.
pub const MAX_LIMIT: u32 = topology_common::service_flags::SPILL_MASK;

/// Share of the distance to a higher reading the usual load climbs in one interval.
const RISE: f64 = 0.25;
/// Factor the usual load falls by in an interval with a lower reading.
const FALL: f64 = 0.9;

/// The usual load after a look that read `per_backend` connections in flight to each of this
/// zone's backends (`None`: none measured yet), `calm` when the zone's latency is within the band;
/// a look in overload leaves it as it was.
pub fn usual(previous: Option<f64>, per_backend: Option<f64>, calm: bool) -> Option<f64> {
    let Some(reading) = per_backend.filter(|_| calm) else { return previous };
    Some(match previous {
        None => reading,
        Some(usual) if reading > usual => usual + (reading - usual) * RISE,
        Some(usual) => reading.max(usual * FALL),
    })
}

/// The connect hook's limit for a port whose usual load is `usual`: 0 (off) before the first
/// measurement or with `spill_min` 0.
pub fn limit(usual: Option<f64>, t: &Tuning) -> u32 {
    match usual {
        Some(usual) if t.spill_min > 0 => {
            let multiple = (usual * t.spill_factor).ceil().min(f64::from(MAX_LIMIT)) as u32;
            multiple.max(t.spill_min).min(MAX_LIMIT)
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_follows_the_usual_load_slowly_and_ignores_overload() {
        let t = Tuning::default();
        assert_eq!(limit(None, &t), 0, "nothing measured: off");
        let first = usual(None, Some(0.5), true);
        assert_eq!(limit(first, &t), 4, "a light port: the floor");
        assert_eq!(usual(first, Some(40.0), false), first, "overloaded: unchanged");
        let pool = usual(None, Some(50.0), true);
        assert_eq!(limit(pool, &t), 100, "a pool of 50: twice it");
        let rising = usual(first, Some(40.5), true).unwrap();
        assert_eq!(rising, 10.5, "a quarter of the way up");
        assert_eq!(usual(Some(10.0), Some(2.0), true), Some(9.0), "a tenth down");
        assert_eq!(usual(Some(10.0), Some(9.5), true), Some(9.5));
        assert_eq!(usual(Some(10.0), None, true), Some(10.0), "no reading");
        assert_eq!(limit(Some(1e9), &t), MAX_LIMIT, "what the kernel holds");
        assert_eq!(limit(Some(5.0), &Tuning { spill_min: 0, ..t }), 0, "off");
    }
}
