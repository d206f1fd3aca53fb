//! What the HTTP fuzz tests share (crates/ingest/tests/ingest/fuzz.rs, crates/admin/tests/admin/fuzz.rs): how
//! many cases to run and for how long, a JSON-value strategy over the field names and words an
//! endpoint reads, arbitrary request bodies, and fixed hostile bodies.
//!
//! - `PROPTEST_CASES` sets the number of cases of every fuzz test (proptest's own variable; the
//!   parser property tests of `tocsin-domain` read it too). Each test has its own default.
//! - `TOCSIN_FUZZ_TIME` (a duration such as `30s` or `5m`, default `60s`) bounds the time one
//!   fuzz test spends generating and sending cases: it stops early, saying how many cases it
//!   ran, when the time is up. So a large `PROPTEST_CASES` cannot make a CI run unbounded.
//! - `PROPTEST_RNG_SEED` makes a run repeatable, as in proptest.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use serde_json::Value;

/// The default of `TOCSIN_FUZZ_TIME`.
pub const DEFAULT_TIME: Duration = Duration::from_secs(60);

/// How many cases a fuzz test runs, and for how long at most.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub cases: u32,
    pub time: Duration,
}

impl Budget {
    /// `PROPTEST_CASES` (else `default_cases`) cases within `TOCSIN_FUZZ_TIME` (else 60 s).
    pub fn from_env(default_cases: u32) -> Budget {
        let cases = std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .filter(|n| *n > 0)
            .unwrap_or(default_cases);
        let time = std::env::var("TOCSIN_FUZZ_TIME")
            .ok()
            .and_then(|v| tocsin_domain::retry::parse_duration(v.trim()).ok())
            .filter(|t| !t.is_zero())
            .unwrap_or(DEFAULT_TIME);
        Budget { cases, time }
    }

    /// Values drawn from `strategy`, one per case, until the cases are done or the time is up
    /// (counted from this call, so the work done on each value counts too).
    pub fn samples<S: Strategy>(self, strategy: S) -> Samples<S> {
        let config = Config {
            cases: self.cases,
            ..Config::default()
        };
        Samples {
            runner: TestRunner::new(config),
            strategy,
            budget: self,
            started: Instant::now(),
            drawn: 0,
        }
    }
}

/// The values of a fuzz run; see [`Budget::samples`].
pub struct Samples<S> {
    runner: TestRunner,
    strategy: S,
    budget: Budget,
    started: Instant,
    drawn: u32,
}

impl<S: Strategy> Samples<S> {
    /// How many values were drawn, and whether the time ran out before all cases were drawn.
    pub fn summary(&self) -> String {
        let cut = self.drawn < self.budget.cases;
        format!(
            "{} of {} cases in {:.1} s{}",
            self.drawn,
            self.budget.cases,
            self.started.elapsed().as_secs_f64(),
            if cut {
                " (stopped by TOCSIN_FUZZ_TIME)"
            } else {
                ""
            }
        )
    }
}

impl<S: Strategy> Iterator for Samples<S> {
    type Item = S::Value;

    fn next(&mut self) -> Option<S::Value> {
        if self.drawn >= self.budget.cases || self.started.elapsed() >= self.budget.time {
            return None;
        }
        self.drawn += 1;
        let tree = self
            .strategy
            .new_tree(&mut self.runner)
            .expect("the strategy generates values");
        Some(tree.current())
    }
}

/// Checks an HTTP answer to fuzzed input: never a server error, and a refusal (4xx) in the
/// common error shape (`{"error": {"code": ...}}`).
pub fn check_refusal(status: u16, answer: &Value, what: &dyn std::fmt::Display) {
    assert!(status < 500, "{status} for {what}: {answer}");
    if status >= 400 {
        assert!(
            answer["error"]["code"].is_string(),
            "common error shape for {status} ({what}): {answer}"
        );
    }
}

