//! The bot rules: user-agent patterns and crawler ranges from data files, behaviour thresholds.
//!
//! The lists are data, not code, because they go stale faster than we release: the shipped
//! copies (`analytics/data/bot-agents.txt`, `analytics/data/crawler-ranges.txt`, compiled in)
//! are the default, and an operator's file replaces either one whole. Each file's header
//! documents its format. A malformed line refuses the file with its path and line number: a
//! processor quietly running with half its rules would count bots as people.
//!
//! **User agents** are matched case-insensitively, substrings with one Aho-Corasick automaton and
//! regexes with one `RegexSet`, so the cost does not grow with the number of rules; a user agent
//! that starts with none of the file's browser prefixes is automation. `allow` lines carve
//! exceptions out of the generic rules (`bot` must not catch a "Cubot" phone): a rule's match that lies inside an allow
//! match is ignored. Substrings rather than word boundaries, because the long tail of bots names
//! itself `SomethingBot/1.0`, which a word-boundary `bot` would miss.
//!
//! **Crawler ranges**: an event carries only its client's /24 (IPv4) or /48 (IPv6), never the
//! address, so a range matches an event when the two overlap: the range contains the event's
//! network (prefix ≤ 24, or ≤ 48), or lies inside it (a Googlebot /28 marks its whole /24). The
//! cost is one hash probe: ranges down to /16 (/40) are expanded into their /24s (/48s), at most
//! 256 entries each; only the rare shorter ranges need a probe per distinct prefix length.

use std::fmt;
use std::net::IpAddr;
use std::path::Path;

use aho_corasick::{AhoCorasick, MatchKind};
use hashbrown::HashMap;
use lasthop_core::click::Net;

/// The shipped user-agent rules.
const BUILTIN_AGENTS: &str = include_str!("../data/bot-agents.txt");
/// The shipped crawler ranges.
const BUILTIN_CRAWLERS: &str = include_str!("../data/crawler-ranges.txt");
/// The default of [`Rules::max_codes_per_minute`].
pub const DEFAULT_MAX_CODES_PER_MINUTE: u32 = 30;
/// The default of [`Rules::burst_codes`].
pub const DEFAULT_BURST_CODES: u32 = 5;
/// The default of [`Rules::burst_secs`].
pub const DEFAULT_BURST_SECS: u32 = 5;
/// The longest user-agent substring a rule may have (an event's user agent is at most 256 bytes).
const MAX_PATTERN: usize = 256;
/// The longest crawler name.
const MAX_NAME: usize = 64;

/// How a rules file's regexes are compiled, alone and as one set (two builder types with the
/// same options): case-insensitive, ASCII classes (`\w`, `\b`, `\d` as the maintained
/// lists' JavaScript means them), over bytes.
macro_rules! regex_options {
    ($builder:expr) => {
        $builder
            .case_insensitive(true)
            .unicode(false)
            .size_limit(REGEX_SIZE_LIMIT)
            .dfa_size_limit(REGEX_SIZE_LIMIT)
    };
}

/// The rules a [`crate::Classifier`] applies.
pub struct Rules {
    /// A visitor fetching more than this many distinct codes within one minute is a bot.
    pub max_codes_per_minute: u32,
    /// One user agent on one public network (an event's /24 or /48) fetching this many distinct
    /// codes within one [`burst_secs`](Self::burst_secs) window is a bot from that fetch on, for
    /// the rest of the window: a mail security scanner opening every link of a message, a
    /// link-preview service unfurling every link of a post, with a browser's user agent. 0 turns
    /// the rule off.
    pub burst_codes: u32,
    /// The burst rule's window, in seconds of event time.
    pub burst_secs: u32,
    agents: AgentRules,
    crawlers: CrawlerRanges,
}

impl fmt::Debug for Rules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rules")
            .field("max_codes_per_minute", &self.max_codes_per_minute)
            .field("burst_codes", &self.burst_codes)
            .field("burst_secs", &self.burst_secs)
            .field("agent_rules", &self.agent_rules())
            .field("crawler_ranges", &self.crawlers.count)
            .finish()
    }
}

