//! The system under test: admin, ingest and two dispatchers, each its own process (the release
//! binaries' debug builds), and webhooks whose receivers are real HTTP servers on loopback.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use tocsin_testkit::{
    binary, free_port, wait_ready, Behavior, Receiver, ServiceProcess, TestPrefix,
};

const ADMIN_TOKEN: &str = "faults-admin-token-0123456789abcdef";
/// Attempts of the failing webhook's deliveries (all of them fail).
pub const FAILING_ATTEMPTS: u64 = 3;

/// How a webhook's deliveries must end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// `succeeded`, the receiver having answered 2xx.
    Succeeded,
    /// `failed` after exactly this many attempts.
    Failed { attempts: u64 },
}

/// A webhook to register: its name, receiver and retry settings, and how its deliveries end.
pub struct TargetSpec {
    pub name: &'static str,
    pub receiver: Receiver,
    pub max_attempts: u64,
    pub timeout_ms: u64,
    pub expect: Expect,
}

impl TargetSpec {
    pub fn succeeding(name: &'static str, receiver: Receiver, timeout_ms: u64) -> TargetSpec {
        TargetSpec {
            name,
            receiver,
            max_attempts: 5,
            timeout_ms,
            expect: Expect::Succeeded,
        }
    }
}

/// The webhooks of most scenarios: *healthy* (200 at once), *failing* (always 500) and *slow*
/// (200 after 400 ms). The first is always healthy: recovery is measured at its receiver.
pub async fn standard_targets() -> Vec<TargetSpec> {
    vec![
        TargetSpec::succeeding("healthy", Receiver::start().await, 2_000),
        TargetSpec {
            name: "failing",
            receiver: Receiver::start_with(Behavior::Status(500)).await,
            max_attempts: FAILING_ATTEMPTS,
            timeout_ms: 2_000,
            expect: Expect::Failed {
                attempts: FAILING_ATTEMPTS,
            },
        },
        TargetSpec::succeeding(
            "slow",
            Receiver::start_with(Behavior::Delay(Duration::from_millis(400), 200)).await,
            5_000,
        ),
    ]
}

/// A registered webhook.
pub struct Target {
    pub name: &'static str,
    pub receiver: Receiver,
    pub webhook: String,
    pub secret: String,
    pub expect: Expect,
}

/// One service process and the port it listens on.
struct Service {
    binary: &'static str,
    log: String,
    address_variable: &'static str,
    port: u16,
    process: Option<ServiceProcess>,
}

