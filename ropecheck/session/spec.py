"""From a run's options to the target it checks: load what ``target`` names (in this
process or a worker), then attach what the options and the target's family declare (its
convention, call form, position axes and head sizes, capabilities, device).

One path for every family: the family (``--family``, else what the target declares, else
1-D RoPE) is a ``properties.property.Family`` record whose ``declare`` turns the family
parameters (an adapter's implied ones, overridden by the options given) into its
convention.
"""

from __future__ import annotations

import json
import re
from typing import Optional

from ropecheck.calling import context_parallel, devices, quiet, sanitizer
from ropecheck.calling.forms import MRope, unbind_dim
from ropecheck.calling.presets import PRESETS
from ropecheck.calling.roles import role
from ropecheck.properties.convention import Convention
from ropecheck.properties.core.contract import APPLIER_FORMS, DIFFERENTIABLE_FORMS, ROW_FORMS
from ropecheck.properties.families import family as family_record
from ropecheck.properties.inputs.cases import SHOWN, abridged
from ropecheck.properties.interfaces import draws
from ropecheck.properties.interfaces.draws import MROPE_MEDIA, media_rules
from ropecheck.properties.property import Family, FamilyError
from ropecheck.reference.rope import DEFAULT_BASE
from ropecheck.session.loading import TargetLoadError, is_named, load, target_name
from ropecheck.session.options import BY_NAME, FAMILY_PARAMETERS, Options, UsageError
from ropecheck.targets.builtins import BUILTINS, DEFAULT_TARGET
from ropecheck.targets.target import Target


class UnusableTarget(Exception):
    """The target cannot be loaded or called at all (exit status 2)."""


def name_of(options: Options) -> str:
    """How the run names its target (the default target when none is given)."""
    return target_name(options.target) or DEFAULT_TARGET


def in_process(options: Options) -> bool:
    """Whether the target's calls run in this process: asked for, or a Python object (a
    worker is a fresh interpreter: a lambda or a closure cannot be sent to one)."""
    return bool(options.in_process) or not (options.target is None or is_named(options.target))


def build(options: Options) -> Target:
    """The target ``options`` describe, loaded and declared; its worker started (close it
    with ``Target.close``). UnusableTarget when it cannot be loaded or its declaration
    does not hold; UsageError for an option that does not apply to its family."""
    spec = options.target if options.target is not None else DEFAULT_TARGET
    if options.family is not None and options.call is not None:  # before anything loads
        _check_call(family_record(options.family), options.call)
    one_d = options.family in (None, "rope")
    builtin_options = (
        {
            k: v
            for k, v in (
                ("base", options.base),
                ("rotary_dim", options.rotary_dim),
                ("layout", options.layout),
                ("scaling", options.scaling_parsed),
            )
            if v is not None
        }
        if one_d and is_named(spec) and spec in BUILTINS
        else {}
    )
    _check_sanitize(options)
    quiet.show(bool(options.get("debug")))  # the target's own output: only with --debug (a CLI option)
    applier = options.api in APPLIER_FORMS  # an N-D applier's interface: its call form (``declare``)
    try:
        devices.require(options.device)
        target = load(
            spec,
            worker=not in_process(options),
            call=options.api if applier else options.call,
            family=options.family,
            builtin_options=builtin_options,
            api=None if applier else options.api,
            sanitize=options.get("sanitize"),
        )
    except (TargetLoadError, ValueError, OSError) as exc:
        raise UnusableTarget(
            f"cannot load target {name_of(options)!r}: {exc}" if isinstance(exc, TargetLoadError) else str(exc)
        ) from None
    try:
        return declare(target, options)
    except BaseException:
        target.close()
        raise


def _check_sanitize(options: Options) -> None:
    """--sanitize runs the target's worker under compute-sanitizer: it needs a worker, a
    CUDA device and the sanitizer (exit 2 with the reason, before anything loads)."""
    if options.get("sanitize") is None:
        return
    if in_process(options):
        raise UsageError(
            "--sanitize runs the target's worker process under compute-sanitizer: it cannot run a target "
            "called in this process (--in-process, or a Python object: pass its name)"
        )
    if options.device is None or not str(options.device).startswith("cuda"):
        raise UnusableTarget("--sanitize checks what CUDA kernels read and write: give --device cuda")
    why = sanitizer.available()
    if why:
        raise UnusableTarget(f"--sanitize: {why}")


