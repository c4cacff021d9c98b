"""orthros/kinds.py: the layer-kind vocabulary refuses bad input with a ValueError naming it."""

import pytest

from orthros.kinds import hybrid_layout, resolve_layer_types


def test_layer_types_with_an_unhashable_entry_are_named():
    with pytest.raises(ValueError, match=r"layer_types has unknown kinds \[\['orthros_attention'\]\]"):
        resolve_layer_types([["orthros_attention"], "linear_attention"], 2, None)


@pytest.mark.parametrize("name", ["gdn", "orthros-h", "linear-hybrid"])
@pytest.mark.parametrize("num_layers", [0, -1, "4", 4.0, True, None])
def test_hybrid_layout_refuses_a_bad_num_layers(name, num_layers):
    with pytest.raises(ValueError, match="num_layers"):
        hybrid_layout(name, num_layers)


def test_hybrid_layouts():
    assert hybrid_layout("gdn", 2) == {"layer_types": ["linear_attention"] * 2}
    assert hybrid_layout("orthros-h", 4) == {"layer_types": ["linear_attention"] * 3 + ["orthros_attention"],
                                             "attention_mode": "orthros"}
