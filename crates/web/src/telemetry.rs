//! Logging, and traces over OpenTelemetry (OTLP over HTTP), off unless an endpoint is set.
//!
//! [`init`] starts logging (`RUST_LOG`, in the format `TOCSIN_LOG_FORMAT` asks for). With
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) set, it adds a second layer
//! that turns Tocsin's spans into OpenTelemetry spans, exported in batches from a thread of
//! their own (`OTEL_BSP_*` tune the batches, `OTEL_TRACES_SAMPLER` samples, as the OpenTelemetry
//! SDK reads them). That layer has its own filter: it takes Tocsin's spans down to `debug` level,
//! whatever `RUST_LOG` says (the per-request stages are `debug` spans), and `info` and louder
//! events inside them; the log output still follows `RUST_LOG` alone. The dispatcher's periodic
//! passes (the sweeper, the waiting pass) are left out: they would make a trace every second.
//!
//! Without an endpoint, logging is set up exactly as before and nothing here costs anything:
//! [`enabled`] is false, and no trace context is read or written.
//!
//! Trace context crosses processes as W3C Trace Context (`traceparent`, `tracestate`):
//! [`inject_current`] writes the current span's into a message's headers (the outbox row's,
//! a retry's), and [`RemoteParent`] reads one back for the span that handles the message.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use opentelemetry::propagation::{Injector, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing::level_filters::LevelFilter;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Installs the logging subscriber alone (`RUST_LOG`, default `info`). Safe to call more than
/// once.
pub fn init_logging(format: LogFormat) {
    let builder = tracing_subscriber::fmt().with_env_filter(log_filter());
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// The log filter: `RUST_LOG`, or `info` when it is missing or invalid.
fn log_filter() -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
}

/// The base URL of an OTLP receiver; traces go to its `/v1/traces`.
pub const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// The full URL traces go to; wins over [`ENDPOINT`].
pub const TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
/// `http/protobuf` (the default) or `http/json`.
pub const PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
/// Like [`PROTOCOL`], for traces only; wins over it.
pub const TRACES_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL";
/// Overrides the binary's name as `service.name`.
pub const SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
/// `true` turns traces off whatever the endpoint.
pub const SDK_DISABLED: &str = "OTEL_SDK_DISABLED";

/// Set once the exporting layer is installed.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether this process exports traces. When it does not, [`inject_current`] and
/// [`RemoteParent::from_headers`] return at once.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// How an OTLP request is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `http/protobuf`: `application/x-protobuf` bodies (the default).
    HttpProtobuf,
    /// `http/json`: `application/json` bodies.
    HttpJson,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::HttpProtobuf => "http/protobuf",
            Protocol::HttpJson => "http/json",
        }
    }
}

/// Where and how traces are exported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Export {
    /// The full URL of the traces endpoint (`…/v1/traces`).
    pub endpoint: String,
    pub protocol: Protocol,
}

impl Export {
    /// Reads the settings from the environment: `None` when no endpoint is set, or
    /// `OTEL_SDK_DISABLED` is `true` (traces off); an error naming the variable for a protocol
    /// other than the two HTTP ones, or an endpoint that is not an `http` or `https` URL.
    pub fn from_env() -> anyhow::Result<Option<Export>> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`Export::from_env`] over any source of variables. As the OpenTelemetry specification
    /// says, an empty variable counts as unset.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> anyhow::Result<Option<Export>> {
        let get = |name: &str| {
            var(name)
                .map(|value| value.trim().to_owned())
                .filter(|value| !value.is_empty())
                .map(|value| (name.to_owned(), value))
        };
        if get(SDK_DISABLED).is_some_and(|(_, value)| value.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let endpoint = if let Some((name, url)) = get(TRACES_ENDPOINT) {
            check_url(&name, &url)?;
            url
        } else if let Some((name, base)) = get(ENDPOINT) {
            check_url(&name, &base)?;
            // The specification's rule for the HTTP protocols: the signal's path is appended.
            format!("{}/v1/traces", base.trim_end_matches('/'))
        } else {
            return Ok(None);
        };
        let protocol = match get(TRACES_PROTOCOL).or_else(|| get(PROTOCOL)) {
            None => Protocol::HttpProtobuf,
            Some((_, value)) if value == "http/protobuf" => Protocol::HttpProtobuf,
            Some((_, value)) if value == "http/json" => Protocol::HttpJson,
            Some((name, value)) => anyhow::bail!(
                "{name}: {value:?} is not supported; use http/protobuf (the default) or http/json"
            ),
        };
        Ok(Some(Export { endpoint, protocol }))
    }
}

