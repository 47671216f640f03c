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

/// How many arguments the BTF at `path` gives `tracepoint` (its `btf_trace_<tracepoint>` typedef,
/// less the context pointer first); `None` without one.
pub fn tracepoint_args_in(path: &Path, tracepoint: &str) -> Result<Option<usize>, BtfOffsetError> {
    let data =
        std::fs::read(path).map_err(|source| BtfOffsetError::Read { path: path.display().to_string(), source })?;
    tracepoint_args(&data, tracepoint)
}

/// [`tracepoint_args_in`] of the BTF blob `data`.
pub fn tracepoint_args(data: &[u8], tracepoint: &str) -> Result<Option<usize>, BtfOffsetError> {
    let types = Types::parse(data)?;
    let name = format!("btf_trace_{tracepoint}");
    for id in 1..=types.starts.len() as u32 {
        let (at, name_off, kind, _, _) = types.entry(id)?;
        if kind != TYPEDEF || types.string(name_off) != name.as_bytes() {
            continue;
        }
        // typedef -> pointer -> function prototype (void *ctx, the tracepoint's arguments...).
        let (pointer, _, pointer_kind, _, _) = types.entry(types.word(at + 8)?)?;
        let (_, _, proto_kind, params, _) = types.entry(types.word(pointer + 8)?)?;
        if pointer_kind != PTR || proto_kind != FUNC_PROTO {
            return Err(BtfOffsetError::Malformed("a btf_trace_ typedef that is not a function pointer"));
        }
        return Ok(Some(params.saturating_sub(1)));
    }
    Ok(None)
}

/// BTF kinds whose entry is followed by data (everything else has none), and the two more that
/// [`tracepoint_args`] follows.
const INT: u32 = 1;
const PTR: u32 = 2;
const TYPEDEF: u32 = 8;
const ARRAY: u32 = 3;
const STRUCT: u32 = 4;
const UNION: u32 = 5;
const ENUM: u32 = 6;
const FUNC_PROTO: u32 = 13;
const VAR: u32 = 14;
const DATASEC: u32 = 15;
const DECL_TAG: u32 = 17;
const ENUM64: u32 = 19;

/// The byte offset of `member` in the first struct named `name` of the BTF blob `data`, looked
/// for in the struct's anonymous unions and structs too (`sock_common.skc_daddr` is in one).
pub fn member_offset(data: &[u8], name: &str, member: &str) -> Result<u32, BtfOffsetError> {
    let types = Types::parse(data)?;
    let not_found = || BtfOffsetError::NotFound { name: name.into(), member: member.into() };
    let id = types.named_struct(name)?.ok_or_else(not_found)?;
    match types.member_bits(id, member, 0)? {
        Some(Bits::Whole(bits)) if bits.is_multiple_of(8) => Ok(bits / 8),
        Some(_) => Err(BtfOffsetError::Bitfield { name: name.into(), member: member.into() }),
        None => Err(not_found()),
    }
}

/// Where a signed 16-bit `member` of struct `name` is in the BTF at `path`: the byte offset of the
/// 16-bit word that holds it, and how far to shift that word (as `i16`, arithmetically) right to
/// read it. A whole field shifts by 0; a bitfield must end at the word's top bit, as
/// `ipv6_pinfo.hop_limit:9` does before Linux 6.5 (little-endian).
pub fn signed16_in(path: &Path, name: &str, member: &str) -> Result<(u32, u32), BtfOffsetError> {
    let data =
        std::fs::read(path).map_err(|source| BtfOffsetError::Read { path: path.display().to_string(), source })?;
    signed16(&data, name, member)
}

/// [`signed16_in`] of the BTF blob `data`.
pub fn signed16(data: &[u8], name: &str, member: &str) -> Result<(u32, u32), BtfOffsetError> {
    let types = Types::parse(data)?;
    let not_found = || BtfOffsetError::NotFound { name: name.into(), member: member.into() };
    let id = types.named_struct(name)?.ok_or_else(not_found)?;
    match types.member_bits(id, member, 0)? {
        Some(Bits::Whole(bits)) if bits.is_multiple_of(8) => Ok((bits / 8, 0)),
        Some(Bits::Field { bits, size }) if bits % 16 + size == 16 => Ok((bits / 16 * 2, bits % 16)),
        Some(_) => Err(BtfOffsetError::Bitfield { name: name.into(), member: member.into() }),
        None => Err(not_found()),
    }
}

/// A member's offset in bits: a whole field, or a bitfield of `size` bits.
enum Bits {
    Whole(u32),
    Field { bits: u32, size: u32 },
}

/// How deep anonymous members are looked into.
const MAX_NESTING: usize = 8;

/// The type section of a BTF blob, with where each type's entry starts (type id `n` at `n - 1`).
struct Types<'a> {
    data: &'a [u8],
    strings: &'a [u8],
    starts: Vec<usize>,
}

