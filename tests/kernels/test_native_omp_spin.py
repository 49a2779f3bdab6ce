"""The compiled extension's libgomp spin default: set only while the extension loads, never
left in the environment, and never over a policy the user set."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from opwarden import native


def test_spin_default_not_left_in_environment():
    # (the extension loaded at import; the variable was set and removed around it)
    if "GOMP_SPINCOUNT" in os.environ or "OMP_WAIT_POLICY" in os.environ:
        pytest.skip("the environment sets an OpenMP wait policy itself")
    assert "GOMP_SPINCOUNT" not in os.environ


def test_short_spin_sets_then_restores(monkeypatch):
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    with native._short_omp_spin():
        assert os.environ["GOMP_SPINCOUNT"] == native.OMP_SPIN
    assert "GOMP_SPINCOUNT" not in os.environ


@pytest.mark.parametrize("key,value", [("GOMP_SPINCOUNT", "300000"),
                                       ("OMP_WAIT_POLICY", "ACTIVE")])
def test_user_policy_wins(monkeypatch, key, value):
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setenv(key, value)
    with native._short_omp_spin():
        assert os.environ[key] == value
        assert "GOMP_SPINCOUNT" not in os.environ or key == "GOMP_SPINCOUNT"
    assert os.environ[key] == value


def test_child_process_environment_untouched():
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    code = ("import os, opwarden.native as n; n.status(); "
            "print(os.environ.get('GOMP_SPINCOUNT', '-'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "-"
