"""The KV cache a fused rope + cache-write kernel is handed (``--api vllm-kvcache``,
``--api sglang-kvcache``), and the check of everything it wrote there.

A serving engine's fused kernel rotates q and k in place and, in the same pass, writes
each token's rotated k and its v into the token's slot of a KV cache: ``slot_mapping`` (or
``out_loc``) gives the slot per token, -1 for a token that must not be cached (the padding
of a CUDA-graph batch). Its bugs are in outputs a comparison of q and k never reads, so
for every call ropecheck makes

- v (values of its own, as many heads as k), and the caches: "paged" (num_blocks,
  block_size, kv_heads, head_size), slot s at block s // block_size, offset s %
  block_size (vLLM), or "slots" (slots, kv_heads * head_size) (SGLang), in k's dtype
  (the cache dtype "auto"), every entry a sentinel;
- a slot per token, distinct and scattered over the cache; in a padded batch, padding
  tokens at the front and the back of the batch (position 0, values of their own), so q,
  k and v are tensors of ropecheck's with the case's tokens in between; a padding token's
  slot is the library's (``padding_slot``): -1 for vLLM (skipped: reshape_and_cache_flash
  returns on a negative slot), 0 for SGLang (its KV pool reserves slot 0 for the writes of
  padding tokens, and never gives it to a token);

and after it checks (``ReturnedWrong("cache", ...)``, naming the token, the slot and the
tensor): each cached token's slot holds its rotated k and its v as given, within one
rounding of the cache dtype each (two computations of one rotated value may round
apart); where the rotated k lives is the library's (``key_cached``): vLLM's kernel
rotates ``key`` in place and caches it; SGLang's stores the rotation in ``k_cache`` and
leaves ``k`` as given (its versions before rotated ``k`` in place too: either is
accepted, and the rotation the checks read is the cache's); every slot no token owns
holds the sentinel (SGLang's slot 0 aside, where padding tokens write); v is left as it
was. The padding tokens' own q and k may be rotated or not.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch

from ropecheck.calling.forms import PADDING, ReturnedWrong, padded_positions

SENTINEL = 8192.0  # what every cache entry holds before the call (exact in every float dtype)
BLOCK_SIZE = 16  # vLLM's default block size


def _rng(*sizes: int) -> np.random.Generator:
    """A generator of the call's own (torch's global one is the target's state)."""
    return np.random.default_rng([7, *sizes])


def _ulps(t: torch.Tensor) -> float:
    return torch.finfo(t.dtype).eps if t.dtype.is_floating_point else 0.0


