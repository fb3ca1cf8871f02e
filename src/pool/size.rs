//! Block size classes: four per doubling, from 64 B to 64 KiB (64, 80, 96, 112, 128, 160,
//! 192, 224, 256, 320, ...). A block rounded up to its class wastes at most a fifth of its
//! bytes; power-of-two classes wasted up to half, and a census of a steady read-heavy cache
//! found mini-pages 68 % full with them.

/// Number of size classes.
pub(crate) const CLASSES: usize = 41;

/// Usable bytes of class `class` (`< CLASSES`).
pub(crate) const fn class_size(class: usize) -> usize {
    let base = 64 << (class / 4);
    base + (class % 4) * (base / 4)
}

/// The class of a usable size, if it is exactly a class size.
pub(crate) fn class_of(size: usize) -> Option<usize> {
    if !(class_size(0)..=class_size(CLASSES - 1)).contains(&size) {
        return None;
    }
    let log = size.ilog2() as usize;
    let base = 1usize << log;
    let step = base / 4;
    let class = (log - 6) * 4 + (size - base) / step;
    (class_size(class) == size).then_some(class)
}

/// The smallest class size holding `need` bytes, if any does.
pub(crate) fn block_size_for(need: usize) -> Option<usize> {
    let need = need.max(class_size(0));
    if need > class_size(CLASSES - 1) {
        return None;
    }
    let log = need.ilog2() as usize;
    let base = 1usize << log;
    let step = base / 4;
    let class = (log - 6) * 4 + (need - base).div_ceil(step);
    Some(class_size(class))
}

/// The largest class size of at most `limit` bytes, if any.
pub(crate) fn largest_class_within(limit: usize) -> Option<usize> {
    (0..CLASSES)
        .map(class_size)
        .take_while(|&size| size <= limit)
        .last()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_run_four_per_doubling_from_64_bytes_to_64_kib() {
        let sizes: Vec<usize> = (0..CLASSES).map(class_size).collect();
        assert_eq!(
            &sizes[..10],
            &[64, 80, 96, 112, 128, 160, 192, 224, 256, 320]
        );
        assert_eq!(sizes[CLASSES - 1], 64 << 10);
        assert!(sizes
            .windows(2)
            .all(|w| w[0] < w[1] && w[1] * 4 <= w[0] * 5));
        assert!(sizes.iter().all(|s| s % 16 == 0));
        for (class, &size) in sizes.iter().enumerate() {
            assert_eq!(class_of(size), Some(class));
            assert_eq!(block_size_for(size), Some(size));
        }
    }

    #[test]
    fn sizes_round_up_to_the_smallest_class_that_holds_them() {
        for need in 0..=(64 << 10) + 1 {
            let got = block_size_for(need);
            let want = (0..CLASSES).map(class_size).find(|&s| s >= need);
            assert_eq!(got, want, "need {need}");
            if class_of(need).is_none() && need >= 64 {
                assert_ne!(got, Some(need));
            }
        }
        assert_eq!(largest_class_within(63), None);
        assert_eq!(largest_class_within(64), Some(64));
        assert_eq!(largest_class_within(1000), Some(896));
        assert_eq!(largest_class_within(4096), Some(4096));
        assert_eq!(largest_class_within(usize::MAX), Some(64 << 10));
        assert_eq!(class_of(63), None);
        assert_eq!(class_of(65), None);
        assert_eq!(class_of(1 << 17), None);
    }
}
