"""all-MiniLM-L6-v2 rebuilt as an ONNX graph straight from its safetensors weights.

The BERT encoder, mean pooling and L2 normalisation are written node by node with
``onnx.helper``, so neither torch nor sentence-transformers is needed at any point; the
embedder (`integrations.embeddings.minilm`) builds the graph once and caches it on disk.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["GRAPH_VERSION", "OPSET", "UnsupportedModel", "build_onnx_model"]

# Bump when the graph layout below changes, so stale cache files are not reused.
# 2: the final hidden states are a second output (`token_embeddings`) for late interaction.
GRAPH_VERSION = 2
OPSET = 17


class UnsupportedModel(ValueError):
    """The model's config asks for something this graph does not implement."""


def build_onnx_model(
    weights: dict[str, np.ndarray], config: dict[str, Any], *, fused: bool = True
) -> Any:
    """Rebuild the BERT encoder + mean pooling + L2 normalisation as an ONNX model.

    Inputs: ``input_ids`` and ``attention_mask`` (int64, [batch, seq]). Outputs:
    ``sentence_embedding`` (float32, [batch, hidden]) and ``token_embeddings`` (the last
    layer's hidden states before pooling, float32, [batch, seq, hidden]). Token type ids are
    always 0 for single sentences, so that embedding row is folded into the position table.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    layers = int(config["num_hidden_layers"])
    eps = float(config["layer_norm_eps"])
    if config.get("hidden_act", "gelu") != "gelu":
        raise UnsupportedModel(f"unsupported activation {config.get('hidden_act')!r}")
    head_dim = hidden // heads

    nodes: list[Any] = []
    inits: list[Any] = []

    def const(name: str, arr: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def node(op: str, inputs: list[str], out: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, inputs, [out], name=f"{op}_{out}", **attrs))
        return out

    def w(key: str) -> np.ndarray:
        return weights[key].astype(np.float32)

    def linear(x: str, prefix: str, out: str) -> str:
        # torch Linear stores [out, in]; MatMul wants [in, out].
        wt = const(f"{prefix}.weight_t", w(f"{prefix}.weight").T)
        b = const(f"{prefix}.bias", w(f"{prefix}.bias"))
        return node("Add", [node("MatMul", [x, wt], f"{out}_mm"), b], out)

    def layer_norm(x: str, prefix: str, out: str) -> str:
        g = const(f"{prefix}.weight", w(f"{prefix}.weight"))
        b = const(f"{prefix}.bias", w(f"{prefix}.bias"))
        return node("LayerNormalization", [x, g, b], out, axis=-1, epsilon=eps)

    i64 = np.int64
    c_zero = const("c_zero", np.array([0], dtype=i64))
    c_one = const("c_one", np.array([1], dtype=i64))
    c_two = const("c_two", np.array([2], dtype=i64))
    c_bsh = const("c_shape_bsh", np.array([0, 0, hidden], dtype=i64))
    c_bsnd = const("c_shape_bsnd", np.array([0, 0, heads, head_dim], dtype=i64))
    c_scale = const("c_scale", np.array(1.0 / math.sqrt(head_dim), dtype=np.float32))
    c_1f = const("c_1f", np.array(1.0, dtype=np.float32))
    c_neg = const("c_neg", np.array(-10000.0, dtype=np.float32))
    c_tiny_pool = const("c_tiny_pool", np.array(1e-9, dtype=np.float32))
    c_tiny_norm = const("c_tiny_norm", np.array(1e-12, dtype=np.float32))
    c_sqrt2 = const("c_sqrt2", np.array(math.sqrt(2.0), dtype=np.float32))
    c_half = const("c_half", np.array(0.5, dtype=np.float32))

    # Embeddings: word + (position + token_type[0]), then LayerNorm.
    word = const("word_embeddings", w("embeddings.word_embeddings.weight"))
    pos_table = (
        w("embeddings.position_embeddings.weight") + w("embeddings.token_type_embeddings.weight")[0]
    )
    pos = const("position_embeddings", pos_table)
    shape = node("Shape", ["input_ids"], "ids_shape")
    seq_len = node("Slice", [shape, c_one, c_two], "seq_len")
    pos_s = node("Slice", [pos, c_zero, seq_len, c_zero], "pos_slice")
    tok = node("Gather", [word, "input_ids"], "tok_emb")
    emb = node("Add", [tok, pos_s], "emb_sum")
    x = layer_norm(emb, "embeddings.LayerNorm", "emb_ln")

    mask_f = node("Cast", ["attention_mask"], "mask_f", to=TensorProto.FLOAT)
    if fused:
        mask_i32 = node("Cast", ["attention_mask"], "mask_i32", to=TensorProto.INT32)
    else:
        # Additive attention bias [B, 1, 1, S]: 0 for tokens, -10000 for padding.
        inv = node("Sub", [c_1f, mask_f], "mask_inv")
        bias2 = node("Mul", [inv, c_neg], "mask_bias2d")
        c_axes12 = const("c_axes12", np.array([1, 2], dtype=i64))
        mask_bias = node("Unsqueeze", [bias2, c_axes12], "mask_bias")

    def ms(op: str, inputs: list[str], out: str, **attrs: Any) -> str:
        """An onnxruntime contrib op (com.microsoft domain)."""
        nodes.append(
            helper.make_node(op, inputs, [out], name=f"{op}_{out}", domain="com.microsoft", **attrs)
        )
        return out

    def skip_layer_norm(x: str, skip: str, prefix: str, out: str) -> str:
        """LayerNorm(x + skip + `prefix`.dense.bias), fused: the residual after a sublayer."""
        return ms(
            "SkipLayerNormalization",
            [
                x,
                skip,
                const(f"{prefix}.LayerNorm.weight", w(f"{prefix}.LayerNorm.weight")),
                const(f"{prefix}.LayerNorm.bias", w(f"{prefix}.LayerNorm.bias")),
                const(f"{prefix}.dense.bias", w(f"{prefix}.dense.bias")),
            ],
            out,
            epsilon=eps,
        )

    for i in range(layers):
        p = f"encoder.layer.{i}"
        a = f"{p}.attention"
        if fused:
            # Contrib ops ORT has tuned kernels for (and that quantize_dynamic understands):
            # Attention with packed QKV, SkipLayerNormalization, BiasGelu.
            qkv_w = np.concatenate(
                [w(f"{a}.self.{n}.weight").T for n in ("query", "key", "value")], axis=1
            )
            qkv_b = np.concatenate([w(f"{a}.self.{n}.bias") for n in ("query", "key", "value")])
            wq = const(f"{a}.qkv.weight_t", qkv_w)
            bq = const(f"{a}.qkv.bias", qkv_b)
            ctx3 = ms("Attention", [x, wq, bq, mask_i32], f"l{i}_ctx3", num_heads=heads)
            wo = const(f"{a}.output.dense.weight_t", w(f"{a}.output.dense.weight").T)
            attn = node("MatMul", [ctx3, wo], f"l{i}_attn_mm")
            x1 = skip_layer_norm(attn, x, f"{a}.output", f"l{i}_ln1")
            wi = const(f"{p}.intermediate.dense.weight_t", w(f"{p}.intermediate.dense.weight").T)
            bi = const(f"{p}.intermediate.dense.bias", w(f"{p}.intermediate.dense.bias"))
            inter = node("MatMul", [x1, wi], f"l{i}_inter_mm")
            gelu = ms("BiasGelu", [inter, bi], f"l{i}_gelu")
            wout = const(f"{p}.output.dense.weight_t", w(f"{p}.output.dense.weight").T)
            out = node("MatMul", [gelu, wout], f"l{i}_out_mm")
            x = skip_layer_norm(out, x1, f"{p}.output", f"l{i}_ln2")
            continue
        q = linear(x, f"{a}.self.query", f"l{i}_q")
        k = linear(x, f"{a}.self.key", f"l{i}_k")
        v = linear(x, f"{a}.self.value", f"l{i}_v")
        q4 = node("Reshape", [q, c_bsnd], f"l{i}_q4")
        k4 = node("Reshape", [k, c_bsnd], f"l{i}_k4")
        v4 = node("Reshape", [v, c_bsnd], f"l{i}_v4")
        qt = node("Transpose", [q4], f"l{i}_qt", perm=[0, 2, 1, 3])
        kt = node("Transpose", [k4], f"l{i}_kt", perm=[0, 2, 3, 1])
        vt = node("Transpose", [v4], f"l{i}_vt", perm=[0, 2, 1, 3])
        scores = node("MatMul", [qt, kt], f"l{i}_scores")
        scaled = node("Mul", [scores, c_scale], f"l{i}_scaled")
        biased = node("Add", [scaled, mask_bias], f"l{i}_biased")
        probs = node("Softmax", [biased], f"l{i}_probs", axis=-1)
        ctx = node("MatMul", [probs, vt], f"l{i}_ctx")
        ctx_t = node("Transpose", [ctx], f"l{i}_ctx_t", perm=[0, 2, 1, 3])
        ctx3 = node("Reshape", [ctx_t, c_bsh], f"l{i}_ctx3")
        attn = linear(ctx3, f"{a}.output.dense", f"l{i}_attn_out")
        res1 = node("Add", [attn, x], f"l{i}_res1")
        x1 = layer_norm(res1, f"{a}.output.LayerNorm", f"l{i}_ln1")
        inter = linear(x1, f"{p}.intermediate.dense", f"l{i}_inter")
        # Exact GELU, 0.5 * x * (1 + erf(x / sqrt 2)), as in BERT.
        erf = node("Erf", [node("Div", [inter, c_sqrt2], f"l{i}_gs")], f"l{i}_erf")
        erf1 = node("Add", [erf, c_1f], f"l{i}_erf1")
        gm = node("Mul", [inter, erf1], f"l{i}_gm")
        gelu = node("Mul", [gm, c_half], f"l{i}_gelu")
        out = linear(gelu, f"{p}.output.dense", f"l{i}_out")
        res2 = node("Add", [out, x1], f"l{i}_res2")
        x = layer_norm(res2, f"{p}.output.LayerNorm", f"l{i}_ln2")

    node("Identity", [x], "token_embeddings")
    # Mean pooling over real tokens, then L2 normalisation (as sentence-transformers does).
    mask3 = node("Unsqueeze", [mask_f, c_two], "mask3")
    summed = node("ReduceSum", [node("Mul", [x, mask3], "masked"), c_one], "summed", keepdims=0)
    counts = node("ReduceSum", [mask3, c_one], "counts", keepdims=0)
    counts_c = node("Max", [counts, c_tiny_pool], "counts_c")
    pooled = node("Div", [summed, counts_c], "pooled")
    sq = node("Mul", [pooled, pooled], "pooled_sq")
    sumsq = node("ReduceSum", [sq, const("c_axis_last", np.array([-1], dtype=i64))], "sumsq")
    norm = node("Sqrt", [sumsq], "norm")
    norm_c = node("Max", [norm, c_tiny_norm], "norm_c")
    node("Div", [pooled, norm_c], "sentence_embedding")

    used = {name for n in nodes for name in n.input}
    inits = [t for t in inits if t.name in used]
    graph = helper.make_graph(
        nodes,
        "all_minilm_l6_v2",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [
            helper.make_tensor_value_info(
                "sentence_embedding", TensorProto.FLOAT, ["batch", hidden]
            ),
            helper.make_tensor_value_info(
                "token_embeddings", TensorProto.FLOAT, ["batch", "seq", hidden]
            ),
        ],
        initializer=inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)],
        producer_name="speakermem",
        producer_version=str(GRAPH_VERSION),
    )
    model.ir_version = 8  # readable by every onnxruntime >= 1.14
    onnx.checker.check_model(model)
    return model
