//! Whether a certificate's names cover a host name (RFC 6125 section 6.4).

use std::net::IpAddr;

/// Whether the certificate identity `pattern` (a SAN dNSName or a CN) covers `host`.
///
/// Comparison is ASCII case-insensitive and ignores one trailing dot. A wildcard is only
/// honoured as the complete left-most label (`*.example.com`), matches exactly one label
/// (`a.example.com`, not `example.com` nor `a.b.example.com`), and needs at least two
/// labels after it (`*.com` covers nothing). Partial-label wildcards (`a*.example.com`)
/// are not honoured, as in current browsers. A host that is itself a wildcard (a route
/// with `wildcardPolicy: Subdomain` serves `*.example.com`) is only covered by the same
/// wildcard.
pub fn dns_name_covers(pattern: &str, host: &str) -> bool {
    let pattern = normalize(pattern);
    let host = normalize(host);
    if pattern.is_empty() || host.is_empty() {
        return false;
    }
    if pattern.eq_ignore_ascii_case(host) {
        return true;
    }
    let Some(pattern_rest) = pattern.strip_prefix("*.") else {
        return false;
    };
    if pattern_rest.contains('*') || !pattern_rest.contains('.') {
        return false;
    }
    let Some((first_label, host_rest)) = host.split_once('.') else {
        return false;
    };
    !first_label.is_empty() && first_label != "*" && host_rest.eq_ignore_ascii_case(pattern_rest)
}

/// Whether any of `dns_names`, or for an IP-address host any of `ip_addresses`, covers
/// `host`.
pub fn names_cover(dns_names: &[String], ip_addresses: &[IpAddr], host: &str) -> bool {
    if let Ok(ip) = normalize(host).parse::<IpAddr>() {
        return ip_addresses.contains(&ip);
    }
    dns_names.iter().any(|name| dns_name_covers(name, host))
}

fn normalize(name: &str) -> &str {
    let name = name.trim();
    name.strip_suffix('.').unwrap_or(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_names_match_case_insensitively() {
        assert!(dns_name_covers("www.example.com", "www.example.com"));
        assert!(dns_name_covers("WWW.Example.COM", "www.example.com"));
        assert!(dns_name_covers("www.example.com.", "www.example.com"));
        assert!(!dns_name_covers("www.example.com", "example.com"));
        assert!(!dns_name_covers("", "example.com"));
    }

    #[test]
    fn wildcard_covers_exactly_one_left_label() {
        assert!(dns_name_covers("*.example.com", "a.example.com"));
        assert!(dns_name_covers("*.Example.com", "A.example.COM"));
        assert!(!dns_name_covers("*.example.com", "example.com"));
        assert!(!dns_name_covers("*.example.com", "a.b.example.com"));
        assert!(!dns_name_covers("*.example.com", ".example.com"));
        assert!(!dns_name_covers("*.example.com", "a.example.org"));
    }

    #[test]
    fn unsafe_wildcards_cover_nothing() {
        assert!(!dns_name_covers("*.com", "example.com"));
        assert!(!dns_name_covers("*", "example"));
        assert!(!dns_name_covers("a*.example.com", "ab.example.com"));
        assert!(!dns_name_covers("*.*.example.com", "a.b.example.com"));
        assert!(!dns_name_covers("www.*.com", "www.example.com"));
    }

    #[test]
    fn wildcard_host_needs_the_same_wildcard() {
        assert!(dns_name_covers("*.example.com", "*.example.com"));
        assert!(!dns_name_covers("a.example.com", "*.example.com"));
    }

    #[test]
    fn ip_hosts_match_ip_sans_only() {
        let ips = ["10.0.0.1".parse().unwrap()];
        let names = ["10.0.0.2".to_owned()];
        assert!(names_cover(&[], &ips, "10.0.0.1"));
        assert!(!names_cover(&names, &ips, "10.0.0.2"));
        assert!(names_cover(
            &["a.example.com".to_owned()],
            &[],
            "a.example.com"
        ));
    }
}