fn check_url(name: &str, url: &str) -> anyhow::Result<()> {
    let scheme_ok = ["http://", "https://"].iter().any(|scheme| {
        url.get(..scheme.len())
            .is_some_and(|start| start.eq_ignore_ascii_case(scheme))
    });
    anyhow::ensure!(
        scheme_ok && url.len() > "https://".len(),
        "{name}: {:?} is not an http:// or https:// URL",
        tocsin_domain::redact_url(url)
    );
    Ok(())
}

/// The tracer provider of a process that exports traces; [`Telemetry::shutdown`] exports what
/// is still queued.
#[derive(Default)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Exports the spans still queued and stops the exporter (bounded by the SDK: 5 s).
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else {
            return;
        };
        ENABLED.store(false, Ordering::Relaxed);
        // Blocking: it waits for the export thread.
        match tokio::task::spawn_blocking(move || provider.shutdown()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => eprintln!("flushing traces at stop failed: {error}"),
            Err(error) => eprintln!("flushing traces at stop failed: {error}"),
        }
    }
}

/// Starts logging in `format` (`RUST_LOG`, default `info`) and, when an OTLP endpoint is set,
/// the export of traces as `service` (the binary's name, unless `OTEL_SERVICE_NAME` is set).
/// Fails on unusable OpenTelemetry settings. If a subscriber is installed already (tests), it
/// stays, and nothing is exported.
pub fn init(format: LogFormat, service: &str) -> anyhow::Result<Telemetry> {
    let Some(export) = Export::from_env()? else {
        init_logging(format);
        return Ok(Telemetry::default());
    };
    let provider = provider(&export, service)?;
    let otel = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("tocsin"))
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        // Tocsin's context travels in its tracing spans; nothing reads OpenTelemetry's current
        // context, so entering a span need not set it.
        .with_context_activation(false)
        .with_filter(
            tracing_subscriber::filter::filter_fn(exported).with_max_level_hint(LevelFilter::DEBUG),
        );
    let fmt: Box<dyn Layer<Registry> + Send + Sync> = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer().boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .boxed(),
    };
    let installed = tracing_subscriber::registry()
        .with(fmt.with_filter(log_filter()))
        .with(otel)
        .try_init();
    if installed.is_err() {
        let _ = provider.shutdown();
        return Ok(Telemetry::default());
    }
    ENABLED.store(true, Ordering::Relaxed);
    tracing::info!(
        endpoint = %tocsin_domain::redact_url(&export.endpoint),
        protocol = export.protocol.as_str(),
        "exporting traces"
    );
    Ok(Telemetry {
        provider: Some(provider),
    })
}

fn provider(export: &Export, service: &str) -> anyhow::Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(export.endpoint.clone())
        .with_protocol(match export.protocol {
            Protocol::HttpProtobuf => opentelemetry_otlp::Protocol::HttpBinary,
            Protocol::HttpJson => opentelemetry_otlp::Protocol::HttpJson,
        })
        .build()
        .context("OpenTelemetry: the OTLP trace exporter cannot be built")?;
    let name = std::env::var(SERVICE_NAME)
        .ok()
        .filter(|name| !name.trim().is_empty())
        .unwrap_or_else(|| service.to_owned());
    let resource = Resource::builder()
        .with_service_name(name)
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

/// Modules whose spans are not exported: periodic passes that would start a trace each time.
const NOT_EXPORTED: &[&str] = &["tocsin_dispatcher::sweeper", "tocsin_dispatcher::waiting"];