def declare(target: Target, options: Options) -> Target:
    """``target`` with what ``options`` and its family declare."""
    try:
        fam = family_record(options.family or target.family)
    except FamilyError as exc:
        raise UsageError(str(exc)) from None
    api = options.api or target.api
    applier = api if api in APPLIER_FORMS else None  # an N-D applier's interface is a call form
    if applier is not None:
        if applier not in fam.calls:
            raise UnusableTarget(f"--api {api} applies an N-D rotation: give --family axial, mrope or pairs")
        if options.call not in (None, applier):
            raise UnusableTarget(f"--api {api} is called as --call {applier}, not --call {options.call}")
        api = None
    elif api and fam.name != "rope" and not (fam.name == "mrope" and PRESETS[api].mrope):
        takers = ", ".join(name for name, p in PRESETS.items() if p.mrope)
        raise UnusableTarget(
            f"--api {api} is a 1-D interface: it takes --family rope (the default), not {fam.name} "
            f"(--family mrope takes --api {takers})"
        )
    elif api and fam.name != "mrope" and PRESETS[api].mrope == "only":
        raise UnusableTarget(
            f"--api {api} is an M-RoPE interface (its sections are among its arguments): give --family mrope "
            "--sections T,H,W"
        )
    preset = PRESETS[api] if api else None
    if preset is not None:
        call = options.call or (target.call if target.call in preset.calls else preset.calls[0])
        if call not in preset.calls:
            raise UnusableTarget(
                f"--api {api} takes {' or '.join('--call ' + c for c in preset.calls)}, not --call {call}"
            )
    else:
        call = applier or options.call or (target.call if target.call in fam.calls else fam.calls[0])
    _check_cp(options, preset)
    _check_call(fam, call)
    options.check_applies(fam.name, call)
    parameters = {**target.implies, **options.parameters()}
    own = target.convention if target.family == fam.name else None
    if preset is not None and own is None and parameters.get("layout") is None:
        parameters["layout"] = "half"  # what the interface's layout argument defaults to
    try:
        declared = fam.declare(parameters, own)
    except FamilyError as exc:
        raise UnusableTarget(str(exc)) from None
    if call in ROW_FORMS and declared.convention is None:
        raise UnusableTarget(
            f"--call {call}: ropecheck makes the applier's cos/sin tables from the declared rotation, or applies "
            "the builder's along its pairs: give --family axial, mrope or pairs with their convention "
            "(--family nd declares none)"
        )
    if call in APPLIER_FORMS:
        _check_applier(call, declared.convention)
    if preset is not None and fam.name == "mrope":
        return _mrope_through(target, options, preset, call, declared, parameters)
    if preset is not None:
        return _through(target, options, preset, call, declared, parameters)
    limits = [n for n in (target.max_position, options.max_position, declared.max_position) if n is not None]
    device = _device(options, target)
    return target.with_(
        family=fam.name,
        call=call,
        convention=declared.convention,
        n_axes=declared.n_axes,
        coordinates=declared.coordinates,
        head_dims=declared.head_dims or target.head_dims,
        rotary_dim=declared.rotary_dim or target.rotary_dim,
        dtypes=declared.dtypes or target.dtypes,
        max_position=min(limits) if limits else None,
        backward=options.backward and target.backward and call in DIFFERENTIABLE_FORMS,
        inplace=options.inplace or target.inplace,
        device=device,
        implies={**target.implies, **options.parameters()},
    )


def _device(options: Options, target: Target) -> str:
    """The device the run makes the target's inputs on (``devices.choose``), which this machine must have."""
    try:
        device = devices.choose(options.device, target.devices)
        devices.require(device)
    except ValueError as exc:
        raise UnusableTarget(str(exc)) from None
    return device


def _through(target: Target, options: Options, preset, call: str, declared, parameters: dict) -> Target:
    """``target`` declared to be called through ``preset``: its call form and capabilities
    are the interface's (in place, k optional, offsets, autograd), the convention becomes
    its table (or its arguments), whose length is its position range."""
    convention = declared.convention
    problem = preset_refuses(preset, convention)
    if problem:
        raise UnusableTarget(problem)
    table = preset.table
    by_row = table is not None and table.by == "position"
    limits = [n for n in (target.max_position, declared.max_position) if n is not None]
    max_position = options.max_position or (preset.max_position if by_row else (min(limits) if limits else None))
    device = _device(options, target)
    cp_size = options.get("cp_size") or 1
    return target.with_(
        family="rope",
        call=call,
        api=preset.name,
        space=run_space(preset, target, options.call, cp_size),
        convention=convention,
        rotary_dim=declared.rotary_dim or target.rotary_dim,
        dtypes=declared.dtypes or target.dtypes,
        max_position=max_position,
        backward=options.backward and target.backward and preset.backward,
        inplace=preset.inplace or options.inplace or (target.inplace and target.api == preset.name),
        k_optional=preset.k == "optional",
        row_offsets=preset.offsets and call == "x",
        cp_size=cp_size,
        device=device,
        implies={**target.implies, **options.parameters()},
    )


