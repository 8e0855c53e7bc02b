//! Every loaded reputation list in one in-memory index: checked on every create, and diffed
//! against the previous index on a reload.
//!
//! Creation checks a destination against lists of a million entries or more, so a check is a
//! handful of hash lookups and nothing else: the URL match key once (a URL entry is the more
//! specific), then the host under each of its [`CanonicalHost::lookup_names`] (the host, then
//! every parent domain), so a host entry covers its subdomains without any scan. Addresses
//! have their own map keyed by [`IpAddr`]: an IP entry matches that address only, and since
//! every spelling of an address is canonicalised to one [`CanonicalHost`], every spelling of it.
//!
//! Memory is what a million entries make it: each is one boxed string and a list id in a
//! `hashbrown` map (list names are stored once, not per entry). Where several lists hold one
//! entry, the first list in build order owns it.
//!
//! A reload builds a new index and asks it what it [`added`](ReputationIndex::added) over the
//! old one: the time-bomb defence takes down every existing link a new entry matches (a link
//! created while its destination was clean, then turned malicious). An entry that only moved
//! to another list is not new.

use std::fmt;
use std::net::IpAddr;

use hashbrown::HashMap;

use crate::destination::Destination;
use crate::host::{CanonicalHost, LookupName};
use crate::lists::Entry;

/// What a check matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hit<'a> {
    /// The name of the list that owns the entry.
    pub list: &'a str,
    /// The entry as listed: a host name (`evil.example`, `192.0.2.1`, `2001:db8::1`) or a URL
    /// match key ([`Destination::url_key`]).
    pub entry: &'a str,
    pub kind: HitKind,
}

/// Which kind of entry a [`Hit`] matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HitKind {
    /// A host entry: the destination's host or one of its parent domains.
    Host,
    /// A URL entry: the destination's whole match key.
    Url,
}

/// An entry a reload added.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Added {
    Host { host: CanonicalHost, list: String },
    Url { key: String, list: String },
}

/// An index into [`ReputationIndex::lists`]. A `u32` costs no more than a `u16` here: a map
/// slot of a boxed string and either one pads to 24 bytes.
type ListId = u32;

/// Every loaded list in one index.
#[derive(Default)]
pub struct ReputationIndex {
    /// List names by [`ListId`]; every id stored in the maps is an index into this.
    lists: Vec<Box<str>>,
    /// Host entries that are names, by the canonical name.
    domains: HashMap<Box<str>, ListId>,
    /// Host entries that are addresses, with their canonical text (what a [`Hit`] borrows).
    ips: HashMap<IpAddr, (Box<str>, ListId)>,
    /// URL entries, by match key.
    urls: HashMap<Box<str>, ListId>,
}

