//! Amazon SNS: subscription confirmation and message signatures.
//!
//! SNS sends a new HTTP(S) subscriber a `SubscriptionConfirmation` whose `SubscribeURL` the
//! subscriber must fetch, and signs every message with a certificate found at its
//! `SigningCertURL`. Ingest fetches either URL only when its host is one `TOCSIN_SNS_HOSTS`
//! permits, and through the SSRF rules of webhook deliveries (`TOCSIN_ALLOWED_TARGETS`): the
//! address connected to must be public unless an allowlisted CIDR covers it; redirects are not
//! followed. A token with `sns_signature` requires every message's signature to verify
//! (<https://docs.aws.amazon.com/sns/latest/dg/sns-verify-signature-of-message.html>).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ring::signature::{self, UnparsedPublicKey};
use serde_json::{Map, Value};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use tocsin_web::ssrf::{GuardedResolver, TargetPolicy};
use url::Url;

/// How long a request to SNS (a confirmation, a certificate) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The SNS URLs (`SubscribeURL`, `SigningCertURL`) ingest may fetch: a comma-separated list
/// whose entries are host patterns (`sns.*.amazonaws.com`: HTTPS on its default port, `*` standing for exactly one DNS
/// label) or origins (`http://127.0.0.1:4566`: that scheme, host and port exactly, for a local
/// SNS emulator). Empty: no subscription is ever confirmed and no signature verifies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnsHosts(Vec<HostRule>);

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

impl SnsHosts {
    /// Parses the setting.
    pub fn parse(text: &str) -> Result<SnsHosts, String> {
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
            .map(SnsHosts)
    }

    /// The setting's default: Amazon SNS's own hosts, in every region.
    pub const DEFAULT: &'static str = "sns.*.amazonaws.com,sns.*.amazonaws.com.cn";

    /// Whether `url` may be fetched.
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
    #[error("SubscribeURL: its host is not one TOCSIN_SNS_HOSTS permits")]
    NotPermitted,
    /// The request failed or was refused (answered 502: SNS sends the confirmation again).
    #[error("the SubscribeURL could not be fetched: {0}")]
    Failed(String),
}

/// Talks to SNS: fetches permitted `SubscribeURL`s and signing certificates through the SSRF
/// rules, and keeps the certificates' keys.
#[derive(Clone)]
pub struct Sns {
    hosts: SnsHosts,
    policy: Arc<TargetPolicy>,
    client: reqwest::Client,
    /// Public keys by certificate URL, with when their certificate expires: SNS signs with few
    /// certificates and changes them rarely. Emptied when full.
    keys: Arc<Mutex<HashMap<String, CertificateKey>>>,
}

impl Sns {
    pub fn new(hosts: SnsHosts, policy: TargetPolicy) -> anyhow::Result<Sns> {
        let policy = Arc::new(policy);
        let client = reqwest::Client::builder()
            .dns_resolver(Arc::new(GuardedResolver::new(policy.clone())))
            .redirect(reqwest::redirect::Policy::none())
            .timeout(REQUEST_TIMEOUT)
            .user_agent(concat!("Tocsin/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Sns {
            hosts,
            policy,
            client,
            keys: Arc::default(),
        })
    }

    /// Confirms the subscription by fetching `subscribe_url`; the host is all a log may show
    /// of it (it carries the subscription's token).
    pub async fn confirm(&self, subscribe_url: &str) -> Result<(), ConfirmError> {
        let url = Url::parse(subscribe_url).map_err(|_| ConfirmError::NotPermitted)?;
        if !self.hosts.permits(&url) {
            return Err(ConfirmError::NotPermitted);
        }
        self.get(url).await.map(drop).map_err(ConfirmError::Failed)
    }

