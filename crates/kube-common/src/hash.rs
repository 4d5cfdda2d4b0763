//! Hash maps and sets keyed by names that tenants choose (namespaces, secrets, routes,
//! hosts), with a faster hasher than the standard library's.
//!
//! Every route goes through a few dozen lookups in such maps at start-up, and the
//! standard library's SipHash-1-3 was about 5 % of certwatch's start-up instructions
//! (docs/BENCHMARKS.md). aHash is several times faster on short keys and keeps the
//! property that matters here: the keys are not known to whoever picks the names. Its
//! process-wide keys come from the operating system's random source (its `runtime-rng`
//! feature, on by default) and every map gets its own per-map key on top, so a tenant
//! cannot choose names that collide in the process's maps (hash flooding), as with
//! SipHash's random keys. A fixed-key or unkeyed fast hasher (FxHash, foldhash's fixed
//! state) would not keep that. Iteration order is unspecified with either hasher.

use std::collections::{HashMap, HashSet};

/// The hasher of [`NameMap`] and [`NameSet`]: aHash, keyed from the OS's random source
/// once per process and with a per-map key.
pub type NameHasher = ahash::RandomState;

/// A hash map keyed by names tenants choose. Create it with `NameMap::default()`.
pub type NameMap<K, V> = HashMap<K, V, NameHasher>;

/// A hash set of names tenants choose. Create it with `NameSet::default()`.
pub type NameSet<K> = HashSet<K, NameHasher>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_map_gets_its_own_keys() {
        // Two hashers agreeing on one name is a 2^-64 chance per name; on all three,
        // only if the per-map keys were shared.
        let names = ["shop", "shop-tls", "team-a/shop"];
        let one = NameHasher::default();
        let two = NameHasher::default();
        assert!(
            names
                .iter()
                .any(|name| one.hash_one(name) != two.hash_one(name))
        );
        // One hasher is a function of the key.
        assert!(
            names
                .iter()
                .all(|name| one.hash_one(name) == one.hash_one(name))
        );
    }

    #[test]
    fn a_name_map_holds_what_the_standard_map_holds() {
        let mut ours: NameMap<String, usize> = NameMap::default();
        let mut std_map: HashMap<String, usize> = HashMap::new();
        for i in 0..2_000 {
            let name = format!("ns-{}/route-{i}", i % 37);
            assert_eq!(ours.insert(name.clone(), i), std_map.insert(name, i));
        }
        for i in (0..2_000).step_by(3) {
            let name = format!("ns-{}/route-{i}", i % 37);
            assert_eq!(ours.remove(&name), std_map.remove(&name));
        }
        assert_eq!(ours.len(), std_map.len());
        for (name, value) in &std_map {
            assert_eq!(ours.get(name), Some(value));
        }
        let set: NameSet<&str> = ["a", "b", "a"].into_iter().collect();
        assert_eq!(set.len(), 2);
    }
}
