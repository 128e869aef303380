use super::*;

fn h(i: u32) -> Vec<u8> {
    i.to_be_bytes().to_vec()
}

fn access(kind: AccessKind, i: u32, tier: u32, manifest: &str) -> Access {
    Access {
        kind,
        hash: h(i),
        len: 10,
        tier,
        manifest: Some(manifest.to_owned()),
    }
}

fn usage(capacity: u64, used: u64) -> Vec<TierUsage> {
    vec![
        TierUsage {
            capacity_bytes: Some(capacity),
            used_bytes: used,
        },
        TierUsage {
            capacity_bytes: None,
            used_bytes: 0,
        },
    ]
}

fn named(advice: &[Advice], action: Action) -> Vec<Vec<u8>> {
    advice
        .iter()
        .filter(|a| a.action == action)
        .flat_map(|a| a.hashes.clone())
        .collect()
}

/// Chunk 0 is read by three sessions (a shared prompt), chunks 1..=4 each
/// by one session but more often and more recently: under pressure the
/// unshared ones leave first and the shared one stays.
#[test]
fn shared_prefix_is_protected_under_pressure() {
    let mut p = Policy::new(Knobs::default());
    let mut trace = vec![];
    for i in 0..5 {
        trace.push(access(AccessKind::Put, i, 0, "s0"));
    }
    for s in ["s0", "s1", "s2"] {
        trace.push(access(AccessKind::Hit, 0, 0, s));
    }
    for _ in 0..5 {
        for i in 1..5 {
            trace.push(access(AccessKind::Hit, i, 0, "s0"));
        }
    }
    p.observe(&trace);
    assert!(p.is_protected(&h(0)));
    assert!(!p.is_protected(&h(1)));
    // 50 bytes in a 50-byte tier: above 95%, down to 85% (42 bytes): one
    // chunk must go, and it is not the shared one.
    let advice = p.advise(&usage(50, 50));
    let demoted = named(&advice, Action::Demote);
    assert_eq!(demoted.len(), 1, "{advice:?}");
    assert_ne!(demoted[0], h(0));
    // Plain LRU has no protection: the shared chunk is the least recent.
    let mut lru = Policy::new(Knobs {
        mode: Mode::Lru,
        ..Knobs::default()
    });
    lru.observe(&trace);
    assert_eq!(named(&lru.advise(&usage(50, 50)), Action::Demote), [h(0)]);
}

/// Old hits decay: a chunk hit 4 times long ago is colder than one hit
/// twice just now, so it is demoted first.
#[test]
fn hit_counts_decay() {
    let mut p = Policy::new(Knobs {
        half_life: 4,
        ..Knobs::default()
    });
    let mut trace = vec![
        access(AccessKind::Put, 1, 0, "a"),
        access(AccessKind::Put, 2, 0, "a"),
    ];
    trace.extend((0..4).map(|_| access(AccessKind::Hit, 1, 0, "a")));
    // Unrelated traffic ages chunk 1.
    trace.extend((10..30).map(|i| access(AccessKind::Miss, i, 0, "a")));
    trace.extend((0..2).map(|_| access(AccessKind::Hit, 2, 0, "a")));
    p.observe(&trace);
    let advice = p.advise(&usage(20, 20));
    assert_eq!(named(&advice, Action::Demote), [h(1)], "{advice:?}");
}

/// A chunk read often from the cold tier is promoted into free room; one
/// read once is not (the frequency policy); plain LRU promotes both.
#[test]
fn promotes_hot_chunks_only() {
    let trace = [
        access(AccessKind::Hit, 1, 1, "a"),
        access(AccessKind::Hit, 1, 1, "a"),
        access(AccessKind::Hit, 1, 1, "a"),
        access(AccessKind::Hit, 2, 1, "a"),
    ];
    let mut p = Policy::new(Knobs::default());
    p.observe(&trace);
    let advice = p.advise(&usage(100, 0));
    assert_eq!(
        advice,
        [Advice {
            action: Action::Promote,
            tier: 1,
            hashes: vec![h(1)]
        }]
    );
    // Promoted once: not advised again.
    assert!(p.advise(&usage(100, 10)).is_empty());

    let mut lru = Policy::new(Knobs {
        mode: Mode::Lru,
        ..Knobs::default()
    });
    lru.observe(&trace);
    let mut promoted = named(&lru.advise(&usage(100, 0)), Action::Promote);
    promoted.sort();
    assert_eq!(promoted, [h(1), h(2)]);
}

/// With no room, a hot cold-tier chunk displaces a colder hot-tier chunk;
/// the displaced one was promoted earlier (a copy is below), so it is
/// evicted rather than demoted.
#[test]
fn promotion_displaces_colder_chunks_by_eviction() {
    let mut p = Policy::new(Knobs::default());
    p.observe(&[
        access(AccessKind::Hit, 1, 1, "a"),
        access(AccessKind::Hit, 1, 1, "a"),
        access(AccessKind::Hit, 1, 1, "a"),
    ]);
    assert_eq!(named(&p.advise(&usage(20, 0)), Action::Promote), [h(1)]);
    p.observe_moves(&[Move {
        kind: MoveKind::Promoted,
        hash: h(1),
        len: 10,
        tier: 1,
    }]);
    p.observe(
        &(0..5)
            .map(|_| access(AccessKind::Hit, 2, 1, "a"))
            .collect::<Vec<_>>(),
    );
    // 15 of 20 bytes used: below the high-water mark, but no room.
    let advice = p.advise(&usage(20, 15));
    assert_eq!(named(&advice, Action::Evict), [h(1)], "{advice:?}");
    assert_eq!(named(&advice, Action::Promote), [h(2)], "{advice:?}");
    assert!(named(&advice, Action::Demote).is_empty());
}

