//! Where rollups are kept, as `--clicks-store` names it. Parsed in every build: a location whose
//! backend a build left out fails when the store is opened ([`RollupStore::open_at`]), not when
//! the flag is read.
//!
//! [`RollupStore::open_at`]: super::RollupStore::open_at

/// Where rollups are kept: `--clicks-store embedded` (the default) or
/// `--clicks-store clickhouse://[USER[:PASSWORD]@]HOST[:PORT]/DB`.
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
        if s.starts_with("clickhouse://") {
            return ClickHouseUrl::parse(s).map(StoreLocation::ClickHouse);
        }
        Err(format!(
            "{s:?} is not a rollup store: use `embedded` or `clickhouse://HOST:8123/DB`"
        ))
    }
}

/// A parsed `clickhouse://[USER[:PASSWORD]@]HOST[:PORT]/DB` (port 8123 by default).
#[derive(Clone, PartialEq, Eq)]
pub struct ClickHouseUrl {
    /// `http://HOST:PORT/`.
    pub endpoint: String,
    /// The database (created if missing).
    pub database: String,
    /// The user and password, if any (never printed).
    pub(super) user: Option<(String, String)>,
}

impl std::fmt::Debug for ClickHouseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the password.
        f.debug_struct("ClickHouseUrl")
            .field("endpoint", &self.endpoint)
            .field("database", &self.database)
            .finish_non_exhaustive()
    }
}

impl ClickHouseUrl {
    /// Parses the `--clicks-store` form.
    pub fn parse(s: &str) -> Result<ClickHouseUrl, String> {
        let url = url::Url::parse(s).map_err(|e| format!("{s:?}: {e}"))?;
        if url.scheme() != "clickhouse" {
            return Err(format!("{s:?}: the scheme must be clickhouse://"));
        }
        let host = url
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| format!("{s:?}: no host"))?;
        let port = url.port().unwrap_or(8123);
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
            endpoint: format!("http://{host}:{port}/"),
            database,
            user,
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
}
