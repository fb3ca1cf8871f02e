//! How a service uses bfkv: open a tree in a directory, write, read, scan a key range,
//! choose when writes are durable, close, and reopen to find the data again.
//!
//! `cargo run --release --example basics [DIR]` (default: a temporary directory). It prints
//! what it does and exits non-zero if anything it reads back is wrong.

use std::error::Error as StdError;
use std::path::Path;

use bfkv::{Config, Durability, Error, Tree};

/// Keys of one table share a prefix, so a range scan over the prefix lists the table.
fn user_key(id: u32) -> Vec<u8> {
    // Big-endian ids sort numerically.
    [b"user/".as_slice(), &id.to_be_bytes()].concat()
}

/// Writes a few users and an order, reads them back and scans the users.
fn write_and_read(tree: &Tree) -> Result<(), Box<dyn StdError>> {
    for (id, name) in [(7, "Grace"), (42, "Ada"), (1000, "Edsger")] {
        tree.insert(user_key(id), name)?;
    }
    tree.insert(b"order/1", b"paid")?;
    assert_eq!(tree.get(user_key(42))?.as_deref(), Some(&b"Ada"[..]));

    // Every key from `user/` up to (not including) `user0`: the whole user table, in order.
    println!("users:");
    for record in tree.range(b"user/".as_slice()..b"user0".as_slice()) {
        let (key, name) = record?;
        let id = u32::from_be_bytes(key[5..].try_into()?);
        println!("  {id:>5}  {}", String::from_utf8_lossy(&name));
    }

    // Removing is a write like any other; removing an absent key is not an error.
    tree.remove(user_key(7))?;
    tree.remove(user_key(8))?;

    // Bad input gets an error and changes nothing.
    match tree.insert(vec![b'x'; 5000], b"too long a key") {
        Err(Error::KeyTooLarge { len, limit }) => {
            println!("refused a {len}-byte key (limit {limit})");
        }
        other => return Err(format!("expected KeyTooLarge, got {other:?}").into()),
    }
    Ok(())
}

/// Reopens the directory and checks that every acknowledged write is there.
fn check_after_reopen(dir: &Path) -> Result<(), Box<dyn StdError>> {
    let tree = Tree::open(Config::new(dir))?;
    assert_eq!(tree.get(user_key(42))?.as_deref(), Some(&b"Ada"[..]));
    assert_eq!(tree.get(user_key(7))?, None);
    assert_eq!(tree.get(b"order/1")?.as_deref(), Some(&b"paid"[..]));
    let users = tree.range(b"user/".as_slice()..b"user0".as_slice()).count();
    println!("after reopening: {users} users, order 1 paid");
    assert_eq!(users, 2);
    tree.close()?;
    Ok(())
}

fn run(dir: &Path) -> Result<(), Box<dyn StdError>> {
    // `Buffered` (the default) acknowledges a write once its log record reached the OS: it
    // survives the process crashing. `Sync` waits for the disk and survives power loss;
    // concurrent writers share each sync. `None` keeps no log: only `flush`, `checkpoint`
    // and `close` make writes durable.
    let config = Config::new(dir)
        .cache_size(16 << 20)
        .durability(Durability::Sync);
    let tree = Tree::open(config)?;
    write_and_read(&tree)?;
    println!("{} writes logged", tree.stats().log_appends);
    // Closing checkpoints and reports errors; dropping the tree does the same silently.
    tree.close()?;
    check_after_reopen(dir)
}

fn main() {
    let temp = tempfile::tempdir();
    let dir = match (std::env::args_os().nth(1), &temp) {
        (Some(d), _) => d.into(),
        (None, Ok(t)) => t.path().join("db"),
        (None, Err(e)) => {
            eprintln!("basics: no temporary directory: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = run(&dir) {
        eprintln!("basics: {e}");
        std::process::exit(1);
    }
}
