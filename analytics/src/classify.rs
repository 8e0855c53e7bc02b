//! Per-event verdicts.
//!
//! The rules run in order of cost and certainty, and the first that fires names the reason:
//! 1. **HEAD**: browsers following a link send GET; HEAD is link checkers and unfurlers.
//! 2. **Prefetch**: the request said it was a prefetch or a preview (`Sec-Purpose`, `Purpose`,
//!    `X-Purpose`, `X-Moz`; the edge sets the event's flag): fetched ahead of a person who may
//!    never click. One who does is served from the browser's prefetch cache and never reaches
//!    the edge again, so such clicks are undercounted; `bot_reasons.prefetch` shows how many.
//! 3. **User agent** matches a bot rule, or is empty ([`Rules::match_agent`]).
//! 4. **Crawler net**: the event's /24 or /48 overlaps a published crawler range (crawlers that
//!    render with a browser's user agent still come from their own networks).
//! 5. **Burst**: one user agent on one public network (the event's /24 or /48) that fetched
//!    [`Rules::burst_codes`] distinct codes within one [`Rules::burst_secs`] window of event
//!    time is a bot from the event that reaches the count on, for the rest of that window. Mail
//!    security scanners open every link of a message within a second or two, and link-preview
//!    services unfurl every link of a post, from a few addresses of a datacenter network and
//!    often with a browser's user agent. Keying on the user agent as well keeps the people
//!    behind one public NAT exit (a carrier's, a university's, a relay's) apart unless they
//!    also share a browser build and open five different short links within seconds; a hot
//!    link clicked by many is one code. The fetches before the count is reached stay counted
//!    as people: nothing can be uncounted from a HyperLogLog sketch, and holding events back
//!    would delay every count. Non-public networks (loopback, private, shared address space,
//!    link-local, benchmarking, documentation, Teredo) are exempt: behind them is a proxy, a
//!    load balancer or a test, and every client would look like one network. Windows are
//!    aligned to multiples of the window, so a burst split across a boundary needs the count
//!    on one side of it.
//! 6. **Behaviour**: a visitor hash that fetched more than [`Rules::max_codes_per_minute`]
//!    distinct codes (links: the same alias on two domains is two) within one UTC minute of event time (`at_ms / 60000`) is a bot from the
//!    event that crosses the threshold on, for the rest of that minute. People click a few
//!    links a minute; scrapers walking codes click hundreds. Only events the first rules let
//!    through are counted by 5 and 6: known bots would spend state the rules do not need.
//!
//! Cost: the processor must keep up with ≥ 350,000 events/s on one core, so classification is
//! a few hash probes. Everything derived from the user agent (bot rule, device, browser, OS) is
//! computed once per distinct string and cached (real traffic has few distinct user agents; the
//! cache is cleared when it reaches [`UA_CACHE_MAX`] entries, which bounds its memory to a few
//! tens of MB even under a flood of random strings). The behaviour state holds only the newest
//! three minutes (the newest event minute seen, and the two before it for slightly late events),
//! the burst state the windows of the newest minute (twelve at the default 5 s); an event older
//! than that (an edge whose clock runs ahead, a backlog read writer by writer) is not judged by
//! them, so a recompute, which reads a day in time order, can judge a few more. Event time is the edge's clock, so an
//! edge with a clock far ahead would pause the rule until real time catches up.
//!
//! Device, browser and OS come from well-known user-agent tokens, not a full parser: enough for
//! an owner's breakdown. iPadOS 13+ asks for desktop pages and says "Macintosh", so those iPads
//! count as desktop macOS; nothing in the string can tell them apart.

use std::sync::Arc;

use hashbrown::hash_map::Entry;
use hashbrown::HashMap;
use lasthop_core::click::{ClickEvent, Method, Net};

use crate::rules::AgentKind;
use crate::Rules;

/// Distinct user agents the classifier remembers before it starts over.
pub const UA_CACHE_MAX: usize = 100_000;
/// Windows a [`Behaviour`] keeps at least: the newest and the two before it.
const MIN_WINDOWS_KEPT: u64 = 3;
/// Event time a [`Behaviour`] keeps windows for, at least (the burst rule's short windows).
const KEPT_MS: u64 = 60_000;

