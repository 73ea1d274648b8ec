"""The test run's own summary (conftest.py): seconds per tier and the slowest test modules, which
CI's log shows so that a growing suite's cost is seen where it is."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]


def test_the_summary_gives_time_per_tier_and_the_slowest_modules(pytester):
    pytester.makeconftest((ROOT / "conftest.py").read_text())
    for i in range(14):
        pytester.makepyfile(**{f"test_m{i:02d}": f"import time\n\ndef test_a():\n    time.sleep({0.05 if i == 7 else 0})\n"})
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=14)
    out = result.stdout.str()
    assert "time per tier" in out and "unit" in out
    assert "slowest 12 test modules" in out
    listed = [line for line in out.splitlines() if line.rstrip().endswith(".py") and " s  " in line]
    assert len(listed) == 12 and listed[0].endswith("test_m07.py"), listed


def _layout(pytester, helm_uses_the_session_cluster: bool = False) -> None:
    """tests/ (host), two e2e modules on the session's `cluster` (slurm-local), two of their own (side);
    each test notes the pytest-xdist worker it ran on, by group."""
    pytester.makeconftest((ROOT / "conftest.py").read_text())
    note = ("import os\n\ndef note(group):\n"
            "    with open(os.path.join({root!r}, group + '.workers'), 'a') as fh:\n"
            "        fh.write(os.environ.get('PYTEST_XDIST_WORKER', '-') + '\\n')\n").format(root=str(pytester.path))
    (pytester.path / "tests").mkdir()
    (pytester.path / "e2e").mkdir()
    (pytester.path / "e2e" / "kubeshare.py").write_text((ROOT / "e2e" / "kubeshare.py").read_text())
    (pytester.path / "e2e" / "conftest.py").write_text(
        "import pytest\n\ndef pytest_configure(config):\n    config.addinivalue_line('markers', 'e2e: e2e')\n\n"
        "@pytest.fixture(scope='session')\ndef cluster():\n    return 'the session cluster'\n")
    for i in range(3):
        (pytester.path / "tests" / f"test_u{i}.py").write_text(
            note + "".join(f"\ndef test_{j}():\n    note('host')\n" for j in range(3)))
    e2e = note + "import pytest\n\npytestmark = pytest.mark.e2e\n"
    for name in ("cluster", "drift"):
        (pytester.path / "e2e" / f"test_e2e_{name}.py").write_text(
            e2e + "".join(f"\ndef test_{j}(cluster):\n    note('slurm-local')\n" for j in range(3)))
    helm_args = "cluster" if helm_uses_the_session_cluster else ""
    (pytester.path / "e2e" / "test_e2e_helm.py").write_text(
        e2e + "".join(f"\ndef test_{j}({helm_args}):\n    note('side-helm')\n" for j in range(3)))
    (pytester.path / "e2e" / "test_e2e_topology.py").write_text(e2e + "\ndef test_0():\n    note('side-topology')\n")
    # two side modules in one namespace (conftest.SIDE_SHARED): one unit
    for name in ("sleep", "sleep_login"):
        (pytester.path / "e2e" / f"test_e2e_{name}.py").write_text(
            e2e + "".join(f"\ndef test_{j}():\n    note('side-sleepy')\n" for j in range(2)))


def test_each_scheduling_unit_runs_whole_on_one_worker(pytester, monkeypatch):
    """host and slurm-local side by side, each whole on one worker; each side module whole on one
    worker (either), the two sleepy modules together, helm and topology together."""
    monkeypatch.setenv("SLURMK8S_E2E_SHARE_LOCK", str(pytester.path / "share.lock"))  # not this machine's
    _layout(pytester)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--all-tiers", "-n", "2", "--dist", "loadgroup",
                                           "tests", "e2e")
    result.assert_outcomes(passed=9 + 6 + 4 + 4)
    units = ("host", "slurm-local", "side-helm", "side-topology", "side-sleepy")
    workers = {unit: (pytester.path / f"{unit}.workers").read_text().split() for unit in units}
    assert {unit: len(seen) for unit, seen in workers.items()} == {
        "host": 9, "slurm-local": 6, "side-helm": 3, "side-topology": 1, "side-sleepy": 4}
    assert all(len(set(seen)) == 1 for seen in workers.values()), workers
    assert set(workers["host"]) != set(workers["slurm-local"]), workers  # side by side
    assert set(workers["side-helm"]) == set(workers["side-topology"]), workers  # one unit (node labels)
    out = result.stdout.str()
    assert "time per run group" in out and all(f"\n{g} " in out for g in ("host", "slurm-local", "side")), out


def test_scheduling_units():
    import importlib.util

    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    unit = conftest.schedule_unit
    assert unit("tests/test_x.py::test_a") == unit("tests/integration/test_y.py::test_b") == "host"
    assert unit("e2e/test_e2e_cluster.py::test_a") == unit("e2e/test_e2e_faults.py::test_b") == "slurm-local"
    assert unit("e2e/test_e2e_helm.py::test_a") == "side:e2e/test_e2e_helm.py"
    assert unit("e2e/test_e2e_zz_quickstart.py::test_a") != unit("e2e/test_e2e_helm.py::test_a")
    # the two that change node labels run one after the other
    assert unit("e2e/test_e2e_topology.py::test_a") == unit("e2e/test_e2e_helm.py::test_a")
    # the two modules that deploy the sleepy cluster into one namespace never run side by side
    assert unit("e2e/test_e2e_sleep_login.py::test_a") == unit("e2e/test_e2e_sleep.py::test_b")


def test_a_side_module_on_the_session_cluster_is_refused(pytester, monkeypatch):
    """Two workers would each deploy the session's cluster, into one namespace."""
    monkeypatch.setenv("SLURMK8S_E2E_SHARE_LOCK", str(pytester.path / "share.lock"))
    _layout(pytester, helm_uses_the_session_cluster=True)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--all-tiers", "e2e")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "e2e/test_e2e_helm.py::test_0 uses the session's cluster: take its module out of SIDE_E2E_MODULES" \
        in result.stderr.str()


