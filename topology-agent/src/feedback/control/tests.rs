//! The controller's band, bounds, rate limit, minimum, ejection and panic rules.

use super::*;
use crate::{
    cluster::{Family, ObjectKey},
    dataplane::LoadCounters,
};

const NEAR: [&str; 2] = ["10.0.1.1:80", "10.0.1.2:80"];
const FAR: [&str; 2] = ["10.0.2.1:80", "10.0.2.2:80"];

fn key() -> PortKey {
    PortKey { service: ObjectKey::new("default", "web"), port: 80, family: Family::V4 }
}

fn addrs(list: &[&str]) -> Vec<SocketAddr> {
    list.iter().map(|a| a.parse().unwrap()).collect()
}

/// Cumulative kernel counters the tests advance interval by interval.
struct Harness {
    controller: Controller,
    counters: BTreeMap<SocketAddr, LoadCounters>,
    ports: BTreeMap<PortKey, PortBackends>,
    now_ms: u64,
}

impl Harness {
    fn new(near: &[&str], far: &[&str]) -> Self {
        let ports = BTreeMap::from([(key(), PortBackends { near: addrs(near), far: addrs(far) })]);
        let mut harness =
            Self { controller: Controller::new(Tuning::default()), counters: BTreeMap::new(), ports, now_ms: 0 };
        // First sight of every backend: no window yet.
        harness.interval(&[], &[]);
        harness
    }

    /// One interval in which each of `near`'s and `far`'s backends closed 20 connections of the
    /// given latency (µs; `None`: no traffic) and `failing` backends failed 10 handshakes.
    fn interval(&mut self, latency: &[(&str, u64)], failing: &[&str]) -> bool {
        let all: Vec<SocketAddr> = self.ports[&key()].near.iter().chain(&self.ports[&key()].far).copied().collect();
        for backend in all {
            self.counters.entry(backend).or_default();
        }
        for (backend, us) in latency {
            let c = self.counters.get_mut(&backend.parse().unwrap()).unwrap();
            c.connects += 20;
            c.established += 20;
            c.closed += 20;
            c.lifetime_us += 20 * us;
        }
        for backend in failing {
            let c = self.counters.get_mut(&backend.parse().unwrap()).unwrap();
            c.connects += 10;
            c.refused += 10;
        }
        let reading: Vec<MeasuredBackend> = self
            .counters
            .iter()
            .map(|(backend, load)| MeasuredBackend { backend: *backend, in_flight: 0, connecting: 0, load: *load })
            .collect();
        let changed = self.controller.step(self.now_ms, &reading, &self.ports);
        self.now_ms += 1000;
        changed.contains(&key())
    }

    /// An interval where this zone's backends answer in `near_us` and the others' in `far_us`.
    fn zones(&mut self, near_us: u64, far_us: u64) -> PortInput {
        let port = &self.ports[&key()];
        let text = |list: &[SocketAddr], us: u64| list.iter().map(move |b| (b.to_string(), us)).collect::<Vec<_>>();
        let owned: Vec<(String, u64)> = text(&port.near, near_us).into_iter().chain(text(&port.far, far_us)).collect();
        let latency: Vec<(&str, u64)> = owned.iter().map(|(b, us)| (b.as_str(), *us)).collect();
        self.interval(&latency, &[]);
        self.input()
    }

    fn input(&self) -> PortInput {
        self.controller.inputs()[&key()].clone()
    }
}

#[test]
fn an_overloaded_zone_sheds_in_bounded_steps_holds_in_the_band_and_returns_below_it() {
    let t = Tuning::default();
    let mut h = Harness::new(&NEAR, &FAR);
    assert_eq!(h.zones(1000, 1000).shift, 0.0, "unloaded: nothing moves");
    let mut shifts = vec![0.0];
    for _ in 0..3 {
        let input = h.zones(4000, 1000);
        assert!(input.reason.contains("4.0× its unloaded latency"), "{}", input.reason);
        shifts.push(input.shift);
    }
    for pair in shifts.windows(2) {
        assert!(pair[1] > pair[0] && pair[1] - pair[0] <= t.step_out + 1e-9, "bounded steps out: {shifts:?}");
    }
    let held = h.zones(1600, 1000);
    assert_eq!(held.shift, shifts[3], "1.6× is inside the band: {}", held.reason);
    assert!(held.reason.contains("holding"), "{}", held.reason);
    let mut back = vec![held.shift];
    while back.last().copied().unwrap_or(0.0) > 0.0 {
        back.push(h.zones(1000, 1000).shift);
        assert!(back.len() < 20, "returns: {back:?}");
    }
    for pair in back.windows(2) {
        assert!((pair[0] - pair[1] - t.step_back).abs() < 1e-9 || pair[1] == 0.0, "steps back: {back:?}");
    }
}

