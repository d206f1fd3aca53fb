//! Signing in to the settings pages with OpenID Connect: the authorization code flow with PKCE
//! (S256), `state` and `nonce` checked, the provider's discovery document and signing keys
//! fetched (the keys again when a token names one not known yet: the provider rotated them),
//! the ID token's RS256 signature, issuer, audience, expiry and nonce checked, and the role
//! taken from a configured claim through a configured mapping; an identity whose claim maps to
//! no role is refused.

use std::collections::HashMap;
use std::sync::RwLock;

use anyhow::Context;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::rand::{SecureRandom, SystemRandom};
use serde::Deserialize;
use serde_json::Value;
use time::OffsetDateTime;
use tocsin_domain::Role;

/// How the pages sign in with the identity provider (`TOCSIN_OIDC_*`). `Debug` leaves the
/// client secret out.
#[derive(Clone)]
pub struct OidcSettings {
    /// The issuer URL; its discovery document is `<issuer>/.well-known/openid-configuration`.
    pub issuer: String,
    pub client_id: String,
    /// Sent as `client_secret_post`; `None` for a public client (PKCE alone).
    pub client_secret: Option<String>,
    /// `https://<admin>/settings/sign-in/oidc/callback`, as registered with the provider;
    /// `None`: built from the address each request was sent to (the provider refuses any but
    /// the registered one).
    pub redirect_url: Option<String>,
    /// The claim holding the identity's groups or roles (a string or an array of strings).
    pub role_claim: String,
    /// Claim value → role; an identity gets the highest role any of its values maps to.
    pub roles: Vec<(String, Role)>,
}

impl std::fmt::Debug for OidcSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OidcSettings")
            .field("issuer", &self.issuer)
            .field("client_id", &self.client_id)
            .field("redirect_url", &self.redirect_url)
            .field("role_claim", &self.role_claim)
            .field("roles", &self.roles)
            .finish_non_exhaustive()
    }
}

impl OidcSettings {
    /// Parses `TOCSIN_OIDC_ROLES`: `value=role` pairs, comma-separated.
    pub fn parse_roles(text: &str) -> anyhow::Result<Vec<(String, Role)>> {
        let roles: Vec<(String, Role)> =
            text.split(',')
                .map(str::trim)
                .filter(|pair| !pair.is_empty())
                .map(|pair| {
                    let (value, role) = pair.rsplit_once('=').with_context(|| {
                        format!("TOCSIN_OIDC_ROLES: {pair:?} is not value=role")
                    })?;
                    let role = role.trim().parse::<Role>().map_err(|e| {
                        anyhow::anyhow!("TOCSIN_OIDC_ROLES: {pair:?}: the role {e}")
                    })?;
                    Ok((value.trim().to_owned(), role))
                })
                .collect::<anyhow::Result<_>>()?;
        anyhow::ensure!(
            !roles.is_empty(),
            "TOCSIN_OIDC_ROLES: map at least one claim value to a role (e.g. tocsin-admins=admin)"
        );
        Ok(roles)
    }

    /// The callback URL of a request: the configured one, or the request's own address's.
    pub fn redirect_url(&self, req: &actix_web::HttpRequest) -> String {
        self.redirect_url.clone().unwrap_or_else(|| {
            let info = req.connection_info();
            format!(
                "{}://{}/settings/sign-in/oidc/callback",
                info.scheme(),
                info.host()
            )
        })
    }

    /// The highest role the claim's values map to.
    pub fn role_of(&self, claims: &Value) -> Option<Role> {
        let values: Vec<&str> = match &claims[&self.role_claim] {
            Value::String(one) => vec![one.as_str()],
            Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        self.roles
            .iter()
            .filter(|(value, _)| values.contains(&value.as_str()))
            .map(|(_, role)| *role)
            .max()
    }
}

/// The provider's endpoints, from its discovery document.
#[derive(Debug, Clone, Deserialize)]
struct Discovery {
    issuer: String,
    authorization_endpoint: String,
    token_endpoint: String,
    jwks_uri: String,
}

/// An RSA signing key of the provider.
#[derive(Debug, Clone, Deserialize)]
struct Jwk {
    kty: String,
    kid: Option<String>,
    n: Option<String>,
    e: Option<String>,
}

#[derive(Deserialize)]
struct Jwks {
    keys: Vec<Jwk>,
}

/// What a sign-in that has left for the provider must find again on its way back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub state: String,
    pub nonce: String,
    pub verifier: String,
}

impl Pending {
    /// New random `state`, `nonce` and PKCE code verifier.
    pub fn new() -> Self {
        Pending {
            state: random(),
            nonce: random(),
            verifier: random(),
        }
    }

    /// As one cookie value (each part is base64url, without dots).
    pub fn encode(&self) -> String {
        format!("{}.{}.{}", self.state, self.nonce, self.verifier)
    }

    pub fn decode(text: &str) -> Option<Self> {
        let mut parts = text.split('.');
        let pending = Pending {
            state: parts.next()?.to_owned(),
            nonce: parts.next()?.to_owned(),
            verifier: parts.next()?.to_owned(),
        };
        parts.next().is_none().then_some(pending)
    }

