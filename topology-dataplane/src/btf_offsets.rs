//! Field offsets read from the kernel's BTF (`/sys/kernel/btf/vmlinux`): the outlier ejection
//! programs read one field of a traced socket, and Rust programs have no CO-RE relocations, so
//! the agent finds the field's offset in this kernel's types and sets it as a global at load.
//!
//! Only what that needs is parsed: the header, each type's length (to walk the section), and the
//! members of structs. Format: the kernel's `Documentation/bpf/btf.rst`.

use std::path::Path;

/// Where the running kernel publishes its types.
pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

/// Why an offset was not found.
#[derive(Debug, thiserror::Error)]
pub enum BtfOffsetError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Not BTF, or cut short.
    #[error("malformed BTF: {0}")]
    Malformed(&'static str),
    /// No struct of that name has that member.
    #[error("no member {member} in struct {name} of the kernel's BTF")]
    NotFound {
        /// The struct.
        name: String,
        /// The member.
        member: String,
    },
    /// The member is a bitfield.
    #[error("member {member} of struct {name} is a bitfield")]
    Bitfield {
        /// The struct.
        name: String,
        /// The member.
        member: String,
    },
}

/// The byte offset of `member` in the first struct named `name` of the BTF file at `path`.
pub fn member_offset_in(path: &Path, name: &str, member: &str) -> Result<u32, BtfOffsetError> {
    let data =
        std::fs::read(path).map_err(|source| BtfOffsetError::Read { path: path.display().to_string(), source })?;
    member_offset(&data, name, member)
}

/// BTF kinds whose entry is followed by data (everything else has none).
const INT: u32 = 1;
const ARRAY: u32 = 3;
const STRUCT: u32 = 4;
const UNION: u32 = 5;
const ENUM: u32 = 6;
const FUNC_PROTO: u32 = 13;
const VAR: u32 = 14;
const DATASEC: u32 = 15;
const DECL_TAG: u32 = 17;
const ENUM64: u32 = 19;

/// The byte offset of `member` in the first struct named `name` of the BTF blob `data`.
pub fn member_offset(data: &[u8], name: &str, member: &str) -> Result<u32, BtfOffsetError> {
    let word = |at: usize| -> Result<u32, BtfOffsetError> {
        let bytes = data.get(at..at + 4).ok_or(BtfOffsetError::Malformed("cut short"))?;
        Ok(u32::from_ne_bytes(bytes.try_into().expect("four bytes")))
    };
    if data.get(0..2) != Some(&0xeb9f_u16.to_ne_bytes()[..]) {
        return Err(BtfOffsetError::Malformed("no BTF magic in this byte order"));
    }
    let header_len = word(4)? as usize;
    let (type_off, type_len, str_off, str_len) = (word(8)?, word(12)?, word(16)?, word(20)?);
    let types = header_len + type_off as usize..header_len + (type_off + type_len) as usize;
    let strings = data
        .get(header_len + str_off as usize..header_len + (str_off + str_len) as usize)
        .ok_or(BtfOffsetError::Malformed("string section out of bounds"))?;
    let string = |offset: u32| -> &[u8] {
        let rest = strings.get(offset as usize..).unwrap_or_default();
        &rest[..rest.iter().position(|&b| b == 0).unwrap_or(rest.len())]
    };
    let mut at = types.start;
    while at < types.end {
        let (name_off, info) = (word(at)?, word(at + 4)?);
        let (vlen, kind, kind_flag) = ((info & 0xffff) as usize, (info >> 24) & 0x1f, info >> 31 != 0);
        let body = at + 12;
        if kind == STRUCT && string(name_off) == name.as_bytes() {
            for m in 0..vlen {
                let entry = body + 12 * m;
                if string(word(entry)?) != member.as_bytes() {
                    continue;
                }
                let offset = word(entry + 8)?;
                let (bits, bitfield) =
                    if kind_flag { (offset & 0xff_ffff, offset >> 24 != 0) } else { (offset, false) };
                if bitfield || !bits.is_multiple_of(8) {
                    return Err(BtfOffsetError::Bitfield { name: name.into(), member: member.into() });
                }
                return Ok(bits / 8);
            }
        }
        at = body
            + match kind {
                INT | VAR | DECL_TAG => 4,
                ARRAY => 12,
                STRUCT | UNION | DATASEC | ENUM64 => 12 * vlen,
                ENUM | FUNC_PROTO => 8 * vlen,
                _ => 0,
            };
    }
    Err(BtfOffsetError::NotFound { name: name.into(), member: member.into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob: an int, then `struct pair { int a; int b; }`, with `b` at bit 32 (or a
    /// bitfield member when `bitfield`).
    fn blob(bitfield: bool) -> Vec<u8> {
        let strings = b"\0int\0pair\0a\0b\0";
        let mut types = Vec::new();
        let mut push = |words: &[u32]| words.iter().for_each(|w| types.extend_from_slice(&w.to_ne_bytes()));
        push(&[1, INT << 24, 4, 32]);
        let flag = if bitfield { 1 << 31 } else { 0 };
        push(&[5, flag | STRUCT << 24 | 2, 8]);
        push(&[10, 1, 0]);
        push(&[12, 1, if bitfield { 3 << 24 | 32 } else { 32 }]);
        let mut data = Vec::new();
        for word in [0x0001_eb9f_u32, 24, 0, types.len() as u32, types.len() as u32, strings.len() as u32] {
            data.extend_from_slice(&word.to_ne_bytes());
        }
        // The magic is a u16 followed by version 1 and flags 0.
        data[0..4].copy_from_slice(&[0x9f, 0xeb, 1, 0]);
        data.extend_from_slice(&types);
        data.extend_from_slice(strings);
        data
    }

    #[test]
    fn finds_a_members_byte_offset_and_names_what_is_missing() {
        assert_eq!(member_offset(&blob(false), "pair", "b").unwrap(), 4);
        assert_eq!(member_offset(&blob(false), "pair", "a").unwrap(), 0);
        let missing = member_offset(&blob(false), "pair", "c").unwrap_err();
        assert_eq!(missing.to_string(), "no member c in struct pair of the kernel's BTF");
        assert!(matches!(member_offset(&blob(true), "pair", "b"), Err(BtfOffsetError::Bitfield { .. })));
        assert!(matches!(member_offset(&blob(false)[..30], "pair", "b"), Err(BtfOffsetError::Malformed(_))));
        assert!(matches!(member_offset(b"not btf at all", "pair", "b"), Err(BtfOffsetError::Malformed(_))));
    }

    #[test]
    fn finds_the_socket_state_in_this_kernel() {
        let path = Path::new(VMLINUX);
        if !path.exists() {
            eprintln!("skipping: no {VMLINUX}");
            return;
        }
        let offset = member_offset_in(path, "sock_common", "skc_state").expect("skc_state");
        // 64-bit kernels since 2.6: after the address and port pairs, the hash and the family.
        assert_eq!(offset, 18);
    }
}
