"""Which parametrised cases the quick tier (``python -m pytest -m "not slow"``) skips; used by
``tests/conftest.py``'s collection hook and tested in ``tests/test_quick_tier.py``."""


def quick_tier_cases(items: list) -> list:
    """The parametrised cases that the quick tier skips: per test function, a case whose every
    (parameter, value) pair an earlier, not-``slow`` case of the same function already ran.
    ``items``: collected test items in collection order. Returns the items to mark ``slow``.

    A value is told apart by identity: pytest hands every combination the same object from the
    ``parametrize`` list (values may be arrays or other unhashable objects)."""
    covered: dict = {}
    redundant = []
    for item in items:
        spec = getattr(item, "callspec", None)
        if spec is None or item.get_closest_marker("slow") is not None:
            continue
        function = (item.path, item.cls, getattr(item, "originalname", item.name))
        pairs = {(name, id(value)) for name, value in spec.params.items()}
        seen = covered.setdefault(function, set())
        if pairs <= seen:
            redundant.append(item)
        seen |= pairs
    return redundant