/// Why an event counts as a bot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BotReason {
    /// The user agent matched a crawler, preview-fetcher or automation pattern.
    UserAgent,
    /// The client's network lies in a published crawler range.
    CrawlerNet,
    /// The visitor fetched too many distinct codes within a minute.
    Behaviour,
    /// The visitor's network and user agent fetched many distinct codes within seconds.
    Burst,
    /// A HEAD request.
    Head,
    /// A prefetch or preview request.
    Prefetch,
}

impl BotReason {
    /// The name used in stats and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            BotReason::UserAgent => "user_agent",
            BotReason::CrawlerNet => "crawler_net",
            BotReason::Behaviour => "behaviour",
            BotReason::Burst => "burst",
            BotReason::Head => "head",
            BotReason::Prefetch => "prefetch",
        }
    }
}

/// A device class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    /// Desktop or laptop browser.
    Desktop,
    /// Phone.
    Mobile,
    /// Tablet.
    Tablet,
    /// A bot of any kind.
    Bot,
    /// Anything else.
    Other,
}

impl Device {
    /// The name used in stats.
    pub fn as_str(&self) -> &'static str {
        match self {
            Device::Desktop => "desktop",
            Device::Mobile => "mobile",
            Device::Tablet => "tablet",
            Device::Bot => "bot",
            Device::Other => "other",
        }
    }
}

/// What the rules make of one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// `Some` when the event is a bot's.
    pub bot: Option<BotReason>,
    /// Device class.
    pub device: Device,
    /// Browser family ("Chrome", "Firefox", "Safari", …, "Other").
    pub browser: &'static str,
    /// OS family ("Windows", "macOS", "iOS", "Android", "Linux", …, "Other").
    pub os: &'static str,
}

impl Verdict {
    /// Whether the event is a bot's.
    pub fn is_bot(&self) -> bool {
        self.bot.is_some()
    }
}

/// Applies [`Rules`] to a stream of events; keeps the behaviour state and a user-agent cache.
#[derive(Debug)]
pub struct Classifier {
    rules: Arc<Rules>,
    agents: HashMap<Box<str>, AgentInfo>,
    behaviour: Behaviour,
    burst: Behaviour,
}

/// What one user-agent string says, worked out once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AgentInfo {
    /// A hash of the string, for the burst rule's (network, user agent) key.
    key: u64,
    bot: Option<AgentKind>,
    device: Device,
    browser: &'static str,
    os: &'static str,
}

impl Classifier {
    /// A classifier with empty state.
    pub fn new(rules: Arc<Rules>) -> Classifier {
        Classifier {
            agents: HashMap::new(),
            behaviour: Behaviour::new(60_000),
            burst: Behaviour::new(u64::from(rules.burst_secs.max(1)) * 1000),
            rules,
        }
    }

    /// The rules in force.
    pub fn rules(&self) -> &Arc<Rules> {
        &self.rules
    }

    /// Swaps in new rules (an operator reloaded the files); forgets cached user agents, keeps
    /// the behaviour state (and the burst state unless the window changed).
    pub fn set_rules(&mut self, rules: Arc<Rules>) {
        let window = u64::from(rules.burst_secs.max(1)) * 1000;
        if window != self.burst.window_ms {
            self.burst = Behaviour::new(window);
        }
        self.rules = rules;
        self.agents.clear();
    }

    /// The verdict on `event` (events should arrive in roughly time order for the behaviour rule).
    pub fn classify(&mut self, event: &ClickEvent<'_>) -> Verdict {
        let agent = self.agent(event.user_agent);
        let bot = if event.method == Method::Head {
            Some(BotReason::Head)
        } else if event.prefetch {
            Some(BotReason::Prefetch)
        } else if agent.bot.is_some() {
            Some(BotReason::UserAgent)
        } else if event
            .net
            .is_some_and(|net| self.rules.crawler_range(net).is_some())
        {
            Some(BotReason::CrawlerNet)
        } else if self.rules.burst_codes > 0
            && event.net.is_some_and(|net| {
                public(net)
                    && self.burst.over_limit(
                        net_key(net) ^ agent.key,
                        link_hash(event),
                        event.at_ms,
                        self.rules.burst_codes - 1,
                    )
            })
        {
            Some(BotReason::Burst)
        } else if self.behaviour.over_limit(
            event.visitor,
            link_hash(event),
            event.at_ms,
            self.rules.max_codes_per_minute,
        ) {
            Some(BotReason::Behaviour)
        } else {
            None
        };
        Verdict {
            bot,
            device: if bot.is_some() {
                Device::Bot
            } else {
                agent.device
            },
            browser: agent.browser,
            os: agent.os,
        }
    }

