"""The memory floor of a decoding step: the bytes a token must read, over the measured bandwidth."""

from memosight.engine import load_engine
from memosight.engine.bench.floor import floor, kv_bytes_per_token, weight_bytes_per_token


def test_a_step_reads_every_layer_weight_and_the_kv_cache_but_one_row_of_an_untied_embedding(tiny_model_dir):
    model = load_engine(str(tiny_model_dir)).model
    everything = sum(p.numel() * p.element_size() for p in model.parameters())
    embedding = model.get_input_embeddings().weight
    tied = model.get_output_embeddings().weight is embedding
    expected = everything if tied else everything - embedding.numel() * embedding.element_size()
    assert weight_bytes_per_token(model) >= expected
    c = model.config
    heads = c.num_key_value_heads or c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    assert kv_bytes_per_token(model, 100, 4) == 2 * c.num_hidden_layers * heads * head_dim * 100 * 4
    f = floor(model, 100, plain_ms_per_token=1.0)
    assert f["read_gb_per_s"] > 0 and f["floor_ms"] > 0
    # times_floor is 1 ms over the floor; both figures are rounded (3 and 2 decimals), which bounds
    # the product's error (a fast machine's floor of ~0.013 ms is off by up to 4% from rounding alone)
    assert abs(f["times_floor"] * f["floor_ms"] - 1.0) <= 0.0005 * f["times_floor"] + 0.005 * f["floor_ms"] + 1e-9