impl ReputationIndex {
    /// Indexes `lists`, each a name and its entries (as [`crate::parse_list`] made them: no
    /// entry is checked again here). Lists of one name are merged; an entry in several lists
    /// belongs to the first.
    pub fn build<'a>(lists: impl IntoIterator<Item = (&'a str, &'a [Entry])>) -> Self {
        let lists: Vec<(&str, &[Entry])> = lists.into_iter().collect();
        let (mut domains, mut urls) = (0, 0);
        for entry in lists.iter().flat_map(|(_, entries)| entries.iter()) {
            match entry {
                Entry::Host(CanonicalHost::Domain(_)) => domains += 1,
                Entry::Url(_) => urls += 1,
                Entry::Host(_) => {}
            }
        }
        let mut index = ReputationIndex {
            lists: Vec::new(),
            domains: HashMap::with_capacity(domains),
            ips: HashMap::new(),
            urls: HashMap::with_capacity(urls),
        };
        let mut ids: HashMap<&str, ListId> = HashMap::new();
        for (name, entries) in lists {
            let id = *ids.entry(name).or_insert_with(|| index.add_list(name));
            for entry in entries {
                index.insert(entry, id);
            }
        }
        index
    }

    fn add_list(&mut self, name: &str) -> ListId {
        match ListId::try_from(self.lists.len()) {
            Ok(id) => {
                self.lists.push(name.into());
                id
            }
            // Past 2^32 distinct names the rest share the last one: their entries still block,
            // only under another list's name (and the id stays an index into `lists`).
            Err(_) => ListId::MAX,
        }
    }

    fn insert(&mut self, entry: &Entry, id: ListId) {
        match entry {
            Entry::Url(key) => {
                self.urls.entry_ref(key.as_str()).or_insert(id);
            }
            Entry::Host(CanonicalHost::Domain(name)) => {
                self.domains.entry_ref(name.as_str()).or_insert(id);
            }
            Entry::Host(host) => {
                if let Some(ip) = address(host) {
                    self.ips
                        .entry(ip)
                        .or_insert_with(|| (host.name().into_boxed_str(), id));
                }
            }
        }
    }

    /// The number of distinct entries.
    pub fn len(&self) -> usize {
        self.domains.len() + self.ips.len() + self.urls.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The names of the lists, in build order.
    pub fn lists(&self) -> impl Iterator<Item = &str> {
        self.lists.iter().map(|name| &**name)
    }

    /// The entry `dest` matches, if any: a URL entry on its whole match key first, then a host
    /// entry on its host or the nearest parent domain.
    pub fn check(&self, dest: &Destination) -> Option<Hit<'_>> {
        if let Some((key, &id)) = self.urls.get_key_value(dest.url_key.as_str()) {
            return Some(self.hit(id, key, HitKind::Url));
        }
        dest.host.lookup_names().find_map(|name| {
            let (entry, &id) = match name {
                LookupName::Domain(d) => self.domains.get_key_value(d)?,
                LookupName::Ip(host) => {
                    let (text, id) = self.ips.get(&address(host)?)?;
                    (text, id)
                }
            };
            Some(self.hit(id, entry, HitKind::Host))
        })
    }

    fn hit<'a>(&'a self, id: ListId, entry: &'a str, kind: HitKind) -> Hit<'a> {
        Hit {
            list: self.list_name(id),
            entry,
            kind,
        }
    }

    fn list_name(&self, id: ListId) -> &str {
        // Every stored id came from `add_list`, which returns an index into `lists`; the
        // fallback is never taken.
        usize::try_from(id)
            .ok()
            .and_then(|i| self.lists.get(i))
            .map_or("", |name| name)
    }

    /// The entries of `self` that `old` does not have, each with the list that owns it here,
    /// sorted (host entries first). An entry that only moved between lists is not added.
    pub fn added(&self, old: &ReputationIndex) -> Vec<Added> {
        let mut added = Vec::new();
        for (name, &id) in &self.domains {
            if !old.domains.contains_key(name) {
                added.push(Added::Host {
                    host: CanonicalHost::Domain(name.to_string()),
                    list: self.list_name(id).to_owned(),
                });
            }
        }
        for (ip, (_, id)) in &self.ips {
            if !old.ips.contains_key(ip) {
                let host = match *ip {
                    IpAddr::V4(v4) => CanonicalHost::V4(v4),
                    IpAddr::V6(v6) => CanonicalHost::V6(v6),
                };
                added.push(Added::Host {
                    host,
                    list: self.list_name(*id).to_owned(),
                });
            }
        }
        for (key, &id) in &self.urls {
            if !old.urls.contains_key(key) {
                added.push(Added::Url {
                    key: key.to_string(),
                    list: self.list_name(id).to_owned(),
                });
            }
        }
        added.sort_unstable();
        added
    }
}

/// The address of an IP host.
fn address(host: &CanonicalHost) -> Option<IpAddr> {
    match host {
        CanonicalHost::V4(ip) => Some(IpAddr::V4(*ip)),
        CanonicalHost::V6(ip) => Some(IpAddr::V6(*ip)),
        CanonicalHost::Domain(_) => None,
    }
}

impl fmt::Debug for ReputationIndex {
    /// Sizes only: a million entries are no debug output.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReputationIndex")
            .field("lists", &self.lists)
            .field("domains", &self.domains.len())
            .field("ips", &self.ips.len())
            .field("urls", &self.urls.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(s: &str) -> Entry {
        Entry::Host(CanonicalHost::parse(s).unwrap())
    }

    fn url(s: &str) -> Entry {
        Entry::Url(Destination::parse(s).unwrap().url_key)
    }

    fn check<'a>(index: &'a ReputationIndex, s: &str) -> Option<(&'a str, &'a str, HitKind)> {
        let hit = index.check(&Destination::parse(s).unwrap())?;
        Some((hit.list, hit.entry, hit.kind))
    }