    /// Checks SNS's signature of `body`, a message as SNS posts it.
    pub async fn verify(&self, body: &[u8]) -> Result<(), SignatureError> {
        let message: Map<String, Value> = serde_json::from_slice(body)
            .map_err(|_| SignatureError::Refused("the body is not an SNS message".into()))?;
        let field = |name: &str| message.get(name).and_then(Value::as_str);
        let algorithm: &'static dyn signature::VerificationAlgorithm =
            match field("SignatureVersion") {
                Some("1") => &signature::RSA_PKCS1_2048_8192_SHA1_FOR_LEGACY_USE_ONLY,
                Some("2") => &signature::RSA_PKCS1_2048_8192_SHA256,
                other => {
                    return Err(SignatureError::Refused(format!(
                        "SignatureVersion {other:?} is not 1 or 2"
                    )))
                }
            };
        let signed = string_to_sign(&message).map_err(SignatureError::Refused)?;
        let signature_bytes = field("Signature")
            .and_then(|text| STANDARD.decode(text).ok())
            .ok_or_else(|| SignatureError::Refused("Signature is missing or not base64".into()))?;
        let cert_url = field("SigningCertURL")
            .ok_or_else(|| SignatureError::Refused("SigningCertURL is missing".into()))?;
        let key = self.public_key(cert_url).await?;
        UnparsedPublicKey::new(algorithm, key.as_slice())
            .verify(&signed, &signature_bytes)
            .map_err(|_| SignatureError::Refused("the signature does not verify".into()))
    }

    /// The public key of the certificate at `cert_url`, fetched once and kept until the
    /// certificate expires.
    async fn public_key(&self, cert_url: &str) -> Result<Arc<Vec<u8>>, SignatureError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| {
                i64::try_from(since.as_secs()).unwrap_or(i64::MAX)
            });
        if let Some(kept) = self.keys.lock().expect("keys lock").get(cert_url) {
            if now < kept.expires {
                return Ok(kept.key.clone());
            }
        }
        let url = Url::parse(cert_url)
            .ok()
            .filter(|url| self.hosts.permits(url))
            .ok_or_else(|| {
                SignatureError::Refused(
                    "SigningCertURL: its host is not one TOCSIN_SNS_HOSTS permits".into(),
                )
            })?;
        let pem = self.get(url).await.map_err(SignatureError::Unavailable)?;
        let kept = certificate_key(&pem).map_err(SignatureError::Refused)?;
        let key = kept.key.clone();
        let mut keys = self.keys.lock().expect("keys lock");
        if keys.len() >= KEPT_KEYS {
            keys.clear();
        }
        keys.insert(cert_url.to_owned(), kept);
        Ok(key)
    }

    /// GETs a permitted URL, checking an address in it against the SSRF rules (the resolver
    /// checks names); the body of a success. Errors name the host only.
    async fn get(&self, url: Url) -> Result<Vec<u8>, String> {
        let host = url.host_str().unwrap_or_default().to_owned();
        let literal = match url.host() {
            Some(url::Host::Ipv4(ip)) => Some(std::net::IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => Some(std::net::IpAddr::V6(ip)),
            _ => None,
        };
        if let Some(ip) = literal {
            if !self.policy.allows(ip) {
                return Err(format!(
                    "{ip} is not allowed (private, loopback, link-local or reserved; see TOCSIN_ALLOWED_TARGETS)"
                ));
            }
        }
        let failed = |error: reqwest::Error| format!("{host}: {}", cause(&error));
        let response = self.client.get(url).send().await.map_err(failed)?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("{host} answered {status}"));
        }
        let body = response.bytes().await.map_err(failed)?;
        Ok(body.to_vec())
    }
}

/// Certificates' keys kept at most.
const KEPT_KEYS: usize = 64;

/// Why a message's signature was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum SignatureError {
    /// The message is not signed, not signed right, or not by a permitted certificate
    /// (answered 401, as every refused credential).
    #[error("{0}")]
    Refused(String),
    /// The certificate could not be fetched (answered 502: SNS sends the message again).
    #[error("the signing certificate could not be fetched: {0}")]
    Unavailable(String),
}

/// The text SNS signs: each field's name and value on lines of their own, in this order.
fn string_to_sign(message: &Map<String, Value>) -> Result<Vec<u8>, String> {
    let kind = message
        .get("Type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let fields: &[&str] = match kind {
        "Notification" => &[
            "Message",
            "MessageId",
            "Subject",
            "Timestamp",
            "TopicArn",
            "Type",
        ],
        "SubscriptionConfirmation" | "UnsubscribeConfirmation" => &[
            "Message",
            "MessageId",
            "SubscribeURL",
            "Timestamp",
            "Token",
            "TopicArn",
            "Type",
        ],
        other => return Err(format!("Type {other:?} is not an SNS message type")),
    };
    let mut text = String::new();
    for &name in fields {
        match message.get(name) {
            Some(Value::String(value)) => {
                text.push_str(name);
                text.push('\n');
                text.push_str(value);
                text.push('\n');
            }
            // A notification's subject is signed only when it has one.
            None if name == "Subject" => {}
            _ => return Err(format!("{name} is missing")),
        }
    }
    Ok(text.into_bytes())
}

