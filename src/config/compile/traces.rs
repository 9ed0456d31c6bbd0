//! `[tracing]`, with the standard `OTEL_*` variables filling what the file leaves out (the file
//! wins where both set a value).

use super::Errors;
use crate::config::raw::RawTracing;
use crate::config::{OtlpProtocol, TraceSettings};

/// The environment as `compile_tracing` reads it: a variable's value, if set.
pub(crate) type Environment<'e> = &'e dyn Fn(&str) -> Option<String>;

pub(super) fn compile_tracing(
    raw: Option<RawTracing>,
    env: Environment<'_>,
    errors: &mut Errors<'_>,
) -> Option<TraceSettings> {
    let base_from_env = env("OTEL_EXPORTER_OTLP_ENDPOINT").filter(|value| !value.is_empty());
    if raw.is_none() && base_from_env.is_none() {
        return None;
    }
    let raw = raw.unwrap_or_default();
    let protocol = match raw.protocol.or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL")) {
        None => OtlpProtocol::Grpc,
        Some(protocol) => match protocol.as_str() {
            "grpc" => OtlpProtocol::Grpc,
            "http/protobuf" => OtlpProtocol::HttpProtobuf,
            other => {
                errors.at(
                    None,
                    "tracing.protocol",
                    format!("{other:?} (or OTEL_EXPORTER_OTLP_PROTOCOL): expected \"grpc\" or \"http/protobuf\""),
                );
                OtlpProtocol::Grpc
            }
        },
    };
    // A traces endpoint is used as it is; a base endpoint gets the signal's path over HTTP.
    let signal_path = match protocol {
        OtlpProtocol::Grpc => "",
        OtlpProtocol::HttpProtobuf => "/v1/traces",
    };
    let endpoint = match raw.otlp_endpoint {
        Some(endpoint) => with_path(&endpoint, signal_path),
        None => match env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").filter(|value| !value.is_empty()) {
            Some(endpoint) => endpoint,
            None => match base_from_env {
                Some(base) => with_path(&base, signal_path),
                None => match protocol {
                    OtlpProtocol::Grpc => "http://localhost:4317".to_owned(),
                    OtlpProtocol::HttpProtobuf => "http://localhost:4318/v1/traces".to_owned(),
                },
            },
        },
    };
    match endpoint.parse::<http::Uri>() {
        Ok(uri) if uri.scheme_str() == Some("http") && uri.host().is_some() => {}
        Ok(uri) if uri.scheme_str() == Some("https") => errors.at(
            None,
            "tracing.otlp_endpoint",
            format!("{endpoint:?}: spans are exported over plain http:// only; run the collector (or its agent) beside tollgate"),
        ),
        _ => errors.at(
            None,
            "tracing.otlp_endpoint",
            format!("{endpoint:?}: expected a URL such as \"http://127.0.0.1:4317\""),
        ),
    }
    let sample_ratio = match raw.sample_ratio {
        Some(ratio) => Some(ratio),
        None => match env("OTEL_TRACES_SAMPLER_ARG") {
            Some(text) => match text.trim().parse::<f64>() {
                Ok(ratio) => Some(ratio),
                Err(_) => {
                    errors.at(
                        None,
                        "tracing.sample_ratio",
                        format!("OTEL_TRACES_SAMPLER_ARG={text:?}: expected a number from 0 to 1"),
                    );
                    None
                }
            },
            None => None,
        },
    }
    .unwrap_or(1.0);
    if !(0.0..=1.0).contains(&sample_ratio) {
        errors.at(
            None,
            "tracing.sample_ratio",
            format!("{sample_ratio}: expected a share from 0 (none) to 1 (every new trace)"),
        );
    }
    let service_name = raw
        .service_name
        .or_else(|| env("OTEL_SERVICE_NAME"))
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "tollgate".to_owned());
    Some(TraceSettings {
        endpoint,
        protocol,
        sample_ratio,
        service_name,
    })
}

fn with_path(base: &str, path: &str) -> String {
    if path.is_empty() || base.trim_end_matches('/').ends_with(path) {
        return base.to_owned();
    }
    format!("{}{path}", base.trim_end_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::compile::compile_with_environment;
    use crate::config::{ConfigErrors, Policy};

    const ROUTES: &str = "[upstreams.app]\nurl = \"http://127.0.0.1:3000\"\n[[routes]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"app\"\n";

    fn compile(text: &str, variables: &[(&str, &str)]) -> Result<Policy, ConfigErrors> {
        let env = |name: &str| {
            variables
                .iter()
                .find(|(variable, _)| *variable == name)
                .map(|(_, value)| (*value).to_owned())
        };
        compile_with_environment("test.toml", &format!("{ROUTES}{text}"), None, &env)
    }

    fn tracing(text: &str, variables: &[(&str, &str)]) -> Option<TraceSettings> {
        compile(text, variables).unwrap().tracing
    }

    #[test]
    fn off_without_the_table_or_an_endpoint_in_the_environment() {
        assert_eq!(tracing("", &[]), None);
        assert_eq!(tracing("", &[("OTEL_SERVICE_NAME", "shop")]), None);
    }

    #[test]
    fn the_file_wins_and_the_environment_fills_the_rest() {
        let settings = tracing(
            "[tracing]\notlp_endpoint = \"http://collector:4318\"\nprotocol = \"http/protobuf\"\n",
            &[
                ("OTEL_SERVICE_NAME", "shop-gateway"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ],
        )
        .unwrap();
        assert_eq!(settings.endpoint, "http://collector:4318/v1/traces");
        assert_eq!(settings.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(settings.sample_ratio, 0.25);
        assert_eq!(settings.service_name, "shop-gateway");
        let from_env = tracing(
            "",
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://10.0.0.1:4317"),
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://10.0.0.2:4317"),
            ],
        )
        .unwrap();
        assert_eq!(from_env.endpoint, "http://10.0.0.2:4317");
        assert_eq!(from_env.protocol, OtlpProtocol::Grpc);
        assert_eq!(from_env.sample_ratio, 1.0);
        assert_eq!(from_env.service_name, "tollgate");
    }

    #[test]
    fn bad_values_are_errors_naming_where_they_came_from() {
        for (text, variables, expected) in [
            (
                "[tracing]\nsample_ratio = 1.5\n",
                &[][..],
                "expected a share from 0",
            ),
            (
                "[tracing]\nprotocol = \"thrift\"\n",
                &[][..],
                "expected \"grpc\" or \"http/protobuf\"",
            ),
            (
                "[tracing]\notlp_endpoint = \"https://c:4317\"\n",
                &[][..],
                "plain http:// only",
            ),
            (
                "[tracing]\notlp_endpoint = \"collector\"\n",
                &[][..],
                "expected a URL",
            ),
            (
                "[tracing]\n",
                &[("OTEL_TRACES_SAMPLER_ARG", "half")][..],
                "OTEL_TRACES_SAMPLER_ARG=\"half\"",
            ),
        ] {
            let errors = compile(text, variables).unwrap_err().to_string();
            assert!(errors.contains(expected), "{text}: {errors}");
        }
    }
}
