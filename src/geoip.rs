//! Who owns a client's network and where it is: MaxMind DB files (`[geoip]`), read whole when
//! the policy is loaded, looked up once per request that needs them.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use maxminddb::{path, Reader};

/// `[geoip]`'s databases, opened.
pub struct GeoIp {
    asn: Option<Database>,
    country: Option<Database>,
}

struct Database {
    path: PathBuf,
    reader: Reader<Vec<u8>>,
}

impl fmt::Debug for GeoIp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = |database: &Option<Database>| database.as_ref().map(|db| db.path.clone());
        f.debug_struct("GeoIp")
            .field("asn_db", &path(&self.asn))
            .field("country_db", &path(&self.country))
            .finish()
    }
}

/// Which database of `[geoip]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Asn,
    Country,
}

impl Kind {
    /// The key of `[geoip]` that names it.
    pub fn setting(self) -> &'static str {
        match self {
            Kind::Asn => "asn_db",
            Kind::Country => "country_db",
        }
    }

    /// Whether a database of this type (its metadata's `database_type`) holds what is read
    /// from it: MaxMind's own, and the compatible ones of other vendors, name it so.
    fn expects(self, database_type: &str) -> bool {
        let name = database_type.to_ascii_lowercase();
        match self {
            Kind::Asn => ["asn", "isp", "enterprise"]
                .iter()
                .any(|kind| name.contains(kind)),
            Kind::Country => ["country", "city", "enterprise"]
                .iter()
                .any(|kind| name.contains(kind)),
        }
    }
}

/// A database file that cannot be read as one, with the setting that names it.
#[derive(Debug, thiserror::Error)]
#[error("cannot read {} as a MaxMind DB file: {error}", path.display())]
pub struct OpenError {
    pub kind: Kind,
    pub path: std::path::PathBuf,
    pub error: maxminddb::MaxMindDbError,
}

impl GeoIp {
    /// Opens the databases named; an error names the file and says what is wrong with it.
    /// Also returns a warning for a database whose type does not say it holds what is read.
    pub fn open(
        asn_db: Option<&Path>,
        country_db: Option<&Path>,
    ) -> Result<(GeoIp, Vec<String>), OpenError> {
        let mut warnings = Vec::new();
        let mut open = |path: Option<&Path>, kind: Kind| -> Result<Option<Database>, OpenError> {
            let Some(path) = path else {
                return Ok(None);
            };
            let reader = Reader::open_readfile(path).map_err(|error| OpenError {
                kind,
                path: path.to_owned(),
                error,
            })?;
            let database_type = &reader.metadata().database_type;
            if !kind.expects(database_type) {
                warnings.push(format!(
                    "geoip.{}: {} is a {database_type:?} database; tollgate reads {} from it",
                    kind.setting(),
                    path.display(),
                    match kind {
                        Kind::Asn => "autonomous_system_number",
                        Kind::Country => "country.iso_code",
                    }
                ));
            }
            Ok(Some(Database {
                path: path.to_owned(),
                reader,
            }))
        };
        let asn = open(asn_db, Kind::Asn)?;
        let country = open(country_db, Kind::Country)?;
        Ok((GeoIp { asn, country }, warnings))
    }

    pub fn has(&self, kind: Kind) -> bool {
        match kind {
            Kind::Asn => self.asn.is_some(),
            Kind::Country => self.country.is_some(),
        }
    }

    /// The client's autonomous system and country, as far as the databases know them.
    pub fn origin(&self, client: IpAddr) -> Origin {
        let client = client.to_canonical();
        Origin {
            asn: self.asn.as_ref().and_then(|db| asn_of(&db.reader, client)),
            country: self
                .country
                .as_ref()
                .and_then(|db| country_of(&db.reader, client)),
        }
    }
}

/// A lookup that fails (an IPv6 address in an IPv4 database, a damaged record) knows nothing.
fn asn_of(reader: &Reader<Vec<u8>>, client: IpAddr) -> Option<u32> {
    let found = reader.lookup(client).ok()?;
    let number: AnyInteger = found
        .decode_path(&path!["autonomous_system_number"])
        .ok()??;
    u32::try_from(number.0).ok()
}

