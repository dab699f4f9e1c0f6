"""The extraction recipe, top to bottom: model + dataset -> question table -> one feature set per variant.

    walla extract --model smollm2-135m --dataset facts            # all variants the dataset has
    python -m walla.extract.cli --model aloe --dataset pubmedqa --backend vllm --variants none,relevant

1. Resolve the model (manifests/models.yaml) and the dataset (manifests/datasets.yaml).
2. Load the dataset (hub or --data-file), assign splits, write the question table (store/questions).
3. For each variant, build the FeatureSetSpec from every resolved input (model id/hash, backend +
   versions + dtype, question-table fingerprint, template text, option tokens, context seed).
   Complete ones are skipped at once ("already complete: <path>"), before any model is loaded.
   The backend settles first (extract/backends/registry.py: dtype, compile, batch invariance, batch
   tokens and shard rows, device) and prints why; the fingerprint is what it settled (`Settled.identity`).
   Where the batch sizes are part of it, sizes a store already recorded for the same inputs are reused
   rather than measured again, and so is the dtype when `--dtype auto` now decides another one than those
   sets hold (a changed verdict never silently starts a second set); a store set of the same inputs settled on another machine (device,
   accelerator, libraries) stops the run with one line naming the field.
4. Load the model ONCE, then per remaining variant: render prompts, resolve option tokens, open the
   store writer, resume after its durable rows, score shard by shard (bounded memory), commit. On a GPU
   the next shard is tokenized and the previous one written while the device runs (extract/variant.py).
   With --workers / --ray-address, step 4 runs in Ray actors over row ranges (extract/distributed.py).

The backend is opened through the registry's one door (`settle_backend`, `open_backend`): this recipe
asks it, never compares its name. Rows are computed by extract/variant.py, here and in every Ray actor alike.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import json
import logging
import time
from pathlib import Path

from walla.extract.backends import BATCHING_KEY, TIER_KEY, Backend, BackendKind, Settled
from walla.extract.backends.registry import identity_difference, open_backend
from walla.extract.command import reproduce_command
from walla.extract.config import ExtractConfig
from walla.extract.datasets import DatasetRequest, default_template, load_dataset_table
from walla.extract.distributed import extract_parallel
from walla.extract.door import settle_for, target_for, with_pinned
from walla.extract.models import ResolvedModel
from walla.extract.models import _hub as hub
from walla.extract.progress import Progress
from walla.extract.prompts import PromptTemplate, build_prompts, get_template
from walla.extract.splits import SplitProtocol
from walla.extract.timeline import Timeline
from walla.extract.variant import prepare_variant, score_and_write
from walla.manifests import catalog  # module attribute: tests swap catalog.load_models / load_datasets
from walla.store.features import (
    META_FILE,
    WRITER_FILE,
    FeatureSetSpec,
    StoreError,
    find_complete,
    open_writer,
    read_feature_set,
    writer_lock,
)
from walla.store.files import read_json
from walla.store.fingerprint import canonical
from walla.store.listing import list_feature_sets
from walla.store.questions import write_question_table

log = logging.getLogger(__name__)


def _lookup(table: dict, name: str, what: str):
    if name not in table:
        close = difflib.get_close_matches(name, list(table), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"unknown {what} {name!r}{hint} (available: {', '.join(sorted(table))})")
    return table[name]


def dataset_request(entry, cfg: ExtractConfig) -> DatasetRequest:
    """DatasetEntry + CLI overrides -> what the loader needs."""
    hub_spec = dict(entry.hub) if entry.hub else None
    if hub_spec is not None:
        if cfg.split:
            hub_spec["split"] = cfg.split
        if cfg.hub_config:
            hub_spec["name"] = cfg.hub_config
    elif cfg.split and cfg.data_file:
        hub_spec = {"split": cfg.split}
    generator = dict(entry.generator) if entry.generator else None
    if cfg.size is not None:
        if generator is None:
            raise ValueError(
                f"--size only applies to generated datasets; {entry.name!r} is loaded, use --limit"
            )
        generator["n"] = cfg.size
    return DatasetRequest(
        name=entry.name,
        loader=entry.loader,
        hub=hub_spec,
        data_file=Path(cfg.data_file) if cfg.data_file else None,
        local_format=entry.local_format,
        split_protocol=SplitProtocol.from_dict(entry.split_protocol),
        generator=generator,
        limit=cfg.limit,
        sample=cfg.sample,
    )


def run(cfg: ExtractConfig, out=print, timeline: Timeline | None = None) -> list[Path]:
    """Extract every requested variant of (model, dataset) into the store; return the feature-set paths.
    `timeline` (the CLI's) gets the seconds of each phase: inputs, settle, model load, extraction.

    Raises:
        KeyError: unknown model or dataset name (message lists close matches).
        hub.HubUnavailableError: hub model/dataset unreachable, gated or not cached (one line).
        ValueError: malformed data, bad settings, store problems (one line naming the input).
    """
    tl = timeline or Timeline()
    # 1. resolve names (a models.yaml name, or an ad hoc hf:org/x, a directory, a .gguf) ------------------
    with tl.phase("inputs"):
        # on a cluster the workers' devices count, not the driver's (they check)
        target = target_for(cfg, check_device=not cfg.ray_address, pin=False)
        model_name = target.name
        d_entry = _lookup(catalog.load_datasets(), cfg.dataset, "dataset")
        template = get_template(default_template(d_entry.loader, d_entry.prompt))
        variants = _variants(cfg, d_entry, template)

        # 2. dataset -> question table (a hub model that cannot load is reported together with a hub dataset)
        rm, table, source = _load_inputs(target.kind, target.model, d_entry, cfg)
        target = with_pinned(target, rm)

    # 3. settle the backend once: what it decides is what the fingerprint records ------------------------
    est_tokens = functools.cache(functools.partial(_estimate_tokens, table, template, variants, d_entry, cfg))
    with tl.phase("settle"):
        settled = settle_for(cfg, target, est_tokens=est_tokens)
    command = reproduce_command(cfg, variants, settled.kind, list(settled.command_args))
    qfp = write_question_table(cfg.store, cfg.dataset, table, source, command)
    counts = table["split"].value_counts().sort("split")
    out(
        f"questions: {table.height} rows ({', '.join(f'{s} {n}' for s, n in counts.iter_rows())}), "
        f"fingerprint {qfp}" + (f"; dropped {source['dropped']}" if source.get("dropped") else "")
    )
    for line in settled.why:
        for part in (line or "").splitlines():
            out(part)
    inputs = {v: _inputs(v, qfp, source, settled.identity, d_entry, template, cfg) for v in variants}
    recorded = _recorded_batching(cfg, model_name, inputs)
    if recorded is not None:  # the sizes the store's sets of these inputs were made with: their fingerprints
        batching, why = recorded
        out(why)
        with tl.phase("settle"):
            settled = settle_for(cfg, target, est_tokens=est_tokens, recorded=batching)
        inputs = {v: _inputs(v, qfp, source, settled.identity, d_entry, template, cfg) for v in variants}
    kept = _recorded_dtype(
        cfg, target, est_tokens, model_name, settled, inputs, (qfp, source, d_entry, template)
    )
    if kept is not None:  # `auto` decides otherwise than when the store's sets were made: theirs is kept
        settled, inputs, why = kept
        out(why)
    _refuse_other_machine(cfg, model_name, inputs, settled)
    specs = [FeatureSetSpec(model_name, cfg.dataset, v, inputs[v]) for v in variants]
    with contextlib.ExitStack() as locks:
        paths, todo = _lock_and_skip_complete(locks, cfg.store, specs, out)
        if not todo:
            return paths
        if cfg.workers or cfg.ray_address:  # 4'. the same, in Ray actors over row ranges
            return paths + extract_parallel(todo, table, template, d_entry, cfg, settled, out)
        # 4. load the model once, extract each remaining variant ----------------------------------------
        return paths + _extract_here(todo, table, template, d_entry, cfg, settled, model_name, out, tl)


def _lock_and_skip_complete(
    locks: contextlib.ExitStack, store, specs: list[FeatureSetSpec], out
) -> tuple[list[Path], list]:
    """(paths of the complete feature sets, [(variant, spec)] still to extract), each spec's writer lock held.

    A second walla extract of the same feature set refuses HERE, before a model loads.
    """
    paths, todo = [], []
    for spec in specs:
        locks.enter_context(writer_lock(store, spec))
        done = find_complete(store, spec)
        if done is not None:
            read_feature_set(done)  # verified: a corrupt set is refused with its fix, never "complete"
            out(f"already complete: {done}")
            paths.append(done)
        else:
            todo.append((spec.variant, spec))
    return paths, todo


def _variants(cfg: ExtractConfig, d_entry, template: PromptTemplate) -> tuple[str, ...]:
    available = template.variants if d_entry.has_context else ("none",)
    variants = tuple(cfg.variants or available)
    bad = [v for v in variants if v not in available]
    if bad:
        raise ValueError(
            f"dataset {cfg.dataset!r} has no {', '.join(bad)} variant (available: {', '.join(available)})"
        )
    return variants


def _load_inputs(kind: BackendKind, rm: ResolvedModel, d_entry, cfg: ExtractConfig) -> tuple:
    """(the model as fingerprinted, question table, source): a model AND a dataset the hub cannot serve fail together."""
    try:
        rm, model_problem = kind.pin_model(rm), None
    except hub.HubUnavailableError as e:
        model_problem = e
    try:
        table, source = load_dataset_table(dataset_request(d_entry, cfg))
    except hub.HubUnavailableError as e:
        raise hub.combine([model_problem, e] if model_problem else [e]) from e
    if model_problem:
        raise model_problem
    return rm, table, source


def _recorded_batching(
    cfg: ExtractConfig, model_name: str, inputs: dict[str, dict]
) -> tuple[dict, str] | None:
    """(batching, why) recorded by feature sets in the store whose inputs equal ours but for the `auto` sizes.

    Only where the sizes are in the fingerprint (`BATCHING_KEY`) and one of them is `auto`: re-sizing from
    the free memory of the moment would silently give a new fingerprint, so a resumed or repeated run would
    neither resume nor find its complete set.

    Raises:
        ValueError: feature sets that differ only in those sizes were made with two or more of them.
    """
    auto = {k for k in ("batch_tokens", "shard_rows") if getattr(cfg, k) is None}
    ours_any = next(iter(inputs.values()))
    if not auto or BATCHING_KEY not in ours_any:
        return None
    found: dict[str, list] = {}
    for variant, ours in inputs.items():
        mine = canonical(ours)
        for info in list_feature_sets(cfg.store, model_name, cfg.dataset, variant):
            theirs = _recorded_inputs(info)
            if theirs is None or not isinstance(theirs.get(BATCHING_KEY), dict):
                continue
            b, want = theirs[BATCHING_KEY], mine[BATCHING_KEY]
            rest_same = {k: v for k, v in theirs.items() if k != BATCHING_KEY} == {
                k: v for k, v in mine.items() if k != BATCHING_KEY
            }
            fixed_same = set(b) == set(want) and all(b[k] == want[k] for k in want if k not in auto)
            if rest_same and fixed_same:
                found.setdefault(json.dumps(b, sort_keys=True), []).append(info)
    if not found:
        return None
    if len(found) > 1:
        recorded = [json.loads(k) for k in sorted(found)]
        sizes = " and ".join(
            f"{b.get('batch_tokens', '-')} tokens/{b.get('shard_rows', '-')} rows" for b in recorded
        )
        raise ValueError(
            f"the store {cfg.store} holds feature sets of {model_name}/{cfg.dataset} that differ only in their "
            f"batch sizes ({sizes}); pass --batch-tokens and --shard-rows to say which to continue"
        )
    ((key, infos),) = found.items()
    b, info = json.loads(key), infos[0]
    sizes = ", ".join(f"{k.replace('_', ' ')} {b[k]:,}" for k in ("batch_tokens", "shard_rows") if k in b)
    return b, (
        f"{sizes}: as the {info.status} feature set "
        f"{info.model}/{info.dataset}/{info.variant} {info.fingerprint} in the store recorded them (auto sizes "
        "that are part of a fingerprint are reused, not measured again)"
    )


def _recorded_dtype(
    cfg: ExtractConfig, target, est_tokens, model_name: str, settled: Settled, inputs: dict[str, dict], data
) -> tuple[Settled, dict[str, dict], str] | None:
    """(settled, inputs, why) for the dtype the store's sets of these inputs hold, when `--dtype auto` now
    decides another one (extract/dtype_probe.py: a machine whose verdict changed). Without this the same
    command would silently start a second set of other numbers beside the first; `--dtype X` still asks
    for X. None when the dtype was given, when a set of this run's inputs exists, or when none matches.

    Raises:
        ValueError: sets of these inputs exist in two or more other dtypes (say which with --dtype).
    """
    if (cfg.dtype or target.entry.dtype or "auto") != "auto":
        return None
    qfp, source, d_entry, template = data
    mine = {v: canonical(ours) for v, ours in inputs.items()}
    others: set[str] = set()
    for variant in inputs:
        for info in list_feature_sets(cfg.store, model_name, cfg.dataset, variant):
            theirs = _recorded_inputs(info)
            if theirs == mine[variant]:
                return None  # the store already has this verdict's set: nothing changes
            if theirs is not None and theirs.get("dtype") not in (None, settled.request.dtype):
                others.add(str(theirs["dtype"]))
    found = []
    for dtype in sorted(others):
        c = dataclasses.replace(cfg, dtype=dtype)
        s = settle_for(c, target, est_tokens=est_tokens)
        ins = {v: _inputs(v, qfp, source, s.identity, d_entry, template, c) for v in inputs}
        recorded = _recorded_batching(c, model_name, ins)
        if recorded is not None:
            s = settle_for(c, target, est_tokens=est_tokens, recorded=recorded[0])
            ins = {v: _inputs(v, qfp, source, s.identity, d_entry, template, c) for v in inputs}
        hits = [
            info
            for v, ours in ins.items()
            for info in list_feature_sets(cfg.store, model_name, cfg.dataset, v)
            if _recorded_inputs(info) == canonical(ours)
        ]
        if hits:
            found.append((dtype, s, ins, hits[0]))
    if not found:
        return None
    if len(found) > 1:
        raise ValueError(
            f"the store {cfg.store} holds feature sets of {model_name}/{cfg.dataset} in "
            f"{' and '.join(f[0] for f in found)}, and `--dtype auto` now says {settled.request.dtype}: "
            "pass --dtype to say which to continue"
        )
    ((dtype, s, ins, info),) = found
    return (
        s,
        ins,
        (
            f"dtype {dtype}: as the {info.status} feature set {info.model}/{info.dataset}/{info.variant} "
            f"{info.fingerprint} in the store recorded it (`auto` says {settled.request.dtype} now; "
            f"--dtype {settled.request.dtype} makes new sets beside it)"
        ),
    )


def _refuse_other_machine(
    cfg: ExtractConfig, model_name: str, inputs: dict[str, dict], settled: Settled
) -> None:
    """Stop when the store holds a set (complete or being written) of these very inputs that another machine
    settled: same model, data, prompt and options, but another device, accelerator or library version.
    Its fingerprint differs, so this run would neither resume it nor reuse it but silently start a second
    set of other numbers.

    Raises:
        ValueError: one line naming the first differing field, the set, and the two ways on.
    """
    machine, derived = set(settled.environment), set(settled.derived)
    for variant, ours in inputs.items():
        mine = canonical(ours)
        for info in list_feature_sets(cfg.store, model_name, cfg.dataset, variant):
            theirs = _recorded_inputs(info)
            if theirs is None or theirs == mine or TIER_KEY not in theirs:
                continue  # made before sets recorded their device and tier: nothing to compare
            differ = {k for k in set(theirs) | set(mine) if theirs.get(k) != mine.get(k)}
            # a machine key both record differently (one that only one records follows from `auto`)
            moved = {k for k in differ & machine if theirs.get(k) is not None and mine.get(k) is not None}
            if not moved or not differ <= machine | derived:
                continue  # other options or other data: a set of its own, rightly
            first = next(k for k in settled.environment if k in moved)
            field = identity_difference({first: theirs.get(first)}, {first: mine.get(first)})
            raise ValueError(
                f"the store's {info.status} feature set {info.model}/{info.dataset}/{info.variant} "
                f"{info.fingerprint} has these inputs but was settled with {field} (recorded != this run's): "
                f"{'resume it where it was started' if info.status != 'complete' else 'use it where it was made'}, "
                f"or remove it (`walla store rm {info.fingerprint} --store {cfg.store} --yes`) to make it here"
            )


def _recorded_inputs(info) -> dict | None:
    """The fingerprint inputs a feature-set directory recorded (meta.json, or writer.json of a write in progress)."""
    if info.status not in ("complete", "incomplete", "writing"):
        return None  # stale, corrupt: never continued
    try:
        data = read_json(info.path / (META_FILE if info.status == "complete" else WRITER_FILE))
    except StoreError:
        return None
    inputs = (data.get("fingerprint_inputs") or {}).get("inputs")
    return inputs if isinstance(inputs, dict) else None


# the fingerprint inputs `_inputs` adds to the backend's settled identity (what the data and the prompt are)
DATA_INPUTS = ("questions_fp", "dataset_revision", "prompt", "option_tokens", "context_seed")


def settled_identity(inputs: dict) -> dict:
    """The backend's settled identity inside a feature set's fingerprint inputs (`walla serve` re-settles to it)."""
    return {k: v for k, v in inputs.items() if k not in DATA_INPUTS}


def _inputs(variant: str, qfp: str, source: dict, ident: dict, d_entry, template, cfg: ExtractConfig) -> dict:
    """Fingerprint inputs of one variant's feature set."""
    return {
        "questions_fp": qfp,
        **({"dataset_revision": source["hub"]["revision"]} if "hub" in source else {}),
        **ident,
        "prompt": {"template": template.name, "text": template.text_for(variant), "description": ""},
        "option_tokens": _option_tokens_input(d_entry, template),
        "context_seed": cfg.context_seed if variant == "irrelevant" else None,
    }


def _estimate_tokens(table, template, variants, d_entry, cfg: ExtractConfig) -> int:
    """Prompt tokens of the job, estimated without a tokenizer (~4 characters per token)."""
    opts, seed = d_entry.option_tokens, cfg.context_seed
    chars = sum(
        len(p.text)
        for v in variants
        for p in build_prompts(table, template, v, option_tokens=opts, seed=seed)
    )
    return chars // 4


def _option_tokens_input(d_entry, template) -> list[str] | str:
    if d_entry.option_tokens:
        return list(d_entry.option_tokens)
    if template.option_tokens:
        return list(template.option_tokens)
    return "display letters by position"


def _extract_here(
    todo, table, template, d_entry, cfg: ExtractConfig, settled: Settled, model_name: str, out, tl: Timeline
) -> list[Path]:
    """Step 4 in this process: load the model once, then extract each variant of `todo` [(variant, spec)]."""
    with tl.phase("model load"):
        backend = open_backend(settled)
    times = backend.load_times
    parts = f": {', '.join(f'{k} {v:.1f} s' for k, v in times.items())}" if times else ""
    ident = settled.identity
    out(
        f"model {model_name} loaded ({settled.kind}, {ident.get('dtype', 'n/a')}"
        f"{', compiled' if ident.get('compile') else ''}) in {tl.phases['model load']:.1f} s{parts}"
    )
    paths = []
    try:
        with Progress(cfg.progress) as bar:
            for variant, spec in todo:
                command = reproduce_command(cfg, [variant], settled.kind, list(settled.command_args))
                with tl.phase("extraction"):
                    paths.append(
                        _extract_variant(
                            backend, spec, table, template, d_entry, cfg, settled, bar, out, command
                        )
                    )
    finally:
        backend.close()
    return paths


def _extract_variant(
    backend: Backend,
    spec,
    table,
    template,
    d_entry,
    cfg: ExtractConfig,
    settled: Settled,
    bar,
    out,
    command: str,
) -> Path:
    """Render, resolve option tokens, then score and store shard by shard (resuming after durable rows)."""
    t0 = time.perf_counter()
    prepared = prepare_variant(
        backend, table, template, spec.variant, d_entry.option_tokens, cfg.context_seed
    )
    n = len(prepared.prompts)
    rows = settled.shard_rows
    with open_writer(
        cfg.store, spec, hidden_size=backend.hidden_size, total_rows=n, command=command, locked=True
    ) as w:
        pieces = [piece for group in w.missing(rows) for piece in group]  # rows no shard holds
        start0 = n - sum(b - a for a, b in pieces)
        if start0:
            out(f"resuming {spec.model}/{spec.dataset}/{spec.variant} after {start0} durable rows")
        bar.task(f"{spec.model} {spec.dataset}/{spec.variant}", n, start0)
        overlap = not settled.device.startswith("cpu")  # a CPU computes with every core: nothing to overlap
        score_and_write(backend, prepared, pieces, w.write_range, bar.advance, rows, overlap)
        w.stats = {
            "n_params_non_embedding": backend.n_params,
            "wall_s": time.perf_counter() - t0,
            "device": settled.device,
        }
        path = w.commit()
    dt = time.perf_counter() - t0
    out(
        f"wrote {spec.model}/{spec.dataset}/{spec.variant}: {n} rows in {dt:.1f} s, fingerprint {spec.fingerprint}\n"
        f"  {path}"
    )
    return path
