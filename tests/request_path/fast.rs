const HTTP1: &str = "fast";

#[path = "cases/concurrency.rs"]
mod concurrency;
#[path = "cases/delay.rs"]
mod delay;
#[path = "cases/http1.rs"]
mod http1;
#[path = "cases/identity.rs"]
mod identity;
#[path = "cases/limits.rs"]
mod limits;
#[path = "cases/proxy.rs"]
mod proxy;
#[path = "cases/quotas.rs"]
mod quotas;
