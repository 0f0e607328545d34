"""Generation sources and the in-process generation load: what a generation dashboard drives."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import labserve
from labserve.lab.demo import SleepModel, TinyLM
from labserve.lab.generation.load import start_runner_generation_load


def wait_for(condition: Callable[[], Any], timeout: float = 20.0) -> None:
    """Poll a condition the loop will make true (not a timing assertion)."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


@pytest.fixture
def lm() -> Iterator[labserve.Runner]:
    r = labserve.Runner(TinyLM(d_model=32, n_layers=1, d_ff=64, max_model_len=64), name="lm")
    yield r
    r.stop(timeout=10)


def test_sources_are_found_in_a_runner_a_method_a_server_and_a_url(lm):
    assert [s.name for s in labserve.generation_sources(lm)] == ["lm.generate"]
    [source] = labserve.generation_sources(lm.generate)
    assert isinstance(source, labserve.RunnerGenerationSource) and source.alive
    server = labserve.serve(lm, port=0, token="t")
    try:
        [inproc] = labserve.generation_sources(server)
        assert inproc.name == "lm.generate"
        [remote] = labserve.generation_sources(server.url, token="t")
        assert isinstance(remote, labserve.HttpGenerationSource)
        assert remote.model == "lm"  # the name /v1/models lists it under
        assert remote.configure(max_num_seqs=4).max_num_seqs == 4
        assert lm.generate.config.max_num_seqs == 4 and remote.config.max_num_seqs == 4
        assert remote.view().snapshot.config.max_num_seqs == 4
        with pytest.raises(TypeError, match="reset"):
            remote.reset_stats()
    finally:
        server.stop()
    assert not inproc.alive  # it ends with the server it was watched through


def test_a_target_without_a_generator_is_refused_by_name():
    sleep = labserve.Runner(SleepModel(), name="sleep")
    try:
        with pytest.raises(ValueError, match="no generative method"):
            labserve.generation_sources(sleep)
    finally:
        sleep.stop()
    with pytest.raises(TypeError, match="a generation source needs"):
        labserve.generation_sources(42)


def test_the_load_answers_every_request_once_refusals_counted_by_type(lm):
    lm.generate.configure(max_num_seqs=1, max_queue_size=1)
    run = start_runner_generation_load(
        lm.generate,
        arrivals=labserve.arrivals("constant", rate_rps=400),
        duration_s=0.1,
        input_len=8,
        output_len=32,
    )
    wait_for(lambda: not run.running)
    assert run.sent == 40
    assert sum(run.outcomes.values()) == run.sent
    assert run.outcomes["served"] >= 1 and run.outcomes["QueueFullError"] >= 1


def test_lengths_past_the_context_are_cut_to_fit(lm):
    run = start_runner_generation_load(
        lm.generate,
        arrivals=labserve.arrivals("constant", rate_rps=50),
        duration_s=0.1,
        input_len=100,
        output_len=100,
    )
    wait_for(lambda: not run.running)
    assert run.outcomes == {"served": run.sent} and run.sent == 5


def test_stop_cancels_what_is_in_flight(lm):
    lm.generate.configure(max_num_seqs=1)
    run = start_runner_generation_load(
        lm.generate,
        arrivals=labserve.arrivals("constant", rate_rps=100),
        duration_s=5.0,
        input_len=8,
        output_len=60,
    )
    wait_for(lambda: run.sent >= 3)
    run.stop()
    run.stop()  # idempotent
    wait_for(lambda: not run.running)
    assert run.sent < 500
    wait_for(lambda: lm.generate.stats().num_running + lm.generate.stats().num_waiting == 0)
    assert lm.generate.stats().outcomes["cancelled"] >= 1
