//! `[server.connections]`: open connections counted in all and per client network, and each
//! network's bucket of new connections (the buckets' one rule, `limit::bucket`). A proxy
//! listener asks as it accepts, before TLS or a byte is read; a refused connection is closed.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ipnet::IpNet;
use parking_lot::Mutex;

use crate::config::{ConnectionLimits, NetworkRate};
use crate::limit::bucket::{self, BucketState, Charge};
use crate::limit::{Clock, Verdicts};

/// Why a connection was closed as soon as it came (`tollgate_connections_refused_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// `max`: the gateway's open connections.
    Max,
    /// `per_network`: the network's new connections came too fast.
    Rate,
    /// `max_per_network`: the network's open connections.
    Open,
    /// A peer of `proxy_protocol.from` without a valid PROXY header.
    ProxyProtocol,
}

impl Refusal {
    pub(crate) const ALL: [Refusal; 4] = [
        Refusal::Max,
        Refusal::Rate,
        Refusal::Open,
        Refusal::ProxyProtocol,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Refusal::Max => "max",
            Refusal::Rate => "rate",
            Refusal::Open => "open",
            Refusal::ProxyProtocol => "proxy_protocol",
        }
    }
}

/// The open connections of the proxy listeners, by client network where counted.
pub(crate) struct ConnectionGate {
    open: AtomicUsize,
    networks: Mutex<HashMap<IpNet, NetworkCount, foldhash::fast::RandomState>>,
    clock: Clock,
    /// `tollgate_connections_open`.
    gauge: prometheus::IntGauge,
}

#[derive(Debug, Default)]
struct NetworkCount {
    open: u32,
    /// New connections' bucket; `None`: full.
    bucket: Option<BucketState>,
}

/// A connection the gate let in: counted open until dropped.
pub(crate) struct OpenConnection {
    gate: Arc<ConnectionGate>,
    network: Option<IpNet>,
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.gate.open.fetch_sub(1, Ordering::Relaxed);
        self.gate.gauge.dec();
        if let Some(network) = self.network {
            let mut networks = self.gate.networks.lock();
            if let Some(count) = networks.get_mut(&network) {
                count.open = count.open.saturating_sub(1);
                if count.open == 0 && count.bucket.is_none() {
                    networks.remove(&network);
                }
            }
        }
    }
}

/// Where a connection comes from, as the limits see it.
pub(crate) struct Source {
    /// Its network: the client address masked by `[client_ip]`'s prefixes.
    pub(crate) network: IpNet,
    /// In `trusted_proxies`: not limited per network.
    pub(crate) trusted: bool,
}

impl ConnectionGate {
    pub(crate) fn new(clock: Clock, gauge: prometheus::IntGauge) -> ConnectionGate {
        ConnectionGate {
            open: AtomicUsize::new(0),
            networks: Mutex::default(),
            clock,
            gauge,
        }
    }

    /// Counts a new connection open, or says which limit refuses it.
    pub(crate) fn admit(
        self: &Arc<Self>,
        limits: &ConnectionLimits,
        source: &Source,
    ) -> Result<OpenConnection, Refusal> {
        let open = self.open.fetch_add(1, Ordering::Relaxed);
        // Counted before the network's check, so that a refusal below gives it back.
        let mut admitted = OpenConnection {
            gate: Arc::clone(self),
            network: None,
        };
        self.gauge.inc();
        if limits.max.is_some_and(|max| open >= max) {
            return Err(Refusal::Max);
        }
        if limits.per_network_apply() && !source.trusted {
            self.admit_from(limits, source.network)?;
            admitted.network = Some(source.network);
        }
        Ok(admitted)
    }

    fn admit_from(&self, limits: &ConnectionLimits, network: IpNet) -> Result<(), Refusal> {
        let mut networks = self.networks.lock();
        let count = networks.entry(network).or_default();
        if limits.max_per_network.is_some_and(|max| count.open >= max) {
            return Err(Refusal::Open);
        }
        if let Some(rate) = limits.per_network {
            let mut state = [count.bucket];
            let mut verdicts = Verdicts::new();
            let charges = [charge(rate)];
            if !bucket::decide(&charges, &mut state, self.clock.now(), &mut verdicts) {
                return Err(Refusal::Rate);
            }
            count.bucket = state[0];
        }
        count.open += 1;
        Ok(())
    }

    /// Whether `source`'s network has no new connection left in its `per_network` bucket
    /// now (nothing is charged): QUIC then asks the next one to prove its address first.
    pub(crate) fn rate_exhausted(&self, limits: &ConnectionLimits, source: &Source) -> bool {
        let Some(rate) = limits.per_network.filter(|_| !source.trusted) else {
            return false;
        };
        let networks = self.networks.lock();
        let state = networks.get(&source.network).and_then(|count| count.bucket);
        bucket::tokens_at(state, &charge(rate), self.clock.now()) < 1.0
    }

    /// Forgets networks with no open connection whose bucket has filled again: what a flood of
    /// new networks leaves behind is kept no longer than a bucket takes to refill.
    pub(crate) fn sweep(&self, limits: &ConnectionLimits) {
        let now = self.clock.now();
        self.networks.lock().retain(|_, count| {
            let refilling = match (count.bucket, limits.per_network) {
                (Some(state), Some(rate)) => {
                    let charge = charge(rate);
                    bucket::tokens_at(Some(state), &charge, now) < charge.capacity
                }
                _ => false,
            };
            count.open > 0 || refilling
        });
    }

