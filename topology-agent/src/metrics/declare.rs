//! Each of the agent's own metrics declared once: its field and type, how it is made, the name it
//! is exported under and its help text, which is also the field's documentation.

/// Declares a metrics struct and its `Default`:
///
/// ```text
/// metrics! {
///     /// Docs.
///     pub struct Name;
///     exported {
///         field: Type = init, "exported_name", "help";
///     }
///     own(registry) {
///         /// Docs.
///         pub other: Type = init;
///     }
/// }
/// ```
///
/// `Default` makes each exported metric and registers it as `topology_agent_<exported_name>`, in
/// the order declared, then makes the other fields in order; their initializers may use
/// `registry` (the name given) to register collectors, and the last may move it.
macro_rules! metrics {
    (
        $(#[$meta:meta])*
        pub struct $name:ident;
        exported {
            $( $field:ident : $ty:ty = $init:expr, $export:literal, $help:literal; )*
        }
        own($registry:ident) {
            $( $(#[$own_meta:meta])* $vis:vis $own:ident : $own_ty:ty = $own_init:expr; )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug)]
        pub struct $name {
            $(
                #[doc = $help]
                pub $field: $ty,
            )*
            $(
                $(#[$own_meta])*
                $vis $own: $own_ty,
            )*
        }

        impl Default for $name {
            fn default() -> Self {
                let mut $registry = prometheus_client::registry::Registry::with_prefix("topology_agent");
                $(
                    let $field: $ty = $init;
                    $registry.register($export, $help, $field.clone());
                )*
                $( let $own: $own_ty = $own_init; )*
                Self { $($field,)* $($own,)* }
            }
        }
    };
}

pub(super) use metrics;