impl<'a> Types<'a> {
    fn parse(data: &'a [u8]) -> Result<Self, BtfOffsetError> {
        let word = |at: usize| word_at(data, at);
        if data.get(0..2) != Some(&0xeb9f_u16.to_ne_bytes()[..]) {
            return Err(BtfOffsetError::Malformed("no BTF magic in this byte order"));
        }
        let header_len = word(4)? as usize;
        let (type_off, type_len, str_off, str_len) = (word(8)?, word(12)?, word(16)?, word(20)?);
        let end = header_len + (type_off + type_len) as usize;
        let strings = data
            .get(header_len + str_off as usize..header_len + (str_off + str_len) as usize)
            .ok_or(BtfOffsetError::Malformed("string section out of bounds"))?;
        let mut starts = Vec::new();
        let mut at = header_len + type_off as usize;
        while at < end {
            starts.push(at);
            let info = word(at + 4)?;
            let (vlen, kind) = ((info & 0xffff) as usize, (info >> 24) & 0x1f);
            at += 12
                + match kind {
                    INT | VAR | DECL_TAG => 4,
                    ARRAY => 12,
                    STRUCT | UNION | DATASEC | ENUM64 => 12 * vlen,
                    ENUM | FUNC_PROTO => 8 * vlen,
                    _ => 0,
                };
        }
        Ok(Self { data, strings, starts })
    }

    fn word(&self, at: usize) -> Result<u32, BtfOffsetError> {
        word_at(self.data, at)
    }

    fn string(&self, offset: u32) -> &[u8] {
        let rest = self.strings.get(offset as usize..).unwrap_or_default();
        &rest[..rest.iter().position(|&b| b == 0).unwrap_or(rest.len())]
    }

    /// Type `id`'s entry: where it starts, its name, kind, member count and kind flag.
    fn entry(&self, id: u32) -> Result<(usize, u32, u32, usize, bool), BtfOffsetError> {
        let at = *id
            .checked_sub(1)
            .and_then(|index| self.starts.get(index as usize))
            .ok_or(BtfOffsetError::Malformed("a member of a type that does not exist"))?;
        let (name_off, info) = (self.word(at)?, self.word(at + 4)?);
        Ok((at, name_off, (info >> 24) & 0x1f, (info & 0xffff) as usize, info >> 31 != 0))
    }

    /// The id of the first struct named `name`.
    fn named_struct(&self, name: &str) -> Result<Option<u32>, BtfOffsetError> {
        for id in 1..=self.starts.len() as u32 {
            let (_, name_off, kind, _, _) = self.entry(id)?;
            if kind == STRUCT && self.string(name_off) == name.as_bytes() {
                return Ok(Some(id));
            }
        }
        Ok(None)
    }

    /// Where `member` is in struct or union `id`, directly or in an anonymous member.
    fn member_bits(&self, id: u32, member: &str, depth: usize) -> Result<Option<Bits>, BtfOffsetError> {
        let (at, _, _, vlen, kind_flag) = self.entry(id)?;
        for m in 0..vlen {
            let entry = at + 12 + 12 * m;
            let (name, member_type, offset) = (self.word(entry)?, self.word(entry + 4)?, self.word(entry + 8)?);
            let (bits, size) = if kind_flag { (offset & 0xff_ffff, offset >> 24) } else { (offset, 0) };
            if self.string(name) == member.as_bytes() {
                return Ok(Some(if size != 0 { Bits::Field { bits, size } } else { Bits::Whole(bits) }));
            }
            if name != 0 && !self.string(name).is_empty() || depth >= MAX_NESTING {
                continue;
            }
            let (_, _, inner_kind, _, _) = self.entry(member_type)?;
            if inner_kind != STRUCT && inner_kind != UNION {
                continue;
            }
            match self.member_bits(member_type, member, depth + 1)? {
                Some(Bits::Whole(inner)) => return Ok(Some(Bits::Whole(bits + inner))),
                Some(Bits::Field { bits: inner, size }) => return Ok(Some(Bits::Field { bits: bits + inner, size })),
                None => {}
            }
        }
        Ok(None)
    }
}

