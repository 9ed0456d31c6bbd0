//! The request path end to end over real sockets. Every case runs twice: against a gateway
//! with `[server] http1 = "fast"` (the gateway's own HTTP/1.1 path) and one with `"hyper"`, so
//! that the two HTTP/1.1 paths are held to the same behaviour by the same tests.

// Each case file is compiled once per setting, on purpose.
#![allow(clippy::duplicate_mod)]

#[path = "../common/mod.rs"]
mod common;

/// The cases on the gateway's own HTTP/1.1 path.
mod fast;
/// The same cases with hyper serving every request.
mod hyper;
