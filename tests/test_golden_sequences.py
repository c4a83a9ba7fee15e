"""Same seed, same per-user operation sequences: compared against a recording made before the pipeline
refactor (tests/fixtures/golden/operation_sequences_seed42.json).

Each request is recorded as (QoS level, context tokens, generated tokens, turn, number of intended
operations, digest of the operation list), after the user's think time.  Regenerate only when a change
of the workload is intended: `python tests/test_golden_sequences.py`.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from kv_cache.cli import parse_settings
from kv_cache.workload.factory import UserFactory, build_trace_workload
from kv_cache.workload.rag import RagCorpus

FIXTURES = Path(__file__).resolve().parent / "fixtures"
GOLDEN = FIXTURES / "golden" / "operation_sequences_seed42.json"
MICRO = ("model_configs:\n  micro:\n    name: Micro test model\n    num_layers: 1\n    hidden_dim: 512\n"
         "    num_heads: 4\n    kv_heads: 1\n    dtype: float16\n")
SYNTHETIC = {
    "synthetic": [],
    "synthetic_rag": ["--enable-rag", "--rag-num-docs", "5"],
    "synthetic_no_multiturn": ["--disable-multi-turn", "--disable-prefix-caching"],
}
TRACES = {
    "mooncake_blocks": ["--trace", str(FIXTURES / "traces/mooncake/conversation_trace_300.jsonl"),
                        "--kv-block-tokens", "512", "--max-requests", "120"],
    "mooncake_entries": ["--trace", str(FIXTURES / "traces/mooncake/synthetic_trace_300.jsonl"),
                         "--max-requests", "60"],
    "agentic_sessions": ["--trace", str(FIXTURES / "traces/agentic-coding"), "--kv-block-tokens", "64",
                         "--think-time", "uniform:1:3"],
}


def _settings(config: Path, extra: list[str]):
    return parse_settings(["--config", str(config), "--model", "micro", "--num-users", "6", "--gpu-mem-gb", "0",
                           "--cpu-mem-gb", "0", "--generation-mode", "none", "--seed", "42",
                           "--output", str(config.parent / "unused.json"), *extra])


def _ops(plan) -> list:
    ops = plan.intended_operations(32)
    digest = hashlib.sha256(json.dumps([list(o) for o in ops], separators=(",", ":")).encode()).hexdigest()[:16]
    return [plan.qos_level, plan.context_tokens, plan.generate_tokens, plan.turn_number, len(ops), digest]


def record(name: str, config: Path) -> dict:
    if name in SYNTHETIC:
        settings = _settings(config, SYNTHETIC[name])
        rag = RagCorpus(settings.config.rag) if settings.workload.enable_rag else None
        users = UserFactory(settings, rag).build(0, settings.workload.num_users)
        return {u.user_id: [[round(u.think_time(), 9), *_ops(u.next_request())] for _ in range(12)] for u in users}
    workload = build_trace_workload(_settings(config, TRACES[name]))
    if workload.sessions is None:
        return {"arrivals": [[round(t, 9), p.user_id, p.request_id, *_ops(p)] for t, p in workload.arrivals]}
    out = {}
    for user in workload.sessions:
        first, turns = round(user.first_wake_s(), 9), []
        while user.has_next():
            plan = user.next_request()
            turns.append([round(user.think_time(), 9), *_ops(plan)])
        out[user.user_id] = {"first_wake_s": first, "turns": turns}
    return out


@pytest.fixture(scope="module")
def micro_config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("golden") / "micro.yaml"
    path.write_text(MICRO)
    return path


@pytest.mark.parametrize("name", [*SYNTHETIC, *TRACES])
def test_operation_sequences_match_the_recording(name, micro_config):
    expected = json.loads(GOLDEN.read_text())[name]
    actual = json.loads(json.dumps(record(name, micro_config)))  # tuples -> lists, as in the file
    assert actual.keys() == expected.keys()
    for user in expected:
        assert actual[user] == expected[user], f"{name}: user {user} issues a different sequence"


if __name__ == "__main__":  # regenerate the recording (an intended workload change only)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "micro.yaml"
        cfg.write_text(MICRO)
        GOLDEN.write_text(json.dumps({n: record(n, cfg) for n in [*SYNTHETIC, *TRACES]}, separators=(",", ":")))
    sys.exit(0)
