"""What the Pallas kernels take is declared once (mx_proxy.numerics.kernel_support): a recipe's ``backend="pallas"``
check and the kernels' own check (``pallas.supported.check_spec``) accept and refuse the same specs."""

import itertools

import pytest

from mx_proxy.numerics import formats, kernel_support, scale_rules
from mx_proxy.numerics.quantize import NVFP4, NVFP4_2D, MXSpec
from mx_proxy.numerics.recipe_type import Recipe
from mx_proxy.pallas import quantize as mxq
from mx_proxy.pallas import supported


def _specs() -> list[MXSpec]:
    out = [NVFP4, NVFP4_2D, NVFP4.replace(rounding="stochastic")]
    for element, rule, dims, rounding, size in itertools.product(
            formats.MX_ELEMENTS, scale_rules.names(), (1, 2), ("even", "away", "stochastic"), (32, 48)):
        try:
            out.append(MXSpec(element, block_size=size, scale_rule=rule, block_dims=dims, rounding=rounding))
        except ValueError:  # a combination the spec itself refuses (paper_bump: E4M3 1-D blocks only)
            continue
    return out


def _accepts(check) -> bool:
    try:
        check()
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("spec", _specs(), ids=lambda s: s.name)
def test_the_recipe_check_and_the_kernels_check_agree(spec):
    kernels = _accepts(lambda: supported.check_spec(spec, "a_spec"))
    recipe = _accepts(lambda: Recipe(fwd_x=spec, backend="pallas"))
    assert kernels == recipe == (not kernel_support.refusals(spec, "a_spec")), spec.name


def test_one_declaration_behind_both_names():
    assert mxq.MX_FORMATS is supported.MX_FORMATS is kernel_support.ELEMENTS is formats.MX_ELEMENTS
    assert mxq.ROUNDINGS == kernel_support.ROUNDINGS and mxq.kernel_rules() == kernel_support.rules()


def test_a_block_size_that_is_not_a_power_of_two_is_refused_by_the_recipe_too():
    spec = MXSpec("fp8_e4m3", block_size=48)
    with pytest.raises(ValueError, match="block_size 48 is not a power of two"):
        supported.check_spec(spec, "a_spec")
    with pytest.raises(ValueError, match="fwd_x, fwd_w use block size 48 \\(not a power of two\\).*backend 'xla'"):
        Recipe(fwd_x=spec, fwd_w=spec, backend="pallas")
    Recipe(fwd_x=spec, fwd_w=spec)  # the XLA path takes it


def test_a_recipe_names_every_reason_and_its_operands():
    with pytest.raises(ValueError) as err:
        Recipe(fwd_x=NVFP4, fwd_w=NVFP4_2D, dgrad_g=NVFP4.replace(rounding="stochastic"), backend="pallas")
    msg = str(err.value)
    assert "fwd_x, fwd_w, dgrad_g use E4M3 (NVFP4) scales" in msg and "fwd_w use 2-D tiles" in msg
    assert "dgrad_g use stochastic rounding" in msg and "floor/rceil/ceil/even" in msg