pub struct System {
    pub prefix: TestPrefix,
    logs: PathBuf,
    env: Vec<(&'static str, String)>,
    admin: Service,
    ingest: Service,
    dispatchers: Vec<Service>,
    pub token: String,
    pub targets: Vec<Target>,
    pub client: reqwest::Client,
}

impl System {
    /// Starts admin (it migrates the database and declares the topology) and registers the
    /// webhooks and an ingest token; [`System::start_workers`] starts ingest and the dispatchers.
    pub async fn start(
        scenario: &str,
        database_url: String,
        amqp_url: String,
        targets: Vec<TargetSpec>,
    ) -> System {
        let prefix = TestPrefix::new();
        let logs = std::env::temp_dir().join(format!("tocsin-faults-{scenario}-{}", prefix.prefix));
        std::fs::create_dir_all(&logs).unwrap();
        let env = vec![
            ("DATABASE_URL", database_url),
            ("AMQP_URL", amqp_url),
            ("TOCSIN_AMQP_PREFIX", prefix.prefix.clone()),
            ("TOCSIN_RETRY_DELAYS", "0s,300ms,600ms,1s,1s".into()),
            ("TOCSIN_ALLOWED_TARGETS", "127.0.0.0/8".into()),
            ("TOCSIN_SWEEP_INTERVAL", "1s".into()),
            ("TOCSIN_SWEEP_GRACE", "5s".into()),
            ("TOCSIN_SHUTDOWN_TIMEOUT", "5s".into()),
            ("TOCSIN_INGEST_RATE_LIMIT", "0".into()),
            ("TOCSIN_ADMIN_TOKEN", ADMIN_TOKEN.into()),
            ("TOCSIN_DB_POOL_SIZE", "8".into()),
            // Debug logs, so that the secrets check reads everything the services can say.
            (
                "RUST_LOG",
                "debug,h2=info,hyper=info,rustls=info,tokio_postgres=info,lapin=info,amq_protocol=info"
                    .into(),
            ),
        ];
        let service = |binary, log: &str, address_variable| Service {
            binary,
            log: log.to_owned(),
            address_variable,
            port: free_port(),
            process: None,
        };
        let mut system = System {
            prefix,
            logs,
            env,
            admin: service("tocsin-admin", "admin", "TOCSIN_ADMIN_ADDR"),
            ingest: service("tocsin-ingest", "ingest", "TOCSIN_INGEST_ADDR"),
            dispatchers: (0..2)
                .map(|i| {
                    service(
                        "tocsin-dispatcher",
                        &format!("dispatcher-{i}"),
                        "TOCSIN_DISPATCHER_ADDR",
                    )
                })
                .collect(),
            token: String::new(),
            targets: Vec::new(),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
        };
        let env = system.env.clone();
        spawn(&mut system.admin, &env, &system.logs).await;
        system.token = system
            .admin(
                reqwest::Method::POST,
                "/api/v1/tokens",
                Some(json!({"name": "faults"})),
            )
            .await["token"]
            .as_str()
            .unwrap()
            .to_owned();
        for spec in targets {
            let created = system
                .admin(
                    reqwest::Method::POST,
                    "/api/v1/webhooks",
                    Some(json!({
                        "name": spec.name,
                        "url": spec.receiver.url(&format!("/{}", spec.name)),
                        "events": ["incidents.opened"],
                        "retry": {"max_attempts": spec.max_attempts, "timeout_ms": spec.timeout_ms},
                    })),
                )
                .await;
            system.targets.push(Target {
                name: spec.name,
                receiver: spec.receiver,
                webhook: created["id"].as_str().unwrap().to_owned(),
                secret: created["secret"].as_str().unwrap().to_owned(),
                expect: spec.expect,
            });
        }
        system
    }

    /// Starts ingest and both dispatchers, with `amqp_url` as their `AMQP_URL` (`None`: the
    /// one admin got).
    pub async fn start_workers(&mut self, amqp_url: Option<&str>) {
        if let Some(url) = amqp_url {
            self.env.retain(|(name, _)| *name != "AMQP_URL");
            self.env.push(("AMQP_URL", url.to_owned()));
        }
        self.start_ingest().await;
        for i in 0..self.dispatchers.len() {
            self.start_dispatcher(i).await;
        }
    }

    pub async fn start_ingest(&mut self) {
        spawn(&mut self.ingest, &self.env, &self.logs).await;
    }

    pub async fn start_dispatcher(&mut self, i: usize) {
        spawn(&mut self.dispatchers[i], &self.env, &self.logs).await;
    }

    /// SIGKILLs ingest.
    pub fn kill_ingest(&mut self) {
        self.ingest.process.take().expect("ingest running").kill();
    }

    /// SIGKILLs dispatcher `i`.
    pub fn kill_dispatcher(&mut self, i: usize) {
        self.dispatchers[i]
            .process
            .take()
            .expect("the dispatcher running")
            .kill();
    }

    pub fn ingest_url(&self) -> String {
        format!(
            "http://127.0.0.1:{}/api/v1/webhooks/alerts",
            self.ingest.port
        )
    }

    /// An admin API call that must succeed; its JSON answer.
    pub async fn admin(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self
            .client
            .request(
                method,
                format!("http://127.0.0.1:{}{path}", self.admin.port),
            )
            .bearer_auth(ADMIN_TOKEN);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        assert!(status.is_success(), "{path}: {status} {text}");
        serde_json::from_str(&text).unwrap()
    }