#[test]
fn the_shift_never_passes_its_maximum() {
    let mut h = Harness::new(&NEAR, &FAR);
    h.zones(1000, 1000);
    for _ in 0..20 {
        let input = h.zones(50_000, 1000);
        assert!(input.shift <= Tuning::default().max_shift, "{input:?}");
    }
    assert_eq!(h.input().shift, Tuning::default().max_shift);
}

#[test]
fn one_change_per_interval_at_most() {
    let mut h = Harness::new(&NEAR, &FAR);
    h.zones(1000, 1000);
    let first = h.zones(8000, 1000).shift;
    assert!(first > 0.0);
    // The next look comes 300 ms later, still overloaded: no second change yet.
    h.now_ms -= 700;
    assert_eq!(h.zones(8000, 1000).shift, first);
    assert!(h.zones(8000, 1000).shift > first, "a full interval later it moves again");
}

#[test]
fn other_zones_as_loaded_hold_the_shift_and_more_loaded_ones_get_traffic_back() {
    let mut h = Harness::new(&NEAR, &FAR);
    h.zones(1000, 1000);
    let moved = h.zones(5000, 1000).shift;
    let held = h.zones(5000, 6000);
    assert_eq!(held.shift, moved, "{}", held.reason);
    let back = h.zones(1500, 4000);
    assert!(back.shift < moved, "{}", back.reason);
}

#[test]
fn too_few_samples_or_no_other_zone_hold_or_stay_home() {
    let mut h = Harness::new(&NEAR, &FAR);
    h.zones(1000, 1000);
    let moved = h.zones(5000, 1000).shift;
    // No connection ended this interval: the latency is unknown, the shift stays.
    h.interval(&[], &[]);
    assert_eq!(h.input().shift, moved);
    assert!(h.input().reason.contains("too few connections"), "{}", h.input().reason);

    let mut alone = Harness::new(&NEAR, &[]);
    alone.zones(1000, 0);
    let input = alone.zones(9000, 0);
    assert_eq!(input.shift, 0.0, "{}", input.reason);
}

#[test]
fn below_the_minimum_of_endpoints_the_static_plan_stands() {
    let mut h = Harness::new(&NEAR[..1], &[]);
    h.interval(&[(NEAR[0], 1000)], &[NEAR[0]]);
    let input = h.input();
    assert_eq!((input.shift, input.panic, input.ejected.len()), (0.0, false, 0), "{input:?}");
    assert!(input.reason.contains("fewer than 2"), "{}", input.reason);
}

#[test]
fn a_failing_backend_is_ejected_with_a_growing_back_off_and_most_failing_is_panic() {
    let t = Tuning::default();
    let mut h = Harness::new(&NEAR, &FAR);
    let bad: SocketAddr = FAR[0].parse().unwrap();
    assert!(h.interval(&[], &[FAR[0]]), "an ejection changes the input");
    assert_eq!(h.input().ejected, vec![bad]);
    // Out for the base back-off, then back.
    let out_for = (1..20).take_while(|_| !h.interval(&[], &[]) && h.input().ejected == vec![bad]).count() + 1;
    assert_eq!(out_for as u64 * 1000, t.eject_base_ms, "back for a try after the base back-off");
    assert!(h.input().ejected.is_empty());
    // Failing again at once: out twice as long.
    h.interval(&[], &[FAR[0]]);
    let second = (1..40).take_while(|_| !h.interval(&[], &[]) && h.input().ejected == vec![bad]).count() + 1;
    assert_eq!(second as u64 * 1000, 2 * t.eject_base_ms);

    // Three of four failing at once: more than the panic threshold, every endpoint is used.
    h.interval(&[], &[NEAR[0], NEAR[1], FAR[1]]);
    let input = h.input();
    assert!(input.panic && input.ejected.is_empty(), "{input:?}");
    assert!(input.reason.starts_with("panic: 3 of 4 endpoints failing"), "{}", input.reason);
}

#[test]
fn forgotten_ports_are_dropped() {
    let mut h = Harness::new(&NEAR, &FAR);
    h.zones(1000, 1000);
    let changed = h.controller.step(h.now_ms, &[], &BTreeMap::new());
    assert!(changed.is_empty());
    assert!(h.controller.inputs().is_empty());
}