class KVCacheCall:
    """The cache arguments of one call, made around the token tensors ``query`` and
    ``key`` ((T, H, D) views), and the check of what the kernel wrote. ``keep(view,
    given)``: the caller's record of a tensor the kernel gets instead of its view, written
    back after the call (``api_call._Call._keep``)."""

    def __init__(
        self,
        layout: str,
        query: torch.Tensor,
        key: torch.Tensor,
        positions: torch.Tensor,
        padded: bool,
        names: dict,
        keep: Callable,
        padding_slot: int = -1,
        key_cached: str = "key",
    ):
        self.layout, self.names = layout, names
        self.padding_slot, self.key_cached = padding_slot, key_cached
        self.before, self.after = PADDING if padded else (0, 0)
        self.tokens = positions.shape[-1]  # (T,), or an M-RoPE run's (3, T)
        self.query, self.key = self._padded(query, keep), self._padded(key, keep)
        n, heads, head_size = self.before + self.tokens + self.after, *self.key.shape[1:]
        rng = _rng(n, heads, head_size, self.before)
        self.key_in = self.key.clone()
        values = rng.standard_normal(self.key.shape).astype(np.float32)
        self.value = torch.from_numpy(values).to(dtype=key.dtype, device=key.device)
        self.value_in = self.value.clone()
        slots = n + 2 * BLOCK_SIZE  # room for slots no token owns, among them the last
        blocks = -(-slots // BLOCK_SIZE)
        slots = blocks * BLOCK_SIZE
        shape = (blocks, BLOCK_SIZE, heads, head_size) if layout == "paged" else (slots, heads * head_size)
        self.key_cache = torch.full(shape, SENTINEL, dtype=key.dtype, device=key.device)
        self.value_cache = torch.full(shape, SENTINEL, dtype=key.dtype, device=key.device)
        # the last slot is never a token's (a -1 used as an index lands there), nor a reserved padding slot
        free = np.setdiff1d(np.arange(slots - 1), [padding_slot])
        owned = free[rng.permutation(free.size)[: self.tokens]]
        mapping = np.full(n, padding_slot, dtype=np.int64)
        mapping[self.before : self.before + self.tokens] = owned
        self.slot_mapping = torch.from_numpy(mapping).to(device=key.device, dtype=positions.dtype)
        self.positions = padded_positions(positions, self.before, self.after)

    def _padded(self, t: torch.Tensor, keep: Callable) -> torch.Tensor:
        """t, or t's tokens between padding rows in a tensor of ropecheck's."""
        if not (self.before or self.after):
            return t
        rows = (self.before + t.shape[0] + self.after, *t.shape[1:])
        rng = _rng(*rows)
        out = torch.from_numpy(rng.standard_normal(rows).astype(np.float32)).to(dtype=t.dtype, device=t.device)
        keep(t, out[self.before : self.before + t.shape[0]]).copy_(t)
        return out

    def arguments(self) -> dict:
        """The values of the cache roles (and the positions, padding included)."""
        scale = torch.ones((), dtype=torch.float32, device=self.key.device)
        return {
            "query": self.query,
            "key": self.key,
            "value": self.value,
            "key_cache": self.key_cache,
            "value_cache": self.value_cache,
            "slot_mapping": self.slot_mapping,
            "positions": self.positions,
            "kv_cache_dtype": "auto",
            "k_scale": scale,
            "v_scale": scale.clone(),
        }

    # --- the check -------------------------------------------------------------------
    def _where(self, slot: int) -> str:
        if self.layout != "paged":
            return f"slot {slot}"
        return f"slot {slot} (block {slot // BLOCK_SIZE}, offset {slot % BLOCK_SIZE})"

    def _token(self, i: int) -> str:
        if self.before <= i < self.before + self.tokens:
            at = self.positions[..., i]
            return f"token {i - self.before} (position {at.tolist() if at.dim() else int(at)})"
        return f"the padding token at index {i} of the batch"

    def _name(self, role: str) -> str:
        return self.names.get(role, role)

    def check(self) -> None:
        if not torch.equal(self.value, self.value_in):
            token = int((self.value != self.value_in).reshape(self.value.shape[0], -1).any(-1).nonzero()[0])
            raise ReturnedWrong("cache", f"the target wrote into {self._name('value')} ({self._token(token)})")
        keys, values = self.key.detach(), self.value
        key_cache = self.key_cache.reshape(-1, *keys.shape[1:])
        value_cache = self.value_cache.reshape(-1, *keys.shape[1:])
        cached = torch.zeros_like(self.slot_mapping, dtype=torch.bool)
        cached[self.before : self.before + self.tokens] = True
        tokens, slots = cached.nonzero().reshape(-1), self.slot_mapping[cached].long()
        if self.key_cached == "cache":
            keys = self._key_from_cache(key_cache, tokens, slots)
        for role, cache, expected in (("key_cache", key_cache, keys), ("value_cache", value_cache, values)):
            held, want = cache[slots].float(), expected[tokens].float()
            room = 2 * _ulps(cache) * want.abs().amax(-1, keepdim=True)
            wrong = ~((held - want).abs() <= room).reshape(held.shape[0], -1).all(-1)  # NaN is wrong
            if bool(wrong.any()):
                first = int(wrong.nonzero()[0])
                i, slot = int(tokens[first]), int(slots[first])
                raise ReturnedWrong("cache", self._wrong_slot(role, i, slot, cache, expected))
        owned = torch.zeros(key_cache.shape[0], dtype=torch.bool, device="cpu")
        owned[slots.cpu()] = True
        if self.padding_slot >= 0 and (self.before or self.after):
            owned[self.padding_slot] = True  # the padding tokens' own slot: written, never read
        for name, cache, expected in (("key_cache", key_cache, keys), ("value_cache", value_cache, values)):
            written = ((cache != SENTINEL).reshape(cache.shape[0], -1).any(-1).cpu()) & ~owned
            if bool(written.any()):
                slot = int(written.nonzero()[0])
                raise ReturnedWrong("cache", self._stray(name, slot, cache, expected))

    def _key_from_cache(self, key_cache: torch.Tensor, tokens: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Where the rotated k goes into the cache (SGLang): ``key`` must be as given or hold
        what the cache holds; the cache's rotation then stands in ``key`` for the checks."""
        key = self.key.detach()
        held = key_cache[slots]
        changed = (key[tokens] != self.key_in[tokens]).reshape(tokens.numel(), -1).any(-1)
        room = 2 * _ulps(key_cache) * held.float().abs().amax(-1, keepdim=True)
        off = ~((key[tokens].float() - held.float()).abs() <= room).reshape(tokens.numel(), -1).all(-1)
        if bool((changed & off).any()):
            first = int((changed & off).nonzero()[0])
            i, slot = int(tokens[first]), int(slots[first])
            raise ReturnedWrong(
                "cache",
                f"{self._name('key')} was changed for {self._token(i)}, but not into what "
                f"{self._name('key_cache')} {self._where(slot)} holds (the rotated k goes into the cache; k itself "
                "is left as given, or rotated in place by earlier versions)",
            )
        with torch.no_grad():
            self.key[tokens] = held.to(self.key.dtype)
        return self.key.detach()

    def _wrong_slot(self, role: str, i: int, slot: int, cache, expected) -> str:
        name, tensor = self._name(role), self._name("key" if role == "key_cache" else "value")
        head, feature = _first_difference(cache[slot], expected[i])
        say = (
            f"{name} {self._where(slot)} does not hold {self._token(i)}'s {tensor} "
            f"(head {head}, feature {feature}: {float(cache[slot][head, feature]):.4g} in {name}, "
            f"{float(expected[i][head, feature]):.4g} in {tensor})"
        )
        if bool((cache[slot] == SENTINEL).all()):
            say += ": nothing was written there"
        elif role == "key_cache" and self.key_cached == "key" and torch.equal(self.key_in[i], expected[i]):
            say += f"; {tensor} was left unrotated (the rotated k went only into {name})"
        elif role == "value_cache" and torch.equal(cache[slot], self.key[i].detach()):
            say += f"; it holds the token's rotated {self._name('key')}"
        elif role == "value_cache":
            say += f"; {tensor} was changed on its way into {name} (rotated?)"
        found = _holder(cache, expected[i])
        if found is not None and found != slot:
            say += f"; it is in {self._where(found)} ({self._name('slot_mapping')} off by {found - slot:+d})"
        return say

    def _stray(self, role: str, slot: int, cache, expected) -> str:
        say = f"{self._name(role)} {self._where(slot)}, which no token's slot_mapping names, was written"
        if slot == cache.shape[0] - 1 and self.padding_slot < 0:
            say += " (the cache's last slot: a slot of -1 used as an index?)"
        for i in range(expected.shape[0]):
            if torch.equal(cache[slot], expected[i]):
                slot_of, mapping = int(self.slot_mapping[i]), self._name("slot_mapping")
                said = "-1 (not to be cached)" if slot_of < 0 else str(slot_of)
                return say + f": it holds the entry of {self._token(i)}, whose {mapping} is {said}"
        return say


def _first_difference(a: torch.Tensor, b: torch.Tensor) -> tuple:
    where = (a.float() - b.float()).abs()
    index = int(where.reshape(-1).argmax())
    return divmod(index, a.shape[-1])


def _holder(cache: torch.Tensor, entry: torch.Tensor) -> Optional[int]:
    """The slot whose entry is ``entry`` exactly, if one is."""
    match = (cache == entry).reshape(cache.shape[0], -1).all(-1).nonzero()
    return int(match[0]) if match.numel() else None
