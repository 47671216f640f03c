//! `aya::Pod` for every map type: what the agent reads and writes as plain bytes.

// SAFETY: every type is `repr(C)`, `Copy`, made only of integers and integer arrays, and has
// its padding spelled out as fields, so any byte pattern is a valid value.
unsafe impl aya::Pod for crate::ServiceKey4 {}
unsafe impl aya::Pod for crate::ServiceKey6 {}
unsafe impl aya::Pod for crate::ServiceValue {}
unsafe impl aya::Pod for crate::Backend {}
unsafe impl aya::Pod for crate::Slot {}
unsafe impl aya::Pod for crate::ServiceCounters {}
unsafe impl aya::Pod for crate::ServiceMeta {}
unsafe impl aya::Pod for crate::SockTranslation {}
unsafe impl aya::Pod for crate::TcpTranslation {}
unsafe impl aya::Pod for crate::IterRecord {}
unsafe impl aya::Pod for crate::DatagramPeer {}
unsafe impl aya::Pod for crate::DatagramPeers {}
unsafe impl aya::Pod for crate::Heartbeat {}
unsafe impl aya::Pod for crate::DnsSteer {}
unsafe impl aya::Pod for crate::NodeCounters {}
unsafe impl aya::Pod for crate::ServiceOptions {}
unsafe impl aya::Pod for crate::ServiceRanges {}
unsafe impl aya::Pod for crate::ClientAffinityKey {}
unsafe impl aya::Pod for crate::ClientAffinityValue {}
unsafe impl aya::Pod for crate::IndexEntry4 {}
unsafe impl aya::Pod for crate::IndexEntry6 {}
unsafe impl aya::Pod for crate::BackendKey {}
unsafe impl aya::Pod for crate::BackendLoad {}
unsafe impl aya::Pod for crate::OutlierEntry {}
unsafe impl aya::Pod for crate::OutlierState {}
unsafe impl aya::Pod for crate::ByteCount {}
unsafe impl aya::Pod for crate::SockBytes {}
unsafe impl aya::Pod for crate::OutlierKey {}
unsafe impl aya::Pod for crate::OutlierLedger {}
