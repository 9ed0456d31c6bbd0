//! The deployment files under deploy/ (and the Dockerfile), checked without a container
//! engine: promtool on the Prometheus files, every YAML and JSON file parsed, metric names
//! against a live scrape, the shipped policies through `tollgate check`, and the Kubernetes
//! manifests against their schemas and against each other.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn files_under(folder: &str, extensions: &[&str]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![root().join(folder)];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|_| panic!("{}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path
                .extension()
                .is_some_and(|ext| extensions.iter().any(|e| ext == *e))
            {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

fn run(program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .current_dir(root())
        .output()
        .unwrap_or_else(|_| panic!("{program} on PATH (CI installs it; see .ci/run)"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{program} {args:?}:\n{text}");
    text
}

#[test]
fn prometheus_config_rules_and_rule_tests_pass_promtool() {
    run(
        "promtool",
        &["check", "config", "deploy/prometheus/prometheus.yml"],
    );
    let rules = run(
        "promtool",
        &["check", "rules", "deploy/prometheus/rules/tollgate.yml"],
    );
    assert!(rules.contains("SUCCESS: 6 rules found"), "{rules}");
    let tests = run(
        "promtool",
        &["test", "rules", "deploy/prometheus/tests/tollgate.test.yml"],
    );
    assert!(tests.contains("SUCCESS"), "{tests}");
}

#[test]
fn every_yaml_and_json_file_parses() {
    let yaml = files_under("deploy", &["yml", "yaml"]);
    assert!(yaml.len() >= 10, "{yaml:?}");
    for file in yaml {
        let text = std::fs::read_to_string(&file).unwrap();
        for document in serde_yaml::Deserializer::from_str(&text) {
            serde_yaml::Value::deserialize(document)
                .unwrap_or_else(|error| panic!("{}: {error}", file.display()));
        }
    }
    for file in files_under("deploy", &["json"]) {
        let text = std::fs::read_to_string(&file).unwrap();
        serde_json::from_str::<serde_json::Value>(&text)
            .unwrap_or_else(|error| panic!("{}: {error}", file.display()));
    }
}

use serde::Deserialize as _;

/// Every metric family a gateway exposes, from a live scrape of a policy that uses every
/// feature.
async fn live_metric_families() -> BTreeSet<String> {
    let upstream = start_upstream().await;
    // A route that reads a token brings the token rejections' series; a concurrency limit,
    // its slots in use; a delaying limit, its delays.
    std::env::set_var(
        "TOLLGATE_TEST_DEPLOY_JWT_SECRET",
        "deploy-test-secret-0123456789abcdef",
    );
    // TLS on the listener (its certificates' ends), plain HTTP beside it for the request.
    let dir = tempfile::tempdir().unwrap();
    let certificate = certificate(dir.path(), "server");
    let server = format!(
        "[server]\nlisten = [\"127.0.0.1:0\"]\nplain_listen = [\"127.0.0.1:0\"]\ntls = {{ cert = {:?}, key = {:?} }}\n",
        certificate.cert, certificate.key
    );
    let policy = r#"
[auth.jwt]
secret_env = "TOLLGATE_TEST_DEPLOY_JWT_SECRET"

[overload]
max_inflight = 100
factor = 0.5

[upstreams.app]
url = "http://{upstream}"

[limits.per_account]
key = { header = "x-user" }
capacity = 5
rate = "1/s"

[limits.per_account.ban]
after = 10
within = "1m"
duration = "10m"

[limits.per_account.adaptive]
on_status = [401]
threshold = 3
window = "60s"
factor = 0.5
hold = "60s"

[limits.per_subject]
key = { jwt_claim = "sub" }
capacity = 5
rate = "1/s"
on_limit = "delay"

[limits.exports]
key = { header = "x-user" }
concurrency = 2

[[routes]]
name = "api"
path_prefix = "/api"
upstream = "app"
limits = ["per_subject"]

[[routes]]
name = "exports"
path_prefix = "/exports"
upstream = "app"
limits = ["exports"]

[[routes]]
name = "default"
path_prefix = "/"
upstream = "app"
limits = [{ limit = "per_account", cost = 1, settle = "response_bytes", scale = 0.001 }]

[decision]
listen = "127.0.0.1:0"
"#;
    let gateway = start_gateway(&format!("{server}{policy}"), upstream.address).await;
    HttpClient::new(gateway.plain_addresses[0])
        .get("/", &[("x-user", "1")])
        .await;
    let text = String::from_utf8(
        HttpClient::new(gateway.admin_address)
            .get("/metrics", &[])
            .await
            .body
            .to_vec(),
    )
    .unwrap();
    text.lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metric_names_in_rules_and_dashboard_exist_in_a_live_scrape() {
    let families = live_metric_families().await;
    let name = regex_lite::Regex::new(r"tollgate_[a-z_]+").unwrap();
    let mut checked = 0;
    for file in [
        "deploy/prometheus/rules/tollgate.yml",
        "deploy/grafana/tollgate-dashboard.json",
        "README.md",
        "deploy/README.md",
        "docs/architecture.md",
        "docs/bots.md",
        "docs/certificates.md",
        "docs/configuration.md",
        "docs/decision.md",
        "docs/metrics.md",
        "docs/performance.md",
        "docs/redis-store.md",
        "docs/worked-example.md",
    ] {
        let text = std::fs::read_to_string(root().join(file)).unwrap();
        for found in name.find_iter(&text) {
            let metric = found.as_str();
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    metric
                        .strip_suffix(suffix)
                        .filter(|base| families.contains(*base))
                })
                .unwrap_or(metric);
            assert!(
                families.contains(family),
                "{file} uses {metric}, which tollgate does not expose: {families:?}"
            );
            checked += 1;
        }
    }
    assert!(checked > 30, "only {checked} metric references found");
}

/// `tollgate check` on a policy file, with the hashing secret a deployment provides.
fn check_policy(path: &Path) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check", "--config"])
        .arg(path)
        .env("TOLLGATE_HASH_KEY", "a deployment secret for the check")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{}: {}",
        path.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

fn yaml_documents(file: &str) -> Vec<serde_yaml::Value> {
    let text = std::fs::read_to_string(root().join(file)).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|document| serde_yaml::Value::deserialize(document).unwrap())
        .collect()
}

#[test]
fn the_image_policy_listens_where_probes_and_prometheus_reach_it() {
    let summary = check_policy(&root().join("deploy/container/tollgate.toml"));
    assert!(
        summary.contains("listen 0.0.0.0:8080   admin 0.0.0.0:9090"),
        "{summary}"
    );
    assert!(summary.contains("http://app:3000"), "{summary}");
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    assert!(dockerfile.contains("COPY deploy/container/tollgate.toml /etc/tollgate/tollgate.toml"));
}

#[test]
fn shipped_policies_pass_check() {
    let compose = check_policy(&root().join("deploy/compose/tollgate.toml"));
    assert!(compose.contains("store: redis"), "{compose}");
    let configmap = &yaml_documents("deploy/kubernetes/configmap.yaml")[0];
    let policy = configmap["data"]["tollgate.toml"]
        .as_str()
        .expect("tollgate.toml in the ConfigMap");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tollgate.toml");
    std::fs::write(&file, policy).unwrap();
    let summary = check_policy(&file);
    assert!(
        summary.contains("listen 0.0.0.0:8080   admin 0.0.0.0:9090"),
        "{summary}"
    );
}

#[test]
fn kubernetes_manifests_validate_and_agree() {
    let manifests = [
        "configmap.yaml",
        "deployment.yaml",
        "service.yaml",
        "pdb.yaml",
        "redis.yaml",
    ];
    let paths: Vec<String> = manifests
        .iter()
        .map(|file| format!("deploy/kubernetes/{file}"))
        .collect();
    let mut args = vec!["-m", "kubernetes_validate", "--strict"];
    args.extend(paths.iter().map(String::as_str));
    let report = run("python3", &args);
    assert_eq!(report.matches("passed").count(), 7, "{report}");

    let deployment = &yaml_documents("deploy/kubernetes/deployment.yaml")[0];
    let pod = &deployment["spec"]["template"];
    let labels = &pod["metadata"]["labels"];
    assert_eq!(&deployment["spec"]["selector"]["matchLabels"], labels);
    let container = &pod["spec"]["containers"][0];
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["port"], "admin");
    assert!(container["resources"]["requests"]["cpu"].is_string());
    assert!(container["resources"]["requests"]["memory"].is_string());
    let ports: BTreeSet<u64> = container["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|port| port["containerPort"].as_u64().unwrap())
        .collect();
    assert_eq!(
        ports,
        BTreeSet::from([8080, 9090]),
        "the ports the ConfigMap's policy listens on"
    );
    // The drain must fit: grace_period (30 s) + preStop pause < terminationGracePeriodSeconds.
    let grace = pod["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap();
    let pause = container["lifecycle"]["preStop"]["sleep"]["seconds"]
        .as_u64()
        .unwrap();
    assert!(30 + pause < grace, "grace {grace} s vs 30 s + {pause} s");
    assert_eq!(container["volumeMounts"][0]["mountPath"], "/etc/tollgate");
    assert!(
        container["volumeMounts"][0].get("subPath").is_none(),
        "subPath mounts never see ConfigMap updates"
    );
    assert_eq!(
        pod["spec"]["volumes"][0]["configMap"]["name"],
        yaml_documents("deploy/kubernetes/configmap.yaml")[0]["metadata"]["name"]
    );

    for service in yaml_documents("deploy/kubernetes/service.yaml") {
        assert_eq!(
            &service["spec"]["selector"]["app.kubernetes.io/name"],
            &labels["app.kubernetes.io/name"]
        );
    }
    let pdb = &yaml_documents("deploy/kubernetes/pdb.yaml")[0];
    assert_eq!(&pdb["spec"]["selector"]["matchLabels"], labels);
    let monitor = &yaml_documents("deploy/kubernetes/servicemonitor.yaml")[0];
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "admin");
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");
    let kustomization = &yaml_documents("deploy/kubernetes/kustomization.yaml")[0];
    let resources: Vec<&str> = kustomization["resources"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert_eq!(resources, manifests);
    // The Deployment's image can be set without editing it.
    let image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap();
    let overridden = kustomization["images"]
        .as_sequence()
        .expect("an images: override")
        .iter()
        .any(|entry| Some(entry["name"].as_str().unwrap_or_default()) == image.split(':').next());
    assert!(overridden, "kustomization images: names {image}");
}

#[test]
fn the_compose_stack_wires_three_replicas_redis_and_prometheus() {
    let compose = &yaml_documents("deploy/compose/docker-compose.yml")[0];
    let services = compose["services"].as_mapping().unwrap();
    for name in [
        "redis",
        "app",
        "tollgate-1",
        "tollgate-2",
        "tollgate-3",
        "loadbalancer",
        "prometheus",
        "grafana",
    ] {
        assert!(services.contains_key(name), "service {name}");
    }
    let nginx = std::fs::read_to_string(root().join("deploy/compose/nginx.conf")).unwrap();
    for replica in ["tollgate-1:8080", "tollgate-2:8080", "tollgate-3:8080"] {
        assert!(nginx.contains(replica), "nginx balances {replica}");
    }
    assert!(
        nginx.contains("$proxy_add_x_forwarded_for"),
        "one appended hop: trusted_hops = 1"
    );
    let policy = std::fs::read_to_string(root().join("deploy/compose/tollgate.toml")).unwrap();
    assert!(
        policy.contains("trusted_hops = 1") && policy.contains("url = \"redis://redis:6379/0\"")
    );
    let prometheus = &yaml_documents("deploy/prometheus/prometheus.yml")[0];
    let targets: Vec<&str> = prometheus["scrape_configs"][0]["static_configs"][0]["targets"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|target| target.as_str().unwrap())
        .collect();
    assert_eq!(
        targets,
        ["tollgate-1:9090", "tollgate-2:9090", "tollgate-3:9090"]
    );
    // Every file the compose file mounts exists.
    let text = std::fs::read_to_string(root().join("deploy/compose/docker-compose.yml")).unwrap();
    let mount = regex_lite::Regex::new(r"- (\.\.?/[^:]+):").unwrap();
    for captures in mount.captures_iter(&text) {
        let path = root().join("deploy/compose").join(&captures[1]);
        assert!(path.exists(), "{} is mounted but missing", path.display());
    }
}

#[test]
fn the_dockerfile_runs_the_documented_command_as_non_root() {
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    assert!(dockerfile.contains("FROM rust:"), "a build stage");
    assert!(dockerfile.contains("USER nonroot"));
    assert!(dockerfile.contains("EXPOSE 8080 9090"));
    assert!(dockerfile.contains(r#"CMD ["run", "--config", "/etc/tollgate/tollgate.toml"]"#));
    assert!(
        dockerfile.contains(r#"CMD ["/usr/local/bin/tollgate", "health"]"#),
        "HEALTHCHECK uses tollgate health, which reads the admin address from $TOLLGATE_CONFIG"
    );
    for copied in [
        "Cargo.toml",
        "Cargo.lock",
        "src",
        "examples",
        "deploy/container/tollgate.toml",
    ] {
        assert!(
            root().join(copied).exists(),
            "the Dockerfile copies {copied}"
        );
    }
    let ignore = std::fs::read_to_string(root().join(".dockerignore")).unwrap();
    assert!(ignore.lines().any(|line| line == "target"));
    // The dependency layer builds against placeholder sources: every explicit target needs one.
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    for bench in regex_lite::Regex::new(r#"\[\[bench\]\]\s*name = "([a-z_]+)""#)
        .unwrap()
        .captures_iter(&manifest)
    {
        assert!(
            dockerfile.contains(&format!("benches/{}.rs", &bench[1])),
            "the Dockerfile stubs benches/{}.rs",
            &bench[1]
        );
    }
    // The image's default policy is valid and listens where the Dockerfile says.
    let summary = check_policy(&root().join("config/tollgate.toml"));
    assert!(summary.contains("listen 0.0.0.0:8080"), "{summary}");
}
