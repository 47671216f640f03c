//! What this kernel runs of the programs, asked for all of them (root, real kernel): the loader's
//! probes must take each optional program exactly where the kernel has what it needs, and the
//! programs route a connection with all of them attached. Run on this machine and, by `cargo
//! xtask kernels`, in a VM of each kernel of the matrix, whose table reads the `FEATURES:` line.
//! `--test-threads=1`.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::net::SocketAddr;

use topology_dataplane::{ByteAccounting, Dataplane, KernelFeatures, LoadSignal};
use topology_model::Protocol;
use topology_tests::{
    fixture::{Fixture, service},
    require_root,
};

/// `uname -r`'s major and minor.
fn release() -> (u32, u32, String) {
    let text = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("the kernel's release");
    let text = text.trim().to_owned();
    let mut parts = text.split(|c: char| !c.is_ascii_digit()).map(|p| p.parse().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0), text)
}

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
    let (major, minor, text) = release();
    let at_least = |want: (u32, u32)| (major, minor) >= want;
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
