//! The controller: once per interval, from the windows of the backends of each feedback port, how
//! much of this node's traffic leaves its zone, which backends are ejected, and whether the port
//! panics. Pure: time comes in as milliseconds, measurements as windows.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
};

use super::{
    Inputs, Measured, PortInput, PortKey, Tuning,
    measured::MeasuredBackend,
    signal::{Window, Windows},
    spill,
};

/// A port's usable endpoints, by where they are from this node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortBackends {
    /// This node's and this zone's.
    pub near: Vec<SocketAddr>,
    /// The other zones' the static plan's scope admits, by zone.
    pub far: BTreeMap<String, Vec<SocketAddr>>,
}

impl PortBackends {
    /// Every other zone's endpoint.
    pub fn far_all(&self) -> impl Iterator<Item = &SocketAddr> {
        self.far.values().flatten()
    }
}

/// A backend out of the set for failing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ejection {
    /// When it may come back.
    until_ms: u64,
    /// Ejections in a row: each doubles the back-off.
    count: u32,
}

/// What the controller keeps of one port between intervals.
#[derive(Clone, Debug, Default)]
struct PortState {
    shift: f64,
    last_look_ms: Option<u64>,
    /// Other zones found overloaded, until when they get no moved traffic.
    avoid: BTreeMap<String, u64>,
    /// This node's share of the zone's capacity (per second), and when the zone was last seen
    /// saturated.
    capacity: Option<(f64, u64)>,
    baseline_us: Option<f64>,
    last_change_ms: Option<u64>,
    ejections: BTreeMap<SocketAddr, Ejection>,
    /// The most connections in flight to one of this zone's backends while it was calm
    /// ([`spill::usual`]).
    usual_in_flight: Option<f64>,
    input: PortInput,
}

/// The feedback regulator: every feedback port's state, and the windows it reads (not the control
/// loop, which is `Controller` in the agent).
#[derive(Clone, Debug, Default)]
pub struct Regulator {
    tuning: Tuning,
    windows: Windows,
    ports: BTreeMap<PortKey, PortState>,
}

impl Regulator {
    /// A regulator with `tuning`.
    pub fn new(tuning: Tuning) -> Self {
        Self { tuning, ..Self::default() }
    }

    /// Its constants.
    pub fn tuning(&self) -> &Tuning {
        &self.tuning
    }

    /// One interval: reads the kernel's counters, decides every port in `ports` (others are
    /// forgotten), and returns the ports whose input changed.
    pub fn step(
        &mut self,
        now_ms: u64,
        reading: &[MeasuredBackend],
        ports: &BTreeMap<PortKey, PortBackends>,
    ) -> BTreeSet<PortKey> {
        let windows = self.windows.advance(reading);
        self.ports.retain(|key, _| ports.contains_key(key));
        let mut changed = BTreeSet::new();
        for (key, backends) in ports {
            let state = self.ports.entry(key.clone()).or_default();
            let before = state.input.clone();
            step_port(state, now_ms, backends, &windows, &self.tuning);
            if state.input.shift != before.shift
                || state.input.ejected != before.ejected
                || state.input.panic != before.panic
                || state.input.spill_at != before.spill_at
            {
                changed.insert(key.clone());
            }
        }
        changed
    }

    /// The current input of every port.
    pub fn inputs(&self) -> Inputs {
        self.ports.iter().map(|(key, state)| (key.clone(), state.input.clone())).collect()
    }
}

