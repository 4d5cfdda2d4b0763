//! What a crt-list line says: a certificate, its options and its SNI filter, as the
//! OpenShift router writes its `cert_config.map`.
//!
//! A line is `<certificate> [alpn h2,http/1.1] <sni>`: the SNI filter is the route's
//! host, or `*.<domain>` for an admitted wildcard route; a route without a host has no
//! line (a line without a filter would answer for every host no other line claims).
//!
//! ALPN follows the router (`generateHAProxyCertConfigMap`): a line offers
//! `h2,http/1.1` unless HTTP/2 is disabled (`ROUTER_DISABLE_HTTP2`; here
//! `--disable-http2`) or its certificate is used by more than one route or is the
//! default certificate. A client that negotiated HTTP/2 reuses its connection for
//! every host the certificate covers (RFC 7540 connection coalescing), and HAProxy picks
//! the backend by the connection's SNI: with one certificate shared by routes of
//! different backends, HTTP/2 would send requests to the wrong one, so those lines get
//! no ALPN and clients speak HTTP/1.1 (the bind line itself says `no-alpn`). The router
//! compares certificates by their text; certwatch compares the chain it serves (the
//! certificates re-encoded), so two secrets holding the same certificates written
//! differently count as one here.

use std::borrow::Cow;
use std::fmt::Write as _;

use route_secrets::machine::Sni;

use crate::cert_dir::IndexFormat;
use crate::files::CRT_LIST_FILE;

/// The ALPN list of a line that offers HTTP/2, as the router writes it.
pub const ALPN_HTTP2: &str = "h2,http/1.1";

/// How crt-list lines are written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrtListOptions {
    /// Whether lines may offer HTTP/2 (`false`: `--disable-http2`).
    pub http2: bool,
    /// SHA-256 of the default certificate's chain as certwatch renders chains
    /// ([`route_secrets::tls::ValidatedTls::chain_pem`]), when known: a route serving
    /// that very chain gets no ALPN, as in the router.
    pub default_chain: Option<[u8; 32]>,
}

impl Default for CrtListOptions {
    fn default() -> Self {
        Self {
            http2: true,
            default_chain: None,
        }
    }
}

impl CrtListOptions {
    /// The ALPN of a line whose chain (digest `chain`) `sharing` served routes use
    /// (itself included).
    pub fn alpn(&self, chain: &[u8; 32], sharing: usize) -> Option<&'static str> {
        let default = self.default_chain.as_ref() == Some(chain);
        (self.http2 && sharing <= 1 && !default).then_some(ALPN_HTTP2)
    }
}

/// The crt-list as the cert directory's index ([`IndexFormat`]): `<name> <rest>` per
/// line, the rest as [`line_rest`] writes it, in the file [`CRT_LIST_FILE`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CrtList {
    /// How its lines are written.
    pub options: CrtListOptions,
}

impl CrtList {
    /// The crt-list written with `options`.
    pub fn new(options: CrtListOptions) -> Self {
        Self { options }
    }
}

impl IndexFormat for CrtList {
    fn file_name(&self) -> &str {
        CRT_LIST_FILE
    }

    fn describe(&self, sni: &Sni, chain: &[u8; 32], sharing: usize) -> Option<String> {
        let filter = sni_filter(sni)?;
        Some(line_rest(&filter, self.options.alpn(chain, sharing)))
    }

    fn write_line(&self, out: &mut String, name: &str, description: &str) {
        let _ = writeln!(out, "{name} {description}");
    }

    fn file_named<'a>(&self, line: &'a str) -> Option<&'a str> {
        line.split_whitespace().next()
    }
}

/// The SNI filter of a route's line: its host, or `*.<domain>` for an allowed wildcard
/// route; `None`: no line.
pub fn sni_filter(sni: &Sni) -> Option<Cow<'_, str>> {
    let filter = match sni {
        Sni::Host(host) => Cow::Borrowed(host.as_str()),
        Sni::Subdomain { domain } => Cow::Owned(format!("*.{domain}")),
        Sni::NoHost => return None,
    };
    usable_sni(&filter).then_some(filter)
}

/// Whether `sni` can be written as a crt-list SNI filter as it is (no negation, no
/// characters a filter cannot hold).
pub fn usable_sni(sni: &str) -> bool {
    !sni.is_empty()
        && !sni.starts_with('!')
        && sni
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'*')
}

/// What follows the certificate on a line: its options, then its SNI filter.
pub fn line_rest(sni: &str, alpn: Option<&str>) -> String {
    match alpn {
        Some(alpn) => format!("[alpn {alpn}] {sni}"),
        None => sni.to_owned(),
    }
}

/// A line as `show ssl crt-list` prints its rest, made comparable with [`line_rest`]:
/// HAProxy 2.6 prints the ALPN list with a NUL byte at its end.
pub fn normalize_shown(rest: &str) -> String {
    rest.replace('\0', "")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_follow_the_route() {
        assert_eq!(
            sni_filter(&Sni::Host("a.example".to_owned())).as_deref(),
            Some("a.example")
        );
        assert_eq!(
            sni_filter(&Sni::Subdomain {
                domain: "shop.example".to_owned()
            })
            .as_deref(),
            Some("*.shop.example")
        );
        assert_eq!(sni_filter(&Sni::NoHost), None);
        assert_eq!(sni_filter(&Sni::Host("!a".to_owned())), None);
    }

    #[test]
    fn alpn_as_the_router_writes_it() {
        let options = CrtListOptions::default();
        let chain = [1; 32];
        assert_eq!(options.alpn(&chain, 1), Some(ALPN_HTTP2));
        assert_eq!(options.alpn(&chain, 2), None, "shared by two routes");
        let disabled = CrtListOptions {
            http2: false,
            ..CrtListOptions::default()
        };
        assert_eq!(disabled.alpn(&chain, 1), None);
        let with_default = CrtListOptions {
            default_chain: Some(chain),
            ..CrtListOptions::default()
        };
        assert_eq!(
            with_default.alpn(&chain, 1),
            None,
            "the default certificate"
        );
        assert_eq!(with_default.alpn(&[2; 32], 1), Some(ALPN_HTTP2));
        assert_eq!(
            line_rest("a.example", Some(ALPN_HTTP2)),
            "[alpn h2,http/1.1] a.example"
        );
        assert_eq!(
            normalize_shown("[alpn h2,http/1.1\0]  a.example"),
            line_rest("a.example", Some(ALPN_HTTP2))
        );
    }

    #[test]
    fn the_crt_list_as_the_cert_directorys_index() {
        let list = CrtList::default();
        assert_eq!(list.file_name(), CRT_LIST_FILE);
        let host = Sni::Host("a.example".to_owned());
        let line = list.describe(&host, &[1; 32], 1).unwrap();
        assert_eq!(line, "[alpn h2,http/1.1] a.example");
        assert_eq!(
            list.describe(&host, &[1; 32], 2).as_deref(),
            Some("a.example"),
            "shared by two routes"
        );
        assert_eq!(list.describe(&Sni::NoHost, &[1; 32], 1), None);
        let mut out = String::new();
        list.write_line(&mut out, "/certs/links/ns_a.pem", &line);
        assert_eq!(out, "/certs/links/ns_a.pem [alpn h2,http/1.1] a.example\n");
        assert_eq!(
            list.file_named(out.trim_end()),
            Some("/certs/links/ns_a.pem")
        );
        assert_eq!(list.file_named(""), None);
    }
}