/// One answer names at most `max_moves` chunks, however far over the
/// high-water mark the tier is.
#[test]
fn moves_per_answer_are_bounded() {
    let mut p = Policy::new(Knobs {
        max_moves: 7,
        ..Knobs::default()
    });
    p.observe(
        &(0..100)
            .map(|i| access(AccessKind::Put, i, 0, "a"))
            .collect::<Vec<_>>(),
    );
    let advice = p.advise(&usage(100, 1000));
    assert_eq!(named(&advice, Action::Demote).len(), 7);
}

/// `gone` forgets a chunk, and tracking is bounded by `max_tracked`.
#[test]
fn tracking_is_bounded() {
    let mut p = Policy::new(Knobs {
        max_tracked: 50,
        ..Knobs::default()
    });
    p.observe(&[access(AccessKind::Put, 1, 0, "a")]);
    p.observe(&[access(AccessKind::Gone, 1, 1, "a")]);
    assert_eq!(p.tracked(), 0);
    p.observe(
        &(0..1000)
            .map(|i| access(AccessKind::Put, i, 0, "a"))
            .collect::<Vec<_>>(),
    );
    assert!(p.tracked() <= 50);
}

/// The benchmark's claim on the default trace: the hot tier never exceeds
/// its capacity, no read misses, the shared prompt ends hot, and the
/// advisor's hit ratio beats plain LRU (and so no advisor) by a margin.
#[test]
fn advisor_beats_lru_on_the_shared_prompt_trace() {
    let w = sim::Workload::default();
    let advisor = sim::run(&w, Some(Knobs::default()));
    let lru = sim::run(
        &w,
        Some(Knobs {
            mode: Mode::Lru,
            ..Knobs::default()
        }),
    );
    for o in [&advisor, &lru] {
        assert!(o.max_hot_bytes <= o.capacity, "{o:?}");
        assert_eq!(o.lost, 0, "{o:?}");
    }
    assert_eq!(advisor.prefix_hot_at_end, w.prefix_chunks, "{advisor:?}");
    assert!(
        advisor.hit_ratio() > lru.hit_ratio() + 0.1,
        "advisor {advisor:?} vs LRU {lru:?}"
    );
}

/// The baseline must not cost hit ratio: on every trace of the benchmark,
/// plain LRU scores at least what the store scores with no advisor.
#[test]
fn lru_is_at_least_as_good_as_no_advisor() {
    let default = sim::Workload::default();
    let traces = [
        default.clone(),
        sim::Workload {
            scan_every: 0,
            ..default.clone()
        },
        sim::Workload {
            hot_pct: 40,
            ..default.clone()
        },
    ];
    for w in traces {
        let none = sim::run(&w, None);
        let lru = sim::run(
            &w,
            Some(Knobs {
                mode: Mode::Lru,
                ..Knobs::default()
            }),
        );
        assert_eq!(lru.refused, 0, "{lru:?}");
        assert!(lru.max_hot_bytes <= lru.capacity, "{lru:?}");
        assert!(
            lru.hit_ratio() >= none.hit_ratio(),
            "{w:?}: LRU {lru:?} vs no advisor {none:?}"
        );
    }
}

/// Moves the store reports put the chunk where it is: a demotion the store
/// made on its own is not advised again, and a promotion refused (no move
/// reported) is asked again on the next read from below.
#[test]
fn the_store_s_moves_keep_the_policy_where_the_chunks_are() {
    let mut p = Policy::new(Knobs {
        high_water_pct: 50,
        low_water_pct: 50,
        ..Knobs::default()
    });
    p.observe(&[
        access(AccessKind::Put, 0, 0, "m"),
        access(AccessKind::Put, 1, 0, "m"),
    ]);
    // The store demoted chunk 0 itself (room for a put): above high water,
    // only chunk 1 is still there to demote.
    p.observe_moves(&[Move {
        kind: MoveKind::Demoted,
        hash: h(0),
        len: 10,
        tier: 0,
    }]);
    let advice = p.advise(&usage(20, 20));
    assert_eq!(named(&advice, Action::Demote), [h(1)], "{advice:?}");
    // Not applied: no move reported, so chunk 1 is still believed hot and
    // advised again.
    assert_eq!(named(&p.advise(&usage(20, 20)), Action::Demote), [h(1)]);
    // Applied: reported, and nothing is left to demote.
    p.observe_moves(&[Move {
        kind: MoveKind::Demoted,
        hash: h(1),
        len: 10,
        tier: 0,
    }]);
    assert!(named(&p.advise(&usage(20, 20)), Action::Demote).is_empty());
    // Promotions: a chunk read from below is asked up once per read; a
    // reported promotion makes a later leave an eviction (a copy is below).
    let mut p = Policy::new(Knobs {
        promote_hits: 1.0,
        ..Knobs::default()
    });
    p.observe(&[access(AccessKind::Hit, 2, 1, "m")]);
    assert_eq!(named(&p.advise(&usage(100, 0)), Action::Promote), [h(2)]);
    assert!(named(&p.advise(&usage(100, 0)), Action::Promote).is_empty());
    p.observe(&[access(AccessKind::Hit, 2, 1, "m")]);
    assert_eq!(named(&p.advise(&usage(100, 0)), Action::Promote), [h(2)]);
    p.observe_moves(&[Move {
        kind: MoveKind::Promoted,
        hash: h(2),
        len: 10,
        tier: 1,
    }]);
    let advice = p.advise(&usage(10, 10));
    assert_eq!(named(&advice, Action::Evict), [h(2)], "{advice:?}");
}
