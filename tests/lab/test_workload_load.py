"""A shared-prefix workload sent to a method in this process: prompts, real replies, turns."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest

import labserve
from labserve.generation.workload import SharedPrefixWorkload
from labserve.lab.demo import TinyLM
from labserve.lab.generation.sessions import start_workload_load


@pytest.fixture(scope="module")
def lm() -> Iterator[labserve.Runner]:
    r = labserve.Runner(TinyLM(d_model=32, n_layers=1, d_ff=64, max_model_len=256), name="wl")
    yield r
    r.stop(timeout=10)


def workload(**over):
    args = dict(prefix_len=48, num_prefixes=2, input_len=8, output_len=6, turns=3, seed=5)
    return SharedPrefixWorkload(**(args | over))


def test_each_turn_resends_the_history_with_the_models_real_replies(lm):
    w = workload()
    run = start_workload_load(
        lm.generate, w, arrivals=labserve.arrivals("constant", rate_rps=50), duration_s=0.1
    )
    rows = run.result(timeout=60)
    assert len(rows) == 5 * 3 and all(r.outcome == "served" for r in rows)
    assert run.sent == 5  # sessions, as an HTTP session load counts them
    again = workload()  # a fresh copy of the same workload: the prompts it makes
    for k in range(5):
        mine = sorted((r for r in rows if r.session == k), key=lambda r: r.turn)
        assert [r.turn for r in mine] == [0, 1, 2]
        replies = [list(r.reply) for r in mine]
        assert all(len(reply) == 6 for reply in replies)
        for t, row in enumerate(mine):
            assert list(row.prompt) == again.prompt_ids(k, t, replies[:t])
        # The model's own reply, as it answers that history alone at temperature 0.
        alone = lm.generate.run(
            list(mine[0].prompt), max_tokens=6, temperature=0.0, ignore_eos=True
        )
        assert list(alone.token_ids) == replies[0]
        assert mine[1].intended_s >= mine[0].end_s  # the closed loop within the session
    per_turn = run.per_turn()
    assert set(per_turn) == {0, 1, 2} and all(v["n"] == 5 for v in per_turn.values())


def test_a_vocabulary_too_small_for_text_ids_is_refused():
    small = SimpleNamespace(vocab_size=64)  # a model of 64 ids cannot take ASCII text as ids
    with pytest.raises(ValueError, match="vocab_size 64"):
        start_workload_load(
            small, workload(), arrivals=labserve.arrivals("constant", rate_rps=1), duration_s=1.0
        )


def test_a_dashboards_source_sends_a_workload_in_process(lm):
    [source] = labserve.generation_sources(lm)
    w = workload(turns=2)
    run = source.start_load(
        arrivals=labserve.arrivals("constant", rate_rps=20), duration_s=0.1, input_len=8,
        output_len=4, seed=3, workload=w,
    )  # fmt: skip
    rows = run.result(timeout=60)
    assert run.sent == 2 and len(rows) == 4
    later = w.next_sessions(3)  # seed 3: the same tenants, other users
    assert list(rows[0].prompt) == later.prompt_ids(rows[0].session)
