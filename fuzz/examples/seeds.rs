//! Writes the seed inputs of the binary targets into `fuzz/corpus/<target>/` (the text ones
//! are written by hand): click events and a spool segment, and an archive object. Run once
//! when a format changes: `cargo run -p lasthop-fuzz --example seeds`.

use std::path::Path;

use lasthop_core::click::{spool, ClickEvent, EventId, Method, Net, Protocol};

fn event(i: u64) -> ClickEvent<'static> {
    ClickEvent {
        id: EventId::new(0xabc, i),
        at_ms: 1_764_504_000_000 + i,
        code: ["Ab3dE9x", "spring-sale", "old-bitly_code"][(i % 3) as usize],
        domain: if i % 3 == 1 { "go.example.com" } else { "" },
        pop: "fra1",
        country: (i % 2 == 0).then_some(*b"DE"),
        method: if i % 4 == 3 {
            Method::Head
        } else {
            Method::Get
        },
        tls: i % 2 == 1,
        prefetch: i % 5 == 1,
        protocol: [Protocol::H1, Protocol::H2, Protocol::H3][(i % 3) as usize],
        early: i % 4 == 2,
        visitor: i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        net: match i % 3 {
            0 => None,
            1 => Some(Net::V4([203, 0, 113])),
            _ => Some(Net::V6([0x20, 0x01, 0x0d, 0xb8, 0, 1])),
        },
        user_agent: "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0",
        referrer_host: if i % 2 == 0 { "" } else { "news.example.com" },
    }
}

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    std::fs::create_dir_all(&dir).expect("the corpus directory");
    std::fs::write(dir.join(name), bytes).expect("a seed");
}

fn main() {
    let events: Vec<ClickEvent<'static>> = (0..6).map(event).collect();
    let mut all = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let mut one = Vec::new();
        e.encode(&mut one);
        write("click_event", &format!("event-v{}-{i}", e.version()), &one);
        all.extend_from_slice(&one);
    }
    write("click_event", "six-events", &all);
    let line = serde_json::to_vec(&events[1].archived()).expect("serialises");
    write("click_event", "archive-line.json", &line);

    let mut seg = spool::SEGMENT_MAGIC.to_vec();
    spool::encode_frame(&mut seg, &all, events.len() as u32);
    spool::encode_frame(&mut seg, &all[..all.len() / 2], 3);
    write("spool", "segment", &seg);
    write("spool", "torn", &seg[..seg.len() - 5]);
    write("spool", "stem", b"edge-a.0000000042.seg");

    let object = lasthop_clicks::columnar::encode(&events).expect("encodes");
    write("archive_object", "six-events.parquet", &object);
    let empty = lasthop_clicks::columnar::encode(&[]).expect("encodes");
    write("archive_object", "empty.parquet", &empty);
}
