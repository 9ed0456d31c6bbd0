//! `GET /ui` rendered by a real headless Chromium: after traffic the page shows the refused
//! key, the scan and the override; markup an operator or a client chose is shown as text and
//! never run; with a token set the page asks for it, and shows the data once given it.

mod common;

use bytes::Bytes;
use common::*;

const POLICY: &str = r#"
[client_ip]
trusted_hops = 1

[upstreams.app]
url = "http://{upstream}"

[limits.strict]
key = "client_network"
ipv4_prefix = 24
capacity = 1
rate = "1/h"

[[routes]]
name = "pages"
path_prefix = "/missing"
upstream = "app"

[[routes]]
name = "strict"
path_prefix = "/"
upstream = "app"
limits = ["strict"]

[scan]
key = "client_network"
ipv4_prefix = 24
distinct_paths = 3
within = "60s"
ban = "10m"
"#;

/// The page as Chromium leaves it once its calls are answered (`--dump-dom` after the load
/// and a budget of virtual time, which stands still while requests are pending).
async fn rendered(url: &str) -> String {
    let browser = chromium_binary();
    let profile = tempfile::tempdir().unwrap();
    let output = tokio::process::Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--virtual-time-budget=5000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(url)
        .output()
        .await
        .expect("run chromium");
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_who_is_refused_and_runs_nothing_it_shows() {
    let upstream = start_upstream().await;
    let gateway = start_gateway(POLICY, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    for _ in 0..5 {
        client.get("/a", &[("x-forwarded-for", "10.0.1.7")]).await;
    }
    for n in 0..3 {
        let path = format!("/missing/probe-{n}");
        let reply = client.get(&path, &[("x-forwarded-for", "10.0.2.7")]).await;
        assert_eq!(reply.status, 404);
    }
    let admin = HttpClient::new(gateway.admin_address);
    let markup =
        r#"<img src=x onerror="document.title='pwned'"><script>document.title='pwned'</script>"#;
    let change = serde_json::json!({"capacity": 50, "rate": "1/s", "reason": markup, "label": "<b>bold</b>"});
    let put = admin
        .send(
            "PUT",
            "/overrides/strict?key=10.0.3.7",
            &[("content-type", "application/json")],
            Bytes::from(change.to_string()),
        )
        .await;
    assert_eq!(put.status, 200, "{:?}", put.body);

    let page = admin.get("/ui", &[]).await;
    assert_eq!(page.status, 200);
    let policy = page.header("content-security-policy").unwrap();
    assert!(
        policy.starts_with("default-src 'none'; script-src 'sha256-"),
        "{policy}"
    );

    let dom = rendered(&format!("http://{}/ui", gateway.admin_address)).await;
    assert!(dom.contains(r#"data-state="ready""#), "{dom}");
    assert!(dom.contains("v4:10.0.1.0/24"), "the refused network: {dom}");
    assert!(
        dom.contains("v4:10.0.2.0/24"),
        "the scan and its ban: {dom}"
    );
    assert!(dom.contains("/missing/probe-0"), "a scanned path: {dom}");
    // The markup is in the page as text, escaped, and ran nothing.
    assert!(dom.contains("&lt;img src=x onerror="), "{dom}");
    assert!(dom.contains("&lt;b&gt;bold&lt;/b&gt;"), "{dom}");
    assert!(!dom.contains("<img"), "{dom}");
    assert!(dom.contains("<title>tollgate</title>"), "{dom}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_set_the_page_asks_for_it() {
    let upstream = start_upstream().await;
    std::env::set_var("TOLLGATE_UI_TEST_TOKEN", "ui-secret-token-0123456789");
    let policy = format!("[admin]\ntoken_env = \"TOLLGATE_UI_TEST_TOKEN\"\n{POLICY}");
    let gateway = start_gateway(&policy, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    for _ in 0..3 {
        client.get("/a", &[("x-forwarded-for", "10.0.1.7")]).await;
    }
    // The page itself is served without the token: it holds no data.
    let url = format!("http://{}/ui", gateway.admin_address);
    let asked = rendered(&url).await;
    assert!(asked.contains(r#"data-state="token""#), "{asked}");
    assert!(!asked.contains("v4:10.0.1.0/24"), "{asked}");
    let shown = rendered(&format!("{url}#token=ui-secret-token-0123456789")).await;
    assert!(shown.contains(r#"data-state="ready""#), "{shown}");
    assert!(shown.contains("v4:10.0.1.0/24"), "{shown}");
}