/// Strings that have caught parsers and HTTP layers out: header injection (CR/LF, a folded
/// header line), NUL and other control characters, percent-encoded line breaks, non-ASCII,
/// right-to-left overrides, markup.
pub const NASTY_STRINGS: &[&str] = &[
    "a\r\nX-Injected: 1",
    "a\nX-Injected: 1",
    "a\rX-Injected: 1",
    "\r\n\r\nHTTP/1.1 200 OK",
    " folded\r\n\tcontinuation",
    "%0d%0aX-Injected:%201",
    "\u{0}",
    "a\u{0}b",
    "\u{7f}\u{1b}[31m",
    "\u{85}\u{2028}\u{2029}",
    "\u{202e}gnp.exe",
    "\u{feff}",
    "é🦀",
    "<script>alert(1)</script>",
    "{{ secret }}",
    "",
    " ",
];

/// Number literals out of every range the services read: past `f64` (serde_json refuses them),
/// past `u64` and `i64`, negative where counts are expected, fractional where integers are.
pub const OUT_OF_RANGE_NUMBERS: &[&str] = &[
    "1e400",
    "-1e400",
    "1e-400",
    "18446744073709551616",
    "-9223372036854775809",
    "340282366920938463463374607431768211456",
    "123456789012345678901234567890.5",
    "-1",
    "0",
    "256",
    "65536",
    "4294967296",
    "1.5",
    "-0",
];

/// JSON values: scalars (out-of-range-ish numbers included), the given words, arbitrary and
/// nasty strings, arrays, and objects keyed mostly by `keys` so that generated bodies reach
/// deep into the endpoint's own fields.
pub fn json_value(
    keys: &'static [&'static str],
    words: &'static [&'static str],
) -> BoxedStrategy<Value> {
    let string = prop_oneof![
        3 => "[a-zA-Z0-9 _:./-]{0,40}".boxed(),
        3 => prop::sample::select(words).prop_map(str::to_owned).boxed(),
        2 => prop::sample::select(NASTY_STRINGS).prop_map(str::to_owned).boxed(),
        2 => any::<String>().prop_map(|s| s.chars().take(40).collect()).boxed(),
        1 => ("[a-z é🦀\r\n]{1,3}", 50usize..500).prop_map(|(unit, n)| unit.repeat(n)).boxed(),
    ];
    let leaf = prop_oneof![
        1 => Just(Value::Null),
        1 => any::<bool>().prop_map(Value::Bool),
        1 => any::<i64>().prop_map(Value::from),
        1 => any::<u64>().prop_map(Value::from),
        1 => any::<f64>().prop_filter_map("finite", |f| {
            serde_json::Number::from_f64(f).map(Value::Number)
        }),
        6 => string.prop_map(Value::String),
    ];
    let key = prop_oneof![
        5 => prop::sample::select(keys).prop_map(str::to_owned),
        1 => "[a-zA-Z_.]{0,8}",
    ];
    leaf.prop_recursive(4, 48, 8, move |inner| {
        prop_oneof![
            1 => prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            3 => prop::collection::vec((key.clone(), inner), 0..8)
                .prop_map(|pairs| Value::Object(pairs.into_iter().collect())),
        ]
    })
    .boxed()
}