/// Why a rules file was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RulesError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// A line is malformed.
    #[error("{path}:{line}: {why}")]
    Line {
        /// The file.
        path: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        why: String,
    },
    /// The patterns, each valid, could not be compiled together (far more than any real list).
    #[error("{path}: {why}")]
    Build {
        /// The file.
        path: String,
        /// What the matcher builder said.
        why: String,
    },
}

/// What kind of bot a user-agent rule names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AgentKind {
    /// A search-engine or AI crawler.
    Crawler,
    /// A link-preview fetcher (chat apps, social networks).
    Preview,
    /// An HTTP library, command-line tool or headless browser (and the empty user agent).
    Automation,
    /// An uptime or performance monitor.
    Monitor,
}

impl AgentKind {
    /// The name used in the rules file.
    pub fn as_str(&self) -> &'static str {
        match self {
            AgentKind::Crawler => "crawler",
            AgentKind::Preview => "preview",
            AgentKind::Automation => "automation",
            AgentKind::Monitor => "monitor",
        }
    }
}

impl Rules {
    /// The rules shipped in `analytics/data/`.
    pub fn builtin() -> Rules {
        // The shipped files are compiled in and parsed by the `builtin_rules_parse` test, so this
        // cannot fail in a build that passed its tests.
        Rules::parse(BUILTIN_AGENTS.as_bytes(), BUILTIN_CRAWLERS.as_bytes())
            .expect("the shipped rules files parse")
    }

    /// The shipped rules with either file replaced by an operator's own.
    pub fn load(agents: Option<&Path>, crawlers: Option<&Path>) -> Result<Rules, RulesError> {
        let agents = match agents {
            Some(path) => AgentRules::parse(&read(path)?, &path.display().to_string())?,
            None => AgentRules::parse(BUILTIN_AGENTS.as_bytes(), "builtin bot-agents.txt")?,
        };
        let crawlers = match crawlers {
            Some(path) => CrawlerRanges::parse(&read(path)?, &path.display().to_string())?,
            None => {
                CrawlerRanges::parse(BUILTIN_CRAWLERS.as_bytes(), "builtin crawler-ranges.txt")?
            }
        };
        Ok(Rules {
            max_codes_per_minute: DEFAULT_MAX_CODES_PER_MINUTE,
            burst_codes: DEFAULT_BURST_CODES,
            burst_secs: DEFAULT_BURST_SECS,
            agents,
            crawlers,
        })
    }

    /// Rules from the two files' contents (in the shipped files' formats).
    pub fn parse(agents: &[u8], crawlers: &[u8]) -> Result<Rules, RulesError> {
        Ok(Rules {
            max_codes_per_minute: DEFAULT_MAX_CODES_PER_MINUTE,
            burst_codes: DEFAULT_BURST_CODES,
            burst_secs: DEFAULT_BURST_SECS,
            agents: AgentRules::parse(agents, "bot-agents")?,
            crawlers: CrawlerRanges::parse(crawlers, "crawler-ranges")?,
        })
    }

    /// The kind of bot `user_agent` names, if any; the empty user agent is automation.
    pub fn match_agent(&self, user_agent: &str) -> Option<AgentKind> {
        if user_agent.is_empty() {
            return Some(AgentKind::Automation);
        }
        self.agents.find(user_agent)
    }

    /// The crawler whose published range overlaps `net`, if any.
    pub fn crawler_range(&self, net: Net) -> Option<&str> {
        let idx = match net {
            Net::V4([a, b, c]) => self
                .crawlers
                .v4
                .get(u64::from(u32::from_be_bytes([0, a, b, c]))),
            Net::V6(p) => self.crawlers.v6.get(u64::from_be_bytes([
                0, 0, p[0], p[1], p[2], p[3], p[4], p[5],
            ])),
        }?;
        self.crawlers.names.get(idx as usize).map(|n| &**n)
    }

