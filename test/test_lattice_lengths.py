"""Which (frames, labels) pairs have a path: espnet_multiblank.lattice's
reachable_lengths / max_labels / has_path against an exhaustive search of the lattice
written here from docs/lattice.md (nodes, symbols, the end rule), not from the
functions' arithmetic."""

import functools
import itertools

import pytest

from espnet_multiblank.lattice import (
    MultiblankLattice,
    TDTLattice,
    has_path,
    max_labels,
    reachable_lengths,
)

LATTICES = [
    MultiblankLattice(0, ()),
    MultiblankLattice(3, (2, 4, 8)),
    MultiblankLattice(1, (3,)),
    TDTLattice(0, (0, 1, 2, 3, 4)),
    TDTLattice(0, (0, 2, 4)),
    TDTLattice(0, (2, 4)),
    TDTLattice(0, (0, 3, 5)),
    TDTLattice(0, (5, 3)),
    TDTLattice(0, (2, 3)),
    TDTLattice(0, (1, 2)),
    TDTLattice(0, (0, 4, 6)),
    TDTLattice(0, (0, 6, 9, 4)),
    TDTLattice(2, (3,)),
    TDTLattice(0, (0, 1)),
]
MAX_T = 26
MAX_L = 9


def _symbols(lattice):
    """[(is_blank, frames)] of every arc kind a node offers (docs/lattice.md)."""
    if isinstance(lattice, MultiblankLattice):
        return (
            [(True, 1)]
            + [(True, d) for d in lattice.big_blank_durations]
            + [(False, 0)]
        )
    arcs = [(False, e) for e in lattice.durations]
    return arcs + [(True, e) for e in lattice.durations if e >= 1]


def search_has_path(lattice, T, L):
    """Exhaustive search from node (0, 0): a step lands on t + n < T (a node), ends
    the path when a blank after the last label lands exactly on T, else leads
    nowhere. T = 0: only the empty utterance (L = 0) has the empty path."""
    if T == 0:
        return L == 0
    arcs = _symbols(lattice)

    @functools.lru_cache(maxsize=None)
    def completes(t, u):
        for is_blank, n in arcs:
            if not is_blank and u == L:
                continue
            dest, du = t + n, u + (0 if is_blank else 1)
            if dest < T:
                if (dest, du) != (t, u) and completes(dest, du):
                    return True
            elif dest == T and is_blank and u == L:
                return True
        return False

    return completes(0, 0)


@pytest.mark.parametrize("lattice", LATTICES, ids=repr)
def test_has_path_and_max_labels_equal_search(lattice):
    limit_free = isinstance(lattice, MultiblankLattice) or 0 in lattice.durations
    for T in range(MAX_T + 1):
        found = [L for L in range(MAX_L + 1) if search_has_path(lattice, T, L)]
        for L in range(MAX_L + 1):
            assert has_path(lattice, T, L) == (L in found), (T, L)
        # the labels that fit are 0..max, never with holes
        assert found == list(range(len(found))), (T, found)
        got = max_labels(lattice, T)
        if not found:
            assert got == -1, T
        elif T > 0 and limit_free:
            assert got is None and len(found) == MAX_L + 1, T
        elif len(found) <= MAX_L:
            assert got == found[-1], (T, found)
        else:
            assert got is not None and got >= MAX_L, (T, got)


@pytest.mark.parametrize("lattice", LATTICES, ids=repr)
def test_reachable_lengths_equal_search(lattice):
    reach = reachable_lengths(lattice)
    for T in range(1, MAX_T + 1):
        want = any(search_has_path(lattice, T, L) for L in range(MAX_L + 1))
        assert (T in reach) == want, T
    assert 0 not in reach


def _sums(moves, limit):
    """Every sum of >= 1 of ``moves`` that is <= limit (plain set closure)."""
    out = set()
    frontier = set(moves)
    while frontier:
        out |= frontier
        frontier = {s + m for s in frontier for m in moves if s + m <= limit} - out
    return {s for s in out if s <= limit}