    /// Every delivery of a webhook from the delivery log: id → (state, attempt_count). `None`
    /// while admin cannot answer (its database down or failing over).
    pub async fn deliveries(&self, webhook: &str) -> Option<HashMap<String, (String, u64)>> {
        let mut all = HashMap::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut url = format!(
                "http://127.0.0.1:{}/api/v1/deliveries?webhook_id={webhook}&limit=200",
                self.admin.port
            );
            if let Some(cursor) = &cursor {
                url.push_str(&format!("&cursor={cursor}"));
            }
            let response = self
                .client
                .get(url)
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .await
                .ok()?;
            if !response.status().is_success() {
                return None;
            }
            let page: Value = response.json().await.ok()?;
            for item in page["items"].as_array()? {
                all.insert(
                    item["id"].as_str()?.to_owned(),
                    (
                        item["state"].as_str()?.to_owned(),
                        item["attempt_count"].as_u64()?,
                    ),
                );
            }
            match page["next_cursor"].as_str() {
                Some(next) => cursor = Some(next.to_owned()),
                None => return Some(all),
            }
        }
    }

    /// How many times each worker connected to RabbitMQ, from its log.
    pub fn broker_connections(&self) -> Vec<(String, usize)> {
        std::iter::once(&self.ingest)
            .chain(&self.dispatchers)
            .map(|service| {
                let log = std::fs::read_to_string(self.logs.join(format!("{}.log", service.log)))
                    .unwrap_or_default();
                (
                    service.log.clone(),
                    log.matches("connected to RabbitMQ and declared the topology")
                        .count(),
                )
            })
            .collect()
    }

    /// No webhook secret, ingest token or admin token in any log or `/metrics`.
    pub async fn assert_no_secrets_leaked(&self) {
        let mut texts = Vec::new();
        for entry in std::fs::read_dir(&self.logs).unwrap().flatten() {
            texts.push((
                entry.path().display().to_string(),
                std::fs::read_to_string(entry.path()).unwrap_or_default(),
            ));
        }
        for service in self.services() {
            let metrics = format!("http://127.0.0.1:{}/metrics", service.port);
            if let Ok(response) = self.client.get(metrics).send().await {
                texts.push((
                    format!("/metrics of {}", service.log),
                    response.text().await.unwrap_or_default(),
                ));
            }
        }
        assert!(
            texts.iter().any(|(_, t)| t.contains("DEBUG")),
            "debug logs were captured"
        );
        let mut secrets = vec![
            self.token.clone(),
            self.token[4..].to_owned(),
            ADMIN_TOKEN.to_owned(),
        ];
        for target in &self.targets {
            secrets.push(target.secret.clone());
            // The key part too, in case it were printed without its prefix.
            secrets.push(target.secret.trim_start_matches("whsec_").to_owned());
        }
        for (source, text) in &texts {
            for secret in &secrets {
                assert!(
                    !text.contains(secret.as_str()),
                    "a secret appears in {source}"
                );
            }
        }
    }

    fn services(&self) -> impl Iterator<Item = &Service> {
        [&self.admin, &self.ingest]
            .into_iter()
            .chain(&self.dispatchers)
    }

    /// Kills every process and removes the logs.
    pub fn stop(mut self) {
        for service in std::iter::once(&mut self.admin)
            .chain(std::iter::once(&mut self.ingest))
            .chain(&mut self.dispatchers)
        {
            if let Some(process) = service.process.take() {
                process.kill();
            }
        }
        let _ = std::fs::remove_dir_all(&self.logs);
    }
}

/// Starts a service's binary with `env` and its address, its output appended to its log, and
/// waits until it is ready.
async fn spawn(service: &mut Service, env: &[(&'static str, String)], logs: &std::path::Path) {
    let mut env = env.to_vec();
    env.push((
        service.address_variable,
        format!("127.0.0.1:{}", service.port),
    ));
    service.process = Some(ServiceProcess::spawn_logged(
        &binary(service.binary),
        &env,
        Some(&logs.join(format!("{}.log", service.log))),
    ));
    wait_ready(service.port, Duration::from_secs(60)).await;
}
