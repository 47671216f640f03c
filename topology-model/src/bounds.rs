//! How much of a tenant's text the agent keeps. A Service's annotations are written by whoever may
//! edit it, and everything kept is kept on every node, copied into every port's warnings and
//! logged: a value longer than any valid one is kept as its start and its length, which no parser
//! accepts and every error can show.

/// At most this many topology keys (KEP-536).
pub const MAX_TOPOLOGY_KEYS: usize = 16;
/// The longest valid topology key: a 253-character prefix, `/` and a 63-character name.
pub const MAX_TOPOLOGY_KEY_LEN: usize = 253 + 1 + 63;
/// The longest value kept of the other annotations the agent reads (modes and numbers).
pub const MAX_SHORT_VALUE: usize = 64;
/// How much of an over-long value is kept to name it.
const SHOWN: usize = 32;

/// `value`, or when it is longer than `max` bytes, its first characters and its length.
pub fn bounded(value: &str, max: usize) -> String {
    if value.len() <= max {
        return value.to_owned();
    }
    let start: String = value.chars().take(SHOWN.min(max)).collect();
    format!("{start}… ({} bytes)", value.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_values_are_kept_as_their_start_and_length() {
        assert_eq!(bounded("capacity", MAX_SHORT_VALUE), "capacity");
        let long = "x".repeat(262_144);
        let kept = bounded(&long, MAX_SHORT_VALUE);
        assert_eq!(kept, format!("{}… (262144 bytes)", "x".repeat(32)));
        assert!(kept.len() < 64, "{kept}");
        // Cut on a character, never inside one.
        assert_eq!(bounded(&"é".repeat(100), 10), format!("{}… (200 bytes)", "é".repeat(10)));
    }
}
