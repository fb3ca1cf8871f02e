//! A scan over a key whose value fails its check yields that record's error in its place
//! and goes on with the keys after it, in both directions: one damaged value never hides
//! the records around it.

use bfkv::{Config, Durability, Error, Tree};

const LEN: usize = 200_000;

fn value(i: u64) -> Vec<u8> {
    (0..LEN)
        .map(|j| (j as u64 ^ i.wrapping_mul(31)) as u8)
        .collect()
}

/// A tree of ten large values (stored out of line, one extent each, in key order) with one
/// bit of the fifth flipped, and between them small values stored in the leaves.
fn damaged_tree(dir: &std::path::Path) -> Tree {
    let config = || Config::new(dir).durability(Durability::Sync);
    {
        let tree = Tree::open(config()).unwrap();
        for i in 0..10u64 {
            tree.insert(format!("k{i}"), value(i)).unwrap();
            tree.insert(format!("k{i}-small"), [i as u8]).unwrap();
        }
        tree.close().unwrap();
    }
    let path = dir.join("blobs");
    let mut bytes = std::fs::read(&path).unwrap();
    // Extents are whole 4 KiB blocks, written in order from the start of the file.
    let extent = LEN.div_ceil(4096) * 4096;
    bytes[4 * extent + 1000] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    Tree::open(config()).unwrap()
}

/// What each item of a scan was: the key it yielded, or `None` for an error.
fn outcomes(items: impl Iterator<Item = bfkv::Result<(Vec<u8>, Vec<u8>)>>) -> Vec<Option<String>> {
    items
        .map(|r| match r {
            Ok((k, v)) => {
                let k = String::from_utf8(k).unwrap();
                if let Some(i) = k.strip_prefix('k').and_then(|n| n.parse::<u64>().ok()) {
                    assert_eq!(v, value(i), "{k}");
                }
                Some(k)
            }
            Err(Error::Corruption { .. }) => None,
            Err(e) => panic!("unexpected error {e}"),
        })
        .collect()
}

#[test]
fn a_scan_yields_a_damaged_value_as_its_error_and_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let tree = damaged_tree(tmp.path());
    let mut want: Vec<Option<String>> = Vec::new();
    for i in 0..10u64 {
        want.push((i != 4).then(|| format!("k{i}")));
        want.push(Some(format!("k{i}-small")));
    }
    assert_eq!(outcomes(tree.iter()), want);
    want.reverse();
    assert_eq!(outcomes(tree.iter().rev()), want);
    // A range that starts at the damaged key yields its error first, then the rest.
    let from: Vec<_> = outcomes(tree.range("k4".to_string()..));
    assert_eq!(from[0], None);
    assert_eq!(from[1].as_deref(), Some("k4-small"));
    assert_eq!(from.len(), 12);
    // The lending iterator does the same.
    let mut scan = tree.range("k3-small".to_string().."k5".to_string());
    let mut lent = Vec::new();
    while let Some(r) = scan.next_ref() {
        lent.push(r.map(|(k, _)| String::from_utf8(k.to_vec()).unwrap()).ok());
    }
    assert_eq!(
        lent,
        [Some("k3-small".into()), None, Some("k4-small".into())]
    );
}
