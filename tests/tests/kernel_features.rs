//! What this kernel runs of the programs, asked for all of them (root, real kernel): the loader's
//! probes must take each optional program exactly where the kernel has what it needs, and the
//! programs route a connection with all of them attached; each object flavour loads exactly where
//! the kernel has its instructions, and routes. Run on this machine and, by `cargo
//! xtask kernels`, in a VM of each kernel of the matrix, whose table reads the `FEATURES:` line.
//! `--test-threads=1`.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::net::SocketAddr;

use topology_dataplane::{
    ByteAccounting, Dataplane, DataplaneError, Flavour, IndexOrdering, KernelFeatures, LoadSignal,
};
use topology_model::Protocol;
use topology_tests::{
    fixture::{Fixture, service},
    kernel, require_root,
};

#[test]
fn every_optional_program_is_taken_exactly_where_the_kernel_has_what_it_needs() {
    require_root!();
    // What the loader says of a program the kernel refused, into the output.
    let _ = tracing_subscriber::fmt().with_writer(std::io::stderr).with_ansi(false).try_init();
    let fx = Fixture::new(2);
    let mut config = fx.config();
    config.programs.outlier_ejection = true;
    config.programs.load_signal = LoadSignal::On;
    config.programs.byte_accounting = ByteAccounting::All;
    let mut dp = Dataplane::open(&config).expect("open dataplane");
    let features = dp.features();
    let release = kernel::release();
    let text = &release.text;
    let at_least = |(major, minor): (u32, u32)| release.at_least(major, minor);
    println!("FEATURES: {text} {features}");
    assert_eq!(
        features,
        KernelFeatures {
            object: features.object,
            index: true,
            // `inet_sk_error_report` came with 5.15.
            outlier_ejection: at_least((5, 15)),
            connection_end: true,
            // The `udp_*` tracepoints with a socket argument came with 6.3.
            udp_accounting: at_least((6, 3)),
        },
        "on {text}"
    );

    // With all of them attached, a connection is still routed.
    let backends = fx.backends.iter().map(|b| b.weighted(false, 1)).collect();
    let report = dp.apply(&Fixture::one_service(service("10.96.0.10", 80, Protocol::Tcp), backends));
    assert!(report.failed.is_empty(), "{:?}; housekeeping: {:?}", report.failed, report.housekeeping);
    let result = fx.place().tcp("10.96.0.10:80".parse::<SocketAddr>().unwrap(), 50);
    assert_eq!(result.failures(), 0, "{result:?}");
}

#[test]
fn every_object_flavour_loads_exactly_where_the_kernel_has_what_it_needs() {
    require_root!();
    let release = kernel::release();
    // The service index read with plain loads and without it, from 5.11; read with BPF
    // load-acquire (the object weakly ordered CPUs get), from 6.15. Forced here, one at a time.
    let flavours = [
        (IndexOrdering::Plain, Flavour { object: "topology", index: true }, (5, 11)),
        (IndexOrdering::Off, Flavour { object: "topology", index: false }, (5, 11)),
        (IndexOrdering::Acquire, Flavour { object: "topology-acquire", index: true }, (6, 15)),
    ];
    for (ordering, flavour, (major, minor)) in flavours {
        let fx = Fixture::new(1);
        let mut config = fx.config();
        config.programs.index = ordering;
        match Dataplane::open(&config) {
            Ok(mut dp) => {
                assert!(release.at_least(major, minor), "{flavour:?} loaded on {}", release.text);
                assert_eq!(dp.flavour(), flavour);
                let backends = fx.backends.iter().map(|b| b.weighted(false, 1)).collect();
                let report = dp.apply(&Fixture::one_service(service("10.96.0.10", 80, Protocol::Tcp), backends));
                assert!(report.failed.is_empty(), "{:?}", report.failed);
                let result = fx.place().tcp("10.96.0.10:80".parse::<SocketAddr>().unwrap(), 20);
                assert_eq!(result.failures(), 0, "{flavour:?}: {result:?}");
                println!("FLAVOUR: {} {flavour:?} loads and routes", release.text);
            }
            Err(error) => {
                assert!(!release.at_least(major, minor), "{flavour:?} refused on {}: {error}", release.text);
                // A program the verifier refused (the agent logs it and tries the next flavour), not
                // a map or anything else of the node.
                let text = error.to_string();
                assert!(matches!(error, DataplaneError::Program { .. }), "{flavour:?}: {text}");
                println!("REFUSED: {} refuses {flavour:?} (before {major}.{minor}): {}", release.text, cut(&text));
            }
        }
    }
}

/// The first 200 characters of `text`, on one line.
fn cut(text: &str) -> String {
    text.replace('\n', " ").chars().take(200).collect()
}
