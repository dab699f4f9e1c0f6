"""The extraction recipe, top to bottom: model + dataset -> question table -> one feature set per variant.

    walla-extract --model smollm2-135m --dataset facts            # all variants the dataset has
    python -m walla.extract.cli --model aloe --dataset pubmedqa --backend vllm --variants none,relevant

1. Resolve the model (manifests/models.yaml) and the dataset (manifests/datasets.yaml).
2. Load the dataset (hub or --data-file), assign splits, write the question table (store/questions).
3. For each variant, build the FeatureSetSpec from every resolved input (model id/hash, backend +
   versions + dtype, question-table fingerprint, template text, option tokens, context seed).
   Complete ones are skipped at once ("already complete: <path>"), before any model is loaded.
4. Load the model ONCE, then per remaining variant: render prompts, resolve option tokens, open the
   store writer, resume after its durable rows, score shard by shard (bounded memory), commit.
   With --workers / --ray-address, step 4 runs in Ray actors over row ranges (extract/distributed.py).
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
from walla.extract import hub
from walla.extract.command import reproduce_command
from walla.extract.config import ExtractConfig
from walla.extract.datasets import DatasetRequest, load_dataset_table
from walla.extract.device import check_device
from walla.extract.model_stats import non_embedding_params
from walla.extract.models import ResolvedModel, pin_revision, resolve_model
from walla.extract.progress import Progress
from walla.extract.prompts import DEFAULT_TEMPLATE, build_prompts, get_template
from walla.extract.scoring import renormalize, resolve_option_token_ids
from walla.extract.splits import SplitProtocol

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
    )


def choose_backend(cfg: ExtractConfig, model_entry) -> str:
    """--backend, else the manifest hint; a vllm hint falls back to hf where vllm cannot run."""
    if cfg.backend:
        return cfg.backend
    hint = model_entry.backend or "hf"
    if hint == "vllm":
        from walla.extract.backends.vllm import vllm_usable

        ok, why = vllm_usable()
        if not ok:
            log.info("model %s prefers the vllm backend, but %s: using hf", model_entry.name, why)
            return "hf"
    return hint


def backend_identity(
    backend: str,
    rm: ResolvedModel,
    dtype: str,
    device: str,
    chat_template: bool,
    hidden_size: int,
    compiled: bool = False,
) -> dict:
    """Fingerprint inputs of (model, backend) known WITHOUT loading the model."""
    if backend == "hf":
        from walla.extract.backends.hf import hf_identity, resolve_dtype

        ident = hf_identity(resolve_dtype(dtype, device), chat_template, compiled)
    elif backend == "vllm":
        from walla.extract.backends.vllm import vllm_identity

        ident = vllm_identity(dtype, chat_template)
    else:
        from walla.extract.backends.dummy import DummyBackend

        ident = DummyBackend(hidden_size).identity()
    return {"model": rm.identity, **ident}


def load_backend(
    backend: str,
    rm: ResolvedModel,
    cfg: ExtractConfig,
    dtype: str,
    device: str,
    chat_template: bool,
    hidden_size: int,
):
    if backend == "hf":
        from walla.extract.backends.hf import load_hf_backend

        return load_hf_backend(
            rm,
            dtype=dtype,
            device=device,
            batch_tokens=cfg.batch_tokens,
            chat_template=chat_template,
            compiled=cfg.compile == "on",
        )
    if backend == "vllm":
        from walla.extract.backends.vllm import load_vllm_backend

        return load_vllm_backend(
            rm,
            dtype=dtype,
            chat_template=chat_template,
            tensor_parallel_size=cfg.tensor_parallel_size,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            max_model_len=cfg.max_model_len,
            enforce_eager=cfg.enforce_eager,
        )
    from walla.extract.backends.dummy import DummyBackend

    return DummyBackend(hidden_size, batch_tokens=cfg.batch_tokens)


def _preflight_model(rm: ResolvedModel, backend: str) -> tuple[ResolvedModel, hub.HubUnavailableError | None]:
    """A hub model pinned to the commit sha of its revision (offline: from the local cache), or the problem."""
    if backend == "dummy":
        return rm, None
    try:
        return pin_revision(rm), None
    except hub.HubUnavailableError as e:
        return rm, e


def feature_rows(prompts, result, token_col: dict[str, int], start: int) -> pl.DataFrame:
    """One shard of rows (schema.ROW_COLUMNS + prompt) from a backend result."""
    raw_rows, opt_rows = [], []
    for i, p in enumerate(prompts):
        raw = result.raw_logprobs[i, [token_col[s] for s in p.options]]  # [K_q]
        raw_rows.append(raw.astype(np.float32).tolist())
        opt_rows.append(renormalize(raw).tolist())
    return pl.DataFrame(
        {
            "question_id": [p.question_id for p in prompts],
            "n_options": pl.Series([len(p.options) for p in prompts], dtype=pl.Int32),
            "option_logprobs": pl.Series(opt_rows, dtype=pl.List(pl.Float32)),
            "raw_option_logprobs": pl.Series(raw_rows, dtype=pl.List(pl.Float32)),
            "prompt_nll": pl.Series(result.prompt_nll, dtype=pl.Float32),
            "n_prompt_tokens": pl.Series(result.n_tokens, dtype=pl.Int32),
            "context_source_id": pl.Series([p.context_source_id for p in prompts], dtype=pl.String),
            "prompt": [p.text for p in prompts],
        }
    )


def run(cfg: ExtractConfig, out=print) -> list[Path]:
    """Extract every requested variant of (model, dataset) into the store; return the feature-set paths.

    Raises:
        KeyError: unknown model or dataset name (message lists close matches).
        hub.HubUnavailableError: hub model/dataset unreachable, gated or not cached (one line).
        ValueError: malformed data, bad settings, store problems (one line naming the input).
    """
    from walla.store.catalog import load_datasets, load_models, resolve_model_name
    from walla.store.featureset import FeatureSetSpec, find_complete, read_feature_set, writer_lock
    from walla.store.questions import write_question_table

    # 1. resolve names -------------------------------------------------------------------------------------
    model_name, m_entry = resolve_model_name(cfg.model, load_models())  # ad hoc: hf:org/x, a dir, a .gguf
    d_entry = _lookup(load_datasets(), cfg.dataset, "dataset")
    template = get_template(d_entry.prompt or DEFAULT_TEMPLATE[d_entry.loader])
    available = template.variants if d_entry.has_context else ("none",)
    variants = tuple(cfg.variants or available)
    bad = [v for v in variants if v not in available]
    if bad:
        raise ValueError(
            f"dataset {cfg.dataset!r} has no {', '.join(bad)} variant (available: {', '.join(available)})"
        )
    backend_name = choose_backend(cfg, m_entry)
    dtype = cfg.dtype or m_entry.dtype or "auto"
    dtype_from = "--dtype" if cfg.dtype else f"manifest dtype of {cfg.model}"
    chat = m_entry.chat_template if cfg.chat_template is None else cfg.chat_template
    device = cfg.device or _default_device(backend_name)
    if not cfg.ray_address:  # on a cluster the workers' devices count, not the driver's (they check)
        check_device(device, backend_name)
    rm = resolve_model(m_entry)

    # 2. dataset -> question table (a hub model that cannot load is reported together with a hub dataset)
    rm, model_problem = _preflight_model(rm, backend_name)
    try:
        table, source = load_dataset_table(dataset_request(d_entry, cfg))
    except hub.HubUnavailableError as e:
        raise hub.combine([model_problem, e] if model_problem else [e]) from e
    if model_problem:
        raise model_problem
    qfp = write_question_table(
        cfg.store, cfg.dataset, table, source, reproduce_command(cfg, variants, backend_name, dtype)
    )
    counts = table["split"].value_counts().sort("split")
    out(
        f"questions: {table.height} rows ({', '.join(f'{s} {n}' for s, n in counts.iter_rows())}), "
        f"fingerprint {qfp}" + (f"; dropped {source['dropped']}" if source.get("dropped") else "")
    )

    # 3. one spec per variant; skip the complete ones before loading anything ----------------------------
    compiled = False
    if backend_name != "dummy":  # `auto` is measured here (cached per machine); the fingerprint gets what ran
        from walla.extract.backends.hf import explain_dtype

        dtype, why = explain_dtype(dtype, device)
        out(f"dtype {why} [{dtype_from}]")
    if backend_name == "hf":
        from walla.extract.backends.hf_compile import explain_compile

        compiled, why = explain_compile(
            cfg.compile, _estimate_tokens(table, template, variants, d_entry, cfg), device
        )
        cfg = replace(cfg, compile="on" if compiled else "off")  # resolved: workers and the command reuse it
        out(why)
    ident = backend_identity(backend_name, rm, dtype, device, chat, m_entry.hidden_size, compiled)
    todo: list[tuple[str, FeatureSetSpec]] = []
    paths: list[Path] = []
    with contextlib.ExitStack() as locks:
        for variant in variants:
            inputs = {
                "questions_fp": qfp,
                **({"dataset_revision": source["hub"]["revision"]} if "hub" in source else {}),
                **ident,
                "prompt": {"template": template.name, "text": template.text_for(variant), "description": ""},
                "option_tokens": _option_tokens_input(d_entry, template),
                "context_seed": cfg.context_seed if variant == "irrelevant" else None,
            }
            spec = FeatureSetSpec(model_name, cfg.dataset, variant, inputs)
            locks.enter_context(
                writer_lock(cfg.store, spec)
            )  # a second walla-extract refuses HERE, before a model loads
            done = find_complete(cfg.store, spec)
            if done is not None:
                read_feature_set(done)  # verified: a corrupt set is refused with its fix, never "complete"
                out(f"already complete: {done}")
                paths.append(done)
            else:
                todo.append((variant, spec))
        if not todo:
            return paths
        if cfg.workers or cfg.ray_address:  # 4'. the same, in Ray actors over row ranges
            from walla.extract.distributed import extract_parallel

            load_args = (backend_name, rm, cfg, dtype, device, chat, m_entry.hidden_size)
            return paths + extract_parallel(todo, table, template, d_entry, cfg, load_args, out)

        # 4. load the model once, extract each remaining variant ----------------------------------------
        t_load = time.perf_counter()
        backend = load_backend(backend_name, rm, cfg, dtype, device, chat, m_entry.hidden_size)
        out(
            f"model {model_name} loaded ({backend_name}, {ident.get('dtype', 'n/a')}"
            f"{', compiled' if compiled else ''}) in {time.perf_counter() - t_load:.1f} s"
        )
        try:
            with Progress(cfg.progress) as bar:
                for variant, spec in todo:
                    command = reproduce_command(cfg, [variant], backend_name, dtype)
                    paths.append(
                        _extract_variant(backend, spec, table, template, d_entry, cfg, bar, out, command)
                    )
        finally:
            backend.close()
    return paths


def _default_device(backend: str) -> str:
    if backend == "dummy":
        return "cpu"
    from walla.extract.backends.hf import default_device

    return default_device()


def _estimate_tokens(table, template, variants, d_entry, cfg: ExtractConfig) -> int:
    """Prompt tokens of the job, estimated without a tokenizer (~4 characters per token)."""
    if cfg.compile != "auto":
        return 0
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


def prepare_variant(backend, spec, table, template, d_entry, cfg: ExtractConfig) -> tuple:
    """Render the prompts of one variant and resolve its option tokens: (prompts, token_ids, token_col)."""
    prompts = build_prompts(
        table, template, spec.variant, option_tokens=d_entry.option_tokens, seed=cfg.context_seed
    )
    prompts = [replace(p, text=backend.format_prompt(p.text)) for p in prompts]
    union = list(dict.fromkeys(s for p in prompts for s in p.options))
    tok_of = resolve_option_token_ids(backend.encode, backend.encode_bare, prompts[0].text, union)
    return prompts, [tok_of[s] for s in union], {s: i for i, s in enumerate(union)}


def score_range(backend, prepared: tuple, a: int, b: int, advance=None) -> tuple[pl.DataFrame, np.ndarray]:
    """Rows a..b-1 of a prepared variant: (store rows, hidden [b - a, H])."""
    prompts, token_ids, token_col = prepared
    chunk = prompts[a:b]
    res = backend.score([p.text for p in chunk], token_ids, advance)
    return feature_rows(chunk, res, token_col, a), res.hidden


def _extract_variant(
    backend, spec, table, template, d_entry, cfg: ExtractConfig, bar, out, command: str
) -> Path:
    """Render, resolve option tokens, then score and store shard by shard (resuming after durable rows)."""
    from walla.store.featureset import open_writer

    t0 = time.perf_counter()
    prepared = prepare_variant(backend, spec, table, template, d_entry, cfg)
    n = len(prepared[0])
    with open_writer(
        cfg.store, spec, hidden_size=backend.hidden_size, total_rows=n, command=command, locked=True
    ) as w:
        pieces = [piece for group in w.missing(cfg.shard_rows) for piece in group]  # rows no shard holds
        start0 = n - sum(b - a for a, b in pieces)
        if start0:
            out(f"resuming {spec.model}/{spec.dataset}/{spec.variant} after {start0} durable rows")
        bar.task(f"{spec.model} {spec.dataset}/{spec.variant}", n, start0)
        for a, b in pieces:
            w.write_range(a, *score_range(backend, prepared, a, b, bar.advance))
        w.stats = {
            "n_params_non_embedding": non_embedding_params(getattr(backend, "model", None)),
            "wall_s": time.perf_counter() - t0,
            "device": str(getattr(backend, "device", cfg.device)),
        }
        path = w.commit()
    dt = time.perf_counter() - t0
    out(
        f"wrote {spec.model}/{spec.dataset}/{spec.variant}: {n} rows in {dt:.1f} s, fingerprint {spec.fingerprint}\n"
        f"  {path}"
    )
    return path
