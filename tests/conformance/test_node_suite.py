"""The ONNX backend node suite through InferenceSession, against the expected-failures list.

A case passes the test when it passes the suite, or when it fails and is listed (with its
reason) in opwarden/verify/expected_failures.txt (shipped with the package). A listed case
that starts passing fails the test: remove it from the list, which may only shrink.
"""

from __future__ import annotations

import pytest

from opwarden.verify import conformance as conf

CASES = conf.load_cases()
EXPECTED = conf.read_expected()


def test_suite_is_large_enough():
    assert len(CASES) >= 1800


def test_expected_list_names_real_cases():
    names = {c.name for c in CASES}
    assert set(EXPECTED) <= names, sorted(set(EXPECTED) - names)[:10]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node_case(case):
    result = conf.run_case(case)
    if result.status == "skip":
        pytest.skip(result.reason)
    if case.name in EXPECTED:
        assert result.status != "pass", (
            f"{case.name} passes now: remove it from opwarden/verify/expected_failures.txt"
        )
    else:
        assert result.status == "pass", result.reason


def test_backend_adapter_drives_onnx_backendtest():
    """onnx's own BackendTest runs (a slice of) the node suite through our Backend adapter."""
    import unittest

    import onnx.backend.test

    from opwarden.verify import backend

    bt = onnx.backend.test.BackendTest(backend, __name__)
    bt.include(r"^test_(relu|add_bcast|conv_with_strides_padding|softmax_axis_0)_cpu$")
    suite = unittest.TestSuite()
    for case in bt.test_cases.values():
        suite.addTests(unittest.defaultTestLoader.loadTestsFromTestCase(case))
    result = unittest.TextTestRunner(verbosity=0).run(suite)
    assert result.testsRun >= 4
    assert result.wasSuccessful(), result.failures + result.errors
