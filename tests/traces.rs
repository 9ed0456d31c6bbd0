//! `[tracing]` against a real OTLP receiver (a Python gRPC and HTTP server built from the
//! `opentelemetry-proto` package, in the tests' virtual environment): span names, attributes
//! and parents, sampling, the context the upstream receives, a malformed `traceparent`, an
//! unreachable collector, the `OTEL_*` variables and the access log's `trace_id`.

#![allow(clippy::disallowed_methods)] // real processes, real time

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::redis_server::free_port;
use common::*;
use serde_json::Value;

/// The receiver, stopped by PID when dropped; every span it got, as JSON.
struct Receiver {
    process: Child,
    grpc: u16,
    http: u16,
    spans: Arc<Mutex<Vec<Value>>>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

impl Receiver {
    fn start() -> Receiver {
        let mut process = Command::new(test_python())
            .arg(crate_root().join("tests/fixtures/otlp_receiver.py"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the tests' python (scripts/test.sh installs opentelemetry-proto and grpcio)");
        let mut lines = BufReader::new(process.stdout.take().unwrap()).lines();
        let ready = lines.next().expect("the receiver starts").unwrap();
        let ports: Value = serde_json::from_str(&ready).unwrap_or_else(|_| panic!("{ready}"));
        let port = |transport: &str| ports[transport].as_u64().expect("a port") as u16;
        let (grpc, http) = (port("grpc"), port("http"));
        let spans = Arc::new(Mutex::new(Vec::new()));
        let received = spans.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                received
                    .lock()
                    .unwrap()
                    .push(serde_json::from_str(&line).unwrap());
            }
        });
        Receiver {
            process,
            grpc,
            http,
            spans,
        }
    }