    /// How many user-agent rules (exceptions included) are loaded.
    pub fn agent_rules(&self) -> usize {
        self.agents.substrings.len() + self.agents.each.len()
    }

    /// How many crawler ranges are loaded.
    pub fn crawler_ranges(&self) -> usize {
        self.crawlers.count
    }
}

fn read(path: &Path) -> Result<Vec<u8>, RulesError> {
    std::fs::read(path).map_err(|source| RulesError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// The non-comment lines of a rules file: (1-based number, trimmed text).
fn lines<'a>(
    text: &'a [u8],
    path: &'a str,
) -> impl Iterator<Item = Result<(usize, &'a str), RulesError>> + 'a {
    text.split(|&b| b == b'\n')
        .enumerate()
        .filter_map(move |(i, raw)| {
            let line = match std::str::from_utf8(raw) {
                Ok(s) => s.trim(),
                Err(_) => return Some(Err(line_error(path, i + 1, "not UTF-8"))),
            };
            if line.is_empty() || line.starts_with('#') {
                return None;
            }
            Some(Ok((i + 1, line)))
        })
}

fn line_error(path: &str, line: usize, why: impl Into<String>) -> RulesError {
    RulesError::Line {
        path: path.to_owned(),
        line,
        why: why.into(),
    }
}

/// The user-agent rules, compiled: substrings in one Aho-Corasick automaton, regexes in one
/// `RegexSet`, each a single pass over the user agent; spans are asked for only of the
/// patterns that matched.
#[derive(Debug)]
struct AgentRules {
    matcher: AhoCorasick,
    /// Per substring: its rule.
    substrings: Vec<Rule>,
    regexes: regex::bytes::RegexSet,
    /// Per regex (the set's order): the same regex alone, for its spans, and its rule.
    each: Vec<(regex::bytes::Regex, Rule)>,
    /// Every real browser's user agent starts with one of these; empty: no such rule.
    browser_prefixes: Vec<String>,
}

/// One line of the file: the kind it names (`None` for an `allow` exception) and its place in
/// the file (the first matching rule names the kind).
#[derive(Debug, Clone, Copy)]
struct Rule {
    kind: Option<AgentKind>,
    line: usize,
}

impl AgentRules {
    fn parse(text: &[u8], path: &str) -> Result<AgentRules, RulesError> {
        let (mut substrings, mut substring_rules) = (Vec::new(), Vec::new());
        let (mut regexes, mut regex_rules) = (Vec::new(), Vec::new());
        let mut browser_prefixes = Vec::new();
        for item in lines(text, path) {
            let (n, line) = item?;
            let (kind, pattern) = line
                .split_once(|c: char| c.is_ascii_whitespace())
                .ok_or_else(|| line_error(path, n, "expected `<kind> <substring>`"))?;
            let pattern = pattern.trim();
            if pattern.len() > MAX_PATTERN {
                return Err(line_error(
                    path,
                    n,
                    format!("pattern longer than {MAX_PATTERN} bytes"),
                ));
            }
            if !pattern.bytes().all(|b| (0x20..0x7f).contains(&b)) {
                return Err(line_error(path, n, "pattern must be printable ASCII"));
            }
            let kind = match kind {
                "crawler" => Some(AgentKind::Crawler),
                "preview" => Some(AgentKind::Preview),
                "automation" => Some(AgentKind::Automation),
                "monitor" => Some(AgentKind::Monitor),
                "allow" => None,
                "browser-prefix" => {
                    browser_prefixes.push(pattern.to_owned());
                    continue;
                }
                other => {
                    return Err(line_error(
                        path,
                        n,
                        format!(
                            "unknown kind {other:?} (crawler, preview, automation, monitor, allow, browser-prefix)"
                        ),
                    ))
                }
            };
            let rule = Rule { kind, line: n };
            match pattern.strip_prefix('~') {
                Some("") => {
                    return Err(line_error(
                        path,
                        n,
                        "empty regex (it would match everything)",
                    ))
                }
                Some(re) => {
                    let one = regex_builder(re)
                        .build()
                        .map_err(|e| line_error(path, n, format!("regex: {e}")))?;
                    regexes.push(re.to_owned());
                    regex_rules.push((one, rule));
                }
                None => {
                    substrings.push(pattern.to_owned());
                    substring_rules.push(rule);
                }
            }
        }
        let build_error = |why: String| RulesError::Build {
            path: path.to_owned(),
            why,
        };
        let matcher = AhoCorasick::builder()
            .ascii_case_insensitive(true)
            .match_kind(MatchKind::Standard)
            .build(&substrings)
            .map_err(|e| build_error(e.to_string()))?;
        let mut set = regex::bytes::RegexSetBuilder::new(&regexes);
        regex_options!(set);
        let set = set.build().map_err(|e| build_error(e.to_string()))?;
        Ok(AgentRules {
            matcher,
            substrings: substring_rules,
            regexes: set,
            each: regex_rules,
            browser_prefixes,
        })
    }

    /// The kind of the first rule, in file order, that matches outside every exception; then,
    /// if none does, automation for a user agent no browser would send (no browser prefix).
    /// File order lets a specific rule (`Slackbot`, a preview) win over a generic one (`bot`)
    /// that matches the same bytes. Exceptions need every match, overlapping ones included;
    /// user agents are short and the classifier caches verdicts per user agent, so this runs
    /// once per distinct string.
    fn find(&self, ua: &str) -> Option<AgentKind> {
        let bytes = ua.as_bytes();
        let mut allowed: Vec<(usize, usize)> = Vec::new();
        // (line, kind, start, end) of each rule match.
        let mut hits: Vec<(usize, AgentKind, usize, usize)> = Vec::new();
        let mut record = |rule: &Rule, start: usize, end: usize| match rule.kind {
            Some(kind) => hits.push((rule.line, kind, start, end)),
            None => allowed.push((start, end)),
        };
        for m in self.matcher.find_overlapping_iter(ua) {
            if let Some(rule) = self.substrings.get(m.pattern().as_usize()) {
                record(rule, m.start(), m.end());
            }
        }
        for i in self.regexes.matches(bytes).iter() {
            if let Some((re, rule)) = self.each.get(i) {
                // A match at every start, overlapping ones included (`find_at` keeps `^` and
                // `\b` seeing the whole string), as the substrings' overlapping search does.
                let mut at = 0;
                while let Some(m) = re.find_at(bytes, at) {
                    record(rule, m.start(), m.end());
                    at = m.start() + 1;
                    if at > bytes.len() {
                        break;
                    }
                }
            }
        }
        let best = hits
            .iter()
            .filter(|&&(_, _, s, e)| !allowed.iter().any(|&(a, b)| a <= s && e <= b))
            .min_by_key(|&&(line, _, _, _)| line);
        if let Some(&(_, kind, _, _)) = best {
            return Some(kind);
        }
        let browser = self.browser_prefixes.is_empty()
            || self
                .browser_prefixes
                .iter()
                .any(|p| ua.starts_with(p.as_str()));
        (!browser).then_some(AgentKind::Automation)
    }
}

fn regex_builder(pattern: &str) -> regex::bytes::RegexBuilder {
    let mut b = regex::bytes::RegexBuilder::new(pattern);
    regex_options!(b);
    b
}

/// Compiled-size ceiling for the rules' regexes (the shipped ~1,800 compile to a few MB).
const REGEX_SIZE_LIMIT: usize = 256 << 20;

/// Published crawler networks, keyed by the event-sized network (/24 or /48) they overlap.
#[derive(Debug, Default)]
struct CrawlerRanges {
    names: Vec<Box<str>>,
    v4: PrefixTable,
    v6: PrefixTable,
    count: usize,
}

impl CrawlerRanges {
    fn parse(text: &[u8], path: &str) -> Result<CrawlerRanges, RulesError> {
        let mut out = CrawlerRanges {
            v4: PrefixTable::new(24),
            v6: PrefixTable::new(48),
            ..CrawlerRanges::default()
        };
        let mut name_index: HashMap<&str, u32> = HashMap::new();
        for item in lines(text, path) {
            let (n, line) = item?;
            let mut words = line.split_ascii_whitespace();
            let (Some(cidr), Some(name), None) = (words.next(), words.next(), words.next()) else {
                return Err(line_error(path, n, "expected `<CIDR> <name>`"));
            };
            let (ip, len) = parse_cidr(cidr).map_err(|why| line_error(path, n, why))?;
            if name.len() > MAX_NAME
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            {
                return Err(line_error(path, n, "name must be 1-64 of [A-Za-z0-9._-]"));
            }
            let next = out.names.len() as u32;
            let idx = *name_index.entry(name).or_insert(next);
            if idx == next {
                out.names.push(name.into());
            }
            match ip {
                IpAddr::V4(v4) => out.v4.insert(u64::from(u32::from(v4) >> 8), len, idx),
                IpAddr::V6(v6) => out.v6.insert((u128::from(v6) >> 80) as u64, len, idx),
            }
            out.count += 1;
        }
        Ok(out)
    }
}

/// `a.b.c.d/len` or `x::/len`, host bits zero.
fn parse_cidr(cidr: &str) -> Result<(IpAddr, u8), String> {
    let (addr, len) = cidr
        .split_once('/')
        .ok_or("expected a CIDR, e.g. 66.249.64.0/19")?;
    let ip: IpAddr = addr
        .parse()
        .map_err(|_| format!("{addr:?} is not an IP address"))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len: u8 = len
        .parse()
        .ok()
        .filter(|&l| l <= max && len.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| format!("prefix length {len:?} is not 0..={max}"))?;
    let host_bits_set = match ip {
        IpAddr::V4(v4) => u32::from(v4).checked_shl(u32::from(len)).unwrap_or(0) != 0,
        IpAddr::V6(v6) => u128::from(v6).checked_shl(u32::from(len)).unwrap_or(0) != 0,
    };
    if host_bits_set {
        return Err(format!("{cidr} has host bits set"));
    }
    Ok((ip, len))
}

/// Ranges over `unit`-bit network keys (24 for IPv4 /24s, 48 for IPv6 /48s).
#[derive(Debug, Default)]
struct PrefixTable {
    unit: u8,
    /// Every event network a range of prefix ≥ unit − 8 overlaps; value: name index.
    exact: HashMap<u64, u32>,
    /// Shorter ranges by prefix length, keyed by their top `len` bits.
    short: Vec<(u8, HashMap<u64, u32>)>,
}

impl PrefixTable {
    /// Ranges at most this many bits shorter than the unit are expanded (≤ 256 entries each).
    const EXPAND_BITS: u8 = 8;

    fn new(unit: u8) -> PrefixTable {
        PrefixTable {
            unit,
            ..PrefixTable::default()
        }
    }

    /// Adds the range whose first `unit` bits are `key`, of prefix `len`; the first name wins.
    fn insert(&mut self, key: u64, len: u8, name: u32) {
        if len >= self.unit {
            self.exact.entry(key).or_insert(name);
        } else if len + Self::EXPAND_BITS >= self.unit {
            let span = 1u64 << (self.unit - len);
            for k in key..key + span {
                self.exact.entry(k).or_insert(name);
            }
        } else {
            let top = key >> (self.unit - len);
            let table = match self.short.iter().position(|(l, _)| *l == len) {
                Some(i) => &mut self.short[i].1,
                None => {
                    self.short.push((len, HashMap::new()));
                    self.short.sort_by_key(|(l, _)| *l);
                    let i = self.short.iter().position(|(l, _)| *l == len).unwrap_or(0);
                    &mut self.short[i].1
                }
            };
            table.entry(top).or_insert(name);
        }
    }

    fn get(&self, key: u64) -> Option<u32> {
        if let Some(&name) = self.exact.get(&key) {
            return Some(name);
        }
        self.short
            .iter()
            .find_map(|(len, table)| table.get(&(key >> (self.unit - len))).copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn builtin_rules_parse() {
        let rules = Rules::builtin();
        assert!(rules.agent_rules() > 100, "{rules:?}");
        assert!(rules.crawler_ranges() > 100, "{rules:?}");
        assert_eq!(rules.max_codes_per_minute, 30);
    }

    /// Every operator whose list the shipped file holds is matched: the first range of each
    /// section (as `refresh-crawler-ranges` writes them) classifies as a crawler net.
    #[test]
    fn shipped_ranges_cover_each_published_list() {
        let rules = Rules::builtin();
        let mut seen = Vec::new();
        for line in BUILTIN_CRAWLERS.lines() {
            let mut words = line.split_whitespace();
            let (Some(cidr), Some(name), None) = (words.next(), words.next(), words.next()) else {
                continue;
            };
            if line.starts_with('#') || seen.iter().any(|s| s == name) {
                continue;
            }
            seen.push(name.to_owned());
            let net = match parse_cidr(cidr).unwrap().0 {
                IpAddr::V4(a) => {
                    let o = a.octets();
                    Net::V4([o[0], o[1], o[2]])
                }
                IpAddr::V6(a) => {
                    let o = a.octets();
                    Net::V6([o[0], o[1], o[2], o[3], o[4], o[5]])
                }
            };
            assert!(rules.crawler_range(net).is_some(), "{name}: {cidr}");
        }
        for want in [
            "googlebot",
            "google-special",
            "google-user-fetchers",
            "bingbot",
            "applebot",
            "duckduckbot",
            "gptbot",
            "oai-searchbot",
            "chatgpt-user",
            "perplexitybot",
            "perplexity-user",
            "duckassistbot",
            "ccbot",
            "claudebot",
        ] {
            assert!(
                seen.iter().any(|s| s == want),
                "{want} missing from {seen:?}"
            );
        }
    }

    #[test]
    fn matches_real_bots_and_not_browsers() {
        let rules = Rules::builtin();
        let bots = [
            ("Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)", AgentKind::Crawler),
            ("Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; GPTBot/1.2; +https://openai.com/gptbot)", AgentKind::Crawler),
            ("facebookexternalhit/1.1 (+http://www.facebook.com/externalhit_uatext.php)", AgentKind::Preview),
            ("Slackbot-LinkExpanding 1.0 (+https://api.slack.com/robots)", AgentKind::Preview),
            ("WhatsApp/2.23.20.0", AgentKind::Preview),
            ("curl/8.5.0", AgentKind::Automation),
            ("python-requests/2.31.0", AgentKind::Automation),
            ("Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) HeadlessChrome/120.0.0.0 Safari/537.36", AgentKind::Automation),
            ("Mozilla/5.0+(compatible; UptimeRobot/2.0; http://www.uptimerobot.com/)", AgentKind::Monitor),
            ("", AgentKind::Automation),
            ("SomeNewThingBot/0.1", AgentKind::Crawler),
            ("GOOGLEBOT", AgentKind::Crawler),
        ];
        for (ua, kind) in bots {
            assert_eq!(rules.match_agent(ua), Some(kind), "{ua}");
        }
        let people = [
            "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
            "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1",
            "Mozilla/5.0 (Linux; Android 10; Cubot X30 Build/QP1A.190711.020) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Mobile Safari/537.36",
            "Mozilla/5.0 (Linux; Android 9; CUBOT_P30) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/100.0 Mobile Safari/537.36",
        ];
        for ua in people {
            assert_eq!(rules.match_agent(ua), None, "{ua}");
        }
        // An exception only covers what it contains: a real bot rule elsewhere still counts.
        assert_eq!(
            rules.match_agent("Cubot; curl/8.0"),
            Some(AgentKind::Automation)
        );
    }

    #[test]
    fn regexes_exceptions_and_browser_prefixes() {
        let rules = Rules::parse(
            b"preview ~^Mail/\\d+ CFNetwork/\n\
              crawler ~(?:^|[^g])news\n\
              allow ~(?:^|[^g])newssapphire\n\
              crawler ~google\n\
              allow ~(?: channel/|google/)google\n\
              allow ~google(?:app| pixel)\n\
              automation ~Chrome/[1-4]?\\d\\.\n\
              browser-prefix Mozilla/\n\
              browser-prefix Opera/\n",
            b"",
        )
        .unwrap();
        let kind = |ua: &str| rules.match_agent(ua);
        // Case-insensitive, and the first rule in the file names the kind.
        assert_eq!(
            kind("Mail/3445 CFNetwork/889 NEWS"),
            Some(AgentKind::Preview)
        );
        assert_eq!(
            kind("Mozilla/5.0 NewsBlur Feed Fetcher"),
            Some(AgentKind::Crawler)
        );
        // The exceptions carry the lookarounds: Google's own apps and phones are people...
        assert_eq!(
            kind("Mozilla/5.0 (Linux; Android 14; Google Pixel 8)"),
            None
        );
        assert_eq!(kind("Mozilla/5.0 GoogleApp/15.2"), None);
        assert_eq!(kind("Mozilla/5.0 Newssapphire/2"), None);
        assert_eq!(kind("Mozilla/5.0 x channel/google"), None);
        // Every match counts, overlapping ones too: each `google` here follows `google/`.
        assert_eq!(kind("Mozilla/5.0 x google/google/google"), None);
        // ...but a match outside them still counts.
        assert_eq!(
            kind("Mozilla/5.0 GoogleApp/15.2 Google-Read-Aloud"),
            Some(AgentKind::Crawler)
        );
        // ASCII classes as JavaScript means them: Chrome 49 is retired, 131 is not.
        assert_eq!(
            kind("Mozilla/5.0 Chrome/49.0.2623.112"),
            Some(AgentKind::Automation)
        );
        assert_eq!(kind("Mozilla/5.0 Chrome/131.0.0.0"), None);
        // No browser prefix: a program; no prefix lines at all: no such rule.
        assert_eq!(kind("Opera/9.80 (J2ME/MIDP; Opera Mini/9.80)"), None);
        assert_eq!(
            kind("VLC/3.0.20 LibVLC/3.0.20"),
            Some(AgentKind::Automation)
        );
        assert_eq!(kind("mozilla/5.0 lower case"), Some(AgentKind::Automation));
        let bare = Rules::parse(b"crawler x\n", b"").unwrap();
        assert_eq!(bare.match_agent("VLC/3.0.20"), None);
        assert_eq!(rules.agent_rules(), 7);
    }

    #[test]
    fn crawler_ranges_overlap_the_event_network() {
        let rules = Rules::parse(
            b"",
            b"# test\n66.249.64.0/19 googlebot\n34.22.85.0/27 googlebot\n17.0.0.0/8 apple\n\
              2001:4860:4801:10::/60 googlebot\n2a00:1000::/20 wide\n10.0.0.0/16 lan\n",
        )
        .unwrap();
        let v4 = |a, b, c| Net::V4([a, b, c]);
        assert_eq!(rules.crawler_range(v4(66, 249, 66)), Some("googlebot"));
        assert_eq!(rules.crawler_range(v4(66, 249, 95)), Some("googlebot"));
        assert_eq!(rules.crawler_range(v4(66, 249, 96)), None);
        assert_eq!(rules.crawler_range(v4(34, 22, 85)), Some("googlebot"));
        assert_eq!(rules.crawler_range(v4(34, 22, 86)), None);
        assert_eq!(rules.crawler_range(v4(17, 200, 1)), Some("apple"));
        assert_eq!(rules.crawler_range(v4(10, 0, 255)), Some("lan"));
        assert_eq!(rules.crawler_range(v4(10, 1, 0)), None);
        assert_eq!(
            rules.crawler_range(Net::V6([0x20, 0x01, 0x48, 0x60, 0x48, 0x01])),
            Some("googlebot")
        );
        assert_eq!(
            rules.crawler_range(Net::V6([0x20, 0x01, 0x48, 0x60, 0x48, 0x02])),
            None
        );
        assert_eq!(
            rules.crawler_range(Net::V6([0x2a, 0x00, 0x1f, 0xff, 0, 1])),
            Some("wide")
        );
        assert_eq!(
            rules.crawler_range(Net::V6([0x2a, 0x00, 0x20, 0, 0, 0])),
            None
        );
        let builtin = Rules::builtin();
        assert_eq!(builtin.crawler_range(v4(66, 249, 66)), Some("googlebot"));
        assert_eq!(builtin.crawler_range(v4(157, 55, 39)), Some("bingbot"));
        assert_eq!(builtin.crawler_range(v4(17, 241, 75)), Some("applebot"));
        assert_eq!(builtin.crawler_range(v4(192, 0, 2)), None);
    }

    #[test]
    fn malformed_lines_name_file_and_line() {
        let cases: [(&[u8], &[u8], usize); 12] = [
            (b"crawler x\ncrawler ~\n", b"", 2),
            (b"crawler Googlebot\nrobot x\n", b"", 2),
            // A regex that does not compile, and one with a lookaround the engine lacks.
            (b"crawler ~ok\ncrawler ~[\\w-.]\n", b"", 2),
            (b"\n\nallow ~(?<!x)y\n", b"", 3),
            (b"# c\n\ncrawler\n", b"", 3),
            (b"crawler caf\xc3\xa9\n", b"", 1),
            (b"crawler \xff\n", b"", 1),
            (b"", b"10.0.0.0/33 x\n", 1),
            (b"", b"# ok\n10.0.0.1/24 x\n", 2),
            (b"", b"10.0.0.0/8\n", 1),
            (b"", b"10.0.0.0/8 a b\n", 1),
            (b"", b"nonsense/8 a\n", 1),
        ];
        for (agents, crawlers, line) in cases {
            match Rules::parse(agents, crawlers) {
                Err(RulesError::Line { line: l, .. }) => assert_eq!(l, line),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn load_replaces_one_file() {
        let dir = std::env::temp_dir().join(format!("lasthop-rules-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let agents = dir.join("agents.txt");
        std::fs::write(&agents, "monitor MyProbe\n").unwrap();
        let rules = Rules::load(Some(&agents), None).unwrap();
        assert_eq!(rules.match_agent("myprobe/1"), Some(AgentKind::Monitor));
        assert_eq!(rules.match_agent("Googlebot"), None);
        assert_eq!(
            rules.crawler_range(Net::V4([66, 249, 66])),
            Some("googlebot")
        );
        let missing = dir.join("missing.txt");
        assert!(matches!(
            Rules::load(None, Some(&missing)),
            Err(RulesError::Io { .. })
        ));
        std::fs::write(&agents, "monitor MyProbe\nbogus\n").unwrap();
        let err = Rules::load(Some(&agents), None).unwrap_err();
        assert!(
            err.to_string()
                .ends_with("agents.txt:2: expected `<kind> <substring>`"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    proptest! {
        #[test]
        fn garbage_files_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = Rules::parse(&bytes, b"");
            let _ = Rules::parse(b"", &bytes);
        }

        #[test]
        fn plausible_lines_never_panic(
            lines in proptest::collection::vec("[a-z]{0,10}[ \t]{0,2}[ -~]{0,30}", 0..8),
            ranges in proptest::collection::vec("[0-9a-f:.]{0,20}/[0-9]{0,4} [a-z#]{0,5}", 0..8),
        ) {
            let _ = Rules::parse(lines.join("\n").as_bytes(), ranges.join("\n").as_bytes());
        }
    }
}