/// The text of a JSON-like object whose values may be what a `Value` cannot hold: number
/// literals out of range, strings with invalid UTF-8 inside or lone surrogate escapes.
fn raw_object(
    keys: &'static [&'static str],
    words: &'static [&'static str],
) -> BoxedStrategy<Vec<u8>> {
    let raw_leaf = prop_oneof![
        3 => json_value(keys, words).prop_map(|v| serde_json::to_vec(&v).unwrap()),
        2 => prop::sample::select(OUT_OF_RANGE_NUMBERS).prop_map(|n| n.as_bytes().to_vec()),
        1 => prop::collection::vec(0x80u8..=0xff, 1..8).prop_map(|bad| {
            let mut text = b"\"ok ".to_vec();
            text.extend(bad);
            text.push(b'"');
            text
        }),
        1 => Just(br#""\ud800""#.to_vec()),
        1 => Just(br#""\udc00x""#.to_vec()),
    ];
    let key = prop::sample::select(keys);
    let pairs = prop::collection::vec((key, raw_leaf), 1..6);
    (
        pairs.clone(),
        prop::option::of((prop::sample::select(keys), pairs)),
    )
        .prop_map(|(pairs, nested)| {
            let mut out = b"{".to_vec();
            let mut first = true;
            let mut push = |out: &mut Vec<u8>, key: &str, value: &[u8]| {
                if !std::mem::take(&mut first) {
                    out.push(b',');
                }
                out.extend(serde_json::to_vec(key).unwrap());
                out.push(b':');
                out.extend(value);
            };
            for (key, value) in &pairs {
                push(&mut out, key, value);
            }
            if let Some((key, inner)) = nested {
                let mut nested = b"{".to_vec();
                for (i, (k, v)) in inner.iter().enumerate() {
                    if i > 0 {
                        nested.push(b',');
                    }
                    nested.extend(serde_json::to_vec(k).unwrap());
                    nested.push(b':');
                    nested.extend(v);
                }
                nested.push(b'}');
                push(&mut out, key, &nested);
            }
            out.push(b'}');
            out
        })
        .boxed()
}

/// JSON objects keyed mostly by `keys`: what an endpoint expects at the top level.
pub fn json_object(
    keys: &'static [&'static str],
    words: &'static [&'static str],
) -> BoxedStrategy<Value> {
    let key = prop_oneof![
        5 => prop::sample::select(keys).prop_map(str::to_owned),
        1 => "[a-zA-Z_.]{0,8}",
    ];
    prop::collection::vec((key, json_value(keys, words)), 0..10)
        .prop_map(|pairs| Value::Object(pairs.into_iter().collect()))
        .boxed()
}

/// Request bodies: JSON objects and other values over `keys` and `words`, objects holding
/// out-of-range numbers and invalid UTF-8, arbitrary bytes, deep nesting past serde_json's
/// recursion limit (arrays, objects, unclosed), and truncated JSON.
pub fn body(
    keys: &'static [&'static str],
    words: &'static [&'static str],
) -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        10 => json_object(keys, words).prop_map(|v| serde_json::to_vec(&v).unwrap()),
        2 => json_value(keys, words).prop_map(|v| serde_json::to_vec(&v).unwrap()),
        2 => raw_object(keys, words),
        1 => prop::collection::vec(any::<u8>(), 0..200),
        1 => prop_oneof![
            (100usize..3_000).prop_map(|d| nested_arrays(d, true)),
            (100usize..3_000, prop::sample::select(keys)).prop_map(|(d, key)| nested_objects(key, d)),
            (100usize..3_000).prop_map(|d| nested_arrays(d, false)),
        ],
        1 => (json_object(keys, words), any::<prop::sample::Index>()).prop_map(|(v, cut)| {
            let text = serde_json::to_vec(&v).unwrap();
            let at = cut.index(text.len().max(1));
            text[..at].to_vec()
        }),
    ]
    .boxed()
}

/// `base` with up to four of its nodes (the whole included) replaced by generated values or
/// removed from their object: valid bodies bent out of shape a little, so that most of them
/// still reach deep into a parser.
pub fn mutated(
    base: Value,
    keys: &'static [&'static str],
    words: &'static [&'static str],
) -> BoxedStrategy<Value> {
    let mutation = (
        any::<prop::sample::Index>(),
        prop::option::of(json_value(keys, words)),
    );
    prop::collection::vec(mutation, 0..4)
        .prop_map(move |mutations| {
            let mut value = base.clone();
            for (index, replacement) in mutations {
                let count = node_count(&value);
                let mut n = index.index(count);
                mutate(&mut value, &mut n, replacement);
            }
            value
        })
        .boxed()
}

