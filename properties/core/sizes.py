"""The sizes a run draws its inputs at: ``toy`` (small, fast, minimal counterexamples: every
profile but ``production``) or ``production`` (what serving and training hand a kernel:
head sizes 64 .. 512, sequences up to 8192, 32 query heads per key head, token x head
products in the tens of thousands, and on a device with the memory a tensor past 2^31
elements, where int32 index arithmetic overflows).

``--sizes NAME[,key=value...]`` picks a set and overrides its fields; lists are written
with ``/``: ``--sizes production,head_dims=192/256,max_seq=4096``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

# A drawn production input holds at most this many elements (x, or q and k together): the
# spec-free checks hold a few float64 copies of it (2^24 elements: 128 MiB each).
PRODUCTION_ELEMENTS = 2**24
# The huge input: past 2^31 elements, so a kernel indexing with int32 offsets wraps around.
HUGE_ELEMENTS = 2**31 + 2**26


@dataclass(frozen=True)
class Sizes:
    """Which sizes inputs are drawn at. ``head_dims``: whole-head sizes (a partial rotary
    dimension r keeps the sizes models pair with r); ``max_seq``: the longest sequence;
    ``heads``: x's heads (and q's in the qk form); ``ratios``: q heads per k head in the qk
    form; ``max_elements``: a drawn input's elements at most (its sequence is cut to fit);
    ``huge``: try one input past 2^31 elements: ``auto`` on a CUDA device, ``yes`` on any,
    where the device and the host have the memory (``huge_plan``); ``no``; ``model``: draw
    one model's shapes (``one_model``), the batch, the sequence, the positions and the
    values still drawn; ``pool``: draw the shapes (batch, heads, head size) from a small
    pool (``POOLS``, ``pool_shapes``) while the sequences, positions, layouts and values
    stay drawn: ``auto`` for a target whose calls launch Triton kernels (each new shape is
    a compile on a GPU), ``yes`` for any, ``no`` for none."""

    name: str
    head_dims: tuple = (8, 80, 128)
    max_seq: int = 24
    heads: tuple = (1, 2, 3)
    ratios: tuple = ()  # empty: q heads from heads, k heads any divisor (the toy rule)
    max_elements: int = 2**20
    huge: str = "no"
    model: bool = False
    pool: str = "auto"

    def pooled(self) -> Sizes:
        """These sizes drawing their shapes from the pool (``pool=auto`` resolved to yes)."""
        return replace(self, pool="yes")

    @property
    def production(self) -> bool:
        """Longer sequences or wider heads than the toy sizes."""
        return self.max_seq > TOY.max_seq or max(self.head_dims) > max(TOY.head_dims)

    def one_model(self) -> Sizes:
        """These sizes as one model has them, the way a compiled model (or a captured CUDA
        graph) is handed its inputs: one head size (128, else the largest), one head count
        (the largest), one q/k head split and one memory layout (``strategies``), so that
        what varies between calls is what varies in serving and training: the batch, the
        sequence, the positions and the values."""
        return replace(self, head_dims=(common_head_dim(self.head_dims),), heads=(max(self.heads),), model=True)

    def spec(self) -> str:
        """The ``--sizes`` value that gives these sizes."""
        base = SIZES.get(self.name)
        if base == self:
            return self.name
        changed = [f.name for f in fields(self) if f.name != "name" and getattr(self, f.name) != getattr(base, f.name)]
        return ",".join([self.name] + [f"{k}={_show(getattr(self, k))}" for k in changed])

    def describe(self, head_dims: tuple = ()) -> str:
        """One line; ``head_dims``: the sizes a target declares (N-D, xPos), shown instead."""
        return (
            f"sizes {self.spec()}: head sizes {'/'.join(map(str, head_dims or self.head_dims))}"
            + (" (the target's)" if head_dims else "")
            + ", "
            f"seq up to {self.max_seq}, heads {'/'.join(map(str, self.heads))}"
            + (f", q/k ratios {'/'.join(map(str, self.ratios))}" if self.ratios else "")
            + (f", shapes from a pool of {len(pool_shapes(self))}" if pool_shapes(self) else "")
        )


def _show(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "/".join(map(str, value)) if isinstance(value, tuple) else str(value)


def common_head_dim(head_dims) -> int:
    """The head size most models have where it is among ``head_dims`` (128), else the largest."""
    return 128 if 128 in head_dims else max(head_dims)


SIZES = {
    "toy": Sizes("toy"),
    "production": Sizes(
        "production",
        head_dims=(64, 80, 96, 128, 192, 256, 512),
        max_seq=8192,
        heads=(1, 2, 8, 32),
        ratios=(1, 4, 8, 32),
        max_elements=PRODUCTION_ELEMENTS,
        huge="auto",
    ),
}
TOY = SIZES["toy"]


@dataclass(frozen=True)
class Shape:
    """One shape of a run's pool: the batch; x's heads (and a packed input's); q's and k's
    heads in the (q, k) form; and which of the sizes' head sizes (``pool_head_dim``:
    ``small``, ``odd`` (not a power of two), ``common``, ``wide``)."""

    batch: int
    heads: int
    q_heads: int
    k_heads: int
    head: str


# The shapes a pooled run draws from. A kernel compiled per shape (Triton specialises on
# its constexpr batch, head counts and head size, and on whether each integer is 1 or a
# multiple of 16) compiles a few kernels per shape, not one per draw. Each pool keeps the
# shape classes the bugs live in: one head; one key head for several query heads (MQA)
# at a head size that is not a power of two; grouped-query heads (GQA) of the smallest
# size in a batch of three rows; the common head size. One shape has several rows: a
# check that calls each row alone (batch-independence) adds that shape at batch 1 only.
# The smallest head size has the most heads, so that a large input of small heads (a
# token x head count, ``fixed_cases.onto_pool``) has few tokens, as a kernel's grid and an
# interpreted kernel's time follow them. Production's pool has Llama's 32 query heads
# per 8 key heads and the widest head.
POOLS = {
    False: (Shape(1, 1, 1, 1, "common"), Shape(1, 2, 6, 1, "odd"), Shape(3, 3, 4, 2, "small")),
    True: (
        Shape(1, 8, 32, 8, "common"),
        Shape(3, 2, 8, 1, "small"),
        Shape(1, 1, 1, 1, "odd"),
        Shape(1, 32, 32, 32, "wide"),
    ),
}


def pool_shapes(sizes: Sizes) -> tuple:
    """The pool a run draws its shapes from: none unless ``pool=yes`` (one model's sizes
    draw their own one shape); the production pool at production sizes."""
    return POOLS[sizes.production] if sizes.pool == "yes" and not sizes.model else ()


def pool_head_dim(kind: str, head_dims) -> int:
    """The head size of a pool's ``kind`` among ``head_dims``: the smallest, the widest
    that is not a power of two (a kernel pads it to a block: 80 at the toy sizes, 192 at
    production; else the smallest), the common one, the widest."""
    if kind == "small":
        return min(head_dims)
    if kind == "odd":
        return max((d for d in head_dims if d & (d - 1)), default=min(head_dims))
    if kind == "common":
        return common_head_dim(head_dims)
    return max(head_dims)


def _positive_ints(key: str, text: str) -> tuple:
    try:
        values = tuple(int(v) for v in text.split("/"))
    except ValueError:
        raise ValueError(f"--sizes {key}: expected integers separated by '/', got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"--sizes {key}: expected positive integers, got {text!r}")
    return values


def parse(spec: str) -> Sizes:
    """``NAME[,key=value...]`` -> Sizes; ValueError with the accepted forms otherwise."""
    name, *overrides = [part.strip() for part in spec.split(",")]
    if name not in SIZES:
        raise ValueError(
            f"--sizes: unknown size set {name!r}; known: {', '.join(SIZES)} "
            "(then key=value overrides, e.g. production,head_dims=192/256)"
        )
    sizes = SIZES[name]
    keys = [f.name for f in fields(Sizes) if f.name != "name"]
    for item in overrides:
        key, _, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if key not in keys or not value:
            raise ValueError(f"--sizes: expected key=value with key one of {', '.join(keys)}, got {item!r}")
        parsed: object
        if key == "huge":
            if value not in ("auto", "yes", "no"):
                raise ValueError(f"--sizes huge: auto, yes or no, got {value!r}")
            parsed = value
        elif key == "pool":
            if value not in ("auto", "yes", "no"):
                raise ValueError(f"--sizes pool: auto, yes or no, got {value!r}")
            parsed = value
        elif key == "model":
            if value not in ("yes", "no"):
                raise ValueError(f"--sizes model: yes or no, got {value!r}")
            parsed = value == "yes"
        else:
            numbers = _positive_ints(key, value)
            parsed = numbers
            if key in ("max_seq", "max_elements"):
                if len(numbers) != 1:
                    raise ValueError(f"--sizes {key}: one integer, got {value!r}")
                parsed = numbers[0]
        sizes = replace(sizes, **{key: parsed})  # type: ignore[arg-type]  # the field's type, checked above
    return sizes


# Bytes the huge input costs, in units of its own size: on the device, x, the output and
# the temporaries of an eager kernel (cos, sin, rotate_half(x) and a product: six in all);
# on the host, x and the output, each also serialised once on its way to and from the
# worker process, and the worker's copies of both.
DEVICE_COPIES = 6
HOST_COPIES = 8


def _host_available() -> int:
    """Bytes of memory available on this host (Linux's MemAvailable; 0 when unknown)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _device_free(device: str) -> int:
    import torch

    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return int(free)


def huge_plan(sizes: Sizes, device: str, dtype: str) -> tuple[bool, str]:
    """Whether a run tries the input past 2^31 elements, and a line saying why (not)."""
    if sizes.huge == "no":
        return False, ""
    import torch

    from ropecheck.properties.core.dtypes import torch_dtype

    nbytes = HUGE_ELEMENTS * torch.empty((), dtype=torch_dtype(dtype)).element_size()
    gib = 2**30
    what = f"the input past 2^31 elements ({nbytes / gib:.1f} GiB in {dtype})"
    if sizes.huge == "auto" and not device.startswith("cuda"):
        return False, (
            f"{what}: not tried on {device} (it is tried on a CUDA device with the "
            "memory; --sizes production,huge=yes tries it anywhere)"
        )
    needs = [("the host", _host_available(), HOST_COPIES * nbytes)]
    if device != "cpu":
        needs.append((device, _device_free(device), DEVICE_COPIES * nbytes))
    short = [
        f"{where} has {have / gib:.0f} GiB free of the {need / gib:.0f} GiB it needs"
        for where, have, need in needs
        if have < need
    ]
    if short:
        return False, f"{what}: not tried: " + "; ".join(short)
    return True, f"{what}: tried by reference, compared in chunks"


def pool_line(sizes: Sizes) -> str:
    """What a run's header says of a pool it draws from ("" when it draws freely)."""
    pool = pool_shapes(sizes)
    if not pool:
        return ""
    shown = ", ".join(f"{s.batch}x{s.q_heads}/{s.k_heads} {s.head}" for s in pool)
    return (
        f"Shapes from a pool of {len(pool)} (batch x q/k heads, head size: {shown}): "
        "the target launches Triton kernels, a compile per shape on a GPU; --sizes ...,pool=no draws freely"
    )


def huge_fits(sizes: Sizes, device: str, dtype: str) -> bool:
    return huge_plan(sizes, device, dtype)[0]


def sizes_lines(sizes: Sizes, target, dtypes) -> list[str]:
    """What a run's header says of its sizes: nothing for toy ones; the sizes (a target that
    declares its head sizes keeps them), and for each dtype whether the input past 2^31
    elements is tried (1-D targets: the only ones that try it)."""
    if sizes == TOY:
        return []
    declared = tuple(getattr(target, "head_dims", ()) or ())
    lines = [sizes.describe(declared)]
    device = getattr(target, "device", "cpu")
    for dtype in dtypes:
        if dtype != "-" and not declared:
            said = huge_plan(sizes, device, dtype)[1]
            lines += [said] if said else []
    return lines
