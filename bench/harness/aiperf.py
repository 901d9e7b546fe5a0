"""NVIDIA's aiperf (PyPI ``aiperf``, pinned in scripts/aiperf-venv.sh) as an outside client of
``talaria serve``: its ``synthesize agentic-code`` sessions, replayed by ``aiperf profile``,
read back from its export and from Talaria's admin API (bench/aiperf_live.py,
tests/real/test_aiperf.py).

Offline: aiperf turns a trace's hash ids into text with a Hugging Face tokenizer, and its
builtin one (tiktoken) downloads its encoding. aiperf's worker processes load a tokenizer by
hub name in offline mode, so the model directory's tokenizer files are laid out as a hub cache
entry (``talaria/<dir name>`` at a fixed revision) under the run's folder, and every aiperf
process runs with ``HF_HUB_CACHE`` there and ``HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.harness.processes import ROOT

AGENTIC_SMALL = ROOT / "bench" / "aiperf" / "agentic-small.json"
"""The agentic-code generator's distributions scaled to a 135M model on 2 cores (the file's
own comment-free JSON; docs/results.md says what each field was scaled from)."""
REVISION = "0" * 40
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json",
                   "special_tokens_map.json", "generation_config.json")  # fmt: skip


def aiperf_binary() -> str | None:
    """``TALARIA_AIPERF`` (scripts/test.sh sets it from scripts/aiperf-venv.sh), else
    .venv-aiperf's, else ``aiperf`` on the PATH; None when there is none."""
    given = os.environ.get("TALARIA_AIPERF")
    if given:
        return given
    local = ROOT / ".venv-aiperf" / "bin" / "aiperf"
    return str(local) if local.exists() else shutil.which("aiperf")


@dataclass(frozen=True)
class Aiperf:
    """One aiperf installation and the folder its runs write to."""

    binary: str
    folder: Path

    def tokenizer(self, model_dir: Path) -> str:
        """The hub name under which ``model_dir``'s tokenizer is cached for aiperf."""
        name = f"talaria/{model_dir.name}"
        entry = self.folder / "hub" / f"models--talaria--{model_dir.name}"
        snapshot = entry / "snapshots" / REVISION
        snapshot.mkdir(parents=True, exist_ok=True)
        for file in TOKENIZER_FILES:
            if (model_dir / file).is_file():
                shutil.copyfile(model_dir / file, snapshot / file)
        (entry / "refs").mkdir(exist_ok=True)
        (entry / "refs" / "main").write_text(REVISION)
        return name

    def _run(self, args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TALARIA_")}
        env |= {"HF_HUB_CACHE": str(self.folder / "hub"), "HF_HUB_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
        done = subprocess.run(
            [self.binary, *args], capture_output=True, text=True, env=env, timeout=timeout_s
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"aiperf {args[0]} failed ({done.returncode}): {done.stdout[-3000:]}"
            )
        return done

    def synthesize(self, sessions: int, seed: int, config: Path = AGENTIC_SMALL) -> Path:
        """``aiperf synthesize agentic-code``: its dataset (Mooncake trace JSONL)."""
        out = self.folder / f"synth-{seed}"
        args = ["synthesize", "agentic-code", "--num-sessions", str(sessions),
                "--seed", str(seed), "--config", str(config), "--output", str(out)]  # fmt: skip
        self._run(args, timeout_s=300)
        (dataset,) = out.glob("*/dataset.jsonl")
        return dataset

    def profile(
        self,
        url: str,
        model: str,
        tokenizer: str,
        dataset: Path,
        name: str,
        endpoint: str = "chat",
        concurrency: int = 4,
        timeout_s: float = 900,
    ) -> Path:
        """``aiperf profile`` replaying ``dataset`` against ``url``, ``concurrency`` sessions
        in flight (not the trace's timestamps), streamed; its artifact folder."""
        art = self.folder / name
        block = json.loads(AGENTIC_SMALL.read_text())["block_size"]
        args = ["profile", "--model", model, "--url", url, "--endpoint-type", endpoint,
                "--streaming", "--input-file", str(dataset),
                "--custom-dataset-type", "mooncake_trace", "--isl-block-size", str(block),
                "--no-fixed-schedule", "--concurrency", str(concurrency),
                "--request-count", str(sum(trace_sessions(dataset).values())),
                "--tokenizer", tokenizer, "--artifact-dir", str(art), "--ui-type", "none",
                "--api-key", "none"]  # fmt: skip
        self._run(args, timeout_s)
        return art


def trace_sessions(dataset: Path) -> dict[str, int]:
    """The trace's sessions and their number of turns."""
    turns: dict[str, int] = {}
    for line in dataset.read_text().splitlines():
        if line.strip():
            sid = json.loads(line)["session_id"]
            turns[sid] = turns.get(sid, 0) + 1
    return turns


@dataclass(frozen=True)
class Request:
    """One request aiperf sent, from its per-request export."""

    conversation: str
    correlation: str
    turn: int
    error: str | None
    ttft_ms: float | None
    latency_ms: float | None


def requests(art: Path) -> list[Request]:
    """Every request of an aiperf run (profile_export.jsonl)."""
    out = []
    for line in (art / "profile_export.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        meta, metrics = record["metadata"], record.get("metrics") or {}
        error = record.get("error")
        out.append(
            Request(
                conversation=meta["conversation_id"],
                correlation=meta["x_correlation_id"],
                turn=meta["turn_index"],
                error=json.dumps(error) if error else None,
                ttft_ms=(metrics.get("time_to_first_token") or {}).get("value"),
                latency_ms=(metrics.get("request_latency") or {}).get("value"),
            )
        )
    return out


def summary(art: Path) -> dict[str, Any]:
    """aiperf's own summary (profile_export_aiperf.json)."""
    doc: dict[str, Any] = json.loads((art / "profile_export_aiperf.json").read_text())
    return doc


def talaria_sessions(base_url: str, token: str) -> list[dict[str, Any]]:
    """Every session a ``talaria serve`` stored (its admin API, all pages)."""
    found: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 200}
        if cursor:
            params["cursor"] = cursor
        reply = httpx.get(
            base_url + "/admin/sessions",
            params=params,
            headers={"authorization": f"Bearer {token}"},
            timeout=30,
        )
        reply.raise_for_status()
        page = reply.json()
        found += page["data"]
        cursor = page.get("next_cursor")
        if not cursor:
            return found


@dataclass(frozen=True)
class Match:
    """One session aiperf sent (a conversation's replay, one ``x-session-affinity`` id) as
    Talaria stored it."""

    conversation: str
    sent: int
    """Requests aiperf sent with the id."""
    calls: tuple[int, ...]
    """The call counts of the Talaria sessions with the id."""

    @property
    def whole(self) -> bool:
        """One Talaria session, every request one of its calls."""
        return self.calls == (self.sent,)


def matched(sent: list[Request], stored: list[dict[str, Any]]) -> dict[str, Match]:
    """Each session aiperf sent (by its id), matched with the Talaria sessions of that id."""
    by_id: dict[str, list[int]] = {}
    for s in stored:
        by_id.setdefault(s.get("session_id") or "", []).append(s["calls"])
    counts: dict[str, int] = {}
    for r in sent:
        counts[r.correlation] = counts.get(r.correlation, 0) + 1
    conversation = {r.correlation: r.conversation for r in sent}
    return {
        sid: Match(conversation[sid], n, tuple(by_id.get(sid, ()))) for sid, n in counts.items()
    }
