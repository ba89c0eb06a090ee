"""The shapes ``ropecheck bench`` times: a model's heads at a serving step's token count.

Models (q heads / kv heads x head size): Llama 3 8B 32/8x128 (the default), 70B 64/8x128,
Qwen2 7B 28/4x128, heads of 64 (32/8x64) and of 256 (32/8x256), partial rotary
(32/8x128 rotating 64), and DeepSeek's MLA (128 q heads, one shared k head, of 64: its
rotary part). Steps:
- ``decode``: one new token per sequence, each sequence at its own position (a batch of
  requests with different context lengths: positions drawn in 0 .. 32767);
- ``prefill``: sequences of 4096 tokens, each counting up from 0, 4k .. 128k tokens in
  all (cut to what fits in the device's memory);
- ``models``: each model at one decode and one prefill size.
``--sizes cpu`` makes them smaller (decode 1 .. 64 tokens, prefill 512 and 2048) and
``--shape`` overrides any field of every shape (``tokens=8192,heads=32/8``).

An N-D rotation (image and video RoPE) is timed at ``image`` steps instead: one image's
(or video's) patches, a grid as near square as its axes allow (``nd_grid``), 24 heads of
the target's head size (a DiT's: Flux has 24 of 128), 1024 .. 16384 patches (CPU: 256
and 1024).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

DECODE_SPREAD = 32768  # decode positions are drawn in 0 .. DECODE_SPREAD - 1
PREFILL_SEQUENCE = 4096


@dataclass(frozen=True)
class Model:
    name: str
    q_heads: int
    k_heads: int
    head_dim: int
    rotary_dim: int = 0  # 0: the whole head

    @property
    def label(self) -> str:
        partial = f" r{self.rotary_dim}" if self.rotary_dim else ""
        heads = f"{self.q_heads}/{self.k_heads}" if self.k_heads else f"{self.q_heads}"
        return f"{heads}x{self.head_dim}{partial}"


MODELS = (
    Model("llama-8b", 32, 8, 128),
    Model("llama-70b", 64, 8, 128),
    Model("qwen2-7b", 28, 4, 128),
    Model("head-64", 32, 8, 64),
    Model("head-256", 32, 8, 256),
    Model("partial", 32, 8, 128, 64),
    Model("mla", 128, 1, 64),
)

# step -> token counts, by sizes
TOKENS = {
    "gpu": {
        "decode": (1, 32, 512),
        "prefill": (4096, 32768, 131072),
        "models": (64, 16384),
        "image": (1024, 4096, 16384),
    },
    "cpu": {"decode": (1, 16, 64), "prefill": (512, 2048), "models": (16, 1024), "image": (256, 1024)},
}
STEPS_1D = ("decode", "prefill", "models")
DIT_HEADS = 24


@dataclass(frozen=True)
class Shape:
    """One row: ``tokens`` tokens of ``model``'s heads, in ``sequences`` sequences (decode:
    one token each at scattered positions; prefill: each counting up from 0)."""

    step: str  # "decode" or "prefill"
    model: Model
    tokens: int
    sequences: int

    @property
    def name(self) -> str:
        return f"{self.step} T={self.tokens} {self.model.label}"

    @property
    def seq(self) -> int:
        return self.tokens // self.sequences

    def positions(self, seed: int = 0) -> np.ndarray:
        """(sequences, seq) int64."""
        if self.step == "decode" and self.seq == 1:
            rng = np.random.default_rng(seed)
            return rng.integers(0, DECODE_SPREAD, size=(self.sequences, 1), dtype=np.int64)
        return np.tile(np.arange(self.seq, dtype=np.int64), (self.sequences, 1))


def _shape(step: str, model: Model, tokens: int) -> Shape:
    if step == "decode":
        return Shape(step, model, tokens, tokens)
    return Shape(step, model, tokens, max(1, tokens // PREFILL_SEQUENCE))


def shapes(names, sizes: str, head_dim: int = 0) -> list[Shape]:
    """The rows of ``names`` (``decode``, ``prefill``, ``models``; ``image`` for an N-D
    rotation of ``head_dim``) at ``sizes`` (gpu, cpu)."""
    rows: list = []
    default = MODELS[0]
    for name in names:
        counts = TOKENS[sizes][name]
        if name == "image":
            rows += [Shape("image", Model("dit", DIT_HEADS, 0, head_dim), n, 1) for n in counts]
        elif name == "models":
            rows += [_shape(step, m, n) for m in MODELS for step, n in zip(("decode", "prefill"), counts)]
        else:
            rows += [_shape(name, default, n) for n in counts]
    return list(dict.fromkeys(rows))


FIELDS = ("tokens", "sequences", "heads", "head_dim", "rotary_dim")


def override(rows: list, spec: str) -> list:
    """``rows`` with the fields of ``spec`` (``tokens=8192,heads=32/8``) set in every one
    (duplicates dropped); ValueError naming a field it does not know or a bad value."""
    fields: dict = {}
    for item in filter(None, (w.strip() for w in spec.split(","))):
        key, _, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if key not in FIELDS or not value:
            raise ValueError(f"--shape: {item!r} is not one of {', '.join(f + '=' for f in FIELDS)}")
        try:
            fields[key] = tuple(int(v) for v in value.split("/")) if key == "heads" else int(value)
        except ValueError:
            raise ValueError(f"--shape: {item!r}: not a whole number") from None
        if any(v < (0 if key == "rotary_dim" else 1) for v in (fields[key] if key == "heads" else (fields[key],))):
            raise ValueError(f"--shape: {item!r} must be positive")
    if "heads" in fields and len(fields["heads"]) != 2:
        raise ValueError("--shape: heads=Q/K, e.g. heads=32/8")
    out = []
    for row in rows:
        model = row.model
        if "heads" in fields:
            model = replace(model, q_heads=fields["heads"][0], k_heads=fields["heads"][1])
        if "head_dim" in fields:
            model = replace(model, head_dim=fields["head_dim"])
        if "rotary_dim" in fields:
            model = replace(model, rotary_dim=fields["rotary_dim"] if fields["rotary_dim"] != model.head_dim else 0)
        tokens = fields.get("tokens", row.tokens)
        sequences = fields.get("sequences", tokens if row.step == "decode" else max(1, tokens // PREFILL_SEQUENCE))
        if tokens % sequences:
            raise ValueError(f"--shape: {tokens} tokens do not split into {sequences} sequences of one length")
        out.append(Shape(row.step, replace(model, name="custom") if model != row.model else model, tokens, sequences))
    return list(dict.fromkeys(out))
