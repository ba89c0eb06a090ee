"""Half-layout RoPE kernels (base 10000, angles in float32, as HF) that are right at the
toy sizes and wrong only at production sizes or on strided input, for tests/test_sizes.py.
The file imports torch only: ropecheck loads it in its worker process."""

import torch


def _rotate(x, inv_freq, positions):
    angles = positions.float()[..., None] * inv_freq
    emb = torch.cat((angles, angles), dim=-1)[:, :, None, :]
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _inv_freq(d: int, exponent_dim: int):
    return 1.0 / 10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / exponent_dim)


def correct(x, positions):
    return _rotate(x, _inv_freq(x.shape[-1], x.shape[-1]), positions)


def padded_exponent(x, positions):
    """BROKEN past head_dim 128: a kernel that pads a wide head to its power-of-two block
    takes the exponent 2i/d over the padded block (192 -> 256); right for 64..128 and for
    the powers of two 256 and 512."""
    d = x.shape[-1]
    block = d if d <= 128 else 1 << (d - 1).bit_length()
    return _rotate(x, _inv_freq(d, block), positions)


def batch_stride(x, positions):
    """BROKEN on views whose batch stride is not seq x the row stride: it reads row b at
    b * seq * x.stride(1), as it would be in a contiguous tensor (transposed HF views,
    Megatron's (seq, batch) storage); right on contiguous input."""
    b, s, h, d = x.shape
    assumed = (s * x.stride(1), x.stride(1), x.stride(2), x.stride(3))
    storage = x.as_strided((x.untyped_storage().nbytes() // x.element_size(),), (1,), 0)
    reach = x.storage_offset() + sum((n - 1) * st for n, st in zip(x.shape, assumed)) + 1
    if reach > storage.numel():  # reading past the storage: wrap as a raw pointer kernel would not
        storage = torch.cat((storage, storage.new_zeros(reach - storage.numel())))
    seen = storage.as_strided(x.shape, assumed, x.storage_offset())
    return correct(seen, positions)
