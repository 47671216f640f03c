//! The controller: once per interval, from the windows of the backends of each feedback port, how
//! much of this node's traffic leaves its zone, which backends are ejected, and whether the port
//! panics. Pure: time comes in as milliseconds, measurements as windows.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
};

use super::{
    Inputs, Measured, PortInput, PortKey, Tuning,
    signal::{Window, Windows},
};
use crate::dataplane::MeasuredBackend;

/// A port's usable endpoints, by where they are from this node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortBackends {
    /// This node's and this zone's.
    pub near: Vec<SocketAddr>,
    /// The other zones' the static plan's scope admits.
    pub far: Vec<SocketAddr>,
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
    baseline_us: Option<f64>,
    last_change_ms: Option<u64>,
    ejections: BTreeMap<SocketAddr, Ejection>,
    input: PortInput,
}

/// Every feedback port's controller, and the windows they read.
#[derive(Clone, Debug, Default)]
pub struct Controller {
    tuning: Tuning,
    windows: Windows,
    ports: BTreeMap<PortKey, PortState>,
}

impl Controller {
    /// A controller with `tuning`.
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
    let usable = ports.near.len() + ports.far.len();
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
    let sum = |backends: &[SocketAddr]| {
        let mut total = Window::default();
        for backend in backends.iter().filter(|b| !ejected.contains(b)) {
            if let Some(window) = windows.get(backend) {
                total.add(window);
            }
        }
        total
    };
    let (near, far) = (sum(&ports.near), sum(&ports.far));
    let (near_us, far_us) = (near.mean_lifetime_us(t.min_samples), far.mean_lifetime_us(t.min_samples));
    let drifted = state.baseline_us.map(|b| b * t.baseline_drift);
    state.baseline_us = [drifted, near_us, far_us].into_iter().flatten().reduce(f64::min);
    let measured = Measured {
        baseline_us: state.baseline_us,
        near_us,
        far_us,
        near_in_flight: near.in_flight,
        far_in_flight: far.in_flight,
    };
    let (target, why) = decide(state.shift, &measured, !ports.far.is_empty(), t);
    let target = (target * 100.0).round() / 100.0;
    let ejected_list: Vec<SocketAddr> = ejected.into_iter().collect();
    let moves = target != state.shift || ejected_list != state.input.ejected;
    if moves && !may_change {
        // At most one change of the set per interval: keep the last input's decision.
        state.input.measured = measured;
        return;
    }
    if moves {
        state.last_change_ms = Some(now_ms);
    }
    state.shift = target;
    state.input = PortInput { shift: target, ejected: ejected_list, panic: false, measured, reason: why };
}

/// The shift after this interval, and why.
fn decide(shift: f64, m: &Measured, has_far: bool, t: &Tuning) -> (f64, String) {
    let band = format!("band {:.1}–{:.1}×", t.band_low, t.band_high);
    if !has_far {
        return (0.0, "no usable endpoint in another zone: nothing to move".into());
    }
    let Some(near) = m.near_ratio() else {
        return (shift, format!("too few connections ended to read the zone's latency: holding {}", pct(shift)));
    };
    let far = m.far_ratio();
    if near > t.band_high {
        if let Some(far) = far.filter(|&far| far >= near) {
            return (
                shift,
                format!("zone at {near:.1}× its unloaded latency, other zones at {far:.1}×: holding {}", pct(shift)),
            );
        }
        let push = ((near - t.band_low) / t.band_high).clamp(0.2, 1.0);
        let next = (shift + t.step_out * push).min(t.max_shift);
        return (
            next,
            format!("zone at {near:.1}× its unloaded latency ({band}): moving {} → {} out", pct(shift), pct(next)),
        );
    }
    if let Some(far) = far.filter(|&far| far > t.band_high && far > near && shift > 0.0) {
        let next = (shift - t.step_back).max(0.0);
        return (
            next,
            format!("other zones at {far:.1}×, this zone at {near:.1}×: moving back {} → {}", pct(shift), pct(next)),
        );
    }
    if near < t.band_low && shift > 0.0 {
        let next = (shift - t.step_back).max(0.0);
        return (
            next,
            format!("zone at {near:.1}× its unloaded latency ({band}): moving back {} → {}", pct(shift), pct(next)),
        );
    }
    (shift, format!("zone at {near:.1}× its unloaded latency ({band}): holding {}", pct(shift)))
}

/// Updates the port's ejections from this interval's failures; returns the backends out now.
fn eject(
    state: &mut PortState,
    now_ms: u64,
    ports: &PortBackends,
    windows: &BTreeMap<SocketAddr, Window>,
    t: &Tuning,
) -> BTreeSet<SocketAddr> {
    let usable: BTreeSet<&SocketAddr> = ports.near.iter().chain(&ports.far).collect();
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