/// Decides one port for one interval (see the module documentation of [`super`]).
fn step_port(
    state: &mut PortState,
    now_ms: u64,
    ports: &PortBackends,
    windows: &BTreeMap<SocketAddr, Window>,
    t: &Tuning,
) {
    let usable = ports.near.len() + ports.far_all().count();
    let may_change = state.last_change_ms.is_none_or(|at| now_ms.saturating_sub(at) >= t.interval_ms);
    if usable < t.min_endpoints {
        state.shift = 0.0;
        state.ejections.clear();
        state.input = PortInput {
            reason: format!("{usable} usable endpoints, fewer than {}: the static plan", t.min_endpoints),
            ..PortInput::default()
        };
        return;
    }
    let ejected = eject(state, now_ms, ports, windows, t);
    if ejected.len() as f64 > t.panic_ratio * usable as f64 {
        state.input = PortInput {
            panic: true,
            reason: format!(
                "panic: {} of {usable} endpoints failing (more than {:.0}%): every endpoint, equally",
                ejected.len(),
                t.panic_ratio * 100.0
            ),
            ..PortInput::default()
        };
        return;
    }
    let sum = |backends: &mut dyn Iterator<Item = &SocketAddr>| {
        let mut total = Window::default();
        for backend in backends.filter(|b| !ejected.contains(b)) {
            if let Some(window) = windows.get(backend) {
                total.add(window);
            }
        }
        total
    };
    let (near, far) = (sum(&mut ports.near.iter()), sum(&mut ports.far_all()));
    let (near_us, far_us) = (near.mean_lifetime_us(t.min_samples), far.mean_lifetime_us(t.min_samples));
    let drifted = state.baseline_us.map(|b| b * t.baseline_drift);
    state.baseline_us = [drifted, near_us, far_us].into_iter().flatten().reduce(f64::min);
    let seconds = state.last_look_ms.map_or(t.interval_ms, |at| now_ms.saturating_sub(at)).max(1) as f64 / 1000.0;
    state.last_look_ms = Some(now_ms);
    let offered_per_s = (near.connects + far.connects) as f64 / seconds;
    let near_done_per_s = near.closed as f64 / seconds;
    let saturated = near_us.zip(state.baseline_us).is_some_and(|(near, base)| t.overloaded(near, base));
    let measured_near = ports.near.iter().filter(|b| !ejected.contains(*b) && windows.contains_key(*b)).count();
    let per_backend = (measured_near > 0).then(|| near.in_flight as f64 / measured_near as f64);
    let calm = !saturated && near_us.zip(state.baseline_us).is_none_or(|(near, base)| near / base < t.band_low);
    state.usual_in_flight = spill::usual(state.usual_in_flight, per_backend, calm);
    let spill_at = spill::limit(state.usual_in_flight, t);
    // What the zone completed is its capacity only while a queue stood through the interval: at
    // its end more connections were in flight than the zone serves at once (Little's law). A
    // backlog that emptied partway through (the end of a surge) completes less, and says nothing.
    let queue_remains =
        state.baseline_us.is_some_and(|base| near.in_flight as f64 > near_done_per_s * base / 1e6 + 1.0);
    state.capacity = match state.capacity {
        // Within the memory the highest reading stands: a saturated interval whose queue emptied
        // near its end reads low, and a capacity that really dropped shows as a growing backlog,
        // which the drain term answers.
        Some((capacity, at)) if saturated && queue_remains && now_ms.saturating_sub(at) <= t.capacity_memory_ms => {
            Some((capacity.max(near_done_per_s), now_ms))
        }
        _ if saturated && queue_remains && near_done_per_s > 0.0 => Some((near_done_per_s, now_ms)),
        Some((_, at)) if now_ms.saturating_sub(at) > t.capacity_memory_ms => None,
        Some((capacity, at)) => Some((capacity.max(near_done_per_s), at)),
        None => None,
    };
    avoid_loaded(state, now_ms, ports, &|zone| sum(&mut zone.iter()), t);
    let measured = Measured {
        baseline_us: state.baseline_us,
        near_us,
        far_us,
        near_in_flight: near.in_flight,
        far_in_flight: far.in_flight,
        offered_per_s,
        near_done_per_s,
        capacity_per_s: state.capacity.map(|(capacity, _)| capacity),
    };
    let (target, why) = decide(state.shift, &measured, ports.far_all().next().is_some(), t);
    let target = (target * 100.0).round() / 100.0;
    let small = target != state.shift && (target - state.shift).abs() < t.min_move;
    let (target, why) = if target != 0.0 && small {
        (state.shift, format!("{why} (a move under {} is not made)", pct(t.min_move)))
    } else {
        (target, why)
    };
    let ejected_list: Vec<SocketAddr> = ejected.into_iter().collect();
    let moves = target != state.shift || ejected_list != state.input.ejected;
    if moves && !may_change {
        // At most one change of the set per interval: keep the last input's decision.
        state.input.measured = measured;
        state.input.spill_at = spill_at;
        return;
    }
    if moves {
        state.last_change_ms = Some(now_ms);
    }
    state.shift = target;
    let avoid = state.avoid.keys().cloned().collect();
    state.input =
        PortInput { shift: target, ejected: ejected_list, avoid, panic: false, spill_at, measured, reason: why };
}