    /// The PKCE challenge: base64url(SHA-256(verifier)).
    fn challenge(&self) -> String {
        let digest = ring::digest::digest(&ring::digest::SHA256, self.verifier.as_bytes());
        URL_SAFE_NO_PAD.encode(digest.as_ref())
    }
}

impl Default for Pending {
    fn default() -> Self {
        Self::new()
    }
}

fn random() -> String {
    let mut bytes = [0u8; 32];
    SystemRandom::new()
        .fill(&mut bytes)
        .expect("system random source");
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A signed-in identity: who, and with which role, until when.
#[derive(Debug, Clone)]
pub struct Identity {
    pub subject: String,
    pub name: String,
    pub role: Role,
    pub expires_at: OffsetDateTime,
}

/// Why a sign-in through the provider was refused.
#[derive(Debug, thiserror::Error)]
pub enum OidcError {
    /// The identity is known to the provider but maps to no role here.
    #[error("the identity {0} has no role in Tocsin")]
    NoRole(String),
    /// Anything else: the answer could not be trusted or the provider could not be reached.
    #[error("{0:#}")]
    Failed(anyhow::Error),
}

impl From<anyhow::Error> for OidcError {
    fn from(error: anyhow::Error) -> Self {
        OidcError::Failed(error)
    }
}

/// The client of one provider.
pub struct Oidc {
    pub settings: OidcSettings,
    http: reqwest::Client,
    discovery: RwLock<Option<Discovery>>,
    keys: RwLock<HashMap<String, Jwk>>,
}

impl Oidc {
    pub fn new(settings: OidcSettings) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .context("building the OpenID Connect client")?;
        Ok(Oidc {
            settings,
            http,
            discovery: RwLock::new(None),
            keys: RwLock::new(HashMap::new()),
        })
    }

    async fn discovery(&self) -> anyhow::Result<Discovery> {
        if let Some(found) = self
            .discovery
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            return Ok(found);
        }
        let url = format!(
            "{}/.well-known/openid-configuration",
            self.settings.issuer.trim_end_matches('/')
        );
        let found: Discovery = self
            .http
            .get(&url)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .with_context(|| format!("fetching {url}"))?
            .json()
            .await
            .with_context(|| format!("reading {url}"))?;
        anyhow::ensure!(
            found.issuer.trim_end_matches('/') == self.settings.issuer.trim_end_matches('/'),
            "the discovery document names the issuer {}, not {}",
            found.issuer,
            self.settings.issuer
        );
        *self.discovery.write().unwrap_or_else(|e| e.into_inner()) = Some(found.clone());
        Ok(found)
    }

    /// Where to send the browser to sign in.
    pub async fn authorization_url(
        &self,
        pending: &Pending,
        redirect_url: &str,
    ) -> anyhow::Result<String> {
        let discovery = self.discovery().await?;
        let mut url = url::Url::parse(&discovery.authorization_endpoint)
            .context("the provider's authorization endpoint")?;
        url.query_pairs_mut()
            .append_pair("response_type", "code")
            .append_pair("client_id", &self.settings.client_id)
            .append_pair("redirect_uri", redirect_url)
            .append_pair("scope", "openid profile")
            .append_pair("state", &pending.state)
            .append_pair("nonce", &pending.nonce)
            .append_pair("code_challenge", &pending.challenge())
            .append_pair("code_challenge_method", "S256");
        Ok(url.into())
    }

    /// Exchanges the code for tokens and checks the ID token; the identity and its role.
    pub async fn finish(
        &self,
        code: &str,
        pending: &Pending,
        redirect_url: &str,
    ) -> Result<Identity, OidcError> {
        let discovery = self.discovery().await?;
        let mut form = vec![
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", redirect_url),
            ("client_id", self.settings.client_id.as_str()),
            ("code_verifier", pending.verifier.as_str()),
        ];
        if let Some(secret) = &self.settings.client_secret {
            form.push(("client_secret", secret));
        }
        #[derive(Deserialize)]
        struct Tokens {
            id_token: String,
        }
        let tokens: Tokens = self
            .http
            .post(&discovery.token_endpoint)
            .form(&form)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .context("exchanging the code at the token endpoint")?
            .json()
            .await
            .context("reading the token endpoint's answer")?;
        let claims = self
            .verify(&tokens.id_token, &discovery, &pending.nonce)
            .await?;
        let subject = claims["sub"]
            .as_str()
            .context("the ID token has no sub")?
            .to_owned();
        let name = ["name", "preferred_username", "email"]
            .iter()
            .find_map(|claim| claims[*claim].as_str())
            .unwrap_or(&subject)
            .to_owned();
        let role = self
            .settings
            .role_of(&claims)
            .ok_or_else(|| OidcError::NoRole(name.clone()))?;
        let expires_at = claims["exp"]
            .as_i64()
            .and_then(|exp| OffsetDateTime::from_unix_timestamp(exp).ok())
            .context("the ID token has no exp")?;
        Ok(Identity {
            subject,
            name,
            role,
            expires_at,
        })
    }

    /// The claims of an ID token whose signature, issuer, audience, expiry and nonce hold.
    async fn verify(
        &self,
        token: &str,
        discovery: &Discovery,
        nonce: &str,
    ) -> anyhow::Result<Value> {
        let mut parts = token.split('.');
        let (Some(header), Some(payload), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            anyhow::bail!("the ID token is not a JWS");
        };
        let decode = |part: &str| {
            URL_SAFE_NO_PAD
                .decode(part)
                .context("the ID token's base64")
        };
        let header: Value = serde_json::from_slice(&decode(header)?)?;
        anyhow::ensure!(
            header["alg"] == "RS256",
            "the ID token is signed with {}, not RS256",
            header["alg"]
        );
        let kid = header["kid"].as_str().unwrap_or_default().to_owned();
        let key = match self.key(&kid) {
            Some(key) => key,
            None => {
                // A key not seen yet: the provider may have rotated its keys.
                self.fetch_keys(discovery).await?;
                self.key(&kid)
                    .with_context(|| format!("the provider has no signing key {kid:?}"))?
            }
        };
        let n = decode(key.n.as_deref().unwrap_or_default())?;
        let e = decode(key.e.as_deref().unwrap_or_default())?;
        let signed = &token[..token.len() - signature.len() - 1];
        ring::signature::RsaPublicKeyComponents { n: &n, e: &e }
            .verify(
                &ring::signature::RSA_PKCS1_2048_8192_SHA256,
                signed.as_bytes(),
                &decode(signature)?,
            )
            .map_err(|_| anyhow::anyhow!("the ID token's signature does not verify"))?;
        let claims: Value = serde_json::from_slice(&decode(payload)?)?;
        anyhow::ensure!(
            claims["iss"] == discovery.issuer.as_str(),
            "the ID token's issuer is {}",
            claims["iss"]
        );
        let audience_ok = match &claims["aud"] {
            Value::String(one) => *one == self.settings.client_id,
            Value::Array(many) => many.iter().any(|a| *a == self.settings.client_id.as_str()),
            _ => false,
        };
        anyhow::ensure!(audience_ok, "the ID token is not for this client");
        let now = OffsetDateTime::now_utc().unix_timestamp();
        anyhow::ensure!(
            claims["exp"].as_i64().is_some_and(|exp| exp > now),
            "the ID token has expired"
        );
        anyhow::ensure!(
            claims["nonce"]
                .as_str()
                .is_some_and(|n| tocsin_domain::constant_time_eq(n, nonce)),
            "the ID token's nonce is not this sign-in's"
        );
        Ok(claims)
    }

    fn key(&self, kid: &str) -> Option<Jwk> {
        self.keys
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(kid)
            .cloned()
    }

    async fn fetch_keys(&self, discovery: &Discovery) -> anyhow::Result<()> {
        let jwks: Jwks = self
            .http
            .get(&discovery.jwks_uri)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .context("fetching the provider's keys")?
            .json()
            .await
            .context("reading the provider's keys")?;
        let keys = jwks
            .keys
            .into_iter()
            .filter(|key| key.kty == "RSA")
            .map(|key| (key.kid.clone().unwrap_or_default(), key))
            .collect();
        *self.keys.write().unwrap_or_else(|e| e.into_inner()) = keys;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> OidcSettings {
        OidcSettings {
            issuer: "http://127.0.0.1:1".into(),
            client_id: "tocsin".into(),
            client_secret: None,
            redirect_url: None,
            role_claim: "groups".into(),
            roles: OidcSettings::parse_roles("oncall=operator, tocsin-admins=admin,staff=viewer")
                .unwrap(),
        }
    }

    #[test]
    fn the_highest_mapped_role_wins_and_no_mapped_value_is_no_role() {
        let s = settings();
        let claims = serde_json::json!({"groups": ["staff", "oncall"]});
        assert_eq!(s.role_of(&claims), Some(Role::Operator));
        assert_eq!(
            s.role_of(&serde_json::json!({"groups": "tocsin-admins"})),
            Some(Role::Admin)
        );
        assert_eq!(s.role_of(&serde_json::json!({"groups": ["sales"]})), None);
        assert_eq!(s.role_of(&serde_json::json!({})), None);
        assert!(OidcSettings::parse_roles("oncall=root").is_err());
        assert!(OidcSettings::parse_roles("").is_err());
    }

    #[test]
    fn pending_sign_ins_round_trip_and_the_challenge_is_s256() {
        let pending = Pending::new();
        assert_eq!(Pending::decode(&pending.encode()), Some(pending.clone()));
        assert_eq!(Pending::decode("a.b"), None);
        // base64url(SHA-256(verifier)), computed apart with Python's hashlib.
        let rfc = Pending {
            state: String::new(),
            nonce: String::new(),
            verifier: "dBjftJeZ4CVP-mJ92K1s-hXGnvkLTlLIq9TzSbdt-mc".into(),
        };
        assert_eq!(
            rfc.challenge(),
            "jETo-ZbZ1k-Z9YThGETBaJ1IYyzcgSVP3wzFCXLTmLg"
        );
    }
}