    fn agent(&mut self, ua: &str) -> AgentInfo {
        if let Some(info) = self.agents.get(ua) {
            return *info;
        }
        let bot = self.rules.match_agent(ua);
        let (device, browser, os) = parse_agent(ua);
        let info = AgentInfo {
            key: agent_key(ua),
            bot,
            device: if bot.is_some() { Device::Bot } else { device },
            browser,
            os,
        };
        if self.agents.len() >= UA_CACHE_MAX {
            self.agents.clear();
        }
        self.agents.insert(ua.into(), info);
        info
    }
}

/// Device class, browser family and OS family from well-known tokens. Order matters: Edge,
/// Opera and Samsung Internet also say "Chrome/", Chrome also says "Safari/", Android also says
/// "Linux", iOS also says "Mac OS X".
fn parse_agent(ua: &str) -> (Device, &'static str, &'static str) {
    let has = |token: &str| ua.contains(token);
    let android = has("Android");
    let device = if has("iPad")
        || has("Tablet")
        || has("Kindle")
        || has("Silk/")
        || (android && !has("Mobile"))
    {
        Device::Tablet
    } else if android || has("Mobile") || has("iPhone") || has("iPod") || has("Opera Mini") {
        Device::Mobile
    } else if has("Windows") || has("Macintosh") || has("X11") || has("CrOS") || has("Linux") {
        Device::Desktop
    } else {
        Device::Other
    };
    let browser = if has("SamsungBrowser/") {
        "Samsung Internet"
    } else if has("Edg/") || has("EdgA/") || has("EdgiOS/") || has("Edge/") {
        "Edge"
    } else if has("OPR/") || has("OPiOS/") || has("Opera") {
        "Opera"
    } else if has("Firefox/") || has("FxiOS/") {
        "Firefox"
    } else if has("Chrome/") || has("CriOS/") || has("Chromium/") {
        "Chrome"
    } else if has("Safari/") {
        "Safari"
    } else {
        "Other"
    };
    let os = if has("CrOS") {
        "ChromeOS"
    } else if has("iPhone") || has("iPad") || has("iPod") {
        "iOS"
    } else if android {
        "Android"
    } else if has("Windows") {
        "Windows"
    } else if has("Macintosh") || has("Mac OS X") {
        "macOS"
    } else if has("Linux") || has("X11") {
        "Linux"
    } else {
        "Other"
    };
    (device, browser, os)
}

/// FNV-1a: codes are short, and a collision merely undercounts one visitor's distinct codes.
/// Never [`MANY`] or [`BOT`].
fn code_hash(code: &str) -> u64 {
    fnv(code.as_bytes().iter()).min(BOT - 1)
}

/// [`code_hash`] of the event's link key ([`ClickEvent::link_key`], without building it): the
/// code on the default domain, `domain/code` on a branded one, so the rules count the same
/// alias on two domains as two links.
fn link_hash(event: &ClickEvent<'_>) -> u64 {
    fnv(event.link_key_parts().iter().flat_map(|part| part.iter())).min(BOT - 1)
}