/// The native-endian u32 at `at` of `data`.
fn word_at(data: &[u8], at: usize) -> Result<u32, BtfOffsetError> {
    let bytes = data.get(at..at + 4).ok_or(BtfOffsetError::Malformed("cut short"))?;
    Ok(u32::from_ne_bytes(bytes.try_into().expect("four bytes")))
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
        assemble(&types, strings)
    }

    #[test]
    fn a_tracepoints_arguments_are_counted_from_its_typedef() {
        // 1 int, 2 void *, 3 proto (void *, int, int) -> int, 4 pointer to 3, 5 the typedef.
        let strings = b"\0int\0btf_trace_tcp_retransmit_skb\0";
        let mut types = Vec::new();
        let mut push = |words: &[u32]| words.iter().for_each(|w| types.extend_from_slice(&w.to_ne_bytes()));
        push(&[1, INT << 24, 4, 32]);
        push(&[0, PTR << 24, 0]);
        push(&[0, FUNC_PROTO << 24 | 3, 1, 0, 2, 0, 1, 0, 1]);
        push(&[0, PTR << 24, 3]);
        push(&[5, TYPEDEF << 24, 4]);
        let data = assemble(&types, strings);
        assert_eq!(tracepoint_args(&data, "tcp_retransmit_skb").unwrap(), Some(2));
        assert_eq!(tracepoint_args(&data, "tcp_receive_reset").unwrap(), None);
    }

    /// A BTF blob of the type section `types` and the string section `strings`.
    fn assemble(types: &[u8], strings: &[u8]) -> Vec<u8> {
        let mut data = Vec::new();
        for word in [0x0001_eb9f_u32, 24, 0, types.len() as u32, types.len() as u32, strings.len() as u32] {
            data.extend_from_slice(&word.to_ne_bytes());
        }
        // The magic is a u16 followed by version 1 and flags 0.
        data[0..4].copy_from_slice(&[0x9f, 0xeb, 1, 0]);
        data.extend_from_slice(types);
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

    /// `struct pinfo { int a; short unused:7; short hop:9; short low:9; }` (the last at bit 48, not
    /// at its word's top).
    fn bitfields() -> Vec<u8> {
        let strings = b"\0short\0pinfo\0a\0unused\0hop\0low\0";
        let mut types = Vec::new();
        let mut push = |words: &[u32]| words.iter().for_each(|w| types.extend_from_slice(&w.to_ne_bytes()));
        push(&[1, INT << 24, 2, 1 << 24 | 16]); // 1: short (signed)
        push(&[7, 1 << 31 | STRUCT << 24 | 4, 8]); // 2: pinfo, members with bitfield sizes
        push(&[13, 1, 0]);
        push(&[15, 1, 7 << 24 | 32]);
        push(&[22, 1, 9 << 24 | 39]);
        push(&[26, 1, 9 << 24 | 48]);
        assemble(&types, strings)
    }

    #[test]
    fn finds_a_signed_16_bit_field_whole_or_at_the_top_of_its_word() {
        assert_eq!(signed16(&blob(false), "pair", "b").unwrap(), (4, 0), "a whole field");
        // 6.1's ipv6_pinfo: `__u16 __unused_1:7; __s16 hop_limit:9;` — the word at byte 4, >> 7.
        assert_eq!(signed16(&bitfields(), "pinfo", "hop").unwrap(), (4, 7));
        assert!(matches!(signed16(&bitfields(), "pinfo", "low"), Err(BtfOffsetError::Bitfield { .. })));
        // What the program does with the word: an arithmetic shift keeps -1 as -1.
        let word: u16 = 0x1ff << 7 | 0x55;
        assert_eq!((word as i16) >> 7, -1);
        let word: u16 = 64 << 7 | 0x55;
        assert_eq!((word as i16) >> 7, 64);
    }

    /// `struct outer { int x; union { int a; struct { int b; int c; }; }; }`: `c` at byte 8.
    fn nested() -> Vec<u8> {
        let strings = b"\0int\0outer\0x\0a\0b\0c\0";
        let mut types = Vec::new();
        let mut push = |words: &[u32]| words.iter().for_each(|w| types.extend_from_slice(&w.to_ne_bytes()));
        push(&[1, INT << 24, 4, 32]); // 1: int
        push(&[0, STRUCT << 24 | 2, 8]); // 2: struct { b; c; }
        push(&[15, 1, 0]);
        push(&[17, 1, 32]);
        push(&[0, UNION << 24 | 2, 8]); // 3: union { a; struct 2; }
        push(&[13, 1, 0]);
        push(&[0, 2, 0]);
        push(&[5, STRUCT << 24 | 2, 12]); // 4: outer { x; union 3 at 32; }
        push(&[11, 1, 0]);
        push(&[0, 3, 32]);
        assemble(&types, strings)
    }

    #[test]
    fn finds_members_of_anonymous_unions_and_structs() {
        let data = nested();
        let offsets: Vec<u32> =
            ["x", "a", "b", "c"].iter().map(|m| member_offset(&data, "outer", m).unwrap()).collect();
        assert_eq!(offsets, [0, 4, 4, 8]);
        assert!(matches!(member_offset(&data, "outer", "d"), Err(BtfOffsetError::NotFound { .. })));
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
        // In anonymous structs of anonymous unions: the peer's address first, its port at 12.
        assert_eq!(member_offset_in(path, "sock_common", "skc_daddr").expect("skc_daddr"), 0);
        assert_eq!(member_offset_in(path, "sock_common", "skc_dport").expect("skc_dport"), 12);
    }
}
