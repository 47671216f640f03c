//! The initial lists and the full sync: lists taken in page by page and programmed only once
//! every kind is listed, and a large full sync written while it is decided.

use super::*;

/// Services by name, each at ClusterIP 10.96.0.`host`.
fn services(named: &[(&str, u8)]) -> Vec<Object> {
    named.iter().map(|(name, host)| Object::Service(service(name, &format!("10.96.0.{host}")))).collect()
}

fn page(kind: Kind, objects: Vec<Object>) -> SourceEvent {
    SourceEvent::ListPage { kind, objects, invalid: vec![] }
}

/// Nodes and slices listed whole, Services by `pages` of the given names, then `last`.
fn listed_in_pages(pages: Vec<SourceEvent>, last: Vec<Object>) -> Vec<SourceEvent> {
    let mut events = vec![replace(Kind::Node, vec![node("a", "z1")]), replace(Kind::EndpointSlice, vec![])];
    events.extend(pages);
    events.push(replace(Kind::Service, last));
    events
}

fn programmed(recording: &Recording) -> BTreeSet<IpAddr> {
    recording.current.services.keys().map(|port| port.vip).collect()
}

#[test]
fn a_list_in_pages_is_programmed_whole_once_its_last_page_came() {
    let events = listed_in_pages(
        vec![
            SourceEvent::Listing(Kind::Service),
            page(Kind::Service, services(&[("first", 10)])),
            page(Kind::Service, services(&[("second", 11)])),
        ],
        services(&[("third", 12)]),
    );
    let recording = run(events);
    assert_eq!((recording.full, recording.partial.len()), (1, 0), "one programming, after the last page");
    let vips = ["10.96.0.10", "10.96.0.11", "10.96.0.12"].map(|vip| vip.parse().unwrap());
    assert_eq!(programmed(&recording), BTreeSet::from(vips));
}

#[test]
fn nothing_is_programmed_while_a_list_has_pages_to_come() {
    let mut events = listed_in_pages(vec![SourceEvent::Listing(Kind::Service)], vec![]);
    events.pop();
    events.push(page(Kind::Service, services(&[("first", 10)])));
    let recording = run(events);
    assert_eq!((recording.full, recording.partial.len()), (0, 0));
}

#[test]
fn a_list_begun_again_forgets_what_the_abandoned_one_listed() {
    // The first list failed after a page naming a Service deleted before the second list.
    let events = listed_in_pages(
        vec![
            SourceEvent::Listing(Kind::Service),
            page(Kind::Service, services(&[("first", 10), ("deleted", 11)])),
            SourceEvent::Listing(Kind::Service),
            page(Kind::Service, services(&[("first", 10)])),
        ],
        services(&[("third", 12)]),
    );
    let recording = run(events);
    let vips = ["10.96.0.10", "10.96.0.12"].map(|vip| vip.parse().unwrap());
    assert_eq!(programmed(&recording), BTreeSet::from(vips), "the deleted Service is gone");
}

#[test]
fn a_large_full_sync_writes_every_port_while_it_decides_and_the_whole_apply_only_checks() {
    let count = full_sync::PIPELINE_FROM + 100;
    let vip = |i: usize| format!("10.96.{}.{}", i / 200, i % 200 + 1);
    let name = |i: usize| format!("svc-{i:05}");
    let mut services: Vec<Object> = (0..count).map(|i| Object::Service(service(&name(i), &vip(i)))).collect();
    // Decided after svc-00007 and claiming its port: never owns it, never written.
    services.push(Object::Service(service("zz-claims-7", &vip(7))));
    let slices = (0..count).map(|i| {
        let address = format!("10.1.{}.{}", i / 200, i % 200 + 1);
        Object::EndpointSlice(slice(&format!("{}-1", name(i)), &name(i), &[address.as_str()]))
    });
    let recording = run(vec![
        replace(Kind::Node, vec![node("a", "z1")]),
        replace(Kind::Service, services),
        replace(Kind::EndpointSlice, slices.collect()),
    ]);
    assert_eq!(recording.full, 1, "one whole apply");
    let chunks = count.div_ceil(full_sync::CHUNK);
    assert_eq!(recording.partial.len(), chunks, "one apply per chunk (no Service waited for a port)");
    assert_eq!(recording.partial_threads, BTreeSet::from(["topology-writer".to_owned()]));
    assert_eq!(recording.current.services.len(), count);
    assert_eq!(recording.before_full.as_ref(), Some(&recording.current), "every port written before the whole apply");
    assert_eq!(addresses(&recording, &vip(7)), Some(vec!["10.1.0.8".to_owned()]), "the first claim owns the port");
    assert_eq!(
        addresses(&recording, &vip(count - 1)),
        Some(vec![format!("10.1.{}.{}", (count - 1) / 200, (count - 1) % 200 + 1)])
    );
}
