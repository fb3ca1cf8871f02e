//! What the tests that run a child process (and kill it) share.

use std::time::{Duration, Instant};

use bfkv::{Error, Tree};

/// Opens the tree in a child process with `open`. The parent's other tests spawn children
/// too, and a child holds a copy of the parent's descriptors (a test's `LOCK` among them,
/// while the parent verifies a tree) from its fork until its `exec` closes them: a lock
/// still held that way for a moment after the parent closed its tree is waited out, for at
/// most 5 s (`open` itself waits up to a second; a loaded CI machine can stretch a fork's
/// window past that, and a child that gives up fails its whole kill cycle). Any other error
/// panics.
pub(crate) fn open_child(open: impl Fn() -> Result<Tree, Error>) -> Tree {
    let start = Instant::now();
    let mut waited = false;
    loop {
        match open() {
            Ok(tree) => {
                if waited {
                    eprintln!("child open waited {:?} for the lock", start.elapsed());
                }
                return tree;
            }
            Err(Error::Locked { .. }) if start.elapsed() < Duration::from_secs(5) => {
                waited = true;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!(
                "child open ({:?} after the first try): {e:?}",
                start.elapsed()
            ),
        }
    }
}
