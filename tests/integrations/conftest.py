"""Marks for single parameters of LangChain's standard tests (see test_langchain_standard.py)."""


def pytest_collection_modifyitems(items):
    for item in items:
        marks = getattr(item.module, "PARAM_XFAILS", {})
        if item.name in marks:
            item.add_marker(marks[item.name])