/// What the exporting layer takes: Tocsin's spans down to `debug`, and `info` and louder events
/// (recorded on the span they happen in) but the OpenTelemetry SDK's own, which go to the log
/// only (an export failure must not feed the export).
fn exported(metadata: &tracing::Metadata<'_>) -> bool {
    let target = metadata.target();
    if metadata.is_span() {
        *metadata.level() <= tracing::Level::DEBUG
            && target.starts_with("tocsin_")
            && !NOT_EXPORTED.iter().any(|module| target.starts_with(module))
    } else {
        *metadata.level() <= tracing::Level::INFO && !target.starts_with("opentelemetry")
    }
}

struct Put<F>(F);

impl<F: FnMut(&str, String)> Injector for Put<F> {
    fn set(&mut self, key: &str, value: String) {
        if !value.is_empty() {
            (self.0)(key, value);
        }
    }
}

/// Calls `put` with each header of the current span's trace context (`traceparent`, and
/// `tracestate` when it is not empty) when traces are exported and a span is current;
/// otherwise does nothing.
pub fn inject_current(put: impl FnMut(&str, String)) {
    if !enabled() {
        return;
    }
    let context = tracing::Span::current().context();
    if !context.span().span_context().is_valid() {
        return;
    }
    TraceContextPropagator::new().inject_context(&context, &mut Put(put));
}

/// The current span's trace context as a JSON object of headers (an outbox row's), or `None`
/// when traces are not exported or no span is current.
pub fn current_headers() -> Option<serde_json::Value> {
    let mut headers = serde_json::Map::new();
    inject_current(|name, value| {
        headers.insert(name.to_owned(), serde_json::Value::String(value));
    });
    (!headers.is_empty()).then_some(serde_json::Value::Object(headers))
}

/// The trace context a request or message came with, for the span that handles it.
#[derive(Debug, Default)]
pub struct RemoteParent(Option<opentelemetry::Context>);

impl RemoteParent {
    /// Reads the trace context from headers (`get` answers a header's value by name). Empty
    /// when traces are not exported, or the headers hold no valid context.
    pub fn from_headers(get: impl Fn(&str) -> Option<String>) -> RemoteParent {
        if !enabled() {
            return RemoteParent(None);
        }
        let propagator = TraceContextPropagator::new();
        let found: HashMap<String, String> = propagator
            .fields()
            .filter_map(|name| Some((name.to_owned(), get(name)?)))
            .collect();
        if found.is_empty() {
            return RemoteParent(None);
        }
        let context = propagator.extract(&found);
        let valid = context.span().span_context().is_valid();
        RemoteParent(valid.then_some(context))
    }

    pub fn is_some(&self) -> bool {
        self.0.is_some()
    }