/// A number as a database writer chose to store it: MaxMind's files hold an ASN as uint32,
/// other writers pick the smallest type (uint16) or a signed one.
struct AnyInteger(i128);

impl<'de> serde::Deserialize<'de> for AnyInteger {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = AnyInteger;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer")
            }
            fn visit_u64<E>(self, value: u64) -> Result<AnyInteger, E> {
                Ok(AnyInteger(i128::from(value)))
            }
            fn visit_i64<E>(self, value: i64) -> Result<AnyInteger, E> {
                Ok(AnyInteger(i128::from(value)))
            }
            fn visit_u128<E>(self, value: u128) -> Result<AnyInteger, E> {
                Ok(AnyInteger(i128::try_from(value).unwrap_or(-1)))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// The country the network is in, else the one it is registered in (MaxMind leaves `country`
/// out for some networks, anycast ones among them).
fn country_of(reader: &Reader<Vec<u8>>, client: IpAddr) -> Option<Country> {
    let found = reader.lookup(client).ok()?;
    let code = |field: &str| -> Option<Country> {
        let code: &str = found.decode_path(&path![field, "iso_code"]).ok()??;
        Country::parse(code)
    };
    code("country").or_else(|| code("registered_country"))
}

/// What the databases say of one client address.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Origin {
    pub asn: Option<u32>,
    pub country: Option<Country>,
}

/// An ISO 3166 alpha-2 country code, upper case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Country([u8; 2]);

impl Country {
    /// Two ASCII letters, in either case.
    pub fn parse(code: &str) -> Option<Country> {
        match code.as_bytes() {
            [first, second] if first.is_ascii_alphabetic() && second.is_ascii_alphabetic() => {
                Some(Country([
                    first.to_ascii_uppercase(),
                    second.to_ascii_uppercase(),
                ]))
            }
            _ => None,
        }
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).unwrap_or("??")
    }
}

impl fmt::Display for Country {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An autonomous system number as written in a policy, a log or the admin API: `AS64500`
/// (either case) or `64500`.
pub fn parse_asn(text: &str) -> Option<u32> {
    let text = text.trim();
    let digits = match text.get(..2) {
        Some(prefix) if prefix.eq_ignore_ascii_case("as") => &text[2..],
        _ => text,
    };
    if digits.is_empty() || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asn_and_country_spellings() {
        assert_eq!(parse_asn("AS64500"), Some(64500));
        assert_eq!(parse_asn("as15169"), Some(15169));
        assert_eq!(parse_asn(" 13335 "), Some(13335));
        assert_eq!(parse_asn("AS"), None);
        assert_eq!(parse_asn("AS-1"), None);
        assert_eq!(parse_asn("AS+1"), None);
        assert_eq!(parse_asn("AS99999999999"), None);
        assert_eq!(parse_asn("ASN1"), None);
        assert_eq!(
            Country::parse("de").map(|c| c.to_string()),
            Some("DE".into())
        );
        assert_eq!(Country::parse("DEU"), None);
        assert_eq!(Country::parse("1A"), None);
        assert_eq!(Country::parse("é"), None);
    }

    #[test]
    fn a_file_that_is_not_a_database_is_named() {
        let dir = std::env::temp_dir().join(format!("tollgate-geoip-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bogus = dir.join("bogus.mmdb");
        std::fs::write(&bogus, b"not a database at all").unwrap();
        let error = GeoIp::open(Some(&bogus), None).unwrap_err();
        assert_eq!(error.kind, Kind::Asn);
        assert!(error.to_string().contains("bogus.mmdb"), "{error}");
        let missing = dir.join("missing.mmdb");
        let error = GeoIp::open(None, Some(&missing)).unwrap_err();
        assert_eq!(error.kind, Kind::Country);
        assert!(error.to_string().contains("missing.mmdb"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