@pytest.mark.parametrize("lattice", LATTICES, ids=repr)
def test_gaps_count_period_and_large_lengths(lattice):
    """Far beyond the search's grid: membership, the finite gap list, its count and
    the period against the sums of blank moves (the lengths a path of blanks only
    reaches; labels' frames are blank durations too in these lattices)."""
    reach = reachable_lengths(lattice)
    if isinstance(lattice, MultiblankLattice):
        blanks = [1, *lattice.big_blank_durations]
    else:
        blanks = [e for e in lattice.durations if e >= 1]
    limit = 400
    sums = _sums(blanks, limit)
    assert {T for T in range(1, limit + 1) if T in reach} == sums
    gaps = list(reach.gaps())
    assert len(gaps) == reach.gap_count
    assert gaps == sorted(gaps)
    assert all(g % reach.period == 0 and g not in reach for g in gaps)
    assert set(gaps) == {
        T for T in range(1, limit + 1) if T % reach.period == 0 and T not in sums
    }
    assert all(T in sums for T in range(limit - 20, limit + 1) if T % reach.period == 0)
    assert reach.all_reachable == (not gaps and reach.period == 1)


@pytest.mark.parametrize(
    "durations, period, gaps, words",
    [
        ((0, 2, 4), 2, [], "every T that is not a multiple of 2 (T = 1, 3, 5, ...)"),
        ((2, 4), 2, [], "every T that is not a multiple of 2 (T = 1, 3, 5, ...)"),
        ((0, 3, 5), 1, [1, 2, 4, 7], "T = 1, 2, 4, 7"),
        ((2, 3), 1, [1], "T = 1"),
        (
            (0, 4, 6),
            2,
            [2],
            "every T that is not a multiple of 2 (T = 1, 3, 5, ...) and T = 2",
        ),
        ((0, 1, 2, 3, 4), 1, [], "none"),
        ((1, 2), 1, [], "none"),
    ],
)
def test_worked_examples(durations, period, gaps, words):
    """The brief's examples, by hand: [0, 3, 5] cannot make 1, 2, 4, 7 (3 + 3 = 6,
    3 + 5 = 8, then everything); [0, 2, 4] makes the even lengths only."""
    reach = reachable_lengths(TDTLattice(0, durations))
    assert (reach.period, list(reach.gaps())) == (period, gaps)
    assert reach.describe() == words


def test_large_durations_are_described_without_listing_every_gap():
    """[1000, 1001]: 499500 gaps, the largest 1000 * 1001 - 1000 - 1001 (Sylvester);
    computed from 1000 residues, listed lazily."""
    reach = reachable_lengths(TDTLattice(0, (0, 1000, 1001)))
    assert reach.gap_count == 999 * 1000 // 2
    assert 998999 not in reach and 999000 in reach and 2001 in reach
    words = reach.describe()
    assert words.startswith("T = 1, 2, 3, 4, 5, 6, 7, 8, ...") and "998999" in words
    assert list(itertools.islice(reach.gaps(), 3)) == [1, 2, 3]


def test_labels_that_cover_frames_limit_the_label_count():
    """[1, 2]: each label covers >= 1 frame and a blank ends the path: L <= T - 1.
    [2, 3]: L <= T // 2 - 1 (2 frames per label, one blank of 2 or 3)."""
    for T in range(1, 30):
        assert max_labels(TDTLattice(0, (1, 2)), T) == T - 1
        assert max_labels(TDTLattice(0, (2, 3)), T) == (T // 2 - 1 if T > 1 else -1)
    assert max_labels(TDTLattice(0, (0, 2)), 4) is None
    assert max_labels(TDTLattice(0, (0, 2)), 5) == -1
    assert max_labels(MultiblankLattice(0, ()), 1) is None
    assert max_labels(MultiblankLattice(0, ()), 0) == 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_frames must be >= 0"):
        max_labels(MultiblankLattice(0), -1)
    with pytest.raises(TypeError, match="num_frames must be an int"):
        max_labels(MultiblankLattice(0), 2.0)
    with pytest.raises(ValueError, match="num_labels must be >= 0"):
        has_path(MultiblankLattice(0), 3, -2)
    with pytest.raises(TypeError, match="lattice must be a MultiblankLattice"):
        reachable_lengths((0, 2, 4))