def test_a_test_marked_e2e_alone_runs_while_no_other_e2e_test_does(pytester, monkeypatch):
    """Two workers: the session cluster's tests beside the side group's, one of which stops the
    cluster (e2e_alone). Each test notes when it ran; nothing overlaps the one alone."""
    monkeypatch.setenv("SLURMK8S_E2E_SHARE_LOCK", str(pytester.path / "share.lock"))
    pytester.makeconftest((ROOT / "conftest.py").read_text())
    (pytester.path / "e2e").mkdir()
    (pytester.path / "e2e" / "kubeshare.py").write_text((ROOT / "e2e" / "kubeshare.py").read_text())
    (pytester.path / "e2e" / "conftest.py").write_text(
        "import pytest\n\ndef pytest_configure(config):\n    config.addinivalue_line('markers', 'e2e: e2e')\n\n"
        "@pytest.fixture(scope='session')\ndef cluster():\n    return 'the session cluster'\n")
    ran = pytester.path / "ran"
    head = ("import time\nimport pytest\n\npytestmark = pytest.mark.e2e\n\n"
            f"def note(name, t0):\n    with open({str(ran)!r}, 'a') as fh:\n"
            "        fh.write(f'{name} {t0} {time.time()}\\n')\n")
    (pytester.path / "e2e" / "test_e2e_cluster.py").write_text(head + "".join(
        f"\ndef test_{i}(cluster):\n    t0 = time.time()\n    time.sleep(0.15)\n    note('shared{i}', t0)\n"
        for i in range(12)))
    (pytester.path / "e2e" / "test_e2e_helm.py").write_text(head + "".join(
        f"\ndef test_{i}():\n    t0 = time.time()\n    time.sleep(0.1)\n    note('side{i}', t0)\n" for i in range(3))
        + "\n@pytest.mark.e2e_alone\ndef test_stops_the_cluster():\n    t0 = time.time()\n    time.sleep(0.5)\n"
          "    note('alone', t0)\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--all-tiers", "-n", "2", "--dist", "loadgroup",
                                           "e2e")
    result.assert_outcomes(passed=16)
    spans = {name: (float(t0), float(t1)) for name, t0, t1 in (line.split() for line in ran.read_text().splitlines())}
    a0, a1 = spans.pop("alone")
    assert not [name for name, (t0, t1) in spans.items() if t0 < a1 and a0 < t1], spans
    side = [span for name, span in spans.items() if name.startswith("side")]
    shared = [span for name, span in spans.items() if name.startswith("shared")]
    assert any(s0 < t1 and t0 < s1 for s0, s1 in side for t0, t1 in shared), "the two groups never ran side by side"

