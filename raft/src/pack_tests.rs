//! The pack format: round trips (sparse files, nested and empty directories, a real bfkv
//! backup) and rejection of every truncation, garbling and malformed structure.

use super::*;

/// Every file and directory under `dir`, as relative path → contents (`None`: directory).
fn listing(dir: &Path) -> Vec<(String, Option<Vec<u8>>)> {
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), String::new())];
    while let Some((path, rel)) = stack.pop() {
        for entry in fs::read_dir(&path).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().into_string().unwrap();
            let rel = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            if entry.file_type().unwrap().is_dir() {
                out.push((rel.clone(), None));
                stack.push((entry.path(), rel));
            } else {
                out.push((rel, Some(fs::read(entry.path()).unwrap())));
            }
        }
    }
    out.sort();
    out
}

/// A directory with the shapes a bfkv tree has and some it does not.
fn sample_dir(dir: &Path) {
    fs::create_dir_all(dir.join("wal/deeper")).unwrap();
    fs::create_dir_all(dir.join("empty")).unwrap();
    fs::write(dir.join("LOCK"), b"").unwrap();
    fs::write(dir.join("small"), b"hello").unwrap();
    // Data, a zero block, data again, and a tail that is not a whole block.
    let mut mixed = vec![0u8; 3 * BLOCK + 100];
    mixed[..10].fill(1);
    mixed[2 * BLOCK + 5] = 9;
    mixed[3 * BLOCK + 99] = 7;
    fs::write(dir.join("wal/mixed"), &mixed).unwrap();
    // All zeros: stored as its length alone.
    File::create(dir.join("wal/deeper/zeros"))
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
}

/// `body` followed by its CRC-32C, as a pack ends.
fn seal(body: &[u8]) -> Vec<u8> {
    let mut out = body.to_vec();
    out.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
    out
}

/// A pack header announcing `count` entries.
fn header(count: u32) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out
}

/// An entry's kind and path.
fn entry(out: &mut Vec<u8>, kind: u8, path: &str) {
    out.push(kind);
    out.extend_from_slice(&u16::try_from(path.len()).unwrap().to_le_bytes());
    out.extend_from_slice(path.as_bytes());
}

/// A file entry with the given extents.
fn file(out: &mut Vec<u8>, path: &str, len: u64, extents: &[(u64, &[u8])]) {
    entry(out, KIND_FILE, path);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&u32::try_from(extents.len()).unwrap().to_le_bytes());
    for (offset, data) in extents {
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&(data.len() as u64).to_le_bytes());
        out.extend_from_slice(data);
    }
}

#[test]
fn round_trip_keeps_every_file_and_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let source = tmp.path().join("source");
    sample_dir(&source);
    let bytes = pack_dir(&source).unwrap();
    // The 8 MiB of zeros and the zero block cost nothing.
    assert!(bytes.len() < 4 * BLOCK, "pack of {} bytes", bytes.len());
    let target = tmp.path().join("target");
    unpack(&bytes, &target).unwrap();
    assert_eq!(listing(&source), listing(&target));
    // Packing is deterministic: the unpacked copy packs to the same bytes.
    assert_eq!(pack_dir(&target).unwrap(), bytes);
}

#[test]
fn empty_directory_round_trips() {
    let tmp = tempfile::tempdir().unwrap();
    let bytes = pack_dir(tmp.path()).unwrap();
    assert_eq!(parse(&bytes).unwrap(), []);
    unpack(&bytes, &tmp.path().join("copy")).unwrap();
    assert!(listing(&tmp.path().join("copy")).is_empty());
}

#[test]
fn a_bfkv_backup_round_trips_and_opens() {
    let tmp = tempfile::tempdir().unwrap();
    let tree =
        bfkv::Tree::open(bfkv::Config::new(tmp.path().join("db")).cache_size(1 << 20)).unwrap();
    for i in 0..500u32 {
        tree.insert(i.to_be_bytes(), i.to_le_bytes()).unwrap();
    }
    tree.insert(b"large", vec![3u8; 100_000]).unwrap();
    tree.backup(tmp.path().join("backup")).unwrap();
    let bytes = pack_dir(&tmp.path().join("backup")).unwrap();
    unpack(&bytes, &tmp.path().join("restored")).unwrap();
    let restored =
        bfkv::Tree::open(bfkv::Config::new(tmp.path().join("restored")).cache_size(1 << 20))
            .unwrap();
    assert_eq!(restored.get(b"large").unwrap(), Some(vec![3u8; 100_000]));
    assert_eq!(
        restored.get(499u32.to_be_bytes()).unwrap(),
        Some(499u32.to_le_bytes().to_vec())
    );
    assert_eq!(restored.iter().count(), 501);
}

