//! Per-event verdicts.
//!
//! The rules run in order of cost and certainty, and the first that fires names the reason:
//! 1. **HEAD**: browsers following a link send GET; HEAD is link checkers and unfurlers.
//! 2. **User agent** matches a bot rule, or is empty ([`Rules::match_agent`]).
//! 3. **Crawler net**: the event's /24 or /48 overlaps a published crawler range (crawlers that
//!    render with a browser's user agent still come from their own networks).
//! 4. **Behaviour**: a visitor hash that fetched more than [`Rules::max_codes_per_minute`]
//!    distinct codes within one UTC minute of event time (`at_ms / 60000`) is a bot from the
//!    event that crosses the threshold on, for the rest of that minute. People click a few
//!    links a minute; scrapers walking codes click hundreds. Only events the first three rules
//!    let through are counted: known bots would spend state the rule does not need.
//!
//! Cost: the processor must keep up with ≥ 350,000 events/s on one core, so classification is
//! a few hash probes. Everything derived from the user agent (bot rule, device, browser, OS) is
//! computed once per distinct string and cached (real traffic has few distinct user agents; the
//! cache is cleared when it reaches [`UA_CACHE_MAX`] entries, which bounds its memory to a few
//! tens of MB even under a flood of random strings). The behaviour state holds only the newest
//! three minutes (the newest event minute seen, and the two before it for slightly late events);
//! an event older than that is not judged by behaviour. Event time is the edge's clock, so an
//! edge with a clock far ahead would pause the rule until real time catches up.
//!
//! Device, browser and OS come from well-known user-agent tokens, not a full parser: enough for
//! an owner's breakdown. iPadOS 13+ asks for desktop pages and says "Macintosh", so those iPads
//! count as desktop macOS; nothing in the string can tell them apart.

use std::sync::Arc;

use hashbrown::hash_map::Entry;
use hashbrown::HashMap;
use lasthop_core::click::{ClickEvent, Method};

use crate::rules::AgentKind;
use crate::Rules;

/// Distinct user agents the classifier remembers before it starts over.
pub const UA_CACHE_MAX: usize = 100_000;
/// Event minutes the behaviour rule keeps: the newest and the two before it.
const MINUTES_KEPT: u64 = 3;

/// Why an event counts as a bot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BotReason {
    /// The user agent matched a crawler, preview-fetcher or automation pattern.
    UserAgent,
    /// The client's network lies in a published crawler range.
    CrawlerNet,
    /// The visitor fetched too many distinct codes within a minute.
    Behaviour,
    /// A HEAD request.
    Head,
}

impl BotReason {
    /// The name used in stats and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            BotReason::UserAgent => "user_agent",
            BotReason::CrawlerNet => "crawler_net",
            BotReason::Behaviour => "behaviour",
            BotReason::Head => "head",
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
}

/// What one user-agent string says, worked out once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AgentInfo {
    bot: Option<AgentKind>,
    device: Device,
    browser: &'static str,
    os: &'static str,
}

impl Classifier {
    /// A classifier with empty state.
    pub fn new(rules: Arc<Rules>) -> Classifier {
        Classifier {
            rules,
            agents: HashMap::new(),
            behaviour: Behaviour::default(),
        }
    }

    /// The rules in force.
    pub fn rules(&self) -> &Arc<Rules> {
        &self.rules
    }

    /// Swaps in new rules (an operator reloaded the files); forgets cached user agents, keeps
    /// the behaviour state.
    pub fn set_rules(&mut self, rules: Arc<Rules>) {
        self.rules = rules;
        self.agents.clear();
    }

    /// The verdict on `event` (events should arrive in roughly time order for the behaviour rule).
    pub fn classify(&mut self, event: &ClickEvent<'_>) -> Verdict {
        let agent = self.agent(event.user_agent);
        let bot = if event.method == Method::Head {
            Some(BotReason::Head)
        } else if agent.bot.is_some() {
            Some(BotReason::UserAgent)
        } else if event
            .net
            .is_some_and(|net| self.rules.crawler_range(net).is_some())
        {
            Some(BotReason::CrawlerNet)
        } else if self.behaviour.over_limit(
            event.visitor,
            code_hash(event.code),
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
fn code_hash(code: &str) -> u64 {
    code.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The distinct-codes-per-minute state.
#[derive(Debug, Default)]
struct Behaviour {
    /// The newest event minute seen.
    newest: Option<u64>,
    /// Per kept minute: what each visitor fetched in it.
    minutes: Vec<(u64, HashMap<u64, Seen>)>,
    /// Emptied maps of pruned minutes, kept for their allocation.
    spare: Vec<HashMap<u64, Seen>>,
}

/// One visitor's fetches within one minute.
#[derive(Debug)]
enum Seen {
    /// One distinct code (by hash): nearly every visitor, and no allocation.
    One(u64),
    /// Several distinct codes, at most the limit.
    Many(Vec<u64>),
    /// Past the limit: a bot for the rest of the minute.
    Bot,
}

impl Behaviour {
    /// Records `visitor` fetching `code` at `at_ms`; true when it is past `max` distinct codes.
    fn over_limit(&mut self, visitor: u64, code: u64, at_ms: u64, max: u32) -> bool {
        let minute = at_ms / 60_000;
        let newest = match self.newest {
            Some(n) if n >= minute => n,
            _ => {
                self.newest = Some(minute);
                self.prune(minute);
                minute
            }
        };
        if minute + MINUTES_KEPT <= newest {
            // Its minute is gone: too late to judge.
            return false;
        }
        let visitors = match self.minutes.iter().position(|(m, _)| *m == minute) {
            Some(i) => &mut self.minutes[i].1,
            None => {
                let map = self.spare.pop().unwrap_or_default();
                self.minutes.push((minute, map));
                let last = self.minutes.len() - 1;
                &mut self.minutes[last].1
            }
        };
        let max = max as usize;
        match visitors.entry(visitor) {
            Entry::Vacant(e) => {
                e.insert(if max == 0 { Seen::Bot } else { Seen::One(code) });
                max == 0
            }
            Entry::Occupied(mut e) => {
                let seen = e.get_mut();
                match seen {
                    Seen::Bot => true,
                    Seen::One(first) if *first == code => false,
                    Seen::One(first) => {
                        if max <= 1 {
                            *seen = Seen::Bot;
                            true
                        } else {
                            *seen = Seen::Many(vec![*first, code]);
                            false
                        }
                    }
                    Seen::Many(codes) if codes.contains(&code) => false,
                    Seen::Many(codes) => {
                        if codes.len() >= max {
                            *seen = Seen::Bot;
                            true
                        } else {
                            codes.push(code);
                            false
                        }
                    }
                }
            }
        }
    }

    /// Drops minutes older than `newest` − 2, keeping their maps' allocations.
    fn prune(&mut self, newest: u64) {
        let mut i = 0;
        while i < self.minutes.len() {
            if self.minutes[i].0 + MINUTES_KEPT <= newest {
                let (_, mut map) = self.minutes.swap_remove(i);
                map.clear();
                if self.spare.len() < MINUTES_KEPT as usize {
                    self.spare.push(map);
                }
            } else {
                i += 1;
            }
        }
    }

    /// Visitor-minutes held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.minutes.iter().map(|(_, m)| m.len()).sum()
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
            pop: "fra1",
            country: Some(*b"DE"),
            method: Method::Get,
            tls: true,
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
            assert!(c.behaviour.minutes.len() <= 3);
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
