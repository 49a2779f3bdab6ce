"""Structure-aware fuzzing of load -> run in a watched subprocess (opwarden.verify.fuzz).

Every example (a seed model with its graph structure mutated, plus mutated feeds) must load
and run or raise an OpwardenError; another exception, a non-array output, a crash or a hang is
a failure listed with its reproducer. ``OPWARDEN_FUZZ_EXAMPLES=N`` runs a longer campaign,
``OPWARDEN_FUZZ_SEED=S`` another one.
"""

from __future__ import annotations

import os

from opwarden.verify import fuzz

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = int(os.environ.get("OPWARDEN_FUZZ_EXAMPLES", "1000"))
SEED = int(os.environ.get("OPWARDEN_FUZZ_SEED", "0"))
EXTRA_SEEDS = ("tests.models:small_cnn", "tests.models:small_cnn(batch=2, opset=17)")

# Escapes already routed to their owners, matched on Result.signature (status:error@where,
# fnmatch patterns). Each entry goes once its fix lands; anything not listed fails the test.
# (Empty: every escape found so far has its fix and a test in tests/test_fuzz_regressions.py.)
KNOWN_OPEN: dict[str, str] = {}


def test_structure_fuzz_escapes_only_opwarden_errors():
    rep = fuzz.campaign(SEED, EXAMPLES, timeout=10.0, extra_seeds=EXTRA_SEEDS, cwd=ROOT)
    assert len(rep.results) == EXAMPLES
    counts = rep.counts()
    # the corpus and mutators reach both outcomes; a broken generator would not
    assert counts.get("ok", 0) > EXAMPLES // 20 and counts.get("refused", 0) > EXAMPLES // 4
    assert counts.get("generator", 0) == 0, rep.format(
        [r for r in rep.results if r.status == "generator"]
    )
    new = [r for r in rep.failures if not fuzz.matches(r, KNOWN_OPEN)]
    assert not new, f"{len(new)} new escapes:\n" + rep.format(new, tracebacks=True)


def test_examples_are_reproducible():
    corpus = fuzz.build_corpus(node_suite=False)
    a = [fuzz.make_example(corpus, 7, k) for k in range(40)]
    b = [fuzz.make_example(corpus, 7, k) for k in range(40)]
    assert [e.model for e in a] == [e.model for e in b]
    assert [e.mutations for e in a] == [e.mutations for e in b]
    assert len({e.model for e in a}) > 20  # examples differ from one another


def test_runner_records_crash_and_hang_and_goes_on():
    rep = fuzz.campaign(
        3, 6, timeout=3.0, node_suite=False, inject={1: "crash", 3: "hang"}, cwd=ROOT
    )
    by_index = {r.index: r for r in rep.results}
    assert sorted(by_index) == list(range(6))
    assert by_index[1].status == "crash" and "exit status" in by_index[1].message
    assert by_index[3].status == "hang" and "time.sleep" not in by_index[3].where
    assert "Timeout" in by_index[3].detail  # faulthandler's stack of the hung worker
    assert all(by_index[k].status not in ("crash", "hang") for k in (0, 2, 4, 5))
    assert "--seed 3 --index 1" in rep.format()
