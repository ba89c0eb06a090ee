"""Built-in targets in torch, written from the seeds' implementations.

Each is correct and generic in head_dim; together they cover the four classic styles:
Meta LLaMA's complex multiplication, ChatGLM / GPT-NeoX / HF ``rotate_half``, the
explicit rotation matrix, and a cached cos/sin module. All form the angle m * theta_i in
float32, as the libraries they imitate do.
"""

from __future__ import annotations

import torch

import ropecheck.reference as reference
from ropecheck.properties.convention import Convention
from ropecheck.reference.scaling import Scaling
from ropecheck.targets import triton_builtins
from ropecheck.targets.target import Target

NO_SCALING = Scaling()


def _inv_freq(
    rotary_dim: int, base: float, scaling: Scaling = NO_SCALING, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """theta_i = base^(-2i/r) in float32, the way every library writes it; with a position
    scaling, the reference's scaled theta_i rounded to float32 (dynamic scalings read the
    sequence length, largest position + 1, from ``positions``)."""
    if scaling.rope_type == "default":
        return 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
    seq_len = None if positions is None or positions.numel() == 0 else int(positions.max()) + 1
    return torch.from_numpy(scaling.inv_freq(rotary_dim, base, seq_len)).to(torch.float32)


def _angles(positions: torch.Tensor, rotary_dim: int, base: float, scaling: Scaling = NO_SCALING) -> torch.Tensor:
    """(batch, seq, 1, r/2) float32 angles m * theta_i."""
    theta = _inv_freq(rotary_dim, base, scaling, positions).to(positions.device)
    return (positions.to(torch.float32)[..., None] * theta)[:, :, None, :]


def _split(x: torch.Tensor, rotary_dim):
    r = x.shape[-1] if rotary_dim is None else rotary_dim
    return x[..., :r], x[..., r:], r


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves (ChatGLM, GPT-NeoX, HF)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def make_rotate_half(base: float = reference.DEFAULT_BASE, rotary_dim=None, scaling=NO_SCALING):
    """HF style: cos/sin computed in float32 (times the attention factor), cast to x's
    dtype, x*cos + rotate_half(x)*sin."""
    amplitude = scaling.attention_factor()

    def rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        rot, tail, r = _split(x, rotary_dim)
        phi = _angles(positions, r, base, scaling)
        phi = torch.cat((phi, phi), dim=-1)
        cos, sin = (phi.cos() * amplitude).to(x.dtype), (phi.sin() * amplitude).to(x.dtype)
        return torch.cat((rot * cos + rotate_half(rot) * sin, tail), dim=-1)

    return rope


def make_llama_complex(base: float = reference.DEFAULT_BASE, rotary_dim=None, scaling=NO_SCALING):
    """Meta LLaMA: interleaved pairs as complex numbers times freqs_cis = polar(A, m theta)."""
    amplitude = torch.tensor(scaling.attention_factor(), dtype=torch.float32)

    def rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        rot, tail, r = _split(x, rotary_dim)
        angles = _angles(positions, r, base, scaling)
        freqs_cis = torch.polar(amplitude.to(angles.device), angles)
        pairs = torch.view_as_complex(rot.float().contiguous().reshape(*rot.shape[:-1], r // 2, 2))
        out = torch.view_as_real(pairs * freqs_cis).flatten(-2)
        return torch.cat((out.to(x.dtype), tail), dim=-1)

    return rope


def make_matrix(base: float = reference.DEFAULT_BASE, rotary_dim=None, scaling=NO_SCALING):
    """The explicit form y = A R_m x with R_m block-diagonal 2x2 rotations (interleaved)."""
    amplitude = scaling.attention_factor()

    def rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        rot, tail, r = _split(x, rotary_dim)
        phi = _angles(positions, r, base, scaling)[:, :, 0, :]  # (b, s, r/2)
        cos, sin = phi.cos() * amplitude, phi.sin() * amplitude
        blocks = torch.stack((torch.stack((cos, -sin), -1), torch.stack((sin, cos), -1)), -2)
        matrix = torch.zeros(*phi.shape[:2], r, r, dtype=torch.float32, device=phi.device)
        for i in range(r // 2):
            matrix[:, :, 2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = blocks[:, :, i]
        out = torch.einsum("bsij,bshj->bshi", matrix, rot.float())
        return torch.cat((out.to(x.dtype), tail), dim=-1)

    return rope


class CachedRotary:
    """A float32 cos/sin table over positions 0 .. L-1 (half layout), grown by doubling up
    to TABLE_LIMIT rows; rows are gathered by position, and positions past the table are
    computed directly (a table never wraps or clamps)."""

    TABLE_LIMIT = 2**16

    def __init__(self, base: float = reference.DEFAULT_BASE, rotary_dim=None, scaling=NO_SCALING):
        if scaling.dynamic:
            raise ValueError(
                "the cached target tabulates fixed frequencies: a dynamic "
                f"{scaling.rope_type} scaling needs rotate-half"
            )
        self.base, self.rotary_dim, self.scaling = base, rotary_dim, scaling
        self.amplitude = scaling.attention_factor()
        self.tables: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # (r, device) -> (cos, sin)

    def _table(self, needed: int, r: int, device: torch.device):
        cos, _ = self.tables.get((r, device), (torch.empty(0, r // 2), None))
        if cos.shape[0] < min(needed, self.TABLE_LIMIT):
            size = min(max(needed, 2 * cos.shape[0], 64), self.TABLE_LIMIT)
            theta = _inv_freq(r, self.base, self.scaling).to(device)
            freqs = torch.outer(torch.arange(size, dtype=torch.float32, device=device), theta)
            self.tables[r, device] = (freqs.cos(), freqs.sin())
        return self.tables[r, device]

    def _cos_sin(self, positions: torch.Tensor, r: int):
        cos_table, sin_table = self._table(int(positions.max()) + 1, r, positions.device)
        inside = positions < cos_table.shape[0]
        index = torch.where(inside, positions, 0)
        phi = positions.to(torch.float32)[..., None] * _inv_freq(r, self.base, self.scaling).to(positions.device)
        cos = torch.where(inside[..., None], cos_table[index], phi.cos())
        sin = torch.where(inside[..., None], sin_table[index], phi.sin())
        return cos, sin

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        rot, tail, r = _split(x, self.rotary_dim)
        cos, sin = self._cos_sin(positions, r)
        cos = torch.cat((cos, cos), -1)[:, :, None, :]
        sin = torch.cat((sin, sin), -1)[:, :, None, :]
        out = (rot.float() * cos + rotate_half(rot.float()) * sin) * self.amplitude
        return torch.cat((out.to(x.dtype), tail), dim=-1)


BUILTINS = {
    "rotate-half": ("half", make_rotate_half, "ChatGLM / GPT-NeoX / HF rotate_half, cos/sin cast to x's dtype"),
    "llama-complex": ("interleaved", make_llama_complex, "Meta LLaMA freqs_cis with view_as_complex"),
    "matrix": ("interleaved", make_matrix, "explicit block-diagonal rotation matrix"),
    "cached": ("half", CachedRotary, "cos/sin table grown on demand, gathered by position"),
    **triton_builtins.BUILTIN_ENTRIES,  # "triton", "triton-interleaved", "triton-qk", "triton-packed"
}
# the call form (Target.call) of built-ins not called as rope(x, positions)
BUILTIN_FORMS: dict[str, dict] = dict(triton_builtins.BUILTIN_FORMS)
DEFAULT_TARGET = "rotate-half"


def builtin(
    name: str, base: float = reference.DEFAULT_BASE, rotary_dim=None, layout=None, scaling: Scaling = NO_SCALING
) -> Target:
    """Build a built-in target; a layout other than its own is refused."""
    own_layout, factory, description = BUILTINS[name]
    if layout is not None and layout != own_layout:
        raise ValueError(f"built-in target {name!r} uses the {own_layout} layout, not {layout}")
    convention = Convention(own_layout, base, rotary_dim, scaling)
    return Target(
        name=name,
        fn=factory(base, rotary_dim, scaling),
        convention=convention,
        rotary_dim=rotary_dim,
        description=description,
        **BUILTIN_FORMS.get(name, {}),
    )