    /// Waits until `count` spans have come (up to 20 s), and returns them all.
    async fn spans(&self, count: usize) -> Vec<Value> {
        for _ in 0..2000 {
            let spans = self.spans.lock().unwrap().clone();
            if spans.len() >= count {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("fewer than {count} spans: {:?}", self.spans.lock().unwrap());
    }
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|span| span["name"] == name).collect()
}

const SERVER: u64 = 2;
const CLIENT: u64 = 3;
const ERROR: u64 = 2;
const PARENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_SPAN: &str = "00f067aa0ba902b7";

fn policy(tracing: &str) -> String {
    format!(
        "{tracing}\n[upstreams.app]\nurl = \"http://{{upstream}}\"\n\
         [limits.login]\nkey = \"client_network\"\ncapacity = 1\nrate = \"1/h\"\n\
         [[routes]]\nname = \"login\"\npath = \"/login\"\nupstream = \"app\"\nlimits = [\"login\"]\n\
         [[routes]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"app\"\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_s_spans_carry_its_route_outcome_and_parents_over_grpc() {
    let receiver = Receiver::start();
    let upstream = start_upstream().await;
    let tracing = format!(
        "[tracing]\notlp_endpoint = \"http://127.0.0.1:{}\"\nsample_ratio = 1.0\nservice_name = \"shop-gateway\"\n",
        receiver.grpc
    );
    let gateway = start_gateway(&policy(&tracing), upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let traceparent = format!("00-{PARENT_TRACE}-{PARENT_SPAN}-01");
    let admitted = client
        .post(
            "/login",
            &[("traceparent", &traceparent), ("tracestate", "shop=1")],
            "",
        )
        .await;
    assert_eq!(admitted.status, 200);
    let refused = client.post("/login", &[], "").await;
    assert_eq!(refused.status, 429);
    // admitted: server + store + upstream; refused: server + store.
    let spans = receiver.spans(5).await;
    let servers = named(&spans, "POST login");
    assert_eq!(servers.len(), 2, "{spans:?}");
    let first = servers
        .iter()
        .find(|span| span["trace_id"] == PARENT_TRACE)
        .expect("the incoming trace is continued");
    assert_eq!(first["parent_span_id"], PARENT_SPAN);
    assert_eq!(first["kind"], SERVER);
    assert_eq!(first["service"], "shop-gateway");
    assert_eq!(first["transport"], "grpc");
    let attributes = &first["attributes"];
    assert_eq!(attributes["http.request.method"], "POST");
    assert_eq!(attributes["url.path"], "/login");
    assert_eq!(attributes["http.response.status_code"], 200);
    assert_eq!(attributes["client.address"], "127.0.0.1");
    assert_eq!(attributes["tollgate.route"], "login");
    assert_eq!(attributes["tollgate.outcome"], "allowed");
    assert_eq!(attributes["tollgate.limits"], "login");
    assert!(attributes.get("tollgate.refused_by").is_none());

    // The forward's CLIENT span is the server span's child, and what the upstream was given.
    let upstream_span = named(&spans, "upstream")[0];
    assert_eq!(upstream_span["kind"], CLIENT);
    assert_eq!(upstream_span["trace_id"], PARENT_TRACE);
    assert_eq!(upstream_span["parent_span_id"], first["span_id"]);
    assert_eq!(upstream_span["attributes"]["server.address"], "127.0.0.1");
    assert_eq!(
        upstream_span["attributes"]["server.port"],
        upstream.address.port()
    );
    let received = admitted.json();
    assert_eq!(
        received["headers"]["traceparent"],
        format!(
            "00-{PARENT_TRACE}-{}-01",
            upstream_span["span_id"].as_str().unwrap()
        )
    );
    assert_eq!(received["headers"]["tracestate"], "shop=1");
    let stores: Vec<&Value> = named(&spans, "tollgate.store");
    assert!(stores
        .iter()
        .any(|span| span["parent_span_id"] == first["span_id"]
            && span["attributes"]["tollgate.store.backend"] == "memory"));

    // The refused one: a new trace, named by the limit; a 429 is no error.
    let second = servers
        .iter()
        .find(|span| span["trace_id"] != PARENT_TRACE)
        .unwrap();
    assert_eq!(second["parent_span_id"], "");
    assert_eq!(second["attributes"]["tollgate.outcome"], "limited");
    assert_eq!(second["attributes"]["tollgate.refused_by"], "login");
    assert_eq!(second["attributes"]["http.response.status_code"], 429);
    assert_ne!(second["status"], ERROR);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_go_over_http_protobuf_and_a_5xx_is_an_error() {
    let receiver = Receiver::start();
    // An upstream that is not there: 502.
    let gone = free_port();
    let tracing = format!(
        "[tracing]\notlp_endpoint = \"http://127.0.0.1:{}\"\nprotocol = \"http/protobuf\"\n",
        receiver.http
    );
    let gateway = start_gateway(
        &policy(&tracing),
        std::net::SocketAddr::from(([127, 0, 0, 1], gone)),
    )
    .await;
    let answer = HttpClient::new(gateway.addresses[0])
        .get("/page", &[])
        .await;
    assert_eq!(answer.status, 502);
    let spans = receiver.spans(2).await;
    let server = named(&spans, "GET all")[0];
    assert_eq!(server["transport"], "http");
    assert_eq!(server["service"], "tollgate");
    assert_eq!(server["status"], ERROR);
    assert_eq!(named(&spans, "upstream")[0]["status"], ERROR);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ratio_of_zero_samples_no_new_trace_but_follows_a_sampled_parent() {
    let receiver = Receiver::start();
    let upstream = start_upstream().await;
    let tracing = format!(
        "[tracing]\notlp_endpoint = \"http://127.0.0.1:{}\"\nsample_ratio = 0.0\n",
        receiver.grpc
    );
    let gateway = start_gateway(&policy(&tracing), upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    // Not sampled: not exported, but the upstream still gets a context (not sampled).
    let unsampled = client.get("/a", &[]).await.json();
    let context = unsampled["headers"]["traceparent"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        context.starts_with("00-") && context.ends_with("-00"),
        "{context}"
    );
    let parent_unsampled = format!("00-{PARENT_TRACE}-{PARENT_SPAN}-00");
    let continued = client
        .get("/b", &[("traceparent", &parent_unsampled)])
        .await
        .json();
    let continued = continued["headers"]["traceparent"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(continued.starts_with(&format!("00-{PARENT_TRACE}-")) && continued.ends_with("-00"));
    // A malformed context starts a new trace; the request is served.
    let malformed = client.get("/c", &[("traceparent", "00-xyz-1-01")]).await;
    assert_eq!(malformed.status, 200);
    let fresh = malformed.json()["headers"]["traceparent"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(!fresh.contains("xyz"), "{fresh}");
    // A sampled parent is followed.
    let sampled = format!("00-{PARENT_TRACE}-{PARENT_SPAN}-01");
    client.get("/d", &[("traceparent", &sampled)]).await;
    let spans = receiver.spans(2).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let spans_now = receiver.spans(2).await;
    assert_eq!(spans.len(), spans_now.len());
    assert!(
        spans_now
            .iter()
            .all(|span| span["trace_id"] == PARENT_TRACE),
        "{spans_now:?}"
    );
    assert_eq!(
        named(&spans_now, "GET all")[0]["attributes"]["url.path"],
        "/d"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_collector_never_holds_a_request() {
    let upstream = start_upstream().await;
    let tracing = format!(
        "[tracing]\notlp_endpoint = \"http://127.0.0.1:{}\"\n",
        free_port()
    );
    let gateway = start_gateway(&policy(&tracing), upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    for _ in 0..50 {
        assert_eq!(client.get("/a", &[]).await.status, 200);
    }
    assert_eq!(
        metric(
            &gateway.render_metrics(),
            "tollgate_trace_spans_dropped_total"
        ),
        0.0,
        "150 spans fit the queue"
    );
    // Shutdown gives up on the collector within its bound.
    let began = std::time::Instant::now();
    gateway.shutdown().await;
    assert!(began.elapsed() < Duration::from_secs(20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_environment_turns_tracing_on_and_the_access_log_names_the_trace() {
    let receiver = Receiver::start();
    let upstream = start_upstream().await;
    let (listen, admin) = (free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tollgate.toml");
    let text = format!(
        "[server]\nlisten = [\"127.0.0.1:{listen}\"]\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n{}",
        policy("").replace("{upstream}", &upstream.address.to_string())
    );
    std::fs::write(&file, text).unwrap();
    let mut gateway = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args([
            "--log-format",
            "json",
            "run",
            "--config",
            file.to_str().unwrap(),
        ])
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{}", receiver.grpc),
        )
        .env("OTEL_SERVICE_NAME", "from-the-environment")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = BufReader::new(gateway.stderr.take().unwrap());
    let lines = Arc::new(Mutex::new(Vec::<Value>::new()));
    let logged = lines.clone();
    std::thread::spawn(move || {
        for line in log.lines().map_while(Result::ok) {
            if let Ok(line) = serde_json::from_str(&line) {
                logged.lock().unwrap().push(line);
            }
        }
    });
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], listen));
    eventually("the gateway listens", || {
        std::net::TcpStream::connect(address).is_ok()
    })
    .await;
    assert_eq!(HttpClient::new(address).get("/page", &[]).await.status, 200);
    let spans = receiver.spans(2).await;
    let server = named(&spans, "GET all")[0];
    assert_eq!(server["service"], "from-the-environment");
    eventually("the access log line", || {
        lines
            .lock()
            .unwrap()
            .iter()
            .any(|line| line["path"] == "/page")
    })
    .await;
    let line = lines
        .lock()
        .unwrap()
        .iter()
        .find(|line| line["path"] == "/page")
        .cloned()
        .unwrap();
    assert_eq!(line["trace_id"], server["trace_id"], "{line}");
    let _ = gateway.kill();
    let _ = gateway.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_get_server_spans_parented_by_the_asking_proxy() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

    let receiver = Receiver::start();
    let upstream = start_upstream().await;
    let text = format!(
        "[tracing]\notlp_endpoint = \"http://127.0.0.1:{}\"\nsample_ratio = 0.0\n\
         [decision]\nlisten = \"127.0.0.1:0\"\n\
         [[decision.descriptors]]\ndomain = \"edge\"\nentries = [\"remote_address\"]\nlimit = \"login\"\n{}",
        receiver.grpc,
        policy("")
    );
    let gateway = start_gateway(&text, upstream.address).await;
    let decision = gateway.decision_address.unwrap();
    // Forward-auth: the proxy's sampled context is followed (the ratio alone samples nothing).
    let forward_auth_parent = format!("00-{PARENT_TRACE}-{PARENT_SPAN}-01");
    let answer = HttpClient::new(decision)
        .get(
            "/decide",
            &[
                ("x-forwarded-method", "POST"),
                ("x-forwarded-uri", "/login"),
                ("x-forwarded-host", "shop.example"),
                ("x-forwarded-for", "203.0.113.9"),
                ("traceparent", &forward_auth_parent),
            ],
        )
        .await;
    assert_eq!(answer.status, 200);
    // gRPC: the context comes in the call's metadata.
    let grpc_trace = "0af7651916cd43dd8448eb211c80319c";
    let channel = tonic::transport::Channel::from_shared(format!("http://{decision}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut call = tonic::Request::new(RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "remote_address".to_owned(),
                value: "198.51.100.7".to_owned(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    });
    call.metadata_mut().insert(
        "traceparent",
        format!("00-{grpc_trace}-{PARENT_SPAN}-01").parse().unwrap(),
    );
    RateLimitServiceClient::new(channel)
        .should_rate_limit(call)
        .await
        .unwrap();
    let spans = receiver.spans(4).await;
    let forward_auth = named(&spans, "POST login")[0];
    assert_eq!(forward_auth["trace_id"], PARENT_TRACE);
    assert_eq!(forward_auth["parent_span_id"], PARENT_SPAN);
    assert_eq!(forward_auth["kind"], SERVER);
    let rls = named(&spans, "POST rls")[0];
    assert_eq!(rls["trace_id"], grpc_trace);
    assert_eq!(rls["parent_span_id"], PARENT_SPAN);
    assert_eq!(rls["attributes"]["tollgate.outcome"], "allowed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_never_answers_costs_dropped_spans_not_memory_or_time() {
    // It takes connections and never says a word.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_address = silent.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            held.push(stream);
        }
    });
    let upstream = start_upstream().await;
    let tracing = format!("[tracing]\notlp_endpoint = \"http://{silent_address}\"\n");
    let gateway = start_gateway(&policy(&tracing), upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    // Two spans a request (the server's and the upstream's; this route has no limit): past
    // the queue's 2048 while the first batch waits on the collector.
    for _ in 0..1500 {
        assert_eq!(client.get("/a", &[]).await.status, 200);
    }
    let dropped = metric(
        &gateway.render_metrics(),
        "tollgate_trace_spans_dropped_total",
    );
    assert!(dropped >= 1.0, "the queue is bounded: {dropped}");
}

/// SIGTERM sends what is queued before the process exits: spans still waiting for their
/// batch (sent every 5 s) reach the collector, though the process is gone right after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_sends_the_queued_spans_before_the_process_exits() {
    let receiver = Receiver::start();
    let upstream = start_upstream().await;
    let (listen, admin) = (free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tollgate.toml");
    let tracing = format!(
        "[tracing]\notlp_endpoint = \"http://127.0.0.1:{}\"\nsample_ratio = 1.0\n",
        receiver.grpc
    );
    let text = format!(
        "[server]\nlisten = [\"127.0.0.1:{listen}\"]\ngrace_period = \"10s\"\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n{}",
        policy(&tracing).replace("{upstream}", &upstream.address.to_string())
    );
    std::fs::write(&file, text).unwrap();
    let mut gateway = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["run", "--config", file.to_str().unwrap()])
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], listen));
    eventually("the gateway listens", || {
        std::net::TcpStream::connect(address).is_ok()
    })
    .await;
    let client = HttpClient::new(address);
    for path in ["/one", "/two", "/three"] {
        assert_eq!(client.get(path, &[]).await.status, 200);
    }
    drop(client);
    let terminated = Command::new("kill")
        .args(["-TERM", &gateway.id().to_string()])
        .status()
        .unwrap();
    assert!(terminated.success());
    let exited = tokio::task::spawn_blocking(move || gateway.wait())
        .await
        .unwrap();
    assert!(exited.unwrap().success(), "a clean exit");
    // Three SERVER spans and their upstream children, all sent before the exit.
    let spans = receiver.spans(6).await;
    let paths: Vec<&str> = named(&spans, "GET all")
        .iter()
        .filter_map(|span| span["attributes"]["url.path"].as_str())
        .collect();
    for path in ["/one", "/two", "/three"] {
        assert!(paths.contains(&path), "{path}: {paths:?}");
    }
}
