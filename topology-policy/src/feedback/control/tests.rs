//! The controller's band, bounds, rate limit, minimum, ejection and panic rules.

use topology_model::{Family, ObjectKey};

use super::*;
use crate::feedback::measured::LoadCounters;

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
    controller: Regulator,
    counters: BTreeMap<SocketAddr, LoadCounters>,
    ports: BTreeMap<PortKey, PortBackends>,
    now_ms: u64,
}

impl Harness {
    fn new(near: &[&str], far: &[&str]) -> Self {
        let far = if far.is_empty() { BTreeMap::new() } else { BTreeMap::from([("zone-b".to_owned(), addrs(far))]) };
        let ports = BTreeMap::from([(key(), PortBackends { near: addrs(near), far })]);
        let mut harness =
            Self { controller: Regulator::new(Tuning::default()), counters: BTreeMap::new(), ports, now_ms: 0 };
        // First sight of every backend: no window yet.
        harness.interval(&[], &[]);
        harness
    }

    /// One interval in which each backend of `latency` had 20 connections of that latency (µs)
    /// and each of `failing` failed 10 handshakes.
    fn interval(&mut self, latency: &[(&str, u64)], failing: &[&str]) -> bool {
        let traffic: Vec<(&str, u64, u64, u64)> = latency.iter().map(|(b, us)| (*b, 20, 20, *us)).collect();
        self.traffic(&traffic, failing)
    }

    /// One interval in which each `(backend, connects, closed, latency µs)` happened, and each of
    /// `failing` failed 10 handshakes.
    fn traffic(&mut self, traffic: &[(&str, u64, u64, u64)], failing: &[&str]) -> bool {
        let all: Vec<SocketAddr> =
            self.ports[&key()].near.iter().chain(self.ports[&key()].far_all()).copied().collect();
        for backend in all {
            self.counters.entry(backend).or_default();
        }
        for (backend, connects, closed, us) in traffic {
            let c = self.counters.get_mut(&backend.parse().unwrap()).unwrap();
            c.connects += connects;
            c.closed += closed;
            c.lifetime_us += closed * us;
        }
        for backend in failing {
            let c = self.counters.get_mut(&backend.parse().unwrap()).unwrap();
            c.connects += 10;
            c.refused += 10;
        }
        let reading: Vec<MeasuredBackend> = self
            .counters
            .iter()
            .map(|(backend, load)| MeasuredBackend {
                backend: *backend,
                in_flight: load.connects - load.closed - load.refused - load.timed_out,
                load: *load,
            })
            .collect();
        let changed = self.controller.step(self.now_ms, &reading, &self.ports);
        self.now_ms += 1000;
        changed.contains(&key())
    }

    /// An interval where this zone's backends answer in `near_us` and the others' in `far_us`,
    /// 20 connections each.
    fn zones(&mut self, near_us: u64, far_us: u64) -> PortInput {
        self.zones_with(near_us, far_us, 20, 20, 20)
    }

    /// An interval where each of this zone's backends got `near_connects` connections and
    /// completed `near_closed` in `near_us`, and each other zone's backend `far` in `far_us`.
    fn zones_with(&mut self, near_us: u64, far_us: u64, near_connects: u64, near_closed: u64, far: u64) -> PortInput {
        let port = &self.ports[&key()];
        let mut owned: Vec<(String, u64, u64, u64)> =
            port.near.iter().map(|b| (b.to_string(), near_connects, near_closed, near_us)).collect();
        owned.extend(port.far_all().map(|b| (b.to_string(), far, far, far_us)));
        let traffic: Vec<(&str, u64, u64, u64)> = owned.iter().map(|(b, c, d, us)| (b.as_str(), *c, *d, *us)).collect();
        self.traffic(&traffic, &[]);
        self.input()
    }

    fn input(&self) -> PortInput {
        self.controller.inputs()[&key()].clone()
    }
}

