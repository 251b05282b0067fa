"""How a parametrization splits over the two test tiers: the cases the unit tier runs (one per code path),
the rest marked ``e2e`` (pyproject's marker: the end-to-end tier, which CI runs second)."""

import pytest


def unit_and_e2e(values, in_unit):
    """``values`` as pytest parameters: each ``v`` with ``in_unit(v)`` true as it is (the unit tier), every other
    one marked ``e2e``."""
    return [v if in_unit(v) else pytest.param(v, marks=pytest.mark.e2e) for v in values]
