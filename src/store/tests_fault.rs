//! Tests of the fault-injecting store: failed writes and syncs, flipped bits, and power
//! cuts that lose exactly the unsynced writes.

use std::collections::BTreeMap;

use super::tests::{assert_corrupt, assert_payload, pattern, P};
use super::*;
use crate::error::Error;

#[test]
fn fault_nth_write_and_sync_fail_once_with_eio() {
    let s = FaultStore::new(P);
    let pages: Vec<PageNo> = (0..3).map(|_| s.allocate().unwrap()).collect();
    let mut bufs: Vec<PageBuf> = pages.iter().map(|&p| pattern(p)).collect();
    s.fail_nth_write(2);
    let eio = |r: Result<()>| match r {
        Err(Error::Io { source, .. }) => assert!(crate::sys::is_injected_fault(&source)),
        other => panic!("expected EIO, got {other:?}"),
    };
    eio(s.write_batch(&pages, &mut bufs));
    s.write_batch(&pages, &mut bufs).unwrap();
    s.sync().unwrap();
    let image = s.crash_image();
    let mut buf = PageBuf::new(P);
    for &p in &pages {
        image.read(p, &mut buf).unwrap();
        assert_payload(&buf, p);
    }
    // A failed flush is sticky: the data it was to write may be gone, so no later sync may
    // claim it is durable (fsyncgate).
    s.write_batch(&pages, &mut bufs).unwrap();
    s.fail_nth_sync(1);
    eio(s.sync());
    for _ in 0..3 {
        assert!(
            matches!(s.sync(), Err(Error::Io { .. })),
            "a later sync succeeded"
        );
    }
}

#[test]
fn fault_flip_bit_on_read_is_detected_once() {
    let s = FaultStore::new(P);
    let p = s.allocate().unwrap();
    s.write(p, &mut pattern(9)).unwrap();
    s.flip_bit_on_read(p, 8 * 700 + 3);
    let mut buf = PageBuf::new(P);
    assert_corrupt(s.read(p, &mut buf), p);
    s.read(p, &mut buf).unwrap();
    assert_payload(&buf, 9);
}

/// The state a crash image must show: pages → seeds, free pages, file pages.
type State = (BTreeMap<PageNo, u64>, u64, u64);

/// Runs a fixed workload. Returns the state at the last sync that finished with power on,
/// and the state the sync during which power failed was writing (if it failed in one).
fn workload(s: &FaultStore, sync_writes: &mut Vec<(u64, u64)>) -> (State, Option<State>) {
    let mut live = BTreeMap::new();
    let mut durable = (BTreeMap::new(), 0, FIRST_DATA_PAGE);
    let mut pages = Vec::new();
    for step in 0..6u64 {
        for i in 0..[5, 400, 700, 300, 5, 5][step as usize] {
            let p = s.allocate().unwrap();
            s.write(p, &mut pattern(step * 1000 + i)).unwrap();
            live.insert(p, step * 1000 + i);
            pages.push(p);
        }
        // Free every third live page, later every second, so the free list outgrows a
        // superblock and its chain grows at several syncs.
        let stride = if step < 3 { 3 } else { 2 };
        // Oldest pages last: the most recently freed page is then one the durable state uses.
        let doomed: Vec<PageNo> = pages
            .iter()
            .skip(step as usize)
            .step_by(stride)
            .copied()
            .collect();
        for p in doomed.into_iter().rev() {
            if live.remove(&p).is_some() {
                s.free(p).unwrap();
            }
        }
        pages.retain(|p| live.contains_key(p));
        if let Some(&p) = live.keys().next() {
            s.write(p, &mut pattern(step + 77)).unwrap();
            live.insert(p, step + 77);
        }
        let was_on = !s.is_powered_off();
        let before = s.disk_writes();
        s.sync().unwrap();
        sync_writes.push((before, s.disk_writes()));
        let st = s.stats();
        let state = (live.clone(), st.free_pages, st.file_pages);
        if !s.is_powered_off() {
            durable = state;
        } else if was_on {
            // Power failed inside this sync: with a torn superblock write whose lost half
            // equals what was meant, the new state may have made it, whole.
            return (durable, Some(state));
        }
    }
    (durable, None)
}

/// Whether `image` holds the pages of `state`, each as `state` has it or, if `newer` is
/// given, as `newer` has it (the data flush of the sync that power interrupted happened).
/// With `torn`, one page may fail its checksum: the in-place write that power tore.
fn has_pages(image: &FaultStore, state: &State, newer: Option<&State>, torn: bool) -> bool {
    let mut buf = PageBuf::new(P);
    let is = |buf: &PageBuf, seed: u64| buf[STORE_RESERVED..] == pattern(seed)[STORE_RESERVED..];
    let mut damaged = 0;
    for (&p, &seed) in &state.0 {
        match image.read(p, &mut buf) {
            Ok(()) if is(&buf, seed) => {}
            Ok(())
                if newer
                    .and_then(|n| n.0.get(&p))
                    .is_some_and(|&s| is(&buf, s)) => {}
            Err(Error::Corruption { page: Some(q), .. }) if q == p && torn => damaged += 1,
            _ => return false,
        }
    }
    damaged <= 1
}

/// Whether `image` has the allocation state (free and file pages) of `state`.
fn has_counts(image: &FaultStore, state: &State) -> bool {
    let st = image.stats();
    (st.free_pages, st.file_pages) == (state.1, state.2)
}

#[test]
fn fault_power_cut_loses_exactly_the_unsynced_writes() {
    let mut syncs = Vec::new();
    let total = {
        let s = FaultStore::new(P);
        let base = s.disk_writes();
        workload(&s, &mut syncs);
        for (a, b) in &mut syncs {
            (*a, *b) = (*a - base, *b - base);
        }
        s.disk_writes() - base
    };
    assert!(total > 1000 && syncs.len() == 6);
    // A torn cut may destroy the page it overwrites in place (detected, not repaired).
    // Every cut point in and just before each sync, and a stride through the rest.
    let near_sync = |n: u64| syncs.iter().any(|&(a, b)| n + 3 > a && n <= b);
    let cuts = (1..=total).filter(|&n| n % 29 == 0 || n < 8 || near_sync(n));
    for n in cuts {
        for torn in [false, true] {
            let s = FaultStore::new(P);
            s.power_cut_at_write(n, torn);
            let (durable, in_flight) = workload(&s, &mut Vec::new());
            assert!(s.is_powered_off());
            let image = s.crash_image();
            assert!(
                image.open_error().is_none(),
                "cut at write {n}: {:?}",
                image.open_error()
            );
            // A cut inside a sync: the data flush may have happened (new page contents),
            // and a torn superblock write may still be whole (new allocation state).
            let ok = match &in_flight {
                None => has_counts(&image, &durable) && has_pages(&image, &durable, None, torn),
                Some(new) if has_counts(&image, &durable) => {
                    has_pages(&image, &durable, Some(new), torn)
                }
                Some(new) => torn && has_counts(&image, new) && has_pages(&image, new, None, torn),
            };
            assert!(ok, "cut at write {n} (torn: {torn}): {:?}", image.stats());
        }
    }
}