    /// Makes `span` a child of this context: call it before the span is first entered (the
    /// exporting layer starts a span then, and its parent is fixed from that moment).
    pub fn adopt_by(self, span: &tracing::Span) {
        if let Some(context) = self.0 {
            let _ = span.set_parent(context);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn export(pairs: &[(&str, &str)]) -> anyhow::Result<Option<Export>> {
        Export::from_vars(vars(pairs))
    }

    #[test]
    fn no_endpoint_means_no_export() {
        assert_eq!(export(&[]).unwrap(), None);
        assert_eq!(export(&[(PROTOCOL, "http/json")]).unwrap(), None);
        assert_eq!(
            export(&[(ENDPOINT, ""), (TRACES_ENDPOINT, " ")]).unwrap(),
            None
        );
    }

    #[test]
    fn the_sdk_can_be_disabled_whatever_the_endpoint() {
        let with =
            |disabled: &str| export(&[(ENDPOINT, "http://c:4318"), (SDK_DISABLED, disabled)]);
        assert_eq!(with("true").unwrap(), None);
        assert_eq!(with("TRUE").unwrap(), None);
        assert!(with("false").unwrap().is_some());
    }

    #[test]
    fn the_base_endpoint_gets_the_traces_path_and_protobuf_is_the_default() {
        for base in ["http://collector:4318", "http://collector:4318/"] {
            assert_eq!(
                export(&[(ENDPOINT, base)]).unwrap(),
                Some(Export {
                    endpoint: "http://collector:4318/v1/traces".into(),
                    protocol: Protocol::HttpProtobuf,
                })
            );
        }
        assert_eq!(
            export(&[(ENDPOINT, "https://otel.example/prefix")])
                .unwrap()
                .unwrap()
                .endpoint,
            "https://otel.example/prefix/v1/traces"
        );
    }

    #[test]
    fn the_traces_endpoint_is_used_as_given_and_wins() {
        let settings = export(&[
            (ENDPOINT, "http://base:4318"),
            (TRACES_ENDPOINT, "http://traces:9999/custom"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(settings.endpoint, "http://traces:9999/custom");
    }

    #[test]
    fn both_http_protocols_are_accepted_and_others_refused_naming_the_variable() {
        let with = |protocol: &str| export(&[(ENDPOINT, "http://c:4318"), (PROTOCOL, protocol)]);
        assert_eq!(
            with("http/json").unwrap().unwrap().protocol,
            Protocol::HttpJson
        );
        assert_eq!(
            with("http/protobuf").unwrap().unwrap().protocol,
            Protocol::HttpProtobuf
        );
        for bad in ["grpc", "json", "HTTP/JSON "] {
            let error = with(bad).unwrap_err().to_string();
            assert!(error.starts_with(PROTOCOL), "{bad}: {error}");
            assert!(error.contains("http/protobuf"), "{bad}: {error}");
        }
        let error = export(&[
            (ENDPOINT, "http://c:4318"),
            (PROTOCOL, "http/json"),
            (TRACES_PROTOCOL, "grpc"),
        ])
        .unwrap_err()
        .to_string();
        assert!(error.starts_with(TRACES_PROTOCOL), "{error}");
    }

    #[test]
    fn an_endpoint_must_be_an_http_url_and_its_password_is_not_printed() {
        for bad in ["collector:4318", "grpc://c:4317", "http://"] {
            let error = export(&[(ENDPOINT, bad)]).unwrap_err().to_string();
            assert!(error.starts_with(ENDPOINT), "{bad}: {error}");
        }
        let error = export(&[(TRACES_ENDPOINT, "ftp://user:s3cret@c/v1/traces")])
            .unwrap_err()
            .to_string();
        assert!(error.starts_with(TRACES_ENDPOINT), "{error}");
        assert!(!error.contains("s3cret"), "{error}");
    }

    #[test]
    fn nothing_is_read_or_written_while_traces_are_off() {
        assert!(!enabled());
        assert_eq!(current_headers(), None);
        let parent = RemoteParent::from_headers(|_| {
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned())
        });
        assert!(!parent.is_some());
    }

    #[test]
    fn only_tocsin_spans_are_exported_and_periodic_passes_are_not() {
        use tracing::callsite::Callsite;
        // Metadata of real callsites, with their own targets and levels.
        macro_rules! span_meta {
            ($target:expr, $level:expr) => {{
                static CALLSITE: tracing::callsite::DefaultCallsite =
                    tracing::callsite::DefaultCallsite::new(&META);
                static META: tracing::Metadata<'static> = tracing::Metadata::new(
                    "test",
                    $target,
                    $level,
                    None,
                    None,
                    None,
                    tracing::field::FieldSet::new(&[], tracing::callsite::Identifier(&CALLSITE)),
                    tracing::metadata::Kind::SPAN,
                );
                CALLSITE.metadata()
            }};
        }
        assert!(exported(span_meta!(
            "tocsin_dispatcher::deliver",
            tracing::Level::DEBUG
        )));
        assert!(exported(span_meta!(
            "tocsin_ingest::routes",
            tracing::Level::DEBUG
        )));
        assert!(exported(span_meta!(
            "tocsin_admin::routes::webhooks",
            tracing::Level::INFO
        )));
        assert!(!exported(span_meta!(
            "tocsin_dispatcher::deliver",
            tracing::Level::TRACE
        )));
        assert!(!exported(span_meta!(
            "tocsin_dispatcher::sweeper",
            tracing::Level::INFO
        )));
        assert!(!exported(span_meta!(
            "tocsin_dispatcher::waiting",
            tracing::Level::INFO
        )));
        assert!(!exported(span_meta!("hyper::proto", tracing::Level::INFO)));
    }
}
