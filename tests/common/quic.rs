//! The HTTP/3 tests' clients: aioquic fixtures in the tests' Python environment.

use std::net::SocketAddr;
use std::path::Path;

use serde_json::{json, Value};

use super::{crate_root, test_python};

/// Runs the aioquic client with `spec` (see `tests/fixtures/h3_client.py`) against `address`,
/// trusting `ca`: one result per connection.
pub async fn h3_client(address: SocketAddr, ca: &Path, spec: Value) -> Vec<Value> {
    let mut spec = spec;
    spec["host"] = json!(address.ip().to_string());
    spec["port"] = json!(address.port());
    spec["ca"] = json!(ca.display().to_string());
    spec["server_name"] = json!("localhost");
    let output = fixture("h3_client.py", &serde_json::to_vec(&spec).unwrap()).await;
    serde_json::from_str(&output).unwrap_or_else(|error| panic!("{error}: {output}"))
}

/// Runs a Python fixture with `input` on stdin; its standard output.
pub async fn fixture(name: &str, input: &[u8]) -> String {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(test_python())
        .arg(crate_root().join("tests/fixtures").join(name))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the tests' Python (scripts/test.sh makes it)");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input).await.unwrap();
    drop(stdin);
    let output = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        child.wait_with_output(),
    )
    .await
    .expect("the fixture ends")
    .unwrap();
    assert!(
        output.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}