#[test]
fn every_truncation_is_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    sample_dir(tmp.path());
    let bytes = pack_dir(tmp.path()).unwrap();
    for len in 0..bytes.len() {
        let err = parse(&bytes[..len]).unwrap_err();
        assert!(
            matches!(err, Error::Malformed { .. }),
            "cut at {len}: {err}"
        );
    }
}

#[test]
fn every_garbled_byte_is_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    sample_dir(tmp.path());
    let bytes = pack_dir(tmp.path()).unwrap();
    for at in 0..bytes.len() {
        let mut garbled = bytes.clone();
        garbled[at] ^= 0x5a;
        assert!(parse(&garbled).is_err(), "byte {at} flipped was accepted");
    }
}

#[test]
fn well_sealed_but_malformed_packs_are_rejected() {
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut body = header(1);
    entry(&mut body, KIND_FILE, "../escape");
    cases.push(("parent path", body));
    let mut body = header(1);
    entry(&mut body, KIND_DIR, "/abs");
    cases.push(("absolute path", body));
    let mut body = header(1);
    entry(&mut body, KIND_DIR, "a//b");
    cases.push(("empty component", body));
    let mut body = header(1);
    file(&mut body, "dir/file", 1, &[]);
    cases.push(("file before its directory", body));
    let mut body = header(2);
    entry(&mut body, KIND_DIR, "d");
    entry(&mut body, KIND_DIR, "d");
    cases.push(("duplicate path", body));
    let mut body = header(1);
    entry(&mut body, 7, "x");
    cases.push(("unknown kind", body));
    let mut body = header(1);
    file(&mut body, "f", 10, &[(5, b"123456")]);
    cases.push(("extent past the end", body));
    let mut body = header(1);
    file(&mut body, "f", 100, &[(50, b"ab"), (10, b"cd")]);
    cases.push(("extents out of order", body));
    let mut body = header(1);
    file(&mut body, "f", 100, &[(50, b"")]);
    cases.push(("empty extent", body));
    let mut body = header(1);
    file(&mut body, "f", MAX_FILE_LEN + 1, &[]);
    cases.push(("file too long", body));
    let mut body = header(1);
    file(&mut body, "f", 1, &[(0, b"x")]);
    body.push(0);
    cases.push(("trailing bytes", body));
    let mut body = header(u32::MAX);
    file(&mut body, "f", 1, &[(0, b"x")]);
    cases.push(("count larger than the entries", body));
    let mut body = header(0);
    body[8] = 2;
    cases.push(("unknown version", body));
    let mut body = header(0);
    body[0] = b'X';
    cases.push(("bad magic", body));
    let tmp = tempfile::tempdir().unwrap();
    for (name, body) in cases {
        let bytes = seal(&body);
        assert!(parse(&bytes).is_err(), "{name} was accepted");
        let target = tmp.path().join("target");
        assert!(unpack(&bytes, &target).is_err(), "{name} was unpacked");
        assert!(!target.exists(), "{name} left a directory behind");
    }
    // And the well-formed neighbour of those cases unpacks.
    let mut body = header(2);
    entry(&mut body, KIND_DIR, "d");
    file(&mut body, "d/f", 8, &[(2, b"ab"), (6, b"cd")]);
    let target = tmp.path().join("ok");
    unpack(&seal(&body), &target).unwrap();
    assert_eq!(fs::read(target.join("d/f")).unwrap(), b"\0\0ab\0\0cd");
}

#[test]
fn unpack_never_writes_into_an_existing_directory() {
    let tmp = tempfile::tempdir().unwrap();
    sample_dir(&tmp.path().join("source"));
    let bytes = pack_dir(&tmp.path().join("source")).unwrap();
    fs::create_dir(tmp.path().join("taken")).unwrap();
    fs::write(tmp.path().join("taken/keep"), b"mine").unwrap();
    assert!(unpack(&bytes, &tmp.path().join("taken")).is_err());
    assert_eq!(fs::read(tmp.path().join("taken/keep")).unwrap(), b"mine");
}