def _mrope_through(target: Target, options: Options, preset, call: str, declared, parameters: dict) -> Target:
    """``target`` declared to be called through ``preset`` in an M-RoPE run: the checks are
    the N-D family's on (t, h, w) positions, its calls pass them as (3, T), its table is the
    1-D RoPE the sections split (``forms.MRope``), and its argument space has the classes of
    the tokens a multimodal model passes (text, an image's, a video's)."""
    if declared.coordinates is not None:
        raise UnusableTarget(f"--api {preset.name} takes M-RoPE token positions (t, h, w), not --coord-* coordinates")
    sections = tuple(int(s) for s in parameters["sections"])
    base = parameters.get("base") or DEFAULT_BASE
    table = Convention(parameters.get("layout") or "half", float(base), 2 * sum(sections))
    problem = preset_refuses(preset, table)
    if problem:
        raise UnusableTarget(problem)
    device = _device(options, target)
    by_row = preset.table is not None and preset.table.by == "position"
    space = run_space(preset, target, options.call, 1)
    return target.with_(
        family="mrope",
        call=call,
        api=preset.name,
        space=space.extended(draws.media(MROPE_MEDIA), media_rules(space)),
        convention=declared.convention,
        n_axes=declared.n_axes,
        head_dims=declared.head_dims or target.head_dims,
        rotary_dim=declared.rotary_dim or target.rotary_dim,
        dtypes=declared.dtypes or target.dtypes,
        max_position=options.max_position or (preset.max_position if by_row else declared.max_position),
        backward=False,
        inplace=preset.inplace or options.inplace,
        k_optional=preset.k == "optional",
        mrope=MRope(table, sections, bool(parameters.get("mrope_interleaved"))),
        device=device,
        implies={**target.implies, **options.parameters()},
    )


def run_space(preset, target: Target, call: Optional[str], cp_size: int):
    """The argument space a run of ``target`` through ``preset`` draws from: the preset's,
    cut to the call form asked for (``--call``), to what context parallelism takes, and to
    the optional parameters the target's signature has (the classes left out are named:
    ``Space.unreached``)."""
    space = preset.space
    for factor in space.factors:
        forms = {c.settings.get("call") for c in factor.classes} - {None}
        if call is not None and forms:
            keep = [c.name for c in factor.classes if c.settings.get("call", call) == call]
            space = space.restricted(factor.name, keep, f"--call {call} was asked for")
    if space.has("context parallel"):  # a run's own: every call split, or none
        ranks = "N ranks" if cp_size > 1 else "1 rank"
        why = f"--cp-size {cp_size} splits every call" if cp_size > 1 else "--cp-size N checks context parallelism"
        space = space.restricted("context parallel", (ranks,), why)
    if cp_size > 1 and space.has("start_positions"):
        space = space.restricted(
            "start_positions",
            ("None",),
            f"--cp-size {cp_size}: under context parallelism TransformerEngine's callers give each sequence's "
            "offset through freqs",
        )
    for param in preset.params:
        if param.optional and param.name not in target.optional_params:
            for factor in param.factors:
                space = space.restricted(
                    factor.name,
                    factor.names[:1],
                    f"the target has no {param.name} parameter: every call keeps its default",
                )
    return space


def preset_refuses(preset, convention) -> str:
    """Why ``convention`` cannot be given to ``preset`` ("" when it can): a scaling it has
    no argument for, a table indexed by position with frequencies that change with the
    call (dynamic, LongRoPE), an angle table with an attention factor and no argument for it."""
    scaling = convention.scaling
    name = f"--api {preset.name}"
    if preset.scalings is not None and scaling.rope_type not in preset.scalings:
        return (
            f"{name} computes its own angles with rope_theta and rope_scale only: "
            f"--scaling {scaling.rope_type} cannot be given to it"
        )
    if not preset.partial and convention.rotary_dim is not None:
        return (
            f"{name} rotates the whole head (its tables are head_dim wide; callers slice partial rotary "
            f"features themselves): --rotary-dim cannot be given to it"
        )
    table = preset.table
    if table is not None and table.by == "position":
        if scaling.dynamic:
            return (
                f"{name} is fed a {table.argument} table made once for every position: the {scaling.rope_type} "
                "scaling's frequencies change with the call's length (check its builder and applier apart)"
            )
    takes_factor = any(role(p.role).attention_factor for p in preset.params)
    if table is not None and table.kind == "angles" and convention.amplitude != 1.0 and not takes_factor:
        return (
            f"{name}'s {table.argument} carry angles only: the {scaling.rope_type} scaling's attention factor "
            "cannot be fed to it"
        )
    return ""