fn fnv<'b>(bytes: impl Iterator<Item = &'b u8>) -> u64 {
    bytes.fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A user agent's part of the burst key: FNV-1a, spread over the word by a multiply so that
/// XOR with a [`net_key`] mixes every bit (computed once per distinct string).
fn agent_key(ua: &str) -> u64 {
    code_hash(ua).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// A network as one key: its bytes and its family, without hashing (no two collide).
fn net_key(net: Net) -> u64 {
    match net {
        Net::V4([a, b, c]) => u64::from_be_bytes([0, 0, 0, 0, 4, a, b, c]),
        Net::V6([a, b, c, d, e, f]) => u64::from_be_bytes([6, 0, a, b, c, d, e, f]),
    }
}

/// Whether `net` is globally routable (IANA's special-purpose registries): not loopback,
/// private (RFC 1918, IPv6 unique-local), shared address space (RFC 6598, carrier-grade NAT),
/// link-local, benchmarking (198.18.0.0/15, 2001:2::/48), documentation (2001:db8::/32,
/// 3fff::/20), Teredo (2001::/32), multicast or reserved.
fn public(net: Net) -> bool {
    match net {
        Net::V4([a, b, c]) => !matches!(
            (a, b, c),
            (0 | 10 | 127, _, _)
                | (100, 64..=127, _)
                | (169, 254, _)
                | (172, 16..=31, _)
                | (192, 0, 0 | 2)
                | (192, 168, _)
                | (198, 18 | 19, _)
                | (198, 51, 100)
                | (203, 0, 113)
                | (224..=255, _, _)
        ),
        // Global unicast is 2000::/3; everything else (::1, ::ffff:0:0/96, fc00::/7,
        // fe80::/10, multicast) is not.
        Net::V6([a, b, c, d, e, f]) => {
            a & 0xe0 == 0x20
                && !matches!(
                    [a, b, c, d, e, f],
                    [0x20, 0x01, 0x0d, 0xb8, ..]
                        | [0x20, 0x01, 0x00, 0x00, ..]
                        | [0x20, 0x01, 0x00, 0x02, 0x00, 0x00]
                        | [0x3f, 0xff, 0x00..=0x0f, ..]
                )
        }
    }
}

/// Distinct codes per key within windows of event time: the behaviour rule's visitors per
/// minute, and the burst rule's networks per few seconds.
///
/// Nearly every key fetches one code in a window, so a window is a flat map of key to one
/// 8-byte word (16 bytes an entry: a busy window holds every network of a few seconds), and
/// only the few keys with more codes spill into a second map.
#[derive(Debug)]
struct Behaviour {
    /// The window's length.
    window_ms: u64,
    /// Windows kept: the newest and those before it, for late events.
    kept: u64,
    /// The newest event window seen.
    newest: Option<u64>,
    /// Per kept window: what each key fetched in it.
    windows: Vec<(u64, Window)>,
    /// Emptied windows of pruned ones, kept for their allocation.
    spare: Vec<Window>,
}

/// One window: key → the hash of its only code, or [`MANY`] (its codes are in `many`), or
/// [`BOT`] (past the limit: a bot for the rest of the window).
#[derive(Debug, Default)]
struct Window {
    seen: HashMap<u64, u64>,
    many: HashMap<u64, Vec<u64>>,
}

/// Markers in [`Window::seen`]; [`code_hash`] never returns them.
const MANY: u64 = u64::MAX;
const BOT: u64 = u64::MAX - 1;

impl Window {
    fn clear(&mut self) {
        self.seen.clear();
        self.many.clear();
    }
}

impl Behaviour {
    /// Windows of `window_ms` (at least 1), kept for at least [`KEPT_MS`] of event time.
    fn new(window_ms: u64) -> Behaviour {
        let window_ms = window_ms.max(1);
        Behaviour {
            window_ms,
            kept: KEPT_MS.div_ceil(window_ms).max(MIN_WINDOWS_KEPT),
            newest: None,
            windows: Vec::new(),
            spare: Vec::new(),
        }
    }

    /// Records `key` fetching `code` (a [`code_hash`]) at `at_ms`; true when it is past `max`
    /// distinct codes within the window of `at_ms`.
    fn over_limit(&mut self, key: u64, code: u64, at_ms: u64, max: u32) -> bool {
        let at = at_ms / self.window_ms;
        let newest = match self.newest {
            Some(n) if n >= at => n,
            _ => {
                self.newest = Some(at);
                self.prune(at);
                at
            }
        };
        if at + self.kept <= newest {
            // Its window is gone: too late to judge.
            return false;
        }
        let window = match self.windows.iter().position(|(w, _)| *w == at) {
            Some(i) => &mut self.windows[i].1,
            None => {
                let window = self.spare.pop().unwrap_or_default();
                self.windows.push((at, window));
                let last = self.windows.len() - 1;
                &mut self.windows[last].1
            }
        };
        let max = max as usize;
        match window.seen.entry(key) {
            Entry::Vacant(e) => {
                e.insert(if max == 0 { BOT } else { code });
                max == 0
            }
            Entry::Occupied(mut e) => {
                let seen = e.get_mut();
                match *seen {
                    BOT => true,
                    MANY => {
                        let codes = window.many.entry(key).or_default();
                        if codes.contains(&code) {
                            false
                        } else if codes.len() >= max {
                            *seen = BOT;
                            window.many.remove(&key);
                            true
                        } else {
                            codes.push(code);
                            false
                        }
                    }
                    first if first == code => false,
                    first => {
                        if max <= 1 {
                            *seen = BOT;
                            true
                        } else {
                            *seen = MANY;
                            window.many.insert(key, vec![first, code]);
                            false
                        }
                    }
                }
            }
        }
    }

    /// Drops windows older than the kept ones, keeping their maps' allocations.
    fn prune(&mut self, newest: u64) {
        let mut i = 0;
        while i < self.windows.len() {
            if self.windows[i].0 + self.kept <= newest {
                let (_, mut window) = self.windows.swap_remove(i);
                window.clear();
                if self.spare.len() < MIN_WINDOWS_KEPT as usize {
                    self.spare.push(window);
                }
            } else {
                i += 1;
            }
        }
    }

    /// Keys held, over all windows.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.windows.iter().map(|(_, w)| w.seen.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lasthop_core::click::{EventId, Net};

    const CHROME_WIN: &str = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36";

    fn event<'a>(ua: &'a str, code: &'a str, visitor: u64, at_ms: u64) -> ClickEvent<'a> {
        ClickEvent {
            id: EventId::new(1, at_ms),
            at_ms,
            code,
            domain: "",
            pop: "fra1",
            country: Some(*b"DE"),
            method: Method::Get,
            tls: true,
            prefetch: false,
            protocol: Default::default(),
            early: false,
            visitor,
            net: Some(Net::V4([203, 0, 113])),
            user_agent: ua,
            referrer_host: "",
        }
    }

    fn classifier() -> Classifier {
        Classifier::new(Arc::new(Rules::builtin()))
    }

    #[test]
    fn people_are_people() {
        let mut c = classifier();
        let v = c.classify(&event(CHROME_WIN, "Ab3dE9x", 1, 0));
        assert_eq!(
            v,
            Verdict {
                bot: None,
                device: Device::Desktop,
                browser: "Chrome",
                os: "Windows"
            }
        );
        assert!(!v.is_bot());
    }

    #[test]
    fn reasons_in_order() {
        let mut c = classifier();
        let mut e = event("curl/8.5.0", "Ab3dE9x", 1, 0);
        e.method = Method::Head;
        assert_eq!(c.classify(&e).bot, Some(BotReason::Head));
        e.method = Method::Get;
        let v = c.classify(&e);
        assert_eq!((v.bot, v.device), (Some(BotReason::UserAgent), Device::Bot));
        assert_eq!(
            c.classify(&event("", "Ab3dE9x", 1, 0)).bot,
            Some(BotReason::UserAgent)
        );
        let mut e = event(CHROME_WIN, "Ab3dE9x", 1, 0);
        e.net = Some(Net::V4([66, 249, 66]));
        let v = c.classify(&e);
        assert_eq!(
            (v.bot, v.device, v.browser),
            (Some(BotReason::CrawlerNet), Device::Bot, "Chrome")
        );
        e.net = Some(Net::V6([0x20, 0x01, 0x48, 0x60, 0x48, 0x01]));
        assert_eq!(c.classify(&e).bot, Some(BotReason::CrawlerNet));
        e.net = None;
        assert_eq!(c.classify(&e).bot, None);
    }

    #[test]
    fn prefetches_are_bots_after_head() {
        let mut c = classifier();
        let mut e = event(CHROME_WIN, "Ab3dE9x", 1, 0);
        e.prefetch = true;
        let v = c.classify(&e);
        assert_eq!((v.bot, v.device), (Some(BotReason::Prefetch), Device::Bot));
        e.method = Method::Head;
        assert_eq!(c.classify(&e).bot, Some(BotReason::Head));
        assert_eq!(BotReason::Prefetch.as_str(), "prefetch");
    }

    /// A window-aligned time (5 s windows).
    const T0: u64 = 1_764_504_000_000;
    /// A public /24 (no published crawler range overlaps it).
    const SCANNER: Net = Net::V4([93, 184, 216]);

    fn from(net: Net, code: &str, visitor: u64, at_ms: u64) -> ClickEvent<'_> {
        ClickEvent {
            net: Some(net),
            ..event(CHROME_WIN, code, visitor, at_ms)
        }
    }

    #[test]
    fn a_network_opening_many_codes_within_seconds_is_a_burst() {
        let mut c = classifier();
        assert_eq!(c.rules().burst_codes, 5);
        assert_eq!(c.rules().burst_secs, 5);
        let codes: Vec<String> = (0..8).map(|i| format!("code{i:03}")).collect();
        // A scanner's fetches come from several addresses of one /24: several visitor hashes.
        for (i, code) in codes.iter().enumerate().take(4) {
            let v = c.classify(&from(SCANNER, code, i as u64, T0 + 100 * i as u64));
            assert_eq!(v.bot, None, "fetch {i}");
        }
        for (i, code) in codes.iter().enumerate().skip(4) {
            let v = c.classify(&from(SCANNER, code, i as u64, T0 + 100 * i as u64));
            assert_eq!(v.bot, Some(BotReason::Burst), "fetch {i}");
        }
        // The rest of the window, an already-seen code included, is the scanner's.
        let v = c.classify(&from(SCANNER, &codes[0], 9, T0 + 4_999));
        assert_eq!((v.bot, v.device), (Some(BotReason::Burst), Device::Bot));
        // The next window starts afresh; so does another network.
        assert_eq!(
            c.classify(&from(SCANNER, &codes[7], 9, T0 + 5_000)).bot,
            None
        );
        assert_eq!(
            c.classify(&from(Net::V4([93, 184, 217]), &codes[7], 9, T0 + 4_000))
                .bot,
            None
        );
        // IPv6 /48s too.
        let v6 = Net::V6([0x2a, 0x00, 0x14, 0x50, 0x40, 0x01]);
        let verdicts: Vec<_> = codes
            .iter()
            .take(5)
            .map(|code| c.classify(&from(v6, code, 1, T0 + 10_000)).bot)
            .collect();
        assert_eq!(verdicts, [None, None, None, None, Some(BotReason::Burst)]);
    }

    #[test]
    fn popular_links_slow_clicks_and_private_networks_are_no_burst() {
        let mut c = classifier();
        // Many people behind one public /24 clicking the same hot link: one code.
        for i in 0..200 {
            let v = c.classify(&from(SCANNER, "Ab3dE9x", i, T0 + i * 10));
            assert_eq!(v.bot, None, "click {i}");
        }
        // Five codes, one every six seconds: a person reading.
        for i in 0..5u64 {
            let code = format!("slow{i:03}");
            let at = T0 + 60_000 + i * 6_000;
            assert_eq!(c.classify(&from(SCANNER, &code, 1, at)).bot, None);
        }
        // Five people behind one public NAT exit, each on their own browser build, each opening
        // a different link within a second.
        let agents = [
            CHROME_WIN,
            "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0",
            "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1",
            "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Safari/605.1.15",
            "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Mobile Safari/537.36",
        ];
        for (i, ua) in agents.iter().enumerate() {
            let code = format!("nat{i:04}");
            let e = ClickEvent {
                user_agent: ua,
                ..from(SCANNER, &code, i as u64, T0 + 30_000 + i as u64)
            };
            assert_eq!(c.classify(&e).bot, None, "{ua}");
        }
        // Behind a proxy, a load balancer or a test network every click shares one /24.
        for net in [
            Net::V4([10, 1, 2]),
            Net::V4([127, 0, 0]),
            Net::V4([100, 100, 7]),
            Net::V4([192, 168, 1]),
            Net::V4([198, 18, 0]),
            Net::V6([0xfd, 0, 1, 2, 3, 4]),
            Net::V6([0x20, 0x01, 0x0d, 0xb8, 0, 1]),
            Net::V6([0x20, 0x01, 0, 0, 0x4a, 0x7b]),
            Net::V6([0x20, 0x01, 0, 2, 0, 0]),
            Net::V6([0x3f, 0xff, 0x0a, 0xbc, 0, 0]),
        ] {
            for i in 0..10u64 {
                let code = format!("lan{i:04}");
                let v = c.classify(&from(net, &code, i, T0 + 120_000 + i));
                assert_eq!(v.bot, None, "{net:?} fetch {i}");
            }
        }
    }

    #[test]
    fn the_burst_rule_follows_its_settings() {
        let mut rules = Rules::builtin();
        rules.burst_codes = 0;
        let mut c = Classifier::new(Arc::new(rules));
        for i in 0..20u64 {
            let code = format!("code{i:03}");
            assert_eq!(c.classify(&from(SCANNER, &code, i, T0 + i)).bot, None);
        }
        let mut rules = Rules::builtin();
        rules.burst_codes = 2;
        rules.burst_secs = 60;
        c.set_rules(Arc::new(rules));
        assert_eq!(c.classify(&from(SCANNER, "aaaaaaa", 1, T0)).bot, None);
        let late = T0 + 59_000;
        assert_eq!(
            c.classify(&from(SCANNER, "bbbbbbb", 2, late)).bot,
            Some(BotReason::Burst)
        );
        assert_ne!(
            net_key(Net::V4([1, 2, 3])),
            net_key(Net::V6([0, 0, 0, 1, 2, 3]))
        );
    }

    #[test]
    fn behaviour_trips_past_the_limit_for_the_rest_of_the_minute() {
        let mut c = classifier();
        let codes: Vec<String> = (0..40).map(|i| format!("code{i:03}")).collect();
        let minute = 1_764_504_000_000 / 60_000 * 60_000;
        for (i, code) in codes.iter().enumerate().take(30) {
            let v = c.classify(&event(CHROME_WIN, code, 42, minute + i as u64));
            assert_eq!(v.bot, None, "code {i}");
            // Repeats are not new codes.
            assert_eq!(
                c.classify(&event(CHROME_WIN, &codes[0], 42, minute + i as u64))
                    .bot,
                None
            );
        }
        let v = c.classify(&event(CHROME_WIN, &codes[30], 42, minute + 100));
        assert_eq!((v.bot, v.device), (Some(BotReason::Behaviour), Device::Bot));
        // The rest of the minute, even a code seen before.
        assert_eq!(
            c.classify(&event(CHROME_WIN, &codes[0], 42, minute + 59_999))
                .bot,
            Some(BotReason::Behaviour)
        );
        // Other visitors are untouched; the next minute starts clean.
        assert_eq!(
            c.classify(&event(CHROME_WIN, &codes[0], 43, minute + 59_999))
                .bot,
            None
        );
        assert_eq!(
            c.classify(&event(CHROME_WIN, &codes[0], 42, minute + 60_000))
                .bot,
            None
        );
    }

    #[test]
    fn behaviour_limit_is_configurable() {
        let mut rules = Rules::builtin();
        rules.max_codes_per_minute = 1;
        let mut c = Classifier::new(Arc::new(rules));
        assert_eq!(c.classify(&event(CHROME_WIN, "aaaaaaa", 9, 0)).bot, None);
        assert_eq!(c.classify(&event(CHROME_WIN, "aaaaaaa", 9, 1)).bot, None);
        assert_eq!(
            c.classify(&event(CHROME_WIN, "bbbbbbb", 9, 2)).bot,
            Some(BotReason::Behaviour)
        );
    }

    #[test]
    fn the_same_alias_on_two_domains_is_two_links() {
        let on = |domain, at_ms| ClickEvent {
            domain,
            ..event(CHROME_WIN, "spring-sale", 9, at_ms)
        };
        // The default domain's hash is the code's, as before branded domains.
        assert_eq!(link_hash(&on("", 0)), code_hash("spring-sale"));
        assert_ne!(
            link_hash(&on("go.example.com", 0)),
            code_hash("spring-sale")
        );
        let mut rules = Rules::builtin();
        rules.max_codes_per_minute = 1;
        let mut c = Classifier::new(Arc::new(rules));
        assert_eq!(c.classify(&on("", 0)).bot, None);
        assert_eq!(c.classify(&on("", 1)).bot, None, "a repeat");
        assert_eq!(
            c.classify(&on("go.example.com", 2)).bot,
            Some(BotReason::Behaviour),
            "a second link"
        );
    }

    #[test]
    fn behaviour_state_is_bounded() {
        let mut c = classifier();
        for minute in 0..50u64 {
            for visitor in 0..100 {
                c.classify(&event(
                    CHROME_WIN,
                    "Ab3dE9x",
                    visitor,
                    minute * 60_000 + visitor,
                ));
            }
            assert!(c.behaviour.windows.len() <= 3);
            assert!(c.behaviour.len() <= 300);
        }
        // A late event from a pruned minute is not judged and leaves no state.
        let before = c.behaviour.len();
        assert_eq!(
            c.classify(&event(CHROME_WIN, "Ab3dE9x", 7_777, 0)).bot,
            None
        );
        assert_eq!(c.behaviour.len(), before);
        // Slightly late events (within two minutes) are still counted.
        c.classify(&event(CHROME_WIN, "Ab3dE9x", 7_777, 47 * 60_000));
        assert_eq!(c.behaviour.len(), before + 1);
    }

    #[test]
    fn user_agent_cache_is_bounded() {
        let mut c = classifier();
        for i in 0..(UA_CACHE_MAX + 10) {
            let ua = format!("Mozilla/5.0 Firefox/{i}");
            c.classify(&event(&ua, "Ab3dE9x", 1, 0));
            assert!(c.agents.len() <= UA_CACHE_MAX);
        }
    }

    #[test]
    fn devices_browsers_oses() {
        let cases = [
            (CHROME_WIN, Device::Desktop, "Chrome", "Windows"),
            ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36 Edg/131.0.0.0", Device::Desktop, "Edge", "Windows"),
            ("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Safari/605.1.15", Device::Desktop, "Safari", "macOS"),
            ("Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0", Device::Desktop, "Firefox", "Linux"),
            ("Mozilla/5.0 (X11; CrOS x86_64 14541.0.0) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36", Device::Desktop, "Chrome", "ChromeOS"),
            ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36 OPR/115.0.0.0", Device::Desktop, "Opera", "Windows"),
            ("Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1", Device::Mobile, "Safari", "iOS"),
            ("Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) CriOS/131.0.6778.73 Mobile/15E148 Safari/604.1", Device::Mobile, "Chrome", "iOS"),
            ("Mozilla/5.0 (iPad; CPU OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1", Device::Tablet, "Safari", "iOS"),
            ("Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Mobile Safari/537.36", Device::Mobile, "Chrome", "Android"),
            ("Mozilla/5.0 (Linux; Android 13; SM-X710) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36", Device::Tablet, "Chrome", "Android"),
            ("Mozilla/5.0 (Linux; Android 14; SM-S918B) AppleWebKit/537.36 (KHTML, like Gecko) SamsungBrowser/26.0 Chrome/122.0.0.0 Mobile Safari/537.36", Device::Mobile, "Samsung Internet", "Android"),
            ("Mozilla/5.0 (Android 14; Mobile; rv:133.0) Gecko/133.0 Firefox/133.0", Device::Mobile, "Firefox", "Android"),
            ("SomeTV/1.0", Device::Other, "Other", "Other"),
        ];
        for (ua, device, browser, os) in cases {
            assert_eq!(parse_agent(ua), (device, browser, os), "{ua}");
        }
        let mut c = classifier();
        let v = c.classify(&event(
            "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
            "Ab3dE9x",
            1,
            0,
        ));
        assert_eq!((v.bot, v.device), (Some(BotReason::UserAgent), Device::Bot));
    }
}
