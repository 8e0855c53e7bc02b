//! Where rollups are kept, as `--clicks-store` names it. Parsed in every build: a location whose
//! backend a build left out fails when the store is opened ([`RollupStore::open_at`]), not when
//! the flag is read.
//!
//! [`RollupStore::open_at`]: super::RollupStore::open_at

/// Where rollups are kept: `--clicks-store embedded` (the default),
/// `--clicks-store clickhouse://[USER[:PASSWORD]@]HOST[:PORT]/DB` (ClickHouse's HTTP interface)
/// or `clickhouses://…` (its HTTPS interface, `https_port`: the server's certificate verified
/// against `--clicks-store-ca FILE`, or the system's trusted CAs without it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreLocation {
    /// `DATA_DIR/clicks/rollups.redb`, one processor.
    Embedded,
    /// A ClickHouse database, shared by several processors.
    ClickHouse(ClickHouseUrl),
}

impl std::str::FromStr for StoreLocation {
    type Err = String;

    fn from_str(s: &str) -> Result<StoreLocation, String> {
        if s == "embedded" {
            return Ok(StoreLocation::Embedded);
        }
        if s.starts_with("clickhouse://") || s.starts_with("clickhouses://") {
            return ClickHouseUrl::parse(s).map(StoreLocation::ClickHouse);
        }
        Err(format!(
            "{} is not a rollup store: use `embedded`, `clickhouse://HOST:8123/DB` or \
             `clickhouses://HOST:8443/DB`",
            redacted(s)
        ))
    }
}

impl StoreLocation {
    /// With `--clicks-store-ca FILE`: the CA a `clickhouses://` store's certificate must chain
    /// to; refused beside any other location (it would be silently unused).
    pub fn with_ca(self, ca: Option<std::path::PathBuf>) -> Result<StoreLocation, String> {
        match (self, ca) {
            (location, None) => Ok(location),
            (StoreLocation::ClickHouse(mut url), Some(ca)) if url.tls => {
                url.ca = Some(ca);
                Ok(StoreLocation::ClickHouse(url))
            }
            (_, Some(ca)) => Err(format!(
                "--clicks-store-ca {}: only a clickhouses:// store is reached over TLS",
                ca.display()
            )),
        }
    }
}

/// `s` with any password in it replaced by `***` (for messages: a password is never printed).
fn redacted(s: &str) -> String {
    match url::Url::parse(s) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        Ok(_) => s.to_string(),
        Err(_) => match (s.find("://"), s.rfind('@')) {
            (Some(start), Some(at)) if at > start => format!("{}***{}", &s[..start + 3], &s[at..]),
            _ => s.to_string(),
        },
    }
}

/// A parsed `clickhouse[s]://[USER[:PASSWORD]@]HOST[:PORT]/DB` (port 8123 by default, 8443
/// over TLS).
#[derive(Clone, PartialEq, Eq)]
pub struct ClickHouseUrl {
    /// `http://HOST:PORT/` or `https://HOST:PORT/`.
    pub endpoint: String,
    /// The database (created if missing).
    pub database: String,
    /// The user and password, if any (never printed).
    pub(super) user: Option<(String, String)>,
    /// `clickhouses://`: HTTPS, the server's certificate verified.
    pub tls: bool,
    /// The CA file that certificate must chain to (`--clicks-store-ca`); the system's trusted
    /// CAs without it.
    pub ca: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for ClickHouseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the password.
        f.debug_struct("ClickHouseUrl")
            .field("endpoint", &self.endpoint)
            .field("database", &self.database)
            .field("ca", &self.ca)
            .finish_non_exhaustive()
    }
}