fn node_count(value: &Value) -> usize {
    1 + match value {
        Value::Array(items) => items.iter().map(node_count).sum(),
        Value::Object(map) => map.values().map(node_count).sum(),
        _ => 0,
    }
}

/// Replaces the `n`-th node (pre-order) with `replacement`, or removes it from its object
/// when there is none; returns whether it was found.
fn mutate(value: &mut Value, n: &mut usize, replacement: Option<Value>) -> bool {
    if *n == 0 {
        *value = replacement.unwrap_or(Value::Null);
        return true;
    }
    *n -= 1;
    match value {
        Value::Array(items) => items
            .iter_mut()
            .any(|item| mutate(item, n, replacement.clone())),
        Value::Object(map) => {
            let mut remove = None;
            for (key, item) in map.iter_mut() {
                if *n == 0 && replacement.is_none() {
                    remove = Some(key.clone());
                    break;
                }
                if mutate(item, n, replacement.clone()) {
                    return true;
                }
            }
            match remove {
                Some(key) => map.remove(&key).is_some(),
                None => false,
            }
        }
        _ => false,
    }
}

/// `depth` nested arrays, closed or not.
pub fn nested_arrays(depth: usize, closed: bool) -> Vec<u8> {
    let mut text = "[".repeat(depth);
    if closed {
        text.push_str(&"]".repeat(depth));
    }
    text.into_bytes()
}

/// `depth` objects nested under `key`: `{"key":{"key":...{}...}}`.
pub fn nested_objects(key: &str, depth: usize) -> Vec<u8> {
    let open = format!("{{{}:", serde_json::to_string(key).unwrap());
    let mut text = open.repeat(depth);
    text.push_str("{}");
    text.push_str(&"}".repeat(depth));
    text.into_bytes()
}

/// Bodies that are not JSON, whatever the endpoint: each must get `400`. Named, for messages.
pub fn syntax_errors(key: &str) -> Vec<(&'static str, Vec<u8>)> {
    let string = |raw: &[u8]| {
        let mut body = format!("{{{}:\"", serde_json::to_string(key).unwrap()).into_bytes();
        body.extend_from_slice(raw);
        body.extend_from_slice(b"\"}");
        body
    };
    let number = |literal: &str| format!("{{{}:{literal}}}", serde_json::to_string(key).unwrap());
    vec![
        ("empty body", Vec::new()),
        ("10 000 nested arrays", nested_arrays(10_000, true)),
        ("10 000 nested objects", nested_objects(key, 10_000)),
        ("100 000 unclosed arrays", nested_arrays(100_000, false)),
        ("invalid UTF-8 in a string", string(b"\xff\xfe\xfd")),
        ("an overlong UTF-8 encoding", string(b"\xc0\xaf")),
        ("a UTF-16 surrogate as UTF-8", string(b"\xed\xa0\x80")),
        ("a lone surrogate escape", string(br"\ud800")),
        (
            "a raw line break in a string",
            string(b"a\r\nX-Injected: 1"),
        ),
        ("a raw NUL in a string", string(b"a\x00b")),
        ("invalid UTF-8 outside strings", b"{\xff}".to_vec()),
        ("a byte-order mark", b"\xef\xbb\xbf{}".to_vec()),
        ("a number past f64", number("1e400").into_bytes()),
        ("a negative number past f64", number("-1e400").into_bytes()),
        ("a bare NaN", number("NaN").into_bytes()),
        ("Infinity", number("Infinity").into_bytes()),
        (
            "a trailing comma",
            format!("{{{}:1,}}", serde_json::to_string(key).unwrap()).into_bytes(),
        ),
        ("trailing garbage", b"{} {}".to_vec()),
        ("a single quote", b"{'a':1}".to_vec()),
        ("a truncated object", b"{\"a\":".to_vec()),
    ]
}
