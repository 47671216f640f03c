//! The kernels people run, in virtual machines: Debian's 6.1, 6.12 and 6.18 kernel packages
//! ([`image`]), booted with qemu on an initramfs of our own that mounts the host's tree read-only
//! over 9p under a tmpfs overlay, so the very test binaries this checkout built run inside as root
//! ([`vm`]); results come back on the serial console. This machine's own 6.18 runs the whole root
//! tier natively besides.

mod image;
mod vm;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::bail;
pub use image::ensure;
use vm::run;

use crate::cmd;

/// The executables of `tests/tests/<name>.rs`, built.
pub fn test_binaries(names: &[&str]) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let mut command = cmd::cargo();
    command.args(["test", "-p", "topology-tests", "--bins", "--no-run", "--message-format=json"]);
    for name in names {
        command.args(["--test", name]);
    }
    let json = cmd::output(command.current_dir(cmd::workspace_root()))?;
    let mut found = Vec::new();
    for line in json.lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let (Some(name), Some(executable)) = (message["target"]["name"].as_str(), message["executable"].as_str())
        else {
            continue;
        };
        if names.contains(&name) && message["target"]["kind"][0] == "test" {
            found.push((name.to_owned(), PathBuf::from(executable)));
        }
    }
    if found.len() != names.len() {
        bail!("built {found:?}, wanted {names:?}");
    }
    Ok(found)
}

/// The agent the VMs run: a release build, as users run it. Emulated, the debug build's start
/// alone (the object's parsing and relocation) takes longer than the tests wait for it.
fn release_agent() -> anyhow::Result<PathBuf> {
    let mut command = cmd::cargo();
    command.args(["build", "--release", "-p", "topology-agent", "--bin", "topology-agent"]);
    cmd::run(command.current_dir(cmd::workspace_root()))?;
    Ok(cmd::workspace_root().join("target/release/topology-agent"))
}

/// The script that runs `tests` (a binary and its filters) one at a time, with the helpers beside
/// them (and `agent` as the agent the tests start), and prints each one's summary.
pub fn script(tests: &[(PathBuf, Vec<&str>)], agent: Option<&Path>) -> String {
    let root = cmd::workspace_root();
    let mut script = format!(
        "cd {root}\nexport TOPOLOGY_PROBE={probe}\nstatus=0\necho \"KERNEL: $(uname -r)\"\n",
        root = root.display(),
        probe = root.join("target/debug/topology-probe").display(),
    );
    if let Some(agent) = agent {
        script.push_str(&format!("export TOPOLOGY_AGENT={}\n", agent.display()));
    }
    for (binary, filters) in tests {
        script.push_str(&format!(
            "echo \"FILE: {name}\"; {} --test-threads=1 --nocapture {} > /tmp/out 2>&1; r=$?; awk '/panicked at/ {{ n = 6 }} n > 0 {{ print; n--; next }} /^test |FEATURES: |FLAVOUR: |REFUSED: |SKIPPED: | WARN |test result/' /tmp/out | cut -c1-400; [ $r = 0 ] || status=1\n",
            binary.display(),
            filters.join(" "),
            name = binary.file_name().and_then(|n| n.to_str()).unwrap_or("?"),
        ));
    }
    script.push_str("exit $status\n");
    script
}

/// The datapath's root tests that apply on every kernel: connect rewrite (TCP and UDP, IPv4, IPv6,
/// v4-mapped), UDP replies from the ClusterIP, no backends refused, atomic swaps under load.
const DATAPATH: &str = "datapath";
/// What the loader's probes took on this kernel, against what its release says they should (the
/// `FEATURES:` line of the table), with a connect through all of them.
const FEATURES: &str = "kernel_features";
/// What CI runs in each kernel besides [`FEATURES`]: the programs load and attach, one set is
/// programmed and connects land on it; an empty set refuses.
const SMOKE: [&str; 2] = ["tcp_ipv4_lands_on_every_backend", "an_empty_set_refuses_tcp_and_udp"];
/// The root tests of the features the agent drives, run whole with `--full`: outlier ejection,
/// the load signal, byte accounting (TCP, and UDP where the kernel has its tracepoints), and
/// fail-open when the agent stops.
const AGENT: [&str; 5] = ["outlier", "load_signal", "bytes", "bytes_udp", "fail_open"];

/// One kernel's row.
struct Row {
    label: &'static str,
    release: String,
    seconds: f64,
    passed: usize,
    failed: usize,
    /// Tests that ended early, the kernel lacking their feature (their `SKIPPED:` line).
    skipped: usize,
    features: String,
}