    #[test]
    fn hosts_cover_subdomains_urls_only_themselves() {
        let a = [host("evil.example"), url("https://phish.example/login?x=1")];
        let b = [
            host("192.0.2.1"),
            host("2001:db8::1"),
            host("sub.other.example"),
        ];
        let index = ReputationIndex::build([("a", &a[..]), ("b", &b[..])]);
        assert_eq!(index.len(), 5);
        let host_hit = Some(("a", "evil.example", HitKind::Host));
        assert_eq!(check(&index, "https://evil.example/"), host_hit);
        assert_eq!(check(&index, "https://a.b.EVIL.example./x?y#z"), host_hit);
        assert_eq!(check(&index, "https://notevil.example/"), None);
        assert_eq!(check(&index, "https://evil.example.attacker.test/"), None);
        assert_eq!(
            check(&index, "http://user@PHISH.example:80/login?x=1#f"),
            Some(("a", "phish.example/login?x=1", HitKind::Url))
        );
        assert_eq!(check(&index, "https://phish.example/login"), None);
        assert_eq!(check(&index, "https://phish.example/"), None);
        let ip_hit = Some(("b", "192.0.2.1", HitKind::Host));
        assert_eq!(check(&index, "http://192.0.2.1/x"), ip_hit);
        assert_eq!(check(&index, "http://0xc0000201/x"), ip_hit);
        assert_eq!(check(&index, "http://[::ffff:192.0.2.1]/x"), ip_hit);
        assert_eq!(check(&index, "http://192.0.2.10/x"), None);
        assert_eq!(
            check(&index, "http://[2001:DB8:0::1]:8080/"),
            Some(("b", "2001:db8::1", HitKind::Host))
        );
        assert_eq!(check(&index, "http://[2001:db8::2]/"), None);
        assert_eq!(
            check(&index, "https://x.sub.other.example/").map(|h| h.1),
            Some("sub.other.example")
        );
        assert_eq!(check(&index, "https://other.example/"), None);
    }

    #[test]
    fn url_entries_are_checked_first_and_the_first_list_wins() {
        let a = [host("evil.example")];
        let b = [
            url("https://evil.example/x"),
            host("evil.example"),
            host("www.evil.example"),
        ];
        let index = ReputationIndex::build([("a", &a[..]), ("b", &b[..]), ("a", &b[..])]);
        assert_eq!(index.lists().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(index.len(), 3);
        assert_eq!(
            check(&index, "https://evil.example/x"),
            Some(("b", "evil.example/x", HitKind::Url))
        );
        assert_eq!(
            check(&index, "https://evil.example/y"),
            Some(("a", "evil.example", HitKind::Host))
        );
        // The most specific name wins.
        assert_eq!(
            check(&index, "https://a.www.evil.example/y"),
            Some(("b", "www.evil.example", HitKind::Host))
        );
    }

    #[test]
    fn empty_index() {
        let index = ReputationIndex::default();
        assert!(index.is_empty());
        assert_eq!(check(&index, "https://evil.example/"), None);
        let index = ReputationIndex::build([("a", &[][..])]);
        assert!(index.is_empty());
        assert_eq!(
            format!("{index:?}"),
            r#"ReputationIndex { lists: ["a"], domains: 0, ips: 0, urls: 0 }"#
        );
    }

    #[test]
    fn added_is_what_is_new_not_what_moved() {
        let old_a = [
            host("kept.example"),
            host("moved.example"),
            host("192.0.2.1"),
        ];
        let old = ReputationIndex::build([("a", &old_a[..])]);
        let new_a = [
            host("kept.example"),
            host("new.example"),
            url("http://new.example/x"),
        ];
        let new_b = [
            host("moved.example"),
            host("192.0.2.1"),
            host("192.0.2.2"),
            host("::1"),
        ];
        let new = ReputationIndex::build([("a", &new_a[..]), ("b", &new_b[..])]);
        let h = |s: &str| CanonicalHost::parse(s).unwrap();
        assert_eq!(
            new.added(&old),
            [
                Added::Host {
                    host: h("new.example"),
                    list: "a".into()
                },
                Added::Host {
                    host: h("192.0.2.2"),
                    list: "b".into()
                },
                Added::Host {
                    host: h("::1"),
                    list: "b".into()
                },
                Added::Url {
                    key: "new.example/x".into(),
                    list: "a".into()
                },
            ]
        );
        assert_eq!(old.added(&new), []);
        assert_eq!(old.added(&ReputationIndex::default()).len(), 3);
    }
}