/// Marks the other zones whose latency is above the band: moved traffic skips them for a while
/// (they are not measured once they get nothing), unless every other zone is marked.
fn avoid_loaded(
    state: &mut PortState,
    now_ms: u64,
    ports: &PortBackends,
    window: &dyn Fn(&[SocketAddr]) -> Window,
    t: &Tuning,
) {
    state.avoid.retain(|zone, until| ports.far.contains_key(zone) && now_ms < *until);
    let Some(baseline) = state.baseline_us else { return };
    for (zone, backends) in &ports.far {
        match window(backends).mean_lifetime_us(t.min_samples) {
            Some(us) if t.overloaded(us, baseline) => {
                state.avoid.insert(zone.clone(), now_ms + AVOID_MS);
            }
            Some(_) => {
                state.avoid.remove(zone);
            }
            None => {}
        }
    }
    if state.avoid.len() == ports.far.len() {
        state.avoid.clear();
    }
}

/// How long an overloaded zone gets no moved traffic without a new measurement, milliseconds.
const AVOID_MS: u64 = 5000;

/// The shift after this interval, and why.
///
/// Above the band the zone is saturated, and what this node's connections to it completed is this
/// node's share of its capacity: the shift aims at using `headroom` of it (the rest of the
/// traffic leaves), in steps of at most `step_out`; if the shift already does, the latency is a
/// backlog draining, and the shift holds. Below the band traffic comes back `step_back` at a time,
/// but never so much that the remembered capacity would be exceeded again; when that capacity
/// takes all of the demand (the surge is over), `step_out` at a time.
fn decide(shift: f64, m: &Measured, has_far: bool, t: &Tuning) -> (f64, String) {
    let band = format!("band {:.1}–{:.1}×", t.band_low, t.band_high);
    if !has_far {
        return (0.0, "no usable endpoint in another zone: nothing to move".into());
    }
    // The least shift that keeps this node's traffic to its zone within the remembered capacity.
    let floor = m
        .capacity_per_s
        .filter(|_| m.offered_per_s > 0.0)
        .map(|capacity| (1.0 - t.headroom * capacity / m.offered_per_s).clamp(0.0, t.max_shift));
    let Some(near) = m.near_ratio() else {
        let few = "too few connections ended to read the zone's latency";
        if floor == Some(0.0) && shift > 0.0 {
            // Few ended because few were sent: the remembered capacity takes all of the demand.
            let next = (shift - t.step_out).max(0.0);
            return (next, format!("{few}, but {}: moving back {} → {}", capacity_text(m), pct(shift), pct(next)));
        }
        return (shift, format!("{few}: holding {}", pct(shift)));
    };
    let over = |us: Option<f64>| us.zip(m.baseline_us).is_some_and(|(us, base)| t.overloaded(us, base));
    let absolute =
        m.near_us.zip(m.baseline_us).map_or(String::new(), |(us, base)| format!("{us:.0} µs over {base:.0} µs, "));
    let zone = format!("zone at {near:.1}× its unloaded latency ({absolute}{band})");
    let far = m.far_ratio();
    if near > t.band_high && !over(m.near_us) {
        let rise = format!("a rise under {:.0} µs, less than another zone's round trip", t.min_excess_us);
        return (shift, format!("{zone}, but {rise}: holding {}", pct(shift)));
    }
    if near > t.band_high {
        if let Some(far) = far.filter(|&far| far >= near) {
            return (shift, format!("{zone}, other zones at {far:.1}×: holding {}", pct(shift)));
        }
        // Little's law: the capacity serves capacity × unloaded latency connections at once; the
        // rest of what is in flight is a queue, drained within `drain_ms` by moving that much more.
        let drain = m.capacity_per_s.zip(m.baseline_us).filter(|_| m.offered_per_s > 0.0).map_or(0.0, |(c, base)| {
            let queued = (m.near_in_flight as f64 - c * base / 1e6).max(0.0);
            queued / (t.drain_ms as f64 / 1000.0) / m.offered_per_s
        });
        let floor = floor.map(|floor| (floor + drain).min(t.max_shift));
        return match floor {
            Some(floor) if floor <= shift => (
                shift,
                format!("{zone}, but {} out already fits its capacity: a backlog draining, holding", pct(shift)),
            ),
            Some(floor) => {
                let next = floor.min(shift + t.step_out);
                (next, format!("{zone}, {}: moving {} → {} out", capacity_text(m), pct(shift), pct(next)))
            }
            None => {
                let next = (shift + t.step_out).min(t.max_shift);
                (next, format!("{zone}: moving {} → {} out", pct(shift), pct(next)))
            }
        };
    }
    if let Some(far) = far.filter(|&far| over(m.far_us) && far > near && shift > 0.0) {
        let next = (shift - t.step_back).max(floor.unwrap_or(0.0)).min(shift);
        return (
            next,
            format!("other zones at {far:.1}×, this zone at {near:.1}×: moving back {} → {}", pct(shift), pct(next)),
        );
    }
    if near < t.band_low && shift > 0.0 {
        // When the remembered capacity takes all of this node's demand, the surge is over: come
        // back as fast as traffic left. Otherwise a step at a time, feeling for the capacity.
        let (step, how) = match floor {
            Some(0.0) => (t.step_out, format!(" ({})", capacity_text(m))),
            _ => (t.step_back, String::new()),
        };
        let next = (shift - step).max(floor.unwrap_or(0.0));
        if next >= shift {
            return (shift, format!("{zone}, but {}: holding {}", capacity_text(m), pct(shift)));
        }
        return (next, format!("{zone}: moving back {} → {}{how}", pct(shift), pct(next)));
    }
    (shift, format!("{zone}: holding {}", pct(shift)))
}