/// Runs the kernel tests in a VM of each kernel (`full`: every datapath test and [`AGENT`]'s; else
/// [`SMOKE`]), or of those labelled `only`, prints the matrix and, when `full` over every kernel,
/// writes it into `docs/operating.md`; an error when any test fails in any kernel.
pub fn matrix(full: bool, only: &[String]) -> anyhow::Result<()> {
    let mut kernels = ensure()?;
    if let Some(unknown) = only.iter().find(|label| !kernels.iter().any(|k| k.label == label.as_str())) {
        let known: Vec<&str> = kernels.iter().map(|k| k.label).collect();
        bail!("--kernel {unknown}: not a kernel of the matrix ({known:?})");
    }
    let whole = only.is_empty();
    kernels.retain(|kernel| whole || only.iter().any(|label| label == kernel.label));
    let mut names = vec![DATAPATH, FEATURES];
    if full {
        names.extend(AGENT);
    }
    let binaries = test_binaries(&names)?;
    let binary = |name: &str| binaries.iter().find(|(n, _)| n == name).map(|(_, path)| path.clone()).expect("built");
    let script = if full {
        let mut tests = vec![(binary(FEATURES), Vec::new()), (binary(DATAPATH), Vec::new())];
        tests.extend(AGENT.iter().map(|name| (binary(name), Vec::new())));
        script(&tests, Some(&release_agent()?))
    } else {
        script(&[(binary(FEATURES), Vec::new()), (binary(DATAPATH), SMOKE.to_vec())], None)
    };
    let mut failed = Vec::new();
    let mut rows = Vec::new();
    for kernel in &kernels {
        let outcome = run(kernel, &script, Duration::from_secs(if full { 2400 } else { 600 }))?;
        // From the summaries ("test result: ok. 2 passed; 0 failed; ..."): with --nocapture a
        // test's own line may be split by what it prints.
        let count = |word: &str| -> usize {
            let summaries = outcome.console.lines().filter_map(|l| l.split_once("test result: ").map(|s| s.1));
            summaries
                .filter_map(|summary| {
                    summary
                        .split("; ")
                        .find_map(|part| part.trim_start_matches(|c: char| !c.is_ascii_digit()).strip_suffix(word))
                })
                .filter_map(|n| n.trim().parse::<usize>().ok())
                .sum()
        };
        let features = outcome
            .console
            .lines()
            .find_map(|line| line.split_once("FEATURES: ").map(|(_, rest)| rest.split_once(' ').map_or(rest, |r| r.1)))
            .unwrap_or("(not reported)")
            .to_owned();
        rows.push(Row {
            label: kernel.label,
            release: kernel.release.clone(),
            seconds: outcome.elapsed.as_secs_f64(),
            passed: count(" passed"),
            failed: count(" failed"),
            skipped: outcome.console.lines().filter(|line| line.contains("SKIPPED: ")).count(),
            features,
        });
        if outcome.status != Some(0) {
            eprintln!("--- kernel {} ({}):\n{}", kernel.label, kernel.release, outcome.console);
            failed.push(kernel.label);
        } else {
            // What the probes refused and the tests skipped, and why, even when all passed.
            let said = ["FLAVOUR: ", "REFUSED: ", "SKIPPED: "];
            for line in outcome.console.lines().filter(|line| said.iter().any(|s| line.contains(s))) {
                eprintln!("kernel {}: {}", kernel.label, line.trim());
            }
        }
    }
    let table = table(&rows);
    eprintln!("kernel matrix ({}):\n{table}", if full { "every datapath test" } else { "load and connect" });
    if full && whole && failed.is_empty() {
        write_table(&table)?;
    }
    if !failed.is_empty() {
        bail!("the kernel tests failed on {failed:?}");
    }
    Ok(())
}

/// The matrix as a Markdown table.
fn table(rows: &[Row]) -> String {
    let mut table = String::from(
        "| Kernel | Release | Tests passed | Failed | Of those passed, skipped by the probe | Seconds (emulated) | What the probes took |\n| --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for row in rows {
        table.push_str(&format!(
            "| {} | `{}` | {} | {} | {} | {:.0} | {} |\n",
            row.label, row.release, row.passed, row.failed, row.skipped, row.seconds, row.features
        ));
    }
    table
}

/// Puts `table` between the kernel matrix's markers of `docs/operating.md`.
fn write_table(table: &str) -> anyhow::Result<()> {
    const BEGIN: &str = "<!-- kernel-matrix:begin (cargo xtask kernels --full) -->\n";
    const END: &str = "<!-- kernel-matrix:end -->";
    let path = cmd::workspace_root().join("docs/operating.md");
    let text = std::fs::read_to_string(&path)?;
    let (Some(begin), Some(end)) = (text.find(BEGIN), text.find(END)) else {
        bail!("{}: no kernel matrix markers", path.display());
    };
    let text = format!("{}{BEGIN}{table}{}", &text[..begin], &text[end..]);
    std::fs::write(&path, text)?;
    eprintln!("kernels: the matrix written into {}", path.display());
    Ok(())
}
