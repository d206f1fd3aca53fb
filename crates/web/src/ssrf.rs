//! SSRF rules for the addresses the services make requests to (webhook targets, SNS
//! subscription confirmations): loopback, private, link-local, CGNAT, multicast,
//! unspecified and reserved addresses, their IPv6 equivalents and IPv4-mapped forms are refused
//! unless an allowlisted CIDR covers them. The check runs in the DNS resolver the HTTP client
//! connects through, so the address checked is the address connected to (no DNS rebinding), and
//! on IP-literal URLs before any request.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// The addresses targets may resolve to.
#[derive(Debug, Clone, Default)]
pub struct TargetPolicy {
    allowed: Vec<IpNet>,
}

/// A target was refused by the SSRF rules.
#[derive(Debug, thiserror::Error)]
#[error("target address {0} is not allowed (private, loopback, link-local or reserved; see TOCSIN_ALLOWED_TARGETS)")]
pub struct Blocked(pub IpAddr);

impl TargetPolicy {
    /// Parses a comma-separated CIDR list; empty means no exemptions.
    pub fn parse(text: &str) -> Result<TargetPolicy, String> {
        let allowed = text
            .split(',')
            .map(str::trim)
            .filter(|part| !part.is_empty())
            .map(|part| {
                part.parse::<IpNet>()
                    .or_else(|_| part.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| format!("{part:?} is not a CIDR (e.g. 10.0.0.0/8)"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TargetPolicy { allowed })
    }

    /// Whether a connection to `ip` is allowed.
    pub fn allows(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        is_public(ip) || self.allowed.iter().any(|net| net.contains(&ip))
    }

    /// Checks an address.
    pub fn check(&self, ip: IpAddr) -> Result<(), Blocked> {
        if self.allows(ip) {
            Ok(())
        } else {
            Err(Blocked(ip))
        }
    }
}

/// IPv4-mapped and NAT64-embedded IPv6 addresses are judged as the IPv4 address they carry.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return IpAddr::V4(v4);
            }
            let s = v6.segments();
            // 64:ff9b::/96, the well-known NAT64 prefix.
            if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
                let [a, b] = s[6].to_be_bytes();
                let [c, d] = s[7].to_be_bytes();
                return IpAddr::V4(Ipv4Addr::new(a, b, c, d));
            }
            IpAddr::V6(v6)
        }
        v4 => v4,
    }
}

fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_multicast()
        || ip.is_broadcast()
        || ip.is_documentation()
        || a == 0 // 0.0.0.0/8 "this network"
        || (a == 100 && (64..128).contains(&b)) // 100.64.0.0/10 CGNAT
        || (a == 192 && b == 0 && ip.octets()[2] == 0) // 192.0.0.0/24 IETF protocol assignments
        || (a == 198 && (b == 18 || b == 19)) // 198.18.0.0/15 benchmarking
        || a >= 240) // 240.0.0.0/4 reserved
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (first & 0xfe00) == 0xfc00 // fc00::/7 unique local
        || (first & 0xffc0) == 0xfe80 // fe80::/10 link-local
        || (first & 0xffc0) == 0xfec0 // fec0::/10 site-local (deprecated)
        || first == 0x2001 && ip.segments()[1] == 0x0db8 // 2001:db8::/32 documentation
        || first == 0x0100 && ip.segments()[1..4] == [0, 0, 0]) // 100::/64 discard
}

/// The resolver the HTTP client connects through: resolves, then keeps only allowed addresses.
pub struct GuardedResolver {
    policy: Arc<TargetPolicy>,
}

impl GuardedResolver {
    pub fn new(policy: Arc<TargetPolicy>) -> Self {
        GuardedResolver { policy }
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let resolved: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map_err(|e| {
                    Box::new(DnsFailure(format!("{host}: {e}")))
                        as Box<dyn std::error::Error + Send + Sync>
                })?
                .collect();
            let allowed: Vec<SocketAddr> = resolved
                .iter()
                .copied()
                .filter(|addr| policy.allows(addr.ip()))
                .collect();
            match (allowed.is_empty(), resolved.first()) {
                (false, _) => Ok(Box::new(allowed.into_iter()) as Addrs),
                (true, Some(first)) => {
                    Err(Box::new(Blocked(first.ip())) as Box<dyn std::error::Error + Send + Sync>)
                }
                (true, None) => Err(Box::new(DnsFailure(format!("{host}: no addresses")))
                    as Box<dyn std::error::Error + Send + Sync>),
            }
        })
    }
}

/// A host name did not resolve.
#[derive(Debug, thiserror::Error)]
#[error("DNS lookup failed: {0}")]
pub struct DnsFailure(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn refuses_internal_addresses_by_default() {
        let policy = TargetPolicy::default();
        for blocked in [
            "127.0.0.1",
            "127.8.9.10",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.254",
            "224.0.0.1",
            "255.255.255.255",
            "0.0.0.0",
            "0.1.2.3",
            "240.0.0.1",
            "::1",
            "::",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:10.0.0.1",
            "64:ff9b::a9fe:a9fe",
        ] {
            assert!(!policy.allows(ip(blocked)), "{blocked} must be refused");
        }
    }

    #[test]
    fn allows_public_addresses() {
        let policy = TargetPolicy::default();
        for public in [
            "8.8.8.8",
            "1.1.1.1",
            "100.128.0.1",
            "172.32.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert!(policy.allows(ip(public)), "{public} must be allowed");
        }
    }

    #[test]
    fn the_allowlist_exempts_its_cidrs_only() {
        let policy = TargetPolicy::parse("127.0.0.0/8, 10.1.0.0/16,::1").unwrap();
        assert!(policy.allows(ip("127.0.0.1")));
        assert!(policy.allows(ip("::ffff:127.0.0.1")));
        assert!(policy.allows(ip("10.1.200.3")));
        assert!(policy.allows(ip("::1")));
        assert!(!policy.allows(ip("10.2.0.1")));
        assert!(!policy.allows(ip("169.254.169.254")));
        assert!(TargetPolicy::parse("").unwrap().allowed.is_empty());
        assert!(TargetPolicy::parse("not-a-cidr").is_err());
    }

    #[tokio::test]
    async fn the_resolver_refuses_names_that_resolve_to_blocked_addresses() {
        let resolver = GuardedResolver::new(Arc::new(TargetPolicy::default()));
        let error = match resolver.resolve("localhost".parse().unwrap()).await {
            Ok(_) => panic!("localhost must be refused"),
            Err(error) => error,
        };
        assert!(error.downcast_ref::<Blocked>().is_some(), "{error}");
        let allowing = GuardedResolver::new(Arc::new(
            TargetPolicy::parse("127.0.0.0/8,::1/128").unwrap(),
        ));
        let addrs: Vec<SocketAddr> = match allowing.resolve("localhost".parse().unwrap()).await {
            Ok(addrs) => addrs.collect(),
            Err(error) => panic!("{error}"),
        };
        assert!(!addrs.is_empty());
    }
}