impl ClickHouseUrl {
    /// Parses the `--clicks-store` form.
    pub fn parse(s: &str) -> Result<ClickHouseUrl, String> {
        // Messages show the URL with its password replaced.
        let (raw, shown) = (s, redacted(s));
        let s = &shown;
        let url = url::Url::parse(raw).map_err(|e| format!("{s:?}: {e}"))?;
        let tls = match url.scheme() {
            "clickhouse" => false,
            "clickhouses" => true,
            _ => {
                return Err(format!(
                    "{s:?}: the scheme must be clickhouse:// or clickhouses://"
                ))
            }
        };
        let host = url
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| format!("{s:?}: no host"))?;
        let port = url.port().unwrap_or(if tls { 8443 } else { 8123 });
        let database = url.path().trim_start_matches('/').to_owned();
        if database.is_empty()
            || database.len() > 64
            || !database
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return Err(format!(
                "{s:?}: the path must name a database (letters, digits, _), e.g. clickhouse://127.0.0.1:8123/lasthop"
            ));
        }
        let user = (!url.username().is_empty()).then(|| {
            let decode = |v: &str| {
                url::form_urlencoded::parse(format!("v={v}").as_bytes())
                    .next()
                    .map(|(_, v)| v.into_owned())
                    .unwrap_or_default()
            };
            (decode(url.username()), decode(url.password().unwrap_or("")))
        });
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        Ok(ClickHouseUrl {
            endpoint: format!("{}://{host}:{port}/", if tls { "https" } else { "http" }),
            database,
            user,
            tls,
            ca: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_locations() {
        assert_eq!("embedded".parse(), Ok(StoreLocation::Embedded));
        assert!(matches!(
            "clickhouse://127.0.0.1:8123/lasthop".parse::<StoreLocation>(),
            Ok(StoreLocation::ClickHouse(_))
        ));
        for bad in ["", "redb", "postgres://h/db", "clickhouse://h"] {
            assert!(bad.parse::<StoreLocation>().is_err(), "{bad}");
        }
    }

    #[test]
    fn urls() {
        let u = ClickHouseUrl::parse("clickhouse://127.0.0.1:18123/lasthop").unwrap();
        assert_eq!(u.endpoint, "http://127.0.0.1:18123/");
        assert_eq!(u.database, "lasthop");
        assert_eq!(u.user, None);
        let u = ClickHouseUrl::parse("clickhouse://ana:p%40ss@ch.example:9000/db_1").unwrap();
        assert_eq!(u.endpoint, "http://ch.example:9000/");
        assert_eq!(u.user, Some(("ana".into(), "p@ss".into())));
        assert!(!format!("{u:?}").contains("p@ss"), "no password in Debug");
        let u = ClickHouseUrl::parse("clickhouse://[::1]/x").unwrap();
        assert_eq!(u.endpoint, "http://[::1]:8123/");
        assert!(!u.tls);
        let u = ClickHouseUrl::parse("clickhouses://ana:s3cret@ch.example/db").unwrap();
        assert_eq!(u.endpoint, "https://ch.example:8443/");
        assert!(u.tls);
        let u = ClickHouseUrl::parse("clickhouses://ch.example:9443/db").unwrap();
        assert_eq!(u.endpoint, "https://ch.example:9443/");
        for bad in [
            "clickhouse://host",
            "clickhouse://host/",
            "clickhouse://host/a;DROP",
            "clickhouse:///db",
            "http://host/db",
        ] {
            assert!(ClickHouseUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_password_is_never_in_a_message() {
        for bad in [
            "clickhouses://ana:s3cret@host",
            "clickhouse://ana:s3cret@host/a;DROP",
            "clickhouses://ana:s3cret@/db",
            "clickhousez://ana:s3cret@host/db",
            "clickhouses://ana:s3cret@ho st/db",
        ] {
            let e = bad.parse::<StoreLocation>().unwrap_err();
            assert!(!e.contains("s3cret"), "{e}");
        }
        let ok: StoreLocation = "clickhouses://ana:s3cret@host/db".parse().unwrap();
        assert!(!format!("{ok:?}").contains("s3cret"));
    }

    #[test]
    fn a_ca_file_goes_with_clickhouses_only() {
        let ca = Some(std::path::PathBuf::from("/etc/ca.pem"));
        let tls: StoreLocation = "clickhouses://host/db".parse().unwrap();
        let StoreLocation::ClickHouse(u) = tls.with_ca(ca.clone()).unwrap() else {
            panic!("a ClickHouse location")
        };
        assert_eq!(u.ca, ca);
        for plain in ["clickhouse://host/db", "embedded"] {
            let l: StoreLocation = plain.parse().unwrap();
            let e = l.with_ca(ca.clone()).unwrap_err();
            assert!(e.contains("--clicks-store-ca /etc/ca.pem"), "{e}");
        }
    }
}
