//! Host-side library target of the eBPF crate; it holds nothing. The programs live in `main.rs`.
#![no_std]
