"""The traces' matcher gives difflib's own opcodes (the alignment the depth extrapolation was
checked with to the byte), on random sequences of few values and on layered ones."""

import difflib
import random

import pytest

from trainfit.memory.trace_align import TraceMatcher


def _difflib(a, b):
    return difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()


@pytest.mark.parametrize("seed", range(40))
def test_random_sequences_of_few_values_align_as_difflib_aligns_them(seed):
    rng = random.Random(seed)
    values = [(rng.random() < 0.5, rng.choice((512, 1024, 4096)), rng.randrange(2))
              for _ in range(rng.randint(1, 6))]
    a = [rng.choice(values) for _ in range(rng.randint(0, 120))]
    b = [rng.choice(values) for _ in range(rng.randint(0, 120))]
    assert TraceMatcher(a, b).get_opcodes() == _difflib(a, b)


@pytest.mark.parametrize("seed", range(10))
def test_a_deeper_layered_trace_aligns_as_difflib_aligns_it(seed):
    """Prefix, layers' forwards, head, layers' backwards, optimizer: the deeper trace has more
    layers, the insertions difflib places are the matcher's."""
    rng = random.Random(100 + seed)
    layer = [rng.choice(("a", "f", "g")) + str(rng.randrange(3)) for _ in range(rng.randint(3, 12))]
    back = [rng.choice(("a", "f")) + str(rng.randrange(3)) for _ in range(rng.randint(3, 12))]

    def trace(depth):
        return (["p0", "p1"] + layer * depth + ["h", "a1", "f1"] + back * depth
                + ["o"] * depth + ["end"])

    shallow, deeper = trace(2 + seed % 3), trace(4 + seed % 3 + seed % 2)
    ops = TraceMatcher(shallow, deeper).get_opcodes()
    assert ops == _difflib(shallow, deeper)
    assert {tag for tag, *_ in ops} <= {"equal", "insert"}
    inserted = sum(j2 - j1 for tag, _, _, j1, j2 in ops if tag == "insert")
    assert inserted == len(deeper) - len(shallow) > 0


def test_ranges_and_empty_sequences():
    m = TraceMatcher("abcabcab", "cabcxabca")
    for rng in ((0, 8, 0, 9), (2, 5, 1, 9), (0, 8, 4, 5), (3, 3, 0, 9)):
        want = difflib.SequenceMatcher(None, "abcabcab", "cabcxabca",
                                       autojunk=False).find_longest_match(*rng)
        assert m.find_longest_match(*rng) == want
    assert TraceMatcher([], []).get_opcodes() == []
    assert TraceMatcher([], [1]).get_opcodes() == [("insert", 0, 0, 0, 1)]