    /// Networks remembered (open connections, or a bucket refilling).
    #[cfg(test)]
    fn networks_kept(&self) -> usize {
        self.networks.lock().len()
    }
}

fn charge(rate: NetworkRate) -> Charge {
    Charge {
        capacity: rate.capacity,
        rate: rate.rate,
        cost: 1.0,
        enforce: true,
        period: None,
        debt: 0.0,
    }
}

/// Where a connection from `client` counts.
pub(crate) fn source(client: IpAddr, client_ip: &crate::config::ClientIpSettings) -> Source {
    let trusted = match &client_ip.trust {
        crate::client_ip::Trust::Proxies(networks) => {
            networks.iter().any(|network| network.contains(&client))
        }
        crate::client_ip::Trust::Hops(_) => false,
    };
    Source {
        network: crate::key::client_network(client, client_ip.ipv4_prefix, client_ip.ipv6_prefix),
        trusted,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::{ConnectionGate, Refusal, Source};
    use crate::config::{ConnectionLimits, NetworkRate};
    use crate::limit::Clock;

    fn gate() -> (Arc<ConnectionGate>, Clock) {
        let clock = Clock::manual();
        let gauge = prometheus::IntGauge::new("open", "open").unwrap();
        (Arc::new(ConnectionGate::new(clock.clone(), gauge)), clock)
    }

    fn from(network: &str) -> Source {
        Source {
            network: network.parse().unwrap(),
            trusted: false,
        }
    }

    #[test]
    fn max_counts_every_open_connection_and_a_closed_one_frees_its_place() {
        let (gate, _) = gate();
        let limits = ConnectionLimits {
            max: Some(2),
            ..ConnectionLimits::default()
        };
        let first = gate.admit(&limits, &from("10.0.0.0/32")).unwrap();
        let _second = gate.admit(&limits, &from("10.0.0.1/32")).unwrap();
        assert_eq!(
            gate.admit(&limits, &from("10.0.0.2/32")).err(),
            Some(Refusal::Max)
        );
        assert_eq!(
            gate.gauge.get(),
            2,
            "a refused connection is not counted open"
        );
        drop(first);
        assert!(gate.admit(&limits, &from("10.0.0.2/32")).is_ok());
    }

    #[test]
    fn open_connections_per_network_and_trusted_proxies_exempt() {
        let (gate, _) = gate();
        let limits = ConnectionLimits {
            max_per_network: Some(2),
            ..ConnectionLimits::default()
        };
        let held: Vec<_> = (0..2)
            .map(|_| gate.admit(&limits, &from("192.0.2.0/24")).unwrap())
            .collect();
        assert_eq!(
            gate.admit(&limits, &from("192.0.2.0/24")).err(),
            Some(Refusal::Open)
        );
        assert!(gate.admit(&limits, &from("198.51.100.0/24")).is_ok());
        let proxy = Source {
            trusted: true,
            ..from("192.0.2.0/24")
        };
        let _through_proxy: Vec<_> = (0..5)
            .map(|_| gate.admit(&limits, &proxy).unwrap())
            .collect();
        drop(held);
        let again = gate.admit(&limits, &from("192.0.2.0/24")).unwrap();
        assert_eq!(
            gate.networks_kept(),
            1,
            "only the network with a connection open"
        );
        drop(again);
        assert_eq!(
            gate.networks_kept(),
            0,
            "a network with nothing open is forgotten"
        );
    }

    #[test]
    fn new_connections_per_network_refill_at_the_rate() {
        let (gate, clock) = gate();
        let limits = ConnectionLimits {
            per_network: Some(NetworkRate {
                capacity: 3.0,
                rate: 2.0,
            }),
            ..ConnectionLimits::default()
        };
        let network = from("2001:db8::/64");
        for _ in 0..3 {
            drop(gate.admit(&limits, &network).unwrap());
        }
        assert_eq!(gate.admit(&limits, &network).err(), Some(Refusal::Rate));
        clock.advance(Duration::from_millis(500));
        assert!(gate.admit(&limits, &network).is_ok());
        assert_eq!(gate.admit(&limits, &network).err(), Some(Refusal::Rate));
        assert_eq!(gate.gauge.get(), 0);
        gate.sweep(&limits);
        assert_eq!(gate.networks_kept(), 1, "its bucket is still refilling");
        clock.advance(Duration::from_secs(2));
        gate.sweep(&limits);
        assert_eq!(gate.networks_kept(), 0);
    }

    #[test]
    fn an_exhausted_network_is_told_without_being_charged() {
        let (gate, clock) = gate();
        let limits = ConnectionLimits {
            per_network: Some(NetworkRate {
                capacity: 2.0,
                rate: 1.0,
            }),
            ..ConnectionLimits::default()
        };
        let network = from("192.0.2.0/24");
        for _ in 0..5 {
            assert!(
                !gate.rate_exhausted(&limits, &network),
                "asking takes nothing"
            );
        }
        let _open = [gate.admit(&limits, &network), gate.admit(&limits, &network)];
        assert!(gate.rate_exhausted(&limits, &network));
        let trusted = Source {
            trusted: true,
            ..from("192.0.2.0/24")
        };
        assert!(!gate.rate_exhausted(&limits, &trusted));
        assert!(!gate.rate_exhausted(&ConnectionLimits::default(), &network));
        clock.advance(Duration::from_secs(1));
        assert!(!gate.rate_exhausted(&limits, &network));
    }
}
