//! topology-metrics: each metric declared once — its field and type, how it is made, the name it
//! is exported under and its help text, which is also the field's documentation — by the one
//! macro [`metrics!`] that the agent and each subsystem with metrics of its own (the DNS
//! responder, its cache) use.

/// The registry the declared metrics register in.
pub use prometheus_client::registry::Registry;

/// Declares a struct of metrics and its `Default`, in one of two forms.
///
/// A subsystem's metrics, registered by their owner with the generated
/// `register(&self, &mut Registry)` (the exported metrics in the order declared, then each
/// nested struct's own):
///
/// ```
/// use prometheus_client::metrics::{counter::Counter, gauge::Gauge};
///
/// topology_metrics::metrics! {
///     /// A cache's metrics.
///     pub struct CacheMetrics;
///     exported {
///         pub hits: Counter = Counter::default(), "cache_hits", "Answers from the cache";
///         bytes: Gauge = Gauge::default(), "cache_bytes", "Memory the cache takes, bytes";
///     }
///     nested {}
///     own {}
/// }
///
/// let mut registry = topology_metrics::Registry::with_prefix("example");
/// CacheMetrics::default().register(&mut registry);
/// ```
///
/// And the root of a process's metrics, which makes its registry with the given prefix, registers
/// each exported metric as it is made, and binds the registry by the given name for the `own`
/// fields' initializers (to register subsystems and collectors; the last may move it):
///
/// ```text
/// metrics! {
///     pub struct Metrics;
///     exported { pub field: Type = init, "exported_name", "help"; }
///     own(registry = "prefix") { /// Docs.
///                               pub other: Type = init; }
/// }
/// ```
///
/// `own` fields are made after the exported ones, in order, and their initializers may use the
/// exported fields by name.
#[macro_export]
macro_rules! metrics {
    (
        $(#[$meta:meta])*
        $svis:vis struct $name:ident;
        exported { $( $vis:vis $field:ident : $ty:ty = $init:expr, $export:literal, $help:literal; )* }
        own($registry:ident = $prefix:literal) {
            $( $(#[$own_meta:meta])* $ovis:vis $own:ident : $own_ty:ty = $own_init:expr; )*
        }
    ) => {
        $crate::metrics!(@struct [$(#[$meta])*] $svis $name
            [$( [$vis $field : $ty, $help] )*]
            [$( [$(#[$own_meta])* $ovis $own : $own_ty] )*]);

        impl Default for $name {
            fn default() -> Self {
                let mut $registry = $crate::Registry::with_prefix($prefix);
                $(
                    let $field: $ty = $init;
                    $registry.register($export, $help, $field.clone());
                )*
                $( let $own: $own_ty = $own_init; )*
                Self { $($field,)* $($own,)* }
            }
        }
    };
    (
        $(#[$meta:meta])*
        $svis:vis struct $name:ident;
        exported { $( $vis:vis $field:ident : $ty:ty = $init:expr, $export:literal, $help:literal; )* }
        nested { $( $(#[$nested_meta:meta])* $nvis:vis $nested:ident : $nested_ty:ty = $nested_init:expr; )* }
        own { $( $(#[$own_meta:meta])* $ovis:vis $own:ident : $own_ty:ty = $own_init:expr; )* }
    ) => {
        $crate::metrics!(@struct [$(#[$meta])*] $svis $name
            [$( [$vis $field : $ty, $help] )*]
            [$( [$(#[$nested_meta])* $nvis $nested : $nested_ty] )* $( [$(#[$own_meta])* $ovis $own : $own_ty] )*]);

        impl Default for $name {
            fn default() -> Self {
                $( let $field: $ty = $init; )*
                $( let $nested: $nested_ty = $nested_init; )*
                $( let $own: $own_ty = $own_init; )*
                Self { $($field,)* $($nested,)* $($own,)* }
            }
        }

        impl $name {
            /// Registers every exported metric under `registry`, in the order declared, then the
            /// nested metrics.
            pub fn register(&self, registry: &mut $crate::Registry) {
                $( registry.register($export, $help, self.$field.clone()); )*
                $( self.$nested.register(registry); )*
            }
        }
    };
    (@struct [$(#[$meta:meta])*] $svis:vis $name:ident
        [$( [$vis:vis $field:ident : $ty:ty, $help:literal] )*]
        [$( [$(#[$other_meta:meta])* $ovis:vis $other:ident : $other_ty:ty] )*]
    ) => {
        $(#[$meta])*
        #[derive(Debug)]
        $svis struct $name {
            $(
                #[doc = $help]
                $vis $field: $ty,
            )*
            $(
                $(#[$other_meta])*
                $ovis $other: $other_ty,
            )*
        }
    };
}