#[test]
fn an_overloaded_zone_sheds_in_bounded_steps_holds_in_the_band_and_returns_below_it() {
    let mut h = Harness::new(&NEAR, &FAR);
    assert_eq!(h.zones(1000, 1000).shift, 0.0, "unloaded: nothing moves");
    // The zone completes 10 of the 20 connections a second each of its two backends gets: this
    // node's share of its capacity is 20/s of 80/s offered, so 1 - 0.9 × 20 / 80 = 77.5% must
    // leave, and more while the queue (10 more connections per backend each second) drains.
    let mut shifts = vec![0.0];
    for _ in 0..3 {
        let input = h.zones_with(4000, 1000, 20, 10, 20);
        assert!(input.reason.contains("4.0× its unloaded latency"), "{}", input.reason);
        shifts.push(input.shift);
    }
    assert_eq!(shifts, [0.0, 0.5, 0.9, 0.9], "bounded steps out, up to what fits the capacity and drains");
    // Still slow, but the queue shrinks: the zone completes 60/s, and 90% out fits it.
    let draining = h.zones_with(4000, 1000, 20, 30, 20);
    assert_eq!(draining.shift, 0.9, "{}", draining.reason);
    assert!(draining.reason.contains("a backlog draining"), "{}", draining.reason);
    let held = h.zones(1600, 1000);
    assert_eq!(held.shift, 0.9, "1.6× is inside the band: {}", held.reason);
    assert!(held.reason.contains("holding"), "{}", held.reason);
    // Below the band with the same demand: back a step at a time, down to what the remembered
    // capacity (60/s) takes: 1 - 0.9 × 60 / 80 = 32.5%.
    let kept: Vec<f64> = (0..7).map(|_| h.zones(1000, 1000).shift).collect();
    assert_eq!(kept, [0.8, 0.7, 0.6, 0.5, 0.4, 0.32, 0.32], "{}", h.input().reason);
    assert!(h.input().reason.contains("holding 32%"), "{}", h.input().reason);
    // Demand calms to a fraction of the remembered capacity: the surge is over, and traffic comes
    // back as fast as it left, even when too few connections end to read the latency.
    let back: Vec<f64> = [3, 1].iter().map(|&n| h.zones_with(1000, 1000, n, n, n).shift).collect();
    assert_eq!(back, [0.0, 0.0], "{}", h.input().reason);
}

#[test]
fn too_few_samples_with_a_calm_demand_still_bring_traffic_back() {
    let mut h = Harness::new(&NEAR, &FAR);
    h.zones(1000, 1000);
    for _ in 0..2 {
        h.zones_with(4000, 1000, 20, 10, 20);
    }
    assert_eq!(h.input().shift, 0.9);
    // Two connections per backend end in a second: too few to read, but 8/s offered fits the
    // remembered 20/s.
    let back = h.zones_with(1000, 1000, 2, 2, 2);
    assert_eq!(back.shift, 0.4, "{}", back.reason);
    assert!(back.reason.starts_with("too few connections ended"), "{}", back.reason);
    assert!(back.reason.contains("moving back 90% → 40%"), "{}", back.reason);
}

#[test]
fn without_a_remembered_capacity_traffic_comes_back_a_step_at_a_time() {
    let t = Tuning::default();
    let mut h = Harness::new(&NEAR, &FAR);
    h.zones(1000, 1000);
    for _ in 0..2 {
        h.zones_with(4000, 1000, 20, 10, 20);
    }
    assert_eq!(h.input().shift, 0.9);
    // A minute later the capacity measured in the surge is forgotten.
    h.now_ms += t.capacity_memory_ms + 1000;
    let mut back = vec![0.9];
    while back.last().copied().unwrap_or(0.0) > 0.0 {
        back.push(h.zones_with(1000, 1000, 3, 3, 3).shift);
        assert!(back.len() < 20, "returns: {back:?}");
    }
    assert!(back.len() > 7, "{back:?}");
    for pair in back.windows(2) {
        assert!(pair[0] - pair[1] <= t.step_back + 1e-9, "steps back: {back:?}");
    }
}

#[test]
fn the_shift_never_passes_its_maximum() {
    let mut h = Harness::new(&NEAR, &FAR);
    h.zones(1000, 1000);
    for _ in 0..20 {
        let input = h.zones_with(50_000, 1000, 200, 5, 20);
        assert!(input.shift <= Tuning::default().max_shift, "{input:?}");
    }
    assert_eq!(h.input().shift, Tuning::default().max_shift);
}

