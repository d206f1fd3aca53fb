//! Amazon SNS subscription confirmation: SNS sends a new HTTP(S) subscriber a
//! `SubscriptionConfirmation` whose `SubscribeURL` the subscriber must fetch. Ingest fetches it
//! only when its host is one `TOCSIN_SNS_CONFIRM_HOSTS` permits, and through the SSRF rules of
//! webhook deliveries (`TOCSIN_ALLOWED_TARGETS`): the address connected to must be public unless
//! an allowlisted CIDR covers it; redirects are not followed.

use std::sync::Arc;
use std::time::Duration;

use tocsin_web::ssrf::{GuardedResolver, TargetPolicy};
use url::Url;

/// How long the confirmation request may take.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

/// The `SubscribeURL`s ingest may fetch: a comma-separated list whose entries are host
/// patterns (`sns.*.amazonaws.com`: HTTPS on its default port, `*` standing for exactly one DNS
/// label) or origins (`http://127.0.0.1:4566`: that scheme, host and port exactly, for a local
/// SNS emulator). Empty: no subscription is ever confirmed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfirmHosts(Vec<HostRule>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostRule {
    /// HTTPS, default port, the host matching label by label.
    Pattern(Vec<String>),
    /// Exactly this scheme, host and port.
    Origin {
        scheme: String,
        host: String,
        port: u16,
    },
}

impl ConfirmHosts {
    /// Parses the setting.
    pub fn parse(text: &str) -> Result<ConfirmHosts, String> {
        text.split(',')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
            .map(|entry| {
                if entry.contains("://") {
                    let url = Url::parse(entry).map_err(|e| format!("{entry:?}: {e}"))?;
                    let ok = matches!(url.scheme(), "http" | "https")
                        && url.username().is_empty()
                        && url.password().is_none()
                        && matches!(url.path(), "" | "/")
                        && url.query().is_none();
                    match (ok, url.host_str(), url.port_or_known_default()) {
                        (true, Some(host), Some(port)) => Ok(HostRule::Origin {
                            scheme: url.scheme().to_owned(),
                            host: host.to_ascii_lowercase(),
                            port,
                        }),
                        _ => Err(format!(
                            "{entry:?} is not an origin (scheme://host[:port], http or https)"
                        )),
                    }
                } else {
                    let labels: Vec<String> =
                        entry.split('.').map(str::to_ascii_lowercase).collect();
                    let valid = labels.iter().all(|label| {
                        label == "*"
                            || (!label.is_empty()
                                && label
                                    .bytes()
                                    .all(|b| b.is_ascii_alphanumeric() || b == b'-'))
                    });
                    if valid && labels.iter().any(|label| label != "*") {
                        Ok(HostRule::Pattern(labels))
                    } else {
                        Err(format!(
                            "{entry:?} is not a host pattern (labels, or * for one label)"
                        ))
                    }
                }
            })
            .collect::<Result<Vec<_>, _>>()
            .map(ConfirmHosts)
    }

    /// Whether `url` may be fetched to confirm a subscription.
    pub fn permits(&self, url: &Url) -> bool {
        let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
            return false;
        };
        if !url.username().is_empty() || url.password().is_some() {
            return false;
        }
        let host = host.to_ascii_lowercase();
        self.0.iter().any(|rule| match rule {
            HostRule::Pattern(labels) => {
                url.scheme() == "https"
                    && port == 443
                    && host.split('.').count() == labels.len()
                    && host
                        .split('.')
                        .zip(labels)
                        .all(|(label, pattern)| pattern == "*" || pattern == label)
            }
            HostRule::Origin {
                scheme,
                host: allowed,
                port: allowed_port,
            } => url.scheme() == scheme && host == *allowed && port == *allowed_port,
        })
    }
}

/// Why a subscription could not be confirmed.
#[derive(Debug, thiserror::Error)]
pub enum ConfirmError {
    /// The URL is not one the setting permits (answered 422 naming `SubscribeURL`).
    #[error("SubscribeURL: its host is not one TOCSIN_SNS_CONFIRM_HOSTS permits")]
    NotPermitted,
    /// The request failed or was refused (answered 502: SNS sends the confirmation again).
    #[error("the SubscribeURL could not be fetched: {0}")]
    Failed(String),
}

/// Fetches permitted `SubscribeURL`s through the SSRF rules.
#[derive(Clone)]
pub struct Confirmer {
    hosts: ConfirmHosts,
    policy: Arc<TargetPolicy>,
    client: reqwest::Client,
}

impl Confirmer {
    pub fn new(hosts: ConfirmHosts, policy: TargetPolicy) -> anyhow::Result<Confirmer> {
        let policy = Arc::new(policy);
        let client = reqwest::Client::builder()
            .dns_resolver(Arc::new(GuardedResolver::new(policy.clone())))
            .redirect(reqwest::redirect::Policy::none())
            .timeout(CONFIRM_TIMEOUT)
            .user_agent(concat!("Tocsin/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Confirmer {
            hosts,
            policy,
            client,
        })
    }

