const HTTP1: &str = "fast";

#[path = "cases/http1.rs"]
mod http1;
#[path = "cases/limits.rs"]
mod limits;
#[path = "cases/proxy.rs"]
mod proxy;