/// "this node's share of its capacity is 120/s of 300/s offered".
fn capacity_text(m: &Measured) -> String {
    match m.capacity_per_s {
        Some(capacity) => {
            format!("this node's share of its capacity is {capacity:.0}/s of {:.0}/s offered", m.offered_per_s)
        }
        None => "its capacity unknown".into(),
    }
}

/// Updates the port's ejections from this interval's failures; returns the backends out now.
fn eject(
    state: &mut PortState,
    now_ms: u64,
    ports: &PortBackends,
    windows: &BTreeMap<SocketAddr, Window>,
    t: &Tuning,
) -> BTreeSet<SocketAddr> {
    let usable: BTreeSet<&SocketAddr> = ports.near.iter().chain(ports.far_all()).collect();
    state.ejections.retain(|backend, e| usable.contains(backend) && now_ms < e.until_ms.saturating_add(t.eject_max_ms));
    for backend in &usable {
        let Some(window) = windows.get(backend) else { continue };
        let failing = window.failures >= t.eject_failures
            && window.failures as f64 >= t.eject_ratio * window.connects.max(window.failures) as f64;
        if !failing {
            continue;
        }
        let count = state.ejections.get(backend).map_or(1, |e| e.count.saturating_add(1));
        let backoff = t.eject_base_ms.saturating_mul(1 << (count - 1).min(16)).min(t.eject_max_ms);
        state.ejections.insert(**backend, Ejection { until_ms: now_ms + backoff, count });
    }
    state.ejections.iter().filter(|(_, e)| now_ms < e.until_ms).map(|(b, _)| *b).collect()
}

/// "40%".
fn pct(share: f64) -> String {
    format!("{:.0}%", share * 100.0)
}

#[cfg(test)]
mod tests;
