"""Shared by the integration tests: marks for single parameters of LangChain's standard tests
(see test_langchain_standard.py), and a local Ray cluster for the Ray tests."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(items):
    for item in items:
        marks = getattr(item.module, "PARAM_XFAILS", {})
        if item.name in marks:
            item.add_marker(marks[item.name])


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray cluster of 3 CPUs for one test module (replicas find agentrt on PYTHONPATH)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}})
    yield
    ray.shutdown()
