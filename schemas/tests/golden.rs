//! The golden byte vectors in `testdata/v1/`, checked in both directions: every valid case
//! encodes to exactly its bytes and decodes back to exactly its event; every invalid case is
//! refused with exactly its error.

use std::fs;
use std::path::{Path, PathBuf};

use verdict_schemas::{DecisionEvent, EVENT_V1_LEN};

/// Found from the crate at run time: the binary may have been built in another clone that
/// shares the target folder.
fn testdata(sub: &str) -> PathBuf {
    let dir =
        std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
    Path::new(&dir).join("testdata/v1").join(sub)
}

/// Reads annotated hex: `#` starts a comment, whitespace is ignored.
fn read_hex(path: &Path) -> Vec<u8> {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let digits: String = text
        .lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .flat_map(|l| l.split_whitespace())
        .collect();
    hex::decode(&digits).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn cases(sub: &str, ext: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = fs::read_dir(testdata(sub))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    out.sort();
    out
}

#[test]
fn valid_vectors_encode_and_decode_exactly() {
    let jsons = cases("valid", "json");
    assert!(
        jsons.len() >= 5,
        "expected the golden cases, found {jsons:?}"
    );
    for json in jsons {
        let event: DecisionEvent =
            serde_json::from_str(&fs::read_to_string(&json).unwrap()).unwrap();
        let bytes = read_hex(&json.with_extension("hex"));
        assert_eq!(bytes.len(), EVENT_V1_LEN, "{}", json.display());
        assert_eq!(
            event.encode().as_slice(),
            bytes.as_slice(),
            "encode {}",
            json.display()
        );
        assert_eq!(
            DecisionEvent::decode(&bytes),
            Ok(event),
            "decode {}",
            json.display()
        );
    }
}

#[test]
fn invalid_vectors_are_refused_with_their_error() {
    let hexes = cases("invalid", "hex");
    assert!(
        hexes.len() >= 10,
        "expected the invalid cases, found {hexes:?}"
    );
    for hex in hexes {
        let bytes = read_hex(&hex);
        let want = fs::read_to_string(hex.with_extension("error")).unwrap();
        match DecisionEvent::decode(&bytes) {
            Ok(e) => panic!("{} decoded to {e:?}", hex.display()),
            Err(err) => assert_eq!(err.to_string(), want.trim_end(), "{}", hex.display()),
        }
    }
}

#[test]
fn encoded_event_fits_the_64_byte_budget() {
    let json = testdata("valid").join("denied_by_window.json");
    let event: DecisionEvent = serde_json::from_str(&fs::read_to_string(json).unwrap()).unwrap();
    let size = event.encode().len();
    println!("encoded v1 decision event: {size} bytes (budget 64)");
    assert!(size <= 64);
}
