"""Shared by the integration tests: marks by name for LangChain's standard tests, which run as
their authors ship them (see test_langchain_standard.py), and a local Ray cluster for the Ray
tests."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(config, items):
    """A test module's PARAM_XFAILS marks one parametrization of a test (by its full name);
    MODEL_QUALITY marks every parametrization of the tests it names `model_quality` (they pass
    only if the model answers well); ONLY deselects the tests of the module's classes it does
    not name (a suite run for some of its tests)."""
    keep, drop = [], []
    for item in items:
        module, name = item.module, getattr(item, "originalname", item.name)
        marks = getattr(module, "PARAM_XFAILS", {})
        if item.name in marks:
            item.add_marker(marks[item.name])
        if name in getattr(module, "MODEL_QUALITY", ()):
            item.add_marker(pytest.mark.model_quality)
        only = getattr(module, "ONLY", None)
        (drop if only is not None and item.cls is not None and name not in only else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray cluster of 3 CPUs for one test module (replicas find agentrt on PYTHONPATH)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}})
    yield
    ray.shutdown()