#[test]
fn one_change_per_interval_at_most() {
    let mut h = Harness::new(&NEAR, &FAR);
    h.zones(1000, 1000);
    let first = h.zones_with(8000, 1000, 100, 5, 20).shift;
    assert!(first > 0.0);
    // The next look comes 300 ms later, still overloaded: no second change yet.
    h.now_ms -= 700;
    assert_eq!(h.zones_with(8000, 1000, 100, 5, 20).shift, first);
    assert!(h.zones_with(8000, 1000, 100, 5, 20).shift > first, "a full interval later it moves again");
}

#[test]
fn other_zones_as_loaded_hold_the_shift_and_more_loaded_ones_get_traffic_back() {
    let mut h = Harness::new(&NEAR, &FAR);
    h.zones(1000, 1000);
    let moved = h.zones(5000, 1000).shift;
    let held = h.zones(5000, 6000);
    assert_eq!(held.shift, moved, "{}", held.reason);
    let back = h.zones_with(1500, 4000, 3, 3, 3);
    assert!(back.shift < moved, "{}", back.reason);
}

#[test]
fn a_rise_under_a_zone_round_trip_is_noise_whatever_its_ratio() {
    // (unloaded µs, loaded µs, moves out): the ratio must pass the band and the rise 1 ms.
    let cases = [(150, 350, false), (150, 1100, false), (150, 1200, true), (400, 900, false), (1000, 2100, true)];
    for (unloaded, loaded, moves) in cases {
        let mut h = Harness::new(&NEAR, &FAR);
        h.zones(unloaded, unloaded);
        let input = h.zones(loaded, unloaded);
        assert_eq!(input.shift > 0.0, moves, "{unloaded} → {loaded} µs: {}", input.reason);
        if !moves {
            assert!(input.reason.contains("holding 0%"), "{}", input.reason);
        }
    }
    // The same gate for another zone: its sub-millisecond rise does not bring traffic back.
    let mut h = Harness::new(&NEAR, &FAR);
    h.zones(150, 150);
    let moved = h.zones(5000, 150).shift;
    assert_eq!(h.zones(240, 900).shift, moved, "{}", h.input().reason);
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
    assert!(!h.input().reason.contains("not made"), "holding is no move: {}", h.input().reason);

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

#[test]
fn the_per_connection_limit_follows_the_calm_load_and_holds_through_an_overload() {
    let mut h = Harness::new(&NEAR, &FAR);
    let calm = h.zones(1000, 1000);
    assert_eq!(calm.spill_at, 4, "nothing in flight when calm: the floor: {calm:?}");
    // Overloaded: 10 of 20 left in flight per backend each second; the limit holds.
    for _ in 0..2 {
        assert_eq!(h.zones_with(4000, 1000, 20, 10, 20).spill_at, 4);
    }
    // A port whose connections stay open (a pool): 30 in flight per near backend at calm latency
    // set the limit at twice that; a steady pool keeps it; a smaller one lowers it a tenth a look;
    // a higher reading raises it a quarter of the way.
    let mut pool = Harness::new(&NEAR, &FAR);
    assert_eq!(pool.zones_with(1000, 1000, 50, 20, 20).spill_at, 60, "first reading: twice 30");
    assert_eq!(pool.zones(1000, 1000).spill_at, 60, "steady");
    assert_eq!(pool.zones_with(1000, 1000, 20, 30, 20).spill_at, 54, "20 in flight: 27 usual");
    assert_eq!(pool.zones_with(1000, 1000, 60, 20, 20).spill_at, 71, "60 in flight: 27 + 33 / 4");
    // Only the limit changes (the shift stays 0): still a change of the input, which the next
    // sync writes to the port's options.
    let closing: Vec<(&str, u64, u64, u64)> =
        vec![(NEAR[0], 0, 40, 1000), (NEAR[1], 0, 40, 1000), (FAR[0], 20, 20, 1000), (FAR[1], 20, 20, 1000)];
    assert!(pool.traffic(&closing, &[]), "the limit fell: the input changed");
    assert_eq!((pool.input().spill_at, pool.input().shift), (64, 0.0));
}
