//! `lasthop-control export` and `import` end to end: the record as the store streams it
//! ([`crate::store::transfer`] has the format), with the API keys of a store that does not keep
//! them (the embedded store's `api-keys` file).

use std::io::{BufRead, Write};

use crate::store::transfer::{
    key_id_text, End, Header, Imported, KeyLine, Reader, Record, Writer, FORMAT, VERSION,
};
use crate::store::{Store, StoreError};

/// `lasthop-control export`: the header, everything [`Store::export`] streams, the API keys
/// of a store that does not keep them (the embedded store's keys file in `keys_dir`), and the
/// end line.
pub fn export_all(
    store: &dyn Store,
    source: &str,
    key_id: u32,
    regions: u32,
    keys_dir: Option<&std::path::Path>,
    out: impl Write,
) -> Result<End, StoreError> {
    let mut w = Writer::new(out);
    w.write(&Record::Header(Header {
        format: FORMAT.into(),
        version: VERSION,
        key_id: key_id_text(key_id),
        regions,
        source: source.into(),
        exported_at_ms: crate::clock::now_ms(),
    }))?;
    let last_seq = store.export(&mut |r| w.write(&r))?;
    if let Some(dir) = keys_dir {
        let keys = crate::auth::ApiKeys::open(dir)
            .records()
            .map_err(|e| StoreError::File {
                what: "reading the api-keys file",
                cause: e.into(),
            })?;
        for key in keys {
            w.write(&Record::ApiKey(KeyLine::from_record(&key)))?;
        }
    }
    w.finish(last_seq)
}

/// `lasthop-control import`: reads an export (checked against `scheme`'s key and `regions`)
/// into the empty store `spec` names (`embedded`: `data_dir/links.redb`, its keys into
/// `data_dir/api-keys`; or a PostgreSQL connection string).
pub fn import_all(
    spec: &str,
    data_dir: Option<&std::path::Path>,
    scheme: lasthop_core::CodeScheme,
    region: u32,
    regions: u32,
    input: impl BufRead,
) -> Result<Imported, StoreError> {
    let (mut reader, _header) = Reader::open(input, scheme.key_id(), regions)?;
    if spec == "embedded" {
        let dir = data_dir.ok_or_else(|| {
            StoreError::Refused("--data-dir is needed with the embedded store".into())
        })?;
        let mut config =
            crate::store::embedded::EmbeddedStoreConfig::new(dir.join("links.redb"), scheme);
        config.region = region;
        config.regions = regions;
        let (done, keys) = crate::store::embedded::transfer::import(&config, &mut reader)?;
        crate::auth::import_keys(dir, &keys).map_err(|e| StoreError::File {
            what: "writing the api-keys file",
            cause: e.into(),
        })?;
        return Ok(done);
    }
    #[cfg(feature = "postgres")]
    {
        let mut config = crate::store::postgres::PgStoreConfig::new(spec, scheme.clone());
        config.region = region;
        config.regions = regions;
        let store = crate::store::postgres::PgStore::open(config)?;
        let done = crate::store::postgres::transfer::import(&store, scheme, regions, &mut reader);
        store.shutdown()?;
        done
    }
    #[cfg(not(feature = "postgres"))]
    Err(StoreError::NotBuilt("--store"))
}