def _check_cp(options: Options, preset) -> None:
    """--cp-size splits the calls of an interface that takes context-parallel ranks."""
    if "cp_size" not in options.given or (preset is not None and context_parallel.takes_cp(preset)):
        return
    takers = ", ".join(name for name, p in PRESETS.items() if context_parallel.takes_cp(p))
    why = (
        f"--api {preset.name}'s signature {preset.signature()} has no cp_size, cp_rank or cp_group argument"
        if preset is not None
        else "the target is called with no --api"
    )
    raise UsageError(
        f"--cp-size splits the calls of an interface that takes context-parallel ranks (--api {takers}): {why}"
    )


def _check_applier(call: str, convention) -> None:
    """UnusableTarget for a declared rotation an applier's tables cannot express."""
    if getattr(convention, "heads", None):
        raise UnusableTarget(f"--call {call}: a rotation across a token's heads has no (seq, head_dim) tables")
    for conv in convention.values() if isinstance(convention, dict) else (convention,):
        try:
            unbind_dim(conv)
        except ValueError as exc:
            raise UnusableTarget(f"--api {call}: {exc}") from None


def _check_call(fam: Family, call: str) -> None:
    if call not in fam.calls:
        raise UnusableTarget(
            f"--call {call} is not available with --family {fam.name} (it takes "
            f"{', '.join('--call ' + f for f in fam.calls)})"
        )


_NUMBER = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
_LONG_NUMBER_LIST = re.compile(rf"\[(?:\s*{_NUMBER}\s*,){{{SHOWN},}}\s*{_NUMBER}\s*\]")  # more than SHOWN numbers


def header(target: Target, options: Optional[Options] = None) -> str:
    """The line a run starts with: what the target is declared to compute (for a family
    other than 1-D RoPE, its flags and the run's, as a reproduce line has them); with
    --hf-config, the flags its config gave (1-D RoPE: they are the convention). A list of
    more than SHOWN numbers in them (LongRoPE's factors) is abridged as a printed line
    abridges one (``cases.abridged``); the reproduce line gives the run whole."""
    return _LONG_NUMBER_LIST.sub(lambda m: abridged(json.loads(m.group())), _header(target, options))


def _header(target: Target, options: Optional[Options]) -> str:
    given = hf_config_line(options)
    fam = family_record(target.family)
    if fam.name == "rope":
        if target.convention is None:
            return (
                "[yellow]No --layout given: running spec-free checks only "
                "(no comparison with the float64 reference).[/]"
            )
        through = _through_line(target)
        config = options.get("hf_config") if options is not None else None
        if config is not None and set(config.defaults) <= set(config.flags):  # its flags are the convention
            return f"Convention: {given}{through}"
        return (f"{given}\n" if given else "") + f"Convention: {target.convention.flags()}{through}"
    run = [
        w
        for name in ("max_position", "device", "backward", "in_process")
        if options is not None and name in options.given
        for w in BY_NAME[name].shown(options[name])
    ]
    call = ["--call", target.call] * (target.call != fam.calls[0] and not target.api)  # an interface's own call
    flags = " ".join(call + family_words(target.implies) + run)
    family = f"Family {fam.name}" + (f": {flags}" if flags else "")
    return (f"{given}\n" if given else "") + family + _through_line(target)


def _through_line(target: Target) -> str:
    """The line a run through a library interface adds: the preset, the call form and
    context-parallel ranks asked for, its signature ("" called in its own form)."""
    if not target.api:
        return ""
    preset = PRESETS[target.api]
    call = f" --call {target.call}" if target.call != preset.calls[0] else ""
    call += f" --cp-size {target.cp_size}" if target.cp_size > 1 else ""
    return f"\nInterface: --api {target.api}{call}: {preset.signature()}"


def hf_config_line(options: Optional[Options]) -> str:
    """``--hf-config PATH = --layout half --base 500000 ...``: the flags of the convention the
    config gives (``session.hf_config``), or "" without one."""
    config = None if options is None else options.get("hf_config")
    if config is None:
        return ""
    chosen = f" --layer-type {config.layer_type}" if config.layer_type else ""
    words = [
        w
        for name in ("family", *FAMILY_PARAMETERS)
        if name in config.flags
        for w in BY_NAME[name].shown(config.flags[name])
    ]
    return f"--hf-config {config.path}{chosen} = {' '.join(words)}"


def family_words(parameters: dict) -> list:
    """The flags that give these family parameters (``--sections 2,3,3 --layout half``)."""
    words: list = []
    for name in FAMILY_PARAMETERS:
        value = parameters.get(name)
        if value is not None and value is not False:
            option = BY_NAME[name]
            words += option.shown(value) if not hasattr(value, "flag") else [option.cli, value.flag()]
    return words


def family_of(target: Target) -> Family:
    return family_record(target.family)


__all__ = ["UnusableTarget", "build", "declare", "header", "name_of", "in_process", "Optional"]
