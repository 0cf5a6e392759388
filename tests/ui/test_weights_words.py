"""The model line names how the float32 model multiplies: on its file's blocks or on its float weights."""

from types import SimpleNamespace

from ui.model_view import weights_words


def _lm(weights="fp32", dtype="float32", blocks=None):
    return SimpleNamespace(weights=weights, dtype=dtype, ee=SimpleNamespace(blocks=blocks))


def test_the_model_line_says_where_the_float32_products_come_from():
    on_blocks = weights_words(_lm(blocks={1: object()}))
    assert "exact reference" in on_blocks and "GGUF file's blocks widened in registers" in on_blocks
    plain = weights_words(_lm(weights="fp32-torch"))
    assert "exact reference" in plain and "blocks" not in plain
    assert "not to float32" in weights_words(_lm(weights="q4"))
