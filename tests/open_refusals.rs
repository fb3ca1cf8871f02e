//! What `Tree::open` refuses: a data file one of whose superblock slots another format
//! version wrote (opening from the other slot could go back to a state that version went
//! on from); and what it still opens: a slot merely damaged.

use std::path::Path;

use bfkv::{Config, Error, Tree};

/// Rewrites the store format version of superblock slot `slot` of the data file in `dir`
/// to `version`, with a checksum that holds (as another version of bfkv would write it).
fn set_slot_version(dir: &Path, page_size: usize, slot: u64, version: u32) {
    let path = dir.join("data");
    let mut bytes = std::fs::read(&path).expect("read data");
    let at = slot as usize * page_size;
    let page = &mut bytes[at..at + page_size];
    assert_eq!(&page[8..16], b"BFKVSTOR", "a superblock");
    page[16..20].copy_from_slice(&version.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&slot.to_le_bytes()), &page[8..]);
    page[0..4].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&path, &bytes).expect("write data");
}

#[test]
fn one_superblock_slot_of_another_format_refuses_the_open() {
    let page_size = 8 << 10;
    for (slot, version) in [(0, 3), (1, 3), (0, 1), (1, u32::MAX)] {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("db");
        let config = Config::new(&dir).page_size(page_size);
        // Two checkpoints: both slots valid, each holding a state of the tree.
        let tree = Tree::open(config.clone()).expect("open");
        tree.insert(b"k", b"v").expect("insert");
        tree.checkpoint().expect("checkpoint");
        tree.insert(b"k2", b"v2").expect("insert");
        tree.close().expect("close");
        set_slot_version(&dir, page_size, slot, version);
        match Tree::open(config.clone()) {
            Err(Error::Corruption {
                file, page, reason, ..
            }) => {
                assert_eq!(file, dir.join("data"));
                assert_eq!(page, Some(slot), "slot {slot} version {version}");
                let expected = if version == 1 { "format 1" } else { "newer" };
                assert!(reason.contains(expected), "{reason}");
            }
            Ok(_) => panic!("slot {slot} of format {version}: opened from the other slot"),
            Err(other) => panic!("expected Corruption, got {other:?}"),
        }
    }
}

#[test]
fn a_damaged_superblock_slot_still_opens_from_the_other() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("db");
    let config = Config::new(&dir).page_size(8 << 10);
    let tree = Tree::open(config.clone()).expect("open");
    tree.insert(b"k", b"v").expect("insert");
    tree.checkpoint().expect("checkpoint");
    tree.close().expect("close");
    // A version field changed without the checksum: damage, not another format.
    let path = dir.join("data");
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[(8 << 10) + 16] ^= 0x04;
    std::fs::write(&path, &bytes).expect("write");
    let tree = Tree::open(config).expect("open from the intact slot");
    assert_eq!(tree.get(b"k").expect("get"), Some(b"v".to_vec()));
}
