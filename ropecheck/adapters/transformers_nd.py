"""HF transformers M-RoPE: ``Qwen2VLRotaryEmbedding`` (sections in chunks, from
``rope_parameters["mrope_section"]``) and ``Qwen3VLTextRotaryEmbedding`` (interleaved
sections) + their ``apply_rotary_pos_emb`` as N-D rotation targets, and
``Qwen2VLModel.get_rope_index`` as a position builder. Built from tiny configs, never from
the hub."""

from __future__ import annotations

from ropecheck.adapters.registry import Adapter, register

INSTALL = "pip install transformers==5.23.0 torch==2.13.0"
SECTIONS = (2, 3, 3)  # head_dim 16: small and fast; [16, 24, 24] is the same code path
QWEN3_SECTIONS = (4, 2, 2)  # interleaved over 8 pairs: t 0,3,6,7  h 1,4  w 2,5 ([24, 20, 20] at 128)
IMAGE_TOKEN, VIDEO_TOKEN = 151655, 151656


def _config():
    from transformers import Qwen2VLConfig

    return Qwen2VLConfig(
        text_config={
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "head_dim": 2 * sum(SECTIONS),
            "num_hidden_layers": 1,
            "intermediate_size": 32,
            "vocab_size": 151700,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": list(SECTIONS)},
        },
        vision_config={"depth": 1, "embed_dim": 16, "num_heads": 2, "hidden_size": 64, "spatial_merge_size": 1},
    )


def _mrope_target(module, emb):
    """HF's own pair of calls: cos, sin = rotary(x, position_ids (3, b, s)), then
    apply_rotary_pos_emb on (b, heads, s, d) views."""

    def rope(x, positions):  # x (b, s, h, d); positions (b, s, 3) as (t, h, w)
        cos, sin = emb(x, positions.permute(2, 0, 1))
        y, _ = module.apply_rotary_pos_emb(x.transpose(1, 2), x.transpose(1, 2), cos, sin, unsqueeze_dim=1)
        return y.transpose(1, 2)

    return rope


def _mrope_qk_target(module, emb):
    """HF's pair of calls in their real form: q and k (GQA: fewer key heads) as the
    (b, heads, s, d) views its attention passes, both rotated by apply_rotary_pos_emb."""

    def rope(q, k, positions):
        cos, sin = emb(q, positions.permute(2, 0, 1))
        q_out, k_out = module.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin, unsqueeze_dim=1)
        return q_out.transpose(1, 2), k_out.transpose(1, 2)

    return rope


def build_mrope_qk():
    from transformers.models.qwen2_vl import modeling_qwen2_vl as q

    return _mrope_qk_target(q, q.Qwen2VLRotaryEmbedding(_config().get_text_config()))


def build_mrope():
    from transformers.models.qwen2_vl import modeling_qwen2_vl as q

    return _mrope_target(q, q.Qwen2VLRotaryEmbedding(_config().get_text_config()))


def build_qwen3vl_mrope():
    from transformers import Qwen3VLConfig
    from transformers.models.qwen3_vl import modeling_qwen3_vl as q

    config = Qwen3VLConfig(
        text_config={
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "head_dim": 2 * sum(QWEN3_SECTIONS),
            "num_hidden_layers": 1,
            "intermediate_size": 32,
            "vocab_size": 1000,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": list(QWEN3_SECTIONS),
                "mrope_interleaved": True,
            },
        }
    )
    return _mrope_target(q, q.Qwen3VLTextRotaryEmbedding(config.get_text_config()))


def build_rope_index():
    import numpy as np
    import torch
    from transformers.models.qwen2_vl import modeling_qwen2_vl as q

    model = q.Qwen2VLModel(_config()).eval()

    def build_positions(segments):
        ids, types, images, videos = [], [], [], []
        for seg in segments:
            n = int(np.prod(seg[1:]))
            kind = {"text": 0, "image": 1, "video": 2}[seg[0]]
            ids += [{0: 0, 1: IMAGE_TOKEN, 2: VIDEO_TOKEN}[kind]] * n
            types += [kind] * n
            if kind == 1:
                images.append([1, seg[1], seg[2]])
            elif kind == 2:
                videos.append(list(seg[1:]))
        if not ids:
            return np.zeros((0, 3), dtype=np.int64)
        if not images and not videos:  # HF: text-only positions come from the model, 0 .. n-1
            return np.repeat(np.arange(len(ids))[:, None], 3, axis=1)
        pos, _ = model.get_rope_index(
            torch.tensor([ids]),
            torch.tensor([types]),
            torch.tensor(images) if images else None,
            torch.tensor(videos) if videos else None,
        )
        return pos[:, 0].T.numpy()

    return build_positions


register(
    Adapter(
        name="hf-qwen2vl-mrope",
        library="transformers",
        build=build_mrope,
        convention=None,
        description=f"HF Qwen2VLRotaryEmbedding + apply_rotary_pos_emb, mrope_section {list(SECTIONS)} "
        "(N-D: --family mrope)",
        modules=("transformers",),
        install=INSTALL,
        notes="N-D target: positions (batch, seq, 3)",
        family="mrope",
        implies={"sections": list(SECTIONS), "layout": "half"},
    )
)
register(
    Adapter(
        name="hf-qwen2vl-rope-index",
        library="transformers",
        build=build_rope_index,
        convention=None,
        description="HF Qwen2VLModel.get_rope_index as a position builder (--family mrope-builder)",
        modules=("transformers",),
        install=INSTALL,
        backward=False,
        notes="builder: build_positions(segments)",
        family="mrope-builder",
        call="segments",
    )
)
register(
    Adapter(
        name="hf-qwen2vl-mrope-qk",
        library="transformers",
        build=build_mrope_qk,
        convention=None,
        description=f"HF Qwen2VLRotaryEmbedding + apply_rotary_pos_emb on q and GQA k as its attention "
        f"passes them, mrope_section {list(SECTIONS)} (N-D: --family mrope --call qk)",
        modules=("transformers",),
        install=INSTALL,
        call="qk",
        notes="N-D target: positions (batch, seq, 3)",
        family="mrope",
        implies={"sections": list(SECTIONS), "layout": "half"},
    )
)
register(
    Adapter(
        name="hf-qwen3vl-mrope",
        library="transformers",
        build=build_qwen3vl_mrope,
        convention=None,
        description=f"HF Qwen3VLTextRotaryEmbedding + apply_rotary_pos_emb, interleaved mrope_section "
        f"{list(QWEN3_SECTIONS)} (N-D: --family mrope --mrope-interleaved)",
        modules=("transformers",),
        install=INSTALL,
        notes="N-D target: positions (batch, seq, 3)",
        family="mrope",
        implies={"sections": list(QWEN3_SECTIONS), "layout": "half", "mrope_interleaved": True},
    )
)
