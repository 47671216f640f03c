//! Running commands with their output visible and their failure explained.

use std::{
    path::PathBuf,
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

/// Runs `command` with inherited stdio; fails with the command line if it fails.
pub fn run(command: &mut Command) -> anyhow::Result<()> {
    let line = describe(command);
    eprintln!("+ {line}");
    let status = command.status().with_context(|| format!("starting `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed: {status}");
    }
    Ok(())
}

/// Runs `command` quietly and returns whether it succeeded.
pub fn succeeds(command: &mut Command) -> bool {
    command.stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// Runs `command` and returns its trimmed stdout.
pub fn output(command: &mut Command) -> anyhow::Result<String> {
    let line = describe(command);
    let output = command.stderr(Stdio::inherit()).output().with_context(|| format!("starting `{line}`"))?;
    if !output.status.success() {
        bail!("`{line}` failed: {}", output.status);
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// `cargo` as invoked by the user (respects `$CARGO`).
pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// The workspace root (the parent of this crate's directory).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

/// True when running as root.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Uid:").map(|ids| ids.split_whitespace().nth(1) == Some("0")))
        })
        .unwrap_or(false)
}

/// True if `program` is on the PATH.
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

fn describe(command: &Command) -> String {
    let mut line = command.get_program().to_string_lossy().into_owned();
    for arg in command.get_args() {
        line.push(' ');
        line.push_str(&arg.to_string_lossy());
    }
    line
}
