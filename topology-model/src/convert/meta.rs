//! What the agent reads of an object's `metadata`, and the plumbing that lets a lean view of an
//! object be listed and watched like a k8s-openapi type.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer};

/// The metadata fields the agent reads; everything else (managed fields, owner references, uid,
/// timestamps) is skipped by the parser without being built.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LeanMeta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
}

/// `metadata` reduced to name, namespace, resourceVersion, labels and annotations.
pub fn lean_metadata<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ObjectMeta, D::Error> {
    let lean = Option::<LeanMeta>::deserialize(deserializer)?;
    Ok(lean.map_or_else(ObjectMeta::default, |lean| ObjectMeta {
        name: lean.name,
        namespace: lean.namespace,
        resource_version: lean.resource_version,
        labels: lean.labels,
        annotations: lean.annotations,
        ..ObjectMeta::default()
    }))
}

/// `null` read as the type's default, as the API's optional lists are.
pub fn null_as_default<'de, D: Deserializer<'de>, T: Default + Deserialize<'de>>(
    deserializer: D,
) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// Makes a lean view a `kube::Resource` of the API kind it reads, so the watchers list and watch
/// it: `view_resource!(NodeView, Cluster, "Node", "", "v1", "nodes")`.
macro_rules! view_resource {
    ($view:ty, $scope:ident, $kind:literal, $group:literal, $version:literal, $plural:literal) => {
        impl kube_core::Resource for $view {
            type DynamicType = ();
            type Scope = view_resource!(@scope $scope);

            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                $kind.into()
            }

            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                $group.into()
            }

            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                $version.into()
            }

            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                $plural.into()
            }

            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }

            fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
    (@scope Cluster) => {
        k8s_openapi::ClusterResourceScope
    };
    (@scope Namespace) => {
        k8s_openapi::NamespaceResourceScope
    };
}

pub(crate) use view_resource;
