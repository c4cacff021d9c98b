"""orthros/kinds.py: the layer-kind vocabulary refuses bad input with a ValueError naming it."""

import pytest

from orthros.kinds import hybrid_layout, resolve_layer_types


def test_layer_types_with_an_unhashable_entry_are_named():
    with pytest.raises(ValueError, match=r"layer_types has unknown kinds \[\['orthros_attention'\]\]"):
        resolve_layer_types([["orthros_attention"], "linear_attention"], 2, None)


@pytest.mark.parametrize("name", ["gdn", "orthros-h", "linear-hybrid"])
@pytest.mark.parametrize("num_layers", [0, -1, "4", 4.0, True, None])
def test_hybrid_layout_refuses_a_bad_num_layers(name, num_layers):
    # 4.0 was refused as "needs num_layers >= 4, got 4.0": the rule it broke (an integer) unsaid
    with pytest.raises(ValueError, match=f"needs num_layers >= {1 if name == 'gdn' else 4} \\(an integer.*got {num_layers!r}"):
        hybrid_layout(name, num_layers)


def test_hybrid_layouts():
    assert hybrid_layout("gdn", 2) == {"layer_types": ["linear_attention"] * 2, "attention_mode": "full"}
    assert hybrid_layout("orthros-h", 4) == {"layer_types": ["linear_attention"] * 3 + ["orthros_attention"],
                                             "attention_mode": "orthros"}


def test_model_kind_tells_a_gdn_model_with_an_output_stream_apart():
    """GDN layers only, with attention_mode 'orthros', read an output stream (another model of the
    same weights): `orthros info` and the trainer's dry run named it 'GDN' like the plain one."""
    from orthros.kinds import model_kind

    gdn = ["linear_attention"] * 4
    assert model_kind(gdn, "full") == model_kind(gdn, "window") == "GDN"
    assert model_kind(gdn, "orthros") == "GDN with output stream"
    assert model_kind(["linear_attention"] * 3 + ["orthros_attention"], "orthros") == "Orthros-H"
    assert model_kind(["linear_attention", "window_attention"], "window") == "SWA + GDN"


def test_the_gdn_layout_names_its_mode():
    """hybrid_layout('gdn') gave layer_types only, so merged over a caller's attention_mode 'orthros'
    (make_tiny_checkpoint's default) it built GDN layers with an output stream, not the GDN baseline."""
    from orthros.models import OrthrosConfig

    kw = dict(vocab_size=10, hidden_size=16, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2)
    assert OrthrosConfig(**{**kw, "attention_mode": "orthros", **hybrid_layout("gdn", 2)}).attention_mode == "full"
