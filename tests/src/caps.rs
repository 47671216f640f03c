//! A process with exactly some capabilities, as a container's root gets them: `capsh` drops
//! every other one from the bounding set before running it as root.

/// Every capability the kernel knows (capability(7)), by `capsh`'s names.
pub const ALL: [&str; 41] = [
    "cap_chown",
    "cap_dac_override",
    "cap_dac_read_search",
    "cap_fowner",
    "cap_fsetid",
    "cap_kill",
    "cap_setgid",
    "cap_setuid",
    "cap_setpcap",
    "cap_linux_immutable",
    "cap_net_bind_service",
    "cap_net_broadcast",
    "cap_net_admin",
    "cap_net_raw",
    "cap_ipc_lock",
    "cap_ipc_owner",
    "cap_sys_module",
    "cap_sys_rawio",
    "cap_sys_chroot",
    "cap_sys_ptrace",
    "cap_sys_pacct",
    "cap_sys_admin",
    "cap_sys_boot",
    "cap_sys_nice",
    "cap_sys_resource",
    "cap_sys_time",
    "cap_sys_tty_config",
    "cap_mknod",
    "cap_lease",
    "cap_audit_write",
    "cap_audit_control",
    "cap_setfcap",
    "cap_mac_override",
    "cap_mac_admin",
    "cap_syslog",
    "cap_wake_alarm",
    "cap_block_suspend",
    "cap_audit_read",
    "cap_perfmon",
    "cap_bpf",
    "cap_checkpoint_restore",
];

/// `capsh` dropping every capability but `keep` from the bounding set, then running the program
/// and arguments that follow (as root, so it gets exactly the bounding set).
pub fn capsh_keeping(keep: &[&str]) -> Vec<String> {
    let drop: Vec<&str> = ALL.iter().copied().filter(|cap| !keep.contains(cap)).collect();
    vec!["capsh".into(), format!("--drop={}", drop.join(",")), "--".into(), "-c".into(), "exec \"$0\" \"$@\"".into()]
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_capability_is_named_once() {
        let unique: std::collections::BTreeSet<&str> = super::ALL.iter().copied().collect();
        assert_eq!(unique.len(), super::ALL.len());
    }
}
