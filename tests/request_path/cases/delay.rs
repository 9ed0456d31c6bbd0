//! Delay instead of refuse (`on_limit = "delay"`), on the memory store with a stopped clock
//! (nothing refills, so every decision is exact): a burst beyond capacity is held and then
//! forwarded in booking order, what would wait longer than `max_delay` is refused, and a
//! client that leaves while held gives its tokens back.

use std::time::Duration;

use tokio::io::AsyncWriteExt;

use super::HTTP1;
use crate::common::*;
use tollgate::limit::Clock;

// Two tokens a second, and up to a second of waiting: two tokens of debt.
const POLICY: &str = r#"
[upstreams.app]
url = "http://{upstream}"

[limits.smooth]
key = { header = "x-user" }
capacity = 2
rate = "2/s"
on_limit = "delay"
max_delay = "1s"

[[routes]]
name = "api"
path_prefix = "/"
upstream = "app"
limits = ["smooth"]
"#;

const DELAYED: &str = r#"tollgate_delayed_total{limit="smooth",route="api"}"#;

async fn start() -> (Upstream, tollgate::Tollgate) {
    let upstream = start_upstream().await;
    let clock = Clock::manual_at(1_796_212_800);
    let gateway = start_gateway_with_clock_on(HTTP1, POLICY, upstream.address, Some(clock)).await;
    (upstream, gateway)
}

async fn until_delayed(gateway: &tollgate::Tollgate, count: f64) {
    eventually(&format!("{DELAYED} reaches {count}"), || {
        metric(&gateway.render_metrics(), DELAYED) == count
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_twice_the_capacity_is_delayed_in_booking_order_and_then_refused() {
    let (_upstream, gateway) = start().await;
    let client = HttpClient::new(gateway.addresses[0]);
    let ann = [("x-user", "ann")];
    for _ in 0..2 {
        assert_eq!(client.get("/", &ann).await.status, 200);
    }
    // The third books the token it lacks and waits half a second; the fourth, booked after
    // it, a second. Both are forwarded, the third first.
    let finished = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let held = |client: HttpClient, finished: std::sync::Arc<std::sync::atomic::AtomicUsize>| async move {
        let reply = client.get("/", &[("x-user", "ann")]).await;
        (
            reply.status,
            finished.fetch_add(1, std::sync::atomic::Ordering::SeqCst),
        )
    };
    let third = tokio::spawn(held(client.clone(), finished.clone()));
    until_delayed(&gateway, 1.0).await;
    let fourth = tokio::spawn(held(client.clone(), finished.clone()));
    until_delayed(&gateway, 2.0).await;
    let ((third_status, third_done), (fourth_status, fourth_done)) =
        (third.await.unwrap(), fourth.await.unwrap());
    assert_eq!(
        (third_status.as_u16(), fourth_status.as_u16()),
        (200, 200),
        "none of the burst is lost"
    );
    assert!(third_done < fourth_done, "forwarded in booking order");

    // A fifth would wait 1.5 s, longer than max_delay: refused as usual.
    let refused = client.get("/", &ann).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("retry-after"), Some("2"));
    let scrape = gateway.render_metrics();
    assert_metrics(&scrape, &[(DELAYED, 2.0)]);
    assert_eq!(metric(&scrape, "tollgate_delay_seconds_count"), 2.0);
    assert!((metric(&scrape, "tollgate_delay_seconds_sum") - 1.5).abs() < 1e-6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_while_held_gives_its_tokens_back() {
    let (upstream, gateway) = start().await;
    let client = HttpClient::new(gateway.addresses[0]);
    let ann = [("x-user", "ann")];
    for _ in 0..2 {
        assert_eq!(client.get("/", &ann).await.status, 200);
    }
    // The third is booked (half a second), and its client goes away at once.
    let mut leaving = tokio::net::TcpStream::connect(gateway.addresses[0])
        .await
        .unwrap();
    leaving
        .write_all(b"GET / HTTP/1.1\r\nHost: a\r\nx-user: ann\r\n\r\n")
        .await
        .unwrap();
    until_delayed(&gateway, 1.0).await;
    drop(leaving);
    let admin = HttpClient::new(gateway.admin_address);
    let mut refunded = false;
    for _ in 0..200 {
        let state = admin.get("/limits/smooth?key=ann", &[]).await.json();
        if state["tokens"].as_f64().is_some_and(|tokens| tokens > -0.5) {
            refunded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(refunded, "the held request's token was not given back");
    // Its token back, ann can book two more (a second of debt), as if it had never come.
    let booked = [
        tokio::spawn({
            let client = client.clone();
            async move { client.get("/", &[("x-user", "ann")]).await.status }
        }),
        tokio::spawn({
            let client = client.clone();
            async move { client.get("/", &[("x-user", "ann")]).await.status }
        }),
    ];
    for request in booked {
        assert_eq!(request.await.unwrap(), 200);
    }
    assert_eq!(
        upstream.hits.load(std::sync::atomic::Ordering::SeqCst),
        4,
        "the request whose client left never went upstream"
    );
}