/// A certificate's public key, and when the certificate expires (Unix seconds).
#[derive(Clone)]
struct CertificateKey {
    key: Arc<Vec<u8>>,
    expires: i64,
}

/// The RSA public key of a PEM certificate that is valid now.
fn certificate_key(pem: &[u8]) -> Result<CertificateKey, String> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem)
        .map_err(|_| "the signing certificate is not PEM".to_owned())?;
    let certificate = pem
        .parse_x509()
        .map_err(|_| "the signing certificate is not X.509".to_owned())?;
    if !certificate.validity().is_valid() {
        return Err("the signing certificate has expired or is not yet valid".into());
    }
    Ok(CertificateKey {
        key: Arc::new(certificate.public_key().subject_public_key.data.to_vec()),
        expires: certificate.validity().not_after.timestamp(),
    })
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
        let hosts = SnsHosts::parse("sns.*.amazonaws.com, sns.*.amazonaws.com.cn").unwrap();
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
        let hosts = SnsHosts::parse("http://127.0.0.1:4566").unwrap();
        assert!(hosts.permits(&url("http://127.0.0.1:4566/?Action=ConfirmSubscription")));
        assert!(!hosts.permits(&url("http://127.0.0.1:4567/")));
        assert!(!hosts.permits(&url("https://127.0.0.1:4566/")));
        assert!(!SnsHosts::parse("")
            .unwrap()
            .permits(&url("https://sns.x.amazonaws.com/")));
    }

    #[test]
    fn the_signed_text_is_the_types_fields_in_order() {
        let message = |text: &str| serde_json::from_str::<Map<String, Value>>(text).unwrap();
        let notification = message(
            r#"{"Type":"Notification","MessageId":"m","TopicArn":"t","Subject":"s",
                "Message":"{\"a\":1}","Timestamp":"ts","Signature":"x"}"#,
        );
        assert_eq!(
            String::from_utf8(string_to_sign(&notification).unwrap()).unwrap(),
            "Message\n{\"a\":1}\nMessageId\nm\nSubject\ns\nTimestamp\nts\nTopicArn\nt\nType\nNotification\n"
        );
        let no_subject = message(
            r#"{"Type":"Notification","MessageId":"m","TopicArn":"t","Message":"x","Timestamp":"ts"}"#,
        );
        assert!(!String::from_utf8(string_to_sign(&no_subject).unwrap())
            .unwrap()
            .contains("Subject"));
        let confirmation = message(
            r#"{"Type":"SubscriptionConfirmation","MessageId":"m","TopicArn":"t","Message":"x",
                "Timestamp":"ts","Token":"k","SubscribeURL":"u"}"#,
        );
        assert_eq!(
            String::from_utf8(string_to_sign(&confirmation).unwrap()).unwrap(),
            "Message\nx\nMessageId\nm\nSubscribeURL\nu\nTimestamp\nts\nToken\nk\nTopicArn\nt\nType\nSubscriptionConfirmation\n"
        );
        let mut no_token = confirmation.clone();
        no_token.remove("Token");
        assert_eq!(string_to_sign(&no_token).unwrap_err(), "Token is missing");
        let mut number = notification.clone();
        number.insert("MessageId".into(), Value::from(7));
        assert_eq!(string_to_sign(&number).unwrap_err(), "MessageId is missing");
        assert!(string_to_sign(&message(r#"{"Type":"Other"}"#)).is_err());
    }

    #[test]
    fn a_certificate_gives_its_key_and_when_it_expires() {
        let pem = include_bytes!("../tests/ingest/sns-signing/certificate.pem");
        let kept = certificate_key(pem).unwrap();
        assert!(!kept.key.is_empty());
        // The test certificate is valid for 100 years from its making (2026-11-26).
        let year = 365 * 24 * 3600;
        assert!(kept.expires > 1_795_000_000 + 90 * year, "{}", kept.expires);
        assert!(certificate_key(b"not a certificate").is_err());
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
            assert!(SnsHosts::parse(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn loopback_is_refused_unless_allowlisted() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let hosts = SnsHosts::parse(&format!("http://127.0.0.1:{port}")).unwrap();
        let guarded = Sns::new(hosts.clone(), TargetPolicy::default()).unwrap();
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
        let hosts = SnsHosts::parse(&format!("http://localhost:{port}")).unwrap();
        let guarded = Sns::new(hosts, TargetPolicy::default()).unwrap();
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
