//! Facts about the machine and the engines' versions, for the report's header.

use std::path::Path;
use std::process::Command;

/// A command's trimmed stdout, if it ran and succeeded.
fn output(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The first line of `path` starting with `prefix`, after the prefix, trimmed.
fn field(path: &str, prefix: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with(prefix))?;
    Some(
        line[prefix.len()..]
            .trim_start_matches([':', ' ', '\t'])
            .trim()
            .to_string(),
    )
}

/// The mount holding `dir`: (device, file system type), from `/proc/mounts` (longest
/// mount point that is a prefix of the directory).
pub fn mount_of(mounts: &str, dir: &Path) -> Option<(String, String)> {
    mounts
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (dev, point, fs) = (w.next()?, w.next()?, w.next()?);
            dir.starts_with(point)
                .then(|| (point.len(), dev.to_string(), fs.to_string()))
        })
        .max_by_key(|(len, _, _)| *len)
        .map(|(_, dev, fs)| (dev, fs))
}

/// The machine facts as (name, value) rows; `dir` is where the databases live.
pub fn facts(dir: &Path) -> Vec<(String, String)> {
    let unknown = || "unknown".to_string();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = field("/proc/cpuinfo", "model name").unwrap_or_else(unknown);
    let mem = field("/proc/meminfo", "MemTotal")
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or_else(unknown, |kib| format!("{:.1} GiB", kib as f64 / 1048576.0));
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| unknown(), |s| s.trim().to_string());
    let abs = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let fs = std::fs::read_to_string("/proc/mounts")
        .ok()
        .and_then(|m| mount_of(&m, &abs))
        .map_or_else(unknown, |(dev, fs)| format!("{fs} on {dev}"));
    let load = std::fs::read_to_string("/proc/loadavg").map_or_else(
        |_| unknown(),
        |s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    );
    vec![
        ("cores".into(), format!("{cores} ({cpu})")),
        ("memory".into(), mem),
        ("kernel".into(), kernel),
        ("file system".into(), format!("{fs} ({})", abs.display())),
        (
            "rustc".into(),
            output("rustc", &["--version"]).unwrap_or_else(unknown),
        ),
        ("bfkv commit".into(), commit().unwrap_or_else(unknown)),
        ("load average at start (1, 5, 15 min)".into(), load),
    ]
}

/// The workspace's git commit (short), with `+changes` if the tree differs from it.
fn commit() -> Option<String> {
    let root = crate::parent::workspace_root();
    let root = root.to_str()?;
    let head = output("git", &["-C", root, "rev-parse", "--short", "HEAD"])?;
    let dirty = output(
        "git",
        &["-C", root, "status", "--porcelain", "--untracked-files=no"],
    )
    .is_some_and(|s| !s.is_empty());
    Some(if dirty {
        format!("{head}+changes")
    } else {
        head
    })
}

/// The version of `package` in a `Cargo.lock` text (the first entry of that name).
pub fn locked_version(lock: &str, package: &str) -> Option<String> {
    let needle = format!("name = \"{package}\"\nversion = \"");
    let at = lock.find(&needle)? + needle.len();
    let rest = &lock[at..];
    Some(rest[..rest.find('"')?].to_string())
}

/// A version string for `engine`, from the workspace's `Cargo.lock`.
pub fn version(lock: &str, engine: &str) -> String {
    let v = |p: &str| locked_version(lock, p).unwrap_or_else(|| "?".into());
    match engine {
        "bfkv" => format!("bfkv {}", v("bfkv")),
        "bf-tree" | "bf-tree-cache-only" => format!("bf-tree {}", v("bf-tree")),
        "rocksdb" | "rocksdb-buffered" => {
            format!(
                "rocksdb {} (librocksdb-sys {})",
                v("rocksdb"),
                v("librocksdb-sys")
            )
        }
        "redb" => format!("redb {}", v("redb")),
        "fjall" => format!("fjall {} (lsm-tree {})", v("fjall"), v("lsm-tree")),
        "lmdb" => format!(
            "heed {} (lmdb-master-sys {})",
            v("heed"),
            v("lmdb-master-sys")
        ),
        "sled" => format!("sled {}", v("sled")),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_mounts_parse() {
        let lock = "[[package]]\nname = \"redb\"\nversion = \"4.5.0\"\n\n[[package]]\nname = \"redb-derive\"\nversion = \"1.0.0\"\n";
        assert_eq!(locked_version(lock, "redb").as_deref(), Some("4.5.0"));
        assert_eq!(locked_version(lock, "sled"), None);
        assert_eq!(version(lock, "redb"), "redb 4.5.0");
        let mounts = "/dev/vda / ext4 rw 0 0\ntmpfs /tmp tmpfs rw 0 0\nproc /proc proc rw 0 0\n";
        assert_eq!(
            mount_of(mounts, Path::new("/work/x")),
            Some(("/dev/vda".into(), "ext4".into()))
        );
        assert_eq!(
            mount_of(mounts, Path::new("/tmp/db")),
            Some(("tmpfs".into(), "tmpfs".into()))
        );
    }
}
