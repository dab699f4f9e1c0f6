"""`walla market agent`: one live agent -- its LLM's forecast, its trained head's wager, learning from payouts.

    WALLA_MARKET_AGENT_TOKEN=wm_... walla market agent --url http://127.0.0.1:8765 --model smollm2-135m \
        --dataset facts --head runs/<scenario>/walla-i/<key-id>/seed=18 --slot 0 --store walla-store

The LLM is settled to the identity the head's features recorded (read from --store): another dtype, device
kind, kernel path, model file or library stops the agent with one line naming the field, unless
--other-identity (then every report is logged with how its features differ).

The token: --token-file FILE (its first word) or the environment variable WALLA_MARKET_AGENT_TOKEN; --token
on the command line still works but shows in `ps` and shell history.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import typer
from walla.cli import options
from walla.cli.exits import UNREACHABLE, USAGE
from walla.market.launch import fail

app = options.app()
TOKEN_ENV = "WALLA_MARKET_AGENT_TOKEN"


def agent_token(token: str | None, token_file: Path | None) -> str:
    """The agent's token from --token-file, --token or $WALLA_MARKET_AGENT_TOKEN (in that order)."""
    if token_file is not None:
        try:
            lines = token_file.read_text(encoding="utf-8").split()
        except OSError as e:
            raise fail(f"--token-file {token_file}: {e.strerror or e}") from None
        if not lines:
            raise fail(f"--token-file {token_file}: empty, expected the agent's token")
        return lines[0]
    token = (token or "").strip() or os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise fail(
            f"no token: pass --token-file FILE or set {TOKEN_ENV} (walla market add-agent prints it)", USAGE
        )
    return token


@app.command()
def agent(
    url: str = typer.Option(..., "--url", help="the market, e.g. http://127.0.0.1:8765"),
    token: str = typer.Option(
        None, "--token", help=f"this agent's token (visible in ps: prefer --token-file or ${TOKEN_ENV})"
    ),
    token_file: Path = typer.Option(None, "--token-file", help="a file holding this agent's token"),
    model: str = typer.Option(
        ..., "--model", help="model name from manifests/models.yaml (or hf:org/name, a dir)"
    ),
    head: Path = typer.Option(
        ..., "--head", help="a WALLA run directory, runs/<scenario>/<method>/<key-id>/seed=<s> (its state.pt)"
    ),
    slot: int = typer.Option(0, "--slot", help="which agent of the run this is (0-based)"),
    dataset: str = typer.Option(
        ..., "--dataset", help="the prompt template and option tokens of this dataset (the run's, e.g. facts)"
    ),
    backend: str = typer.Option(
        None, "--backend", help="extraction backend (hf | vllm; default: the model's manifest hint, else hf)"
    ),
    device: str = typer.Option(None, "--device", help="cpu | cuda (default: the one the features recorded)"),
    dtype: str = typer.Option(
        None, "--dtype", help="the LLM's dtype (default: the one the features recorded)"
    ),
    store: Path = typer.Option(
        Path("walla-store"), "--store", help="the feature store the head's run was trained from"
    ),
    other_identity: bool = typer.Option(
        False, "--other-identity", help="play even on features of another identity (every report labelled)"
    ),
    learn: bool = typer.Option(True, "--learn/--frozen", help="update the head from its own payouts"),
    batch_size: int = typer.Option(1, "--batch-size", help="resolved rounds per head update"),
    poll: float = typer.Option(2.0, "--poll", help="seconds between polls"),
    max_rounds: int = typer.Option(
        None, "--max-rounds", help="stop after this many reports and their payouts"
    ),
) -> None:
    """Run one agent: report on every open round with the LLM's forecast and the head's wager; learn."""
    if batch_size < 1 or poll <= 0:
        raise fail("--batch-size must be >= 1 and --poll > 0", USAGE)
    token = agent_token(token, token_file)
    # its one implementation module, once the options hold: the agent's stack (httpx, torch, the extraction
    # backends) is imported when it runs (walla.cli.lazy)
    from walla.market import agent as live

    logging.basicConfig(level=logging.INFO, format="walla market agent: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not one line per poll
    try:
        h = live.AgentHead.from_run(head, slot)
        client = live.MarketClient(url, token)
        who = client.me()
        try:
            expect = live.run_identity(head, slot, store)
        except ValueError:
            if not other_identity:
                raise
            expect = None
        features = live.LLMFeatures(
            model, dataset, device, dtype, backend, expect=expect, other_identity=other_identity
        )
        label = (
            features.differs
            if expect is not None
            else f"not checked (no identity recorded in --store {store})"
        )
        typer.echo(
            f"walla market agent: {who['name']} on {url}, {model} ({dataset} prompts), head {head} slot {slot}",
            err=True,
        )
        if other_identity and label:
            typer.echo(
                f"walla market agent: playing another identity than the head's features: {label}", err=True
            )
        agent = live.Agent(client, h, features, learn, batch_size, label=label if other_identity else None)
        agent.run(poll, max_rounds)
    except live.IdentityMismatch as e:
        raise fail(f"--head {head} slot {slot}: {e} (or pass --other-identity to play it labelled)") from None
    except (ValueError, KeyError, OSError) as e:  # a run's format (RunFormatError), a name, a file
        raise fail(e.args[0] if isinstance(e, KeyError) and e.args else e) from None
    except live.MarketError as e:
        raise fail(f"--url {url}: {e}") from None
    except live.httpx.TransportError as e:
        raise fail(f"--url {url}: cannot reach the market ({e})", UNREACHABLE) from None
