"""The one preparation path of every front door (the CLI, the Python API, the pytest plugin,
the conformance report): options -> target (``spec.build``: loaded and declared) ->
warm-up (a smoke call in every dtype) -> a ``Session`` ready to run."""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
from rich.markup import escape

from ropecheck.calling import modes as run_modes
from ropecheck.calling.launches import Recorded
from ropecheck.properties.core.contract import CallError, TargetHung
from ropecheck.properties.core.dtypes import canonical
from ropecheck.properties.property import FamilyError, smoke_call
from ropecheck.properties.runner import PROFILES, RunOptions
from ropecheck.session import known_failures
from ropecheck.session.loading import is_named
from ropecheck.session.options import SANITIZE_EXAMPLES, Options, UsageError
from ropecheck.session.session import Reproduce, Session
from ropecheck.session.spec import UnusableTarget, build, family_of, header
from ropecheck.targets.target import Target

WARM_UP_ORDER = ("bfloat16", "float16", "float64", "float32")
WARM_UP_SHARE = 0.25  # of the call limit, for a warm-up call in a dtype the run does not check


def warm_up(
    target: Target, requested=(), timeout: Optional[float] = None, crashes: Optional[dict] = None, launches=None
) -> dict:
    """Smoke-call the target in every dtype it declares, lowest precision first, then in
    the ``requested`` dtypes, before any check: a target that keeps state from its first
    call (a cos/sin cache built in that call's dtype, say) is then checked in the state a
    real multi-dtype process sees. Returns {dtype: why it cannot be called, or None}.
    A dtype whose smallest call crashes the process (or exits) is callable, and a failure:
    its message goes into ``crashes`` (dtype -> message).
    A hang costs a whole time limit, so after one the other unrequested dtypes are not
    tried, and after a hang in a requested dtype nothing more is. A warm-up call in a dtype
    the run does not check only primes the process, so it has WARM_UP_SHARE of the call
    limit: past it the call is abandoned (the worker restarted, the dtype left out) and the
    requested dtypes keep the whole limit, so a target that hangs in every dtype is
    reported within 1 + WARM_UP_SHARE call limits. A target that takes no tensors (a
    position builder, dtype "-") has nothing to warm up. ``launches`` (a
    ``calling.launches.Recorded``) gets the Triton kernels the calls launched."""
    family = family_of(target)
    others = [d for d in WARM_UP_ORDER if d in target.dtypes and d not in requested]
    problems: dict = {}
    warm_up_limit = None if timeout is None else timeout * WARM_UP_SHARE
    for group, limit in ((others, warm_up_limit), ([d for d in WARM_UP_ORDER if d in requested], timeout)):
        for position, dtype in enumerate(group):
            try:
                problems[dtype] = smoke_call(family, target, dtype, limit, launches)
            except CallError as crash:
                problems[dtype] = None
                if crashes is not None:
                    crashes[dtype] = str(crash)
            except TargetHung as hung:
                for rest in group[position:]:
                    problems[rest] = str(hung)
                break
    return problems


def resolve_dtypes(requested, target: Optional[Target]) -> tuple[list[str], bool]:
    """Requested dtypes (comma-separated or repeated), or the target's; and whether explicit.
    A target that takes no tensors (a position builder, dtypes ("-",)) runs once, as "-"."""
    if target is not None and tuple(target.dtypes) == ("-",):
        return ["-"], False
    names = [n for item in requested or () for n in str(item).split(",") if n.strip()]
    if names:
        return list(dict.fromkeys(canonical(n.strip()) for n in names)), True
    return list(target.dtypes) if target is not None else [], False


def default_seed() -> int:
    return int(np.random.default_rng().integers(0, 2**31))


def run_seed(seed: Optional[int], profile: str) -> Optional[int]:
    """The hypothesis seed a run uses: the one given; none for a derandomized profile (ci,
    production); else a random one, printed so that the run can be replayed."""
    return seed if seed is not None or PROFILES[profile].get("derandomize") else default_seed()


def run_options(options: Options, seed: Optional[int]) -> RunOptions:
    examples = options.max_examples or (SANITIZE_EXAMPLES if options.sanitize else None)
    return RunOptions(
        profile=options.profile,
        seed=seed,
        timeout=options.timeout,
        max_examples=examples,
        strict_layouts=options.strict_layouts,
        sizes=options.sizes,
    )


def known_records(options: Options) -> list:
    shipped = (known_failures.DEFAULT_FILE,) if options.shipped_known_failures else ()
    try:
        return known_failures.load([*shipped, *(options.known_failures or ())])
    except (OSError, ValueError) as exc:
        raise UsageError(f"--known-failures: {exc}") from None


def prepare(
    options: Options,
    notify: Callable[[str], None] = lambda line: None,
    *,
    seed: Optional[int] = None,
    target: Optional[Target] = None,
    pytest_args: Optional[list] = None,
) -> Session:
    """A session for ``options``: the target built (or ``target``, already built) and
    warmed up in the requested dtypes (default: the target's), its properties chosen, the
    seed settled (``seed``: one already chosen, the pytest controller's), known failures
    loaded. ``notify`` gets the header line and each dtype skipped.

    Raises UsageError for an option the target's family does not take or a property it
    does not have (before the warm-up), UnusableTarget (exit 2) when the target cannot be
    loaded, cannot be run in a mode asked for (on its device), cannot be called in a dtype
    asked for by name, or in any dtype; the target's worker is closed then."""
    known = known_records(options)
    built = target or build(options)
    try:
        family = family_of(built)
        try:
            chosen = family.selected(options.properties or ())
        except FamilyError as exc:
            raise UsageError(str(exc)) from None
        if not options.properties:
            chosen = [p for p in chosen if p.offered_to(built)]
        if options.modes != ["eager"] and not built.takes_tensors:
            raise UnusableTarget(f"--mode {' '.join(options.modes)}: {built.name!r} takes no tensors to run in a mode")
        try:
            run_modes.require(options.modes, built.device)
        except ValueError as exc:
            raise UnusableTarget(str(exc)) from None
        dtype_list, explicit = resolve_dtypes(options.dtypes, built)
        notify(header(built, options))
        crashes: dict = {}
        launched = Recorded()
        problems = warm_up(built, dtype_list, options.timeout, crashes, launched)
        usable, unsupported = [], {}
        for dtype in dtype_list:
            problem = problems.get(dtype)
            if problem is None:
                usable.append(dtype)
            elif explicit:
                raise UnusableTarget(f"target {built.name!r} cannot be called: {problem}")
            else:
                unsupported[dtype] = problem
                notify(f"[yellow]skipping {dtype}: {escape(problem)}[/]")
        if not usable:
            raise UnusableTarget(
                f"target {built.name!r} cannot be called in any dtype"
                + (f": {next(iter(unsupported.values()))}" if unsupported else "")
            )
    except BaseException:
        built.close()
        raise
    seed = run_seed(options.seed if seed is None else seed, options.profile)
    shown = (
        repr(options.target)
        if options.target is None or is_named(options.target)
        else getattr(options.target, "__name__", "target")
    )
    callable_in = built.with_(dtypes=tuple(d for d in built.dtypes if problems.get(d) is None))
    return Session(
        callable_in,
        usable,
        chosen,
        run_options(options, seed),
        reproduce=Reproduce(options, usable, seed, shown, pytest_args),
        known=known,
        crashes=crashes,
        unsupported=unsupported,
        range_probe=family.probes_range(options.properties or ()),
        modes=list(options.modes),
        options=options,
        compiles_per_shape=bool(launched.keys),
        opcheck=bool(options.get("opcheck")),
    )
