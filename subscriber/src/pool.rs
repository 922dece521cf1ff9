//! The pool objects, `IPAddressPool` (`metallb.io/v1beta1`) and
//! `CiliumLoadBalancerIPPool` (`cilium.io/v2`), from `pool_types`.

pub use pool_types::{
    CiliumLoadBalancerIPPool, IPAddressPool, CILIUM_POOL_API_VERSION,
    CILIUM_POOL_API_VERSION_V2ALPHA1, CILIUM_POOL_KIND, POOL_API_VERSION, POOL_KIND,
};
