//! The official `openai` Python client (from PyPI, in the virtual environment the test script
//! makes) against the README's policy for an OpenAI-compatible API: chat completions plain
//! and streamed, the organisation's bucket charged by `usage.total_tokens`, and
//! `openai.RateLimitError` with `Retry-After` once a response leaves a debt.

mod common;

use std::process::Command;

use common::llm::start_llm_upstream;
use common::*;
use tollgate::limit::Clock;

/// The README's policy for an LLM API: the TOML block of "Costs settled after the response".
fn readme_policy() -> String {
    let readme = std::fs::read_to_string(crate_root().join("README.md")).expect("README.md");
    let section = readme
        .split("\n## Costs settled after the response\n")
        .nth(1)
        .expect("the README's settled costs section");
    let block = section
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a toml block in the section");
    block.to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_client_is_charged_its_usage_and_told_to_wait() {
    let upstream = start_llm_upstream().await;
    let policy = readme_policy().replace("127.0.0.1:8000", "{upstream}");
    assert!(policy.contains("{upstream}"), "{policy}");
    let gateway = start_gateway_with_clock(&policy, upstream.address, Some(Clock::manual())).await;
    let base_url = format!("http://{}/v1", gateway.addresses[0]);
    let script = crate_root().join("tests/fixtures/openai_client.py");
    let python = test_python();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(&python)
            .arg(script)
            .arg(base_url)
            .output()
            .unwrap_or_else(|error| {
                panic!(
                    "{} with the openai package (scripts/test.sh makes it): {error}",
                    python.display()
                )
            })
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let seen: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(seen["plain_usage"], 120);
    assert_eq!(seen["plain_content"], "Hello there.");
    assert_eq!(
        seen["plain_remaining"], "39500",
        "the reservation of max_tokens"
    );
    assert_eq!(seen["stream_text"], "Hello there.");
    assert_eq!(seen["stream_usage"], 30);
    assert_eq!(seen["after_remaining"], "39840", "40000 - 120 - 30 - 10");
    assert_eq!(seen["refused"], true, "{seen}");
    assert_eq!(seen["status"], 429);
    // A debt of 40000 and a reservation of 10 at 40000/min: 60.015 s.
    assert_eq!(seen["retry_after"], "61");

    let scrape = gateway.render_metrics();
    let series = |limit: &str, direction: &str| {
        metric(
            &scrape,
            &format!(
                r#"tollgate_settled_cost_total{{direction="{direction}",limit="{limit}",route="chat"}}"#
            ),
        )
    };
    assert_eq!(series("org_tokens", "refund"), 380.0 + 470.0);
    assert_eq!(series("org_tokens", "charge"), 99_990.0);
    assert_eq!(series("org_monthly_tokens", "charge"), 99_990.0);
    gateway.shutdown().await;
}