    /// Confirms the subscription by fetching `subscribe_url`; the host is all a log may show
    /// of it (it carries the subscription's token).
    pub async fn confirm(&self, subscribe_url: &str) -> Result<(), ConfirmError> {
        let url = Url::parse(subscribe_url).map_err(|_| ConfirmError::NotPermitted)?;
        if !self.hosts.permits(&url) {
            return Err(ConfirmError::NotPermitted);
        }
        let host = url.host_str().unwrap_or_default().to_owned();
        // The resolver sees host names only: an address in the URL is checked here.
        let literal = match url.host() {
            Some(url::Host::Ipv4(ip)) => Some(std::net::IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => Some(std::net::IpAddr::V6(ip)),
            _ => None,
        };
        if let Some(ip) = literal {
            if !self.policy.allows(ip) {
                return Err(ConfirmError::Failed(format!(
                    "{ip} is not allowed (private, loopback, link-local or reserved; see TOCSIN_ALLOWED_TARGETS)"
                )));
            }
        }
        let response = self
            .client
            .get(url)
            .send()
            .await
            .map_err(|error| ConfirmError::Failed(format!("{host}: {}", cause(&error))))?;
        let status = response.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(ConfirmError::Failed(format!("{host} answered {status}")))
        }
    }
}

/// The innermost cause of a request error, without the URL reqwest puts in its own message.
fn cause(error: &reqwest::Error) -> String {
    let mut last: Option<&dyn std::error::Error> = None;
    let mut source = std::error::Error::source(error);
    while let Some(next) = source {
        last = Some(next);
        source = next.source();
    }
    match last {
        Some(source) => source.to_string(),
        None if error.is_timeout() => "timed out".to_owned(),
        None => "request failed".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> Url {
        Url::parse(text).unwrap()
    }

    #[test]
    fn the_default_permits_sns_hosts_over_https_only() {
        let hosts = ConfirmHosts::parse("sns.*.amazonaws.com, sns.*.amazonaws.com.cn").unwrap();
        for ok in [
            "https://sns.eu-west-1.amazonaws.com/?Action=ConfirmSubscription&Token=x",
            "https://SNS.us-east-1.amazonaws.com:443/?Action=ConfirmSubscription",
            "https://sns.cn-north-1.amazonaws.com.cn/?Action=ConfirmSubscription",
        ] {
            assert!(hosts.permits(&url(ok)), "{ok}");
        }
        for refused in [
            "http://sns.eu-west-1.amazonaws.com/",
            "https://sns.eu-west-1.amazonaws.com:8443/",
            "https://sns.amazonaws.com/",
            "https://sns.a.b.amazonaws.com/",
            "https://sns.eu-west-1.amazonaws.com.evil.example/",
            "https://evil.example/?sns.eu-west-1.amazonaws.com",
            "https://user:pw@sns.eu-west-1.amazonaws.com/",
            "https://169.254.169.254/",
        ] {
            assert!(!hosts.permits(&url(refused)), "{refused}");
        }
    }

    #[test]
    fn an_origin_permits_exactly_itself() {
        let hosts = ConfirmHosts::parse("http://127.0.0.1:4566").unwrap();
        assert!(hosts.permits(&url("http://127.0.0.1:4566/?Action=ConfirmSubscription")));
        assert!(!hosts.permits(&url("http://127.0.0.1:4567/")));
        assert!(!hosts.permits(&url("https://127.0.0.1:4566/")));
        assert!(!ConfirmHosts::parse("")
            .unwrap()
            .permits(&url("https://sns.x.amazonaws.com/")));
    }

    #[test]
    fn bad_entries_are_refused() {
        for bad in [
            "*",
            "*.*",
            "sns..amazonaws.com",
            "ftp://x",
            "http://x/path",
            "http://u:p@x",
            "a_b.com",
        ] {
            assert!(ConfirmHosts::parse(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn loopback_is_refused_unless_allowlisted() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let hosts = ConfirmHosts::parse(&format!("http://127.0.0.1:{port}")).unwrap();
        let guarded = Confirmer::new(hosts.clone(), TargetPolicy::default()).unwrap();
        let refused = guarded
            .confirm(&format!("http://127.0.0.1:{port}/?Token=secret-token"))
            .await
            .unwrap_err();
        let message = refused.to_string();
        assert!(matches!(refused, ConfirmError::Failed(_)), "{message}");
        assert!(!message.contains("secret-token"), "{message}");
        let not_permitted = guarded
            .confirm("http://127.0.0.1:1/?Token=x")
            .await
            .unwrap_err();
        assert!(matches!(not_permitted, ConfirmError::NotPermitted));
        // A name that resolves to loopback is refused where it is resolved.
        let hosts = ConfirmHosts::parse(&format!("http://localhost:{port}")).unwrap();
        let guarded = Confirmer::new(hosts, TargetPolicy::default()).unwrap();
        let refused = guarded
            .confirm(&format!("http://localhost:{port}/?Token=secret-token"))
            .await
            .unwrap_err();
        let message = refused.to_string();
        assert!(message.contains("not allowed"), "{message}");
        assert!(!message.contains("secret-token"), "{message}");
        drop(listener);
    }
}
